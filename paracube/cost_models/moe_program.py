"""The event engine's MoE blocks: cost_models/moe.py's terms inserted into a stage's program (event_program.py).

Per MoE block i of the stage, in every forward list after block i's dense ops: dispatch all_to_all (and the
routing weights' beside it, where priced: moe_dispatch.sends_probs), (etp all_gather,) the experts' compute, (etp
reduce_scatter,) combine all_to_all; in every backward list before block i's dense backward (after its
recomputation under full recomputation, which repeats the forward ones): the backward collectives around the
experts' backward compute; before a forward's dispatch its counts (moe_counts.py: the copy counts over ep, the aux
loss's over tp), and in the tail the experts' norm all_reduce. The attention correction
(attention_correction.attention_delta) is added to the largest compute op of each block's forward and backward (it may
be negative: a true attention smaller than the dense part's). The all_to_alls run with payload x MoESpec.load (the most
loaded receiver sets their time; the declared events keep the balanced bytes). zero=2/3: each block's expert unit's
gathers and reduce-scatter around its experts' forward and backward, prefetched on their own stream where
moe_fsdp.Chain prices them so (`_prefetched`: its issue and wait points), else in line; a pipelined stage's
reduce-scatters and zero=2's gathers in the tail (moe_fsdp.py, as moe.stage_cost prices them). The expert gradient
reduction runs in the tail before the optimizer (with the layout's `overlap`: each model chunk's share issued as
that chunk's last backward starts, `_per_chunk`, waited on in the tail, as moe_step.py prices it), and the expert
optimizer step is added to the optimizer op. With the layout's `a2ao`, the `fwd` / `bwd` lists' compute is shortened
by what the combined 1F1B steps hide of the partner pass's all_to_alls (moe_a2a_overlap.py: its saving, the SMs'
slowdown included, scaled to the lists' micro-batches).
A dropless block's
host wait (host_sync.py) is its own compute op before the dispatch, outside the overlap's compute (as moe_step.py),
and so is its forward's and backward's wait for the host's issue (host_issue.py, moe.stage_cost's issue_fwd / issue_bwd:
added to the forward's wait op, and a wait op of its own before the backward's collectives).
"""

from __future__ import annotations

from dataclasses import replace

from paracube.cost_models.attention_correction import attention_delta, delta_again
from paracube.cost_models.compute import GemmModel
from paracube.cost_models.context_parallel import ring_again, ring_core_extra
from paracube.cost_models.dims import Dims
from paracube.cost_models.event_program import Op, StageProgram
from paracube.cost_models.host_sync import HOST_WAIT
from paracube.cost_models.mlp_delta import block_deltas
from paracube.cost_models.moe import (
    StageCost,
    block_cost,
    grad_event,
    moe_layers_of,
    routed,
    stage_cost,
)
from paracube.cost_models.moe_a2a_overlap import SM_SHARE, combined, list_share
from paracube.cost_models.moe_counts import norm_events
from paracube.cost_models.moe_fsdp import ExpertUnit, expert_unit
from paracube.cost_models.moe_mlp_again import again_blocks, again_events, relabel
from paracube.cost_models.moe_step import in_flight
from paracube.cost_models.moe_unshared import drop_ops, unshared_blocks
from paracube.cost_models.recompute_modules_cost import MOE_REGION, moe_side
from paracube.cost_models.validity import layout_arrays
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.experts import before_experts
from paracube.modes.stages import stage_chunks
from paracube.workload import ModelSpec


def _per_chunk(ge: CommEvent, blocks: list[int]) -> list[CommEvent | None]:
    """The expert gradient reduction split over the stage's model chunks by their MoE blocks (None: a chunk without),
    each issued as its own chunk's last backward starts (as v = 1 issues the whole, its buckets firing as that backward
    produces them): with v > 1 the chunks' last backwards are spread over the cool-down, and a chunk's gradients are
    not ready before its own (Megatron-core starts a model chunk's grad sync at its last micro-batch; issuing every
    chunk's at the last chunk's hid them early: the event engine 3% under the analytic model, qwen3-30b-a3b
    dp=16,pp=2,mb=2,v=8,zero=1,overlap on 32 GB200s). The bytes add up to the whole (integer apportioning)."""
    total, out, done, seen = sum(blocks), [], 0, 0
    for k in blocks:
        seen += k
        upto = ge.payload_bytes * seen // total if total else 0
        out.append(replace(ge, payload_bytes=upto - done) if k else None)
        done = upto
    return out

def _timed(e: CommEvent, imbalance: float) -> CommEvent:
    return replace(e, payload_bytes=int(e.payload_bytes * imbalance)) if routed(e) else e


def _ops(events: list[CommEvent], seconds: float, name: str, imbalance: float,
         pre: list[CommEvent] | None = None, wait: float = 0.0, backward: bool = False) -> list[Op]:
    """`pre` (the forward's counts, moe_counts.py), then the host's wait (`wait` seconds of `seconds`: host_sync.py),
    the collectives before the experts' compute, the experts, the ones after (modes/experts.before_experts: dispatch
    (+ the weights', + gather) forward; combine's gradient (+ scatter's) backward)."""
    half = before_experts([e.label for e in events], backward)
    comm = [Op("comm", e.label, event=_timed(e, imbalance)) for e in events]
    first = [Op("comm", e.label, event=e) for e in pre or []]
    held = [Op("compute", name + HOST_WAIT, wait)] if wait > 0 else []
    return [*first, *held, *comm[:half], Op("compute", name, seconds - wait), *comm[half:]]


def _unit_ops(events: tuple[CommEvent, ...], i: int) -> list[Op]:
    """The expert unit's collectives (moe_fsdp.py) of the stage's block i, in line."""
    return [Op("comm", e.label.replace("layers.0.", f"layers.{i}."),
               event=replace(e, label=e.label.replace("layers.0.", f"layers.{i}."))) for e in events]


def _prefetched(ops: list[Op], unit: ExpertUnit, backward: bool, overlap: bool) -> list[Op]:
    """One micro-batch's forward or backward with the expert units prefetched (moe_fsdp.Chain: the same issue and
    wait points): the first MoE block's gather issued as the list starts, each next one as a block's experts start,
    waited for as its own experts start; backward, each unit's reduce-scatter after its experts' backward
    (asynchronous with `overlap`, waited for at the list's end)."""
    suffix = ".experts.bwd" if backward else ".experts"
    blocks = [op.name[len("layers."):-len(suffix)] for op in ops
              if op.kind == "compute" and op.name.startswith("layers.") and op.name.endswith(suffix)]
    gathers = unit.bwd_gather if backward else unit.fwd

    def gather(j: int) -> list[Op]:
        tag = f"experts.{blocks[j]}.{'bwd' if backward else 'fwd'}"
        return [replace(op, asynchronous=True, tag=tag) for op in _unit_ops(gathers, int(blocks[j]))]

    out = gather(0) if gathers and blocks else []
    j = 0
    for op in ops:
        if j < len(blocks) and op.kind == "compute" and op.name == f"layers.{blocks[j]}{suffix}":
            if gathers:
                out.append(Op("wait", f"layers.{blocks[j]}.experts.unit_gather.wait",
                              tag=f"experts.{blocks[j]}.{'bwd' if backward else 'fwd'}"))
                out += gather(j + 1) if j + 1 < len(blocks) else []
            out.append(op)
            if backward:
                out += [replace(rs, asynchronous=overlap) for rs in _unit_ops(unit.bwd_scatter, int(blocks[j]))]
            j += 1
            continue
        out.append(op)
    if backward and overlap and blocks:
        out.append(Op("wait", "experts.unit_rs.wait"))
    return out


def _hidable(op: Op) -> bool:
    """A compute op that other work may overlap: not a host wait (the GPU idles; host_sync.py)."""
    return op.kind == "compute" and not op.name.endswith(HOST_WAIT)


def _adjust(ops: list[Op], prefix: str, delta: float) -> None:
    """Add `delta` seconds to the largest compute op named under `prefix` (kept >= 0)."""
    idx = [j for j, op in enumerate(ops) if _hidable(op) and op.name.startswith(prefix)]
    if delta and idx:
        j = max(idx, key=lambda j: ops[j].seconds)
        ops[j] = replace(ops[j], seconds=max(0.0, ops[j].seconds + delta))


def _insert_fwd(ops: list[Op], i: int, extra: list[Op]) -> None:
    prefix = f"layers.{i}."
    at = max((j for j, op in enumerate(ops) if op.name.startswith(prefix)), default=len(ops) - 1) + 1
    ops[at:at] = extra


def _insert_bwd(ops: list[Op], i: int, rec: list[Op], extra: list[Op]) -> None:
    prefix = f"layers.{i}."
    js = [j for j, op in enumerate(ops) if op.name.startswith(prefix)]
    if not js:
        return
    recs = [j for j in js if ".recompute" in ops[j].name]
    at = (max(recs) + 1) if recs else js[0]
    ops[at:at] = rec + extra


def with_blocks(prog: StageProgram, model: ModelSpec, d: Dims, layout: Layout, mb: int, g: GemmModel,
                links: dict, n_micro: int) -> StageProgram:
    stage = prog.stage
    af, ab, _ = attention_delta(model, d, layout, mb, g)
    rerun = delta_again(model, d, layout, mb, g, af)  # the correction's forward the backward re-runs
    # what the ring steps already carry of the core's correction (their blocks at the true core: event_context.py)
    ring_f, ring_b = ring_core_extra(d, layout.mode, layout_arrays(layout, mb), g)
    ring_b += ring_f if ring_again(d) else 0.0  # the recompute phase's ring steps (context_parallel.ring_again)
    rec = d.recompute == "full"
    rerun_moe = rec or MOE_REGION in moe_side(layout)  # rcm=moe re-runs the MoE layer (recompute_modules_cost.py)
    moe = model.moe
    block = block_cost(model, d, layout, mb, g) if moe is not None and moe_layers_of(model, layout, stage) else None
    unit = expert_unit(moe, d, layout) if moe is not None else ExpertUnit()  # zero=2/3 (moe_fsdp.py)
    imb = moe.load(d.moe_capacity) if moe is not None else 1.0
    chunks = stage_chunks(model.layers, layout.pp, layout.interleave, stage)
    mlp = iter(block_deltas(model, d, layout, mb, g, [i for ch in chunks for i in ch]))  # mlp_delta.py
    sc = stage_cost(model, d, layout, mb, g, stage, links, in_flight(layout, n_micro, stage))
    fi, bi = sc.issue_fwd, sc.issue_bwd  # the host's issue beyond the GPU's work (host_issue.py)
    mlp_again = again_blocks(moe, model.layers, layout, stage)  # rcm=: their MLP's collectives again (moe_mlp_again)
    again_mlp = again_events(d, layout, mb) if mlp_again else ()
    local = 0  # the program names a stage's blocks 0.. in chunk order (event_program.build_stage)
    for c, layers in enumerate(chunks):
        for block_index in layers:
            i, local = local, local + 1
            mf, mbw = next(mlp)
            is_moe = block is not None and moe is not None and moe.is_moe_layer(block_index)
            for lists in (prog.fwd, prog.fwd_first):
                _adjust(lists[c], f"layers.{i}.", af + mf - ring_f)
                if is_moe:
                    assert block is not None
                    experts = _ops(block.events_fwd, block.fwd + fi, f"layers.{i}.experts", imb, block.events_pre,
                                   block.wait + fi)
                    _insert_fwd(lists[c], i, [*([] if sc.chain else _unit_ops(unit.fwd, i)), *experts])
            for lists in (prog.bwd, prog.bwd_last):
                _adjust(lists[c], f"layers.{i}.", ab + rerun + mbw - ring_b)
                if is_moe:
                    assert block is not None
                    again = _ops(block.events_fwd, block.fwd, f"layers.{i}.experts.recompute", imb,
                                 block.events_pre, block.wait) if rerun_moe else []
                    _insert_bwd(lists[c], i, again, [
                        *([] if sc.chain else _unit_ops(unit.bwd_gather, i)),
                        *_ops(block.events_bwd, block.bwd + bi, f"layers.{i}.experts.bwd", imb, wait=bi, backward=True),
                        *([] if sc.chain else _unit_ops(unit.bwd_scatter, i))])
                if i in mlp_again:
                    _insert_bwd(lists[c], i, [Op("comm", e.label, event=e) for e in relabel(again_mlp, i)], [])
    if sc.chain is not None:  # zero=2/3 prefetched (pp = 1): the expert units' gathers ahead, reduce-scatters async
        for lists in (prog.fwd, prog.fwd_first):
            lists[:] = [_prefetched(ops, unit, False, layout.overlap) for ops in lists]
        for lists in (prog.bwd, prog.bwd_last):
            lists[:] = [_prefetched(ops, unit, True, layout.overlap) for ops in lists]
    drop_ops(prog, unshared_blocks(model, layout, stage), layout)  # no shared expert: no MLP collectives
    ge = grad_event(model, layout, stage, d)
    if ge is not None and layout.overlap:
        for c, part in enumerate(_per_chunk(ge, [sum(map(moe.is_moe_layer, ch)) if moe else 0 for ch in chunks])):
            if part is not None:
                prog.bwd_last[c].insert(0, Op("comm", "expert_gradients", event=part, asynchronous=True))
        prog.tail.insert(0, Op("wait", "expert_gradients.wait"))
    elif ge is not None:
        prog.tail.insert(0, Op("comm", "expert_gradients", event=ge))
    held = [i for i, b in enumerate(b for ch in chunks for b in ch) if block is not None and moe is not None
            and moe.is_moe_layer(b)]  # the stage's MoE blocks, by the program's block index
    # zero >= 2 with pipelines: each expert unit's reduce-scatter once a step, in line (moe_fsdp.py)
    prog.tail[0:0] = [op for i in held for op in _unit_ops(unit.step, i)]
    at = next((j for j, op in enumerate(prog.tail) if op.name.startswith("grad_norm") or op.name == "optimizer"),
              len(prog.tail))
    for j, ne in enumerate(norm_events(layout, moe_layers_of(model, layout, stage))):
        prog.tail.insert(at + j, Op("comm", ne.label, event=ne))  # after the gradients, before the step's grad norm
    if layout.a2ao and sc.a2a_fwd + sc.a2a_bwd > 0:
        _overlap(prog, sc, list_share(layout.pp, layout.interleave, n_micro, stage))
    optim = sc.optim
    for j, op in enumerate(prog.tail):
        if op.kind == "compute" and op.name == "optimizer":
            prog.tail[j] = replace(op, seconds=op.seconds + optim)
            prog.tail[j + 1:j + 1] = [op for i in held for op in _unit_ops(unit.after, i)]  # zero=2's gather
            break
    prog.compute_fwd = sum(op.seconds for ch in prog.fwd for op in ch if op.kind == "compute")
    prog.compute_bwd = sum(op.seconds for ch in prog.bwd for op in ch if op.kind == "compute")
    return prog


def _overlap(prog: StageProgram, sc: StageCost, psi: float) -> None:
    """`a2ao` in the `fwd` / `bwd` lists (module docstring): the all_to_alls stay as they run (their links shared as
    without it); what a combined step hides of one pass's is taken off its partner's compute (at most that compute:
    x = max(0, (1 - s) A - C)), every compute op of the partner's list scaled alike."""
    compute = {id(lists): sum(op.seconds for ch in lists for op in ch if _hidable(op))
               for lists in (prog.fwd, prog.bwd)}
    cmb = combined(compute[id(prog.fwd)] + compute[id(prog.bwd)], sc.a2a_fwd, sc.a2a_bwd)
    s = SM_SHARE
    for lists, hidden in ((prog.fwd, (1.0 - s) * cmb.a_bwd - cmb.x_bwd), (prog.bwd, (1.0 - s) * cmb.a_fwd - cmb.x_fwd)):
        hidden *= sc.a2ao_eff  # the share a run hides (moe_a2a_overlap.py)
        total = compute[id(lists)]
        if total <= 0 or hidden <= 0:
            continue
        scale = max(0.0, 1.0 - psi * hidden / total)
        for ch in lists:
            for j, op in enumerate(ch):
                if _hidable(op):  # the cut booked as compute, not all_to_all time (StageStats.hide)
                    ch[j] = replace(op, seconds=op.seconds * scale, hides=op.hides + op.seconds * (1.0 - scale))


__all__ = ["with_blocks"]
