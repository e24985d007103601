"""The analytic engine's step with MoE blocks (and the attention correction) added: cost_models/moe.py's per-stage terms
on top of the dense part's Scores. With N micro-batches, a stage's work becomes W_s + N (compute_s + comm_s) (the
MoE collectives, the counts of moe_counts.py included, are in line with compute: Megatron-core's dispatcher waits on
them), the step W + the bubble (pipeline_bubble.py) + the dense per-step part + the expert gradient reduction
(exposed; with the layout's `overlap` only what one micro-batch's backward, b = 2/3 of its work (3/4 under full
recomputation), leaves after the dense buckets G_d, less their own exposed tail T_d: max(0, G - (b W / N - G_d) - T_d);
where the expert group spans nodes the gradients also slow the last backward's all_to_alls on the NICs they share,
moe_contention.py; each stage's own from its own last backward: the stages before the slowest run theirs in the
drain, and the step pays the latest of them, the drain included) + the experts' norm all_reduce
(moe_counts.norm_event, exposed) + its expert optimizer step + zero=2/3's expert-unit collectives once a step
(a pipelined stage's reduce-scatters, zero=2's gathers after the step: exposed, moe_fsdp.py; their per-micro-batch
ones are in the stage's MoE communication). With the layout's `a2ao`, each stage's work less the
all_to_alls its combined 1F1B steps hide (moe_a2a_overlap.py; its compute without the host waits of host_sync.py and
host_issue.py, which the combined step's C / 3 : 2 C / 3 split does not describe). Memory: of the first, the middle and
the last stage (as analytic.py counts them), each its dense parts plus its own expert parts, the heaviest (_heaviest).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from paracube.cost_models.compute import GemmModel, stage_compute_time
from paracube.cost_models.dims import Dims
from paracube.cost_models.grad_overlap_batch import exposed_grad_time
from paracube.cost_models.links import LinkCache, placement_of
from paracube.cost_models.memory import in_flight as memory_in_flight
from paracube.cost_models.memory import logit_bytes
from paracube.cost_models.moe import moe_layers_of, priced, stage_cost
from paracube.cost_models.moe_a2a import a2a_terms
from paracube.cost_models.moe_a2a_overlap import combined, overlapped_fraction
from paracube.cost_models.moe_contention import exposed_grads, rates, slowdown
from paracube.cost_models.moe_dispatch import dispatch_of
from paracube.cost_models.moe_fsdp import Chain
from paracube.cost_models.moe_links import expert_links, expert_placement
from paracube.cost_models.moe_unshared import drop_stage_events, unshared_blocks
from paracube.cost_models.pipeline_bubble import bubble_seconds
from paracube.cost_models.shared_cores import bubble_share
from paracube.cost_models.stragglers import straggler_wait, without_wait
from paracube.cost_models.validity import layout_arrays
from paracube.estimate import MemoryBreakdown, StepEstimate
from paracube.layout import Layout
from paracube.workload import ModelSpec

STAGE_NAMES = ("first", "middle", "last")


def stage_index(name: str, pp: int, model: ModelSpec | None = None, layout: Layout | None = None) -> int:
    """The stage a name stands for; "middle" with the model and layout: the middle stage holding the most MoE blocks
    (dense first blocks, as DeepSeek-V3's, can sit on stage 1 of an interleaved split), else stage 1."""
    if name == "middle" and pp > 2 and model is not None and layout is not None:
        return max(range(1, pp - 1), key=lambda s: (moe_layers_of(model, layout, s), -s))
    return {"first": 0, "middle": 1 if pp > 2 else 0, "last": pp - 1}[name]


def in_flight(layout: Layout, n_micro: int, stage: int) -> float:
    """Micro-batches whose activations stage `stage` holds at once: memory.in_flight of one layout (1F1B pp - stage;
    interleaved its 2 (pp - stage - 1) + (v - 1) pp warm-up chunk forwards plus one, v chunks a micro-batch)."""
    return float(memory_in_flight(layout_arrays(layout, 1), np.array([float(n_micro)]), stage == 0, stage)[0])


def interleaved_windows(span: float, pp: int, v: int) -> tuple[float, float]:
    """(the seconds from the first chunk's reduction to the stage's end, the last chunk's own) for expert gradients
    reduced per model chunk from the start of its last backward, `span` one micro-batch's backward of the stage.
    Megatron's interleaved cool-down runs the last pp micro-batches' backwards chunk by chunk (v - 1 .. 0), pp of a
    chunk in a row: from chunk c's last one pp c + 1 chunk backwards (span / v each) remain, so the first chunk's
    (v - 1) leaves pp (v - 1) + 1 of them and chunk 0's its own one. Chunks of G_e / v bytes' time arriving so on one
    link leave max(G_e - whole, G_e / v - last) exposed (the queue's drain is linear in c: its extremes); v = 1: the
    one micro-batch's backward for both (the reduction issued as the last backward starts). Stalls in the cool-down
    lengthen the windows: not counted (a bound)."""
    chunk = span / v
    return (pp * (v - 1) + 1) * chunk, chunk


def with_moe(est: StepEstimate, scores: Any, model: ModelSpec, d: Dims, layout: Layout, g: GemmModel,
             cache: LinkCache, row: int = 0) -> StepEstimate:
    """`est` (the dense part's, row `row` of `scores`: analytic.Scores, whose rows estimate_batch.py evaluates
    together) with the MoE and attention terms added."""
    if not priced(model):
        return est
    mb = layout.micro_batch or 1
    n = d.global_batch / (layout.dp * mb)
    dispatch = dispatch_of(model.moe, d.moe_dispatch)
    links = expert_links(layout, cache, dispatch)
    index = {s: stage_index(s, layout.pp, model, layout) for s in STAGE_NAMES}
    rings = _ring_rates(layout, cache, links, dispatch) if layout.pp == 1 and layout.zero >= 2 else {}
    by_index: dict[int, Any] = {}  # pp <= 2: the middle stage is the first (and with pp = 1 the last): priced once
    for i in index.values():
        if i not in by_index:
            by_index[i] = stage_cost(model, d, layout, mb, g, i, links, in_flight(layout, int(n), i),
                                     events=bool(est.events))
    costs = {s: by_index[index[s]] for s in STAGE_NAMES}
    old_slow = int(scores.stage[row])
    old_w = float(scores.stages[old_slow].compute[row] + scores.stages[old_slow].micro[row])
    old_bubble = float(scores.bubble[row])
    # the dense step's per-step communication (its exposed gradient reduction, ...); the stages' optimizer steps
    # differ (the embedding, the head): the slowest stage's own is added below, as its compute is
    rest = (float(without_wait(est.step_time_s, layout.dp, g.straggler)) - old_w - old_bubble
            - float(scores.stages[old_slow].optim[row]))  # wait: below
    work = {s: float(st.compute[row] + st.micro[row]) + n * (costs[s].compute + costs[s].comm)
            - _a2a_saved(layout, float(st.compute[row]) / n + costs[s].compute - costs[s].waits, costs[s], n, index[s])
            + n * _unit_stalls(costs[s].chain, float(st.compute[row] + st.micro[row]) / n, model, d, layout, g,
                               {k: float(v[1][row]) / n for k, v in st.fsdp.items()}, rings)
            for s, st in zip(STAGE_NAMES, scores.stages, strict=True)}
    slow = max(STAGE_NAMES, key=lambda s: work[s])
    c = costs[slow]
    dense_slow = scores.stages[STAGE_NAMES.index(slow)]  # its dense part (not the dense-only slowest stage's)
    dense_optim = float(dense_slow.optim[row])
    w = work[slow]
    stacked = np.array([[work[s]] for s in STAGE_NAMES])  # the bubble: every other stage's micro-batch
    bubble = float(bubble_seconds(stacked, np.array([layout.pp]), layout.interleave, n,
                                  bubble_share(layout.pp, g.ranks_per_core),
                                  None if scores.middle_less is None else scores.middle_less[row:row + 1], d.L,
                                  d.backward_share)[0])
    # Interleaved (v > 1), each model chunk's share G_e / v from the start of its own last backward (the event engine's
    # moe_program._per_chunk): `interleaved_windows`.
    # Overlapped: the dense buckets (their whole time G_d) and the expert gradients share the last backward's
    # window (one queue on the same NICs), which drains max(0, G_d + G_e - B) after it, B the stage's backward of one
    # micro-batch: b (W / N - H - A), b its backward's share (2/3, 3/4 under full recomputation), H the forward's host
    # waits (host_sync.py: a dropless block waits in its forward only; 0 under full recomputation, whose recomputed
    # forward waits again; until 2026-12-05 counted in B: gpt-oss-20b, 2 micro-batches on 32 B200s, the event engine
    # 4.4% above), A the micro-batch's MoE collectives where the expert group spans nodes (else 0); the dense part's
    # step already pays the dense buckets' own tail T_d (grad_overlap.py), so the experts add
    # max(0, G_e - (B - G_d) - T_d) (before 2026-12-03 without - T_d: the tail counted twice). Where the expert group
    # spans nodes the gradients also slow that backward's all_to_alls on its NICs (moe_contention.py).
    share = d.backward_share  # the backward's part of a micro-batch
    tail_d = dense_tail(scores, layout, n, share, row) if layout.overlap else 0.0
    dpn = int(getattr(cache.topo, "devices_per_node", 0) or layout.world_size)

    def exposed(s: str) -> float:
        """Stage s's expert gradients left exposed after its own last backward (the comment above)."""
        cs, ws = costs[s], work[s]
        # An expert group wider than a node: its all_to_alls hold the NICs the expert gradients (over edp, outside
        # it) need, so only the rest of the backward hides them (the event engine's links are shared max-min fairly).
        busy = layout.ep * layout.etp > dpn
        if not layout.overlap:
            return cs.step_comm
        # its backward: without the forward's host waits (a recomputed forward waits again), without its collectives
        # where they hold the NICs
        waits = 0.0 if d.recompute == "full" else cs.waits
        span = max(0.0, share * (ws / n - waits - (cs.comm if busy else 0.0)))
        if busy and cs.step_comm > 0:  # its gradients over edp share the NICs (moe_contention.py)
            nic, other = a2a_terms(cache, expert_placement(layout), ("ep",), dispatch)
            return exposed_grads(cs.step_comm, span, cs.comm_bwd, slowdown(nic, other, links[("edp",)][0]))
        dense_grad = float(scores.stages[STAGE_NAMES.index(s)].grad[row])
        whole, last = interleaved_windows(span, layout.pp, layout.interleave)
        v = layout.interleave
        return max(0.0, cs.step_comm - (whole - dense_grad + tail_d),
                   cs.step_comm / v - (last - dense_grad / v + tail_d))

    # Each stage's gradients start after its own last backward: the stages before the slow one run theirs later, in
    # the drain (the backward share of their part of the bubble), the later ones earlier (taken at the slow one's:
    # an upper bound); the step ends with the last stage to finish, the drain itself included (the first stage).
    after = {s: share * bubble * max(0, index[slow] - index[s]) / max(1, layout.pp - 1) for s in STAGE_NAMES}
    grad = max(after[s] + exposed(s) for s in STAGE_NAMES) - after["first"]
    step = w + bubble + rest + dense_optim + grad + c.norm_comm + c.optim + sum(c.after.values())
    step += float(straggler_wait(step, layout.dp, g.straggler))  # the slowest replica, on the whole step
    loss = (d.c + logit_bytes(d)) * mb * d.s * d.V / layout.tensor_size  # the head's logits and loss (memory.py)
    mem = _heaviest(est.memory, getattr(scores, "memory_stages", ()), costs, loss, layout.pp, row)
    per_step = ("grad_sync", "optimizer")  # the expert gradients and their norm (moe_counts.norm_event)
    micro_events = [e for e in c.events if e.phase not in per_step]
    dense = drop_stage_events(est.events, unshared_blocks(model, layout, index[STAGE_NAMES[old_slow]]), layout)
    events = dense + tuple(e for _ in range(int(n)) for e in micro_events) + tuple(
        e for e in c.events if e.phase in per_step) if est.events else ()
    flops = est.flops_per_gpu + expert_flops(model, d) / layout.world_size
    by_kind, by_axis = dict(est.comm_time_by_kind), dict(est.comm_time_by_axis)
    # rcm='s MLP collectives issued again (moe_mlp_again.py), the expert units' (moe_fsdp.py) and, negative, the dense
    # MLP collectives blocks without a shared expert drop (moe_unshared.py) under their own kind and axes, as the
    # expert gradients' reduction and norm; the rest of the MoE collectives as all_to_all over ep
    own = dict(c.again)
    for key, seconds in (*c.units.items(), *c.dropped.items()):
        own[key] = own.get(key, 0.0) + seconds
    again = sum(own.values())
    # prefetched units: not in comm; the dropped rings' hidden seconds: in comm, not in their serialized own
    moe_comm = n * (c.comm - again - c.dropped_hidden + (sum(c.units.values()) if c.chain is not None else 0.0))
    step_kinds = {("all_reduce", ("edp",)): c.step_comm, ("all_reduce", ("ep",)): c.norm_comm}
    for key, seconds in c.after.items():
        step_kinds[key] = step_kinds.get(key, 0.0) + seconds
    for (kind, axes), seconds in [(("all_to_all", ("ep",)), moe_comm), *((key, n * t) for key, t in own.items()),
                                  *step_kinds.items()]:
        if seconds:
            by_kind[kind] = by_kind.get(kind, 0.0) + seconds
            by_axis[".".join(axes)] = by_axis.get(".".join(axes), 0.0) + seconds
    # the compute the step counts: the slowest stage's (w's), dense and MoE, and its optimizer steps
    compute = float(dense_slow.compute[row]) + dense_optim + n * c.compute + c.optim
    return replace(est, step_time_s=step, compute_time_s=compute,
                   comm_time_s=est.comm_time_s + moe_comm + n * (again + c.dropped_hidden) + sum(step_kinds.values()),
                   exposed_comm_time_s=step - compute - bubble, bubble_time_s=bubble, memory=mem,
                   comm_bytes_per_gpu=est.comm_bytes_per_gpu + n * c.sent + sum(
                       e.sent_bytes() for e in c.events if e.phase in per_step),
                   flops_per_gpu=flops, mfu=flops / (step * g.peak), comm_time_by_axis=by_axis,
                   comm_time_by_kind=by_kind, events=events,
                   notes=(*_stage_notes(est.notes, STAGE_NAMES[old_slow], slow),
                          _note(model, layout, c.chain is not None)))


def _ring_rates(layout: Layout, cache: LinkCache, links: dict, dispatch: Any) -> dict[str, tuple[float, float]]:
    """moe_contention.rates of the expert all_to_all beside the expert units' ring (edp, "unit") and the dense units'
    (the layout's zero axes, "dense")."""
    nic, other = a2a_terms(cache, expert_placement(layout), ("ep",), dispatch)
    dense_place, zero_axes = placement_of(layout), tuple(layout.zero_axes)
    return {"unit": rates(nic, other, links[("edp",)][0], cache.nvlink_share(expert_placement(layout), ("edp",)) >= 1),
            "dense": rates(nic, other, cache.get(dense_place, zero_axes)[0],
                           cache.nvlink_share(dense_place, zero_axes) >= 1)}


def _unit_stalls(chain: Chain | None, dense: float, model: ModelSpec, d: Dims, layout: Layout, g: GemmModel,
                 fsdp: dict[str, float], rings: dict[str, tuple[float, float]]) -> float:
    """Seconds a micro-batch of a stage (pp = 1) waits on its prefetched expert units (moe_fsdp.Chain). The dense
    part's work per micro-batch (`dense`: its compute and in-line communication) less the head's (compute.py's head
    and cross entropy, the backward's first work) spread evenly over the blocks, split forward : backward as
    analytic.py splits a micro-batch (1 : 2; 1 : 3 under full recomputation). The dense units' gathers and
    reduce-scatters (`fsdp`: their bandwidth seconds per micro-batch) run beside the experts' in the same windows, one
    block ahead on their own stream, and share their links (the event engine's max-min): each expert gather is taken
    to move its block's dense one's bytes too; with `overlap` each block's dense reduce-scatter is queued as its
    backward ends, and the backward's all_to_alls share the links of what is queued (`rings`: _ring_rates)."""
    if chain is None or model.moe is None:
        return 0.0
    n = d.global_batch / (layout.dp * (layout.micro_batch or 1))
    b1 = layout_arrays(layout, layout.micro_batch or 1)
    one = np.ones(1)
    head = float((stage_compute_time(d, layout.mode, b1, one, g, one)
                  - stage_compute_time(d, layout.mode, b1, 0 * one, g, one))[0]) / n
    share = 0.25 if d.recompute == "full" else 1.0 / 3.0
    f, b = (share * (dense - head) / model.layers, (1.0 - share) * (dense - head) / model.layers)
    first = next(i for i in range(model.layers) if model.moe.is_moe_layer(i)) + 1  # blocks up to the first MoE one
    gather, scatter = (fsdp.get(kind, 0.0) / model.layers for kind in ("all_gather", "reduce_scatter"))
    return replace(chain, pre_fwd=chain.pre_fwd + first * f, block_fwd=chain.block_fwd + f,
                   pre_bwd=chain.pre_bwd + (1.0 - share) * head, block_bwd=chain.block_bwd + b,
                   end_bwd=chain.end_bwd + first * b,
                   a=chain.a + gather / 2 if chain.a else 0.0,  # a block's dense gathers: forward, backward
                   r_dense=scatter if chain.overlap else 0.0,  # else in line, in the dense part's work
                   unit_rates=rings.get("unit", (1.0, 1.0)), dense_rates=rings.get("dense", (1.0, 1.0))).stalls()


def dense_tail(scores: Any, layout: Layout, n: float, share: float, row: int = 0) -> float:
    """T_d: the dense buckets' exposed time the dense part's step pays (analytic_scores.evaluate's, without its
    contention and drag terms, row `row` of `scores`), the largest over the stages, each's backward its dense part's
    b W_s / N."""
    r = slice(row, row + 1)
    index = {"first": 0, "middle": 1 if layout.pp > 2 else 0, "last": layout.pp - 1}
    out = 0.0
    for name, st in zip(STAGE_NAMES, scores.stages, strict=True):
        if st.releases:
            at = np.array([index[name]])
            out = max(out, float(exposed_grad_time(st.grad[r], share * (st.compute[r] + st.micro[r]) / n, at,
                                                   np.array([layout.pp]), np.array([layout.interleave]),
                                                   st.releases[0], st.releases[2][r])[0]))
    return out


def _a2a_saved(layout: Layout, compute: float, c: Any, n: float, stage: int) -> float:
    """Seconds `a2ao` takes off a stage's work: its combined steps' saving (moe_a2a_overlap.py) x their count x the
    share a run hides (StageCost.a2ao_eff)."""
    if not layout.a2ao or c.a2a_fwd + c.a2a_bwd <= 0:
        return 0.0
    share = overlapped_fraction(layout.pp, layout.interleave, int(n), stage)
    return share * n * c.a2ao_eff * combined(compute, c.a2a_fwd, c.a2a_bwd).saved


def expert_flops(model: ModelSpec, d: Dims) -> float:
    """Model FLOPs of the routed experts and routers in one step (fwd + bwd: 3 x 2 per multiply-add)."""
    moe = model.moe
    if moe is None:
        return 0.0
    per_token = moe.top_k * 3 * d.h * moe.expert_ffn + d.h * moe.experts
    return 6.0 * d.global_batch * d.s * d.cp * moe.moe_layers(model.layers) * per_token  # whole sequences (d.cp)


def _heaviest(dense: MemoryBreakdown, stages: tuple, costs: dict, loss: float, pp: int,
              row: int = 0) -> MemoryBreakdown:
    """The heaviest of the first, the middle and the last stage, each its dense part's memory (Scores.memory_stages,
    row `row`; the dense middle is stage 1, memory.stage_memory, which holds at least the micro-batches in flight of the
    MoE middle stage, stage_index: an upper bound where that is a later one) plus its own expert parts (a model's
    dense first blocks can leave a middle stage the most experts: DeepSeek-V3 at pp = 16 holds 3 dense blocks on its
    first stage and 4 MoE blocks on each middle one); without the dense stages, the dense part's heaviest stage plus
    the heavier expert parts of the first and the last.
    A MoE block's dispatch buffers are alive inside the block only, never with the head's logits and loss (`loss`
    bytes, at the end of the last stage's forward and the start of its backward): on the stage holding the head
    they count beyond those, elsewhere in full (with the largest linear's operands: an upper bound)."""
    def parts(base: dict[str, float], s: str) -> dict[str, float]:
        out = {k: base[k] + v for k, v in costs[s].memory.items()}
        head = s == "last" or pp == 1
        out["temporaries"] += max(0.0, costs[s].buffers - loss) if head else costs[s].buffers
        return out

    if len(stages) == len(STAGE_NAMES):
        every = [parts({k: float(np.asarray(part[k]).ravel()[row]) for k in part}, s)
                 for s, part in zip(STAGE_NAMES, stages, strict=True)]
        return MemoryBreakdown(**max(every, key=lambda m: sum(m.values())))
    base = {k: getattr(dense, k) for k in costs["first"].memory}
    return MemoryBreakdown(**max((parts(base, s) for s in ("first", "last")), key=lambda m: sum(m.values())))


def _stage_notes(notes: tuple[str, ...], dense: str, slow: str) -> tuple[str, ...]:
    """analytic.py's pipeline note naming the stage whose time (and breakdown) the step is: with the experts, `slow`;
    the dense events and communication stay those of the slowest stage without them (`dense`) where it differs."""
    if slow == dense:
        return notes
    return tuple(f"pipeline: time of the slowest stage ({slow}); dense events and communication of the slowest "
                 f"without the experts ({dense}); memory of the most loaded" if n.startswith("pipeline:") else n
                 for n in notes)


def _note(model: ModelSpec, layout: Layout, prefetched: bool = False) -> str:
    moe = model.moe
    if moe is None:
        return "attention priced with its true head widths (cost_models/moe.py)"
    note = (f"experts: {moe.experts} x top-{moe.top_k}, ep={layout.ep}, etp={layout.etp}, edp={layout.expert_data}, "
            f"imbalance {moe.imbalance:g}"
            + (f", capacity factor {moe.capacity_factor:g}" if moe.capacity_factor else ", dropless")
            + " (cost_models/moe.py)")
    if layout.zero >= 2 and layout.expert_data > 1:  # moe_fsdp.py
        how = "prefetched a block ahead on a stream of their own" if prefetched else "in line"
        note += (f"; zero={layout.zero}: each block's experts are an FSDP unit of their own over edp, its "
                 + ("gathers and " if layout.zero == 3 else "") + f"reduce-scatters {how} (cost_models/moe_fsdp.py)")
    return note


__all__ = ["in_flight", "stage_index", "with_moe"]
