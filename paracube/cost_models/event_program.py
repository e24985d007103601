"""The program one representative device of a pipeline stage runs: compute ops and collectives, in order.

Communication comes from traffic.py (the contract of docs/algorithms.md) for ONE micro-batch,
regrouped into execution order: forward of layers 0..L-1, then backward of layers L-1..0 with each
layer's recompute (full recomputation) just before its backward. Compute times: event_compute.py (per linear
the three GEMMs at their local shapes, the rest of a block from compute.stage_compute_time); ops: event_ops.py.
Inside a unit (a linear, a norm, or in 1D a whole attention / MLP half) the order is the executor's:
forward: input gathers -> GEMM -> output reduce-scatter / all-reduce; backward: dY gather -> dX GEMM ->
dX reduce-scatter -> dA GEMM -> dA (and bias) reduce-scatter. With `overlap=True` the dA GEMM runs before
the dX GEMM and the dA / dbias reduce-scatters are asynchronous (hidden under the dX GEMM); with
`grad_overlap` (the layout's `overlap`) the data-parallel gradient buckets are issued asynchronously during
the last backward, each once the layers that produce it are done.
With the layout's `tpo`, each collective its mode declares overlappable (Collective.tpo) carries the seconds of
its GEMM's chunks beside each of its exchanges (`Op.gemm_steps`, the executor's ring schedule: cost_models/tpo.py),
taken out of the unit's compute op: the engine runs each exchange alongside its chunk.
Kept weights (kw=1): a `kept` collective runs once per step (traffic.py), its gather in the first
micro-batch's forward (`fwd_first`), its gradient's reduce-scatter in the last micro-batch's backward
(`bwd_last`); the other micro-batches' `fwd` / `bwd` skip them (`micro_batch_events` of micro-batch 0 and 1
of 2 hold exactly these two cases).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paracube.cost_models.compute import GemmModel, fp8_step_time, optimizer_time
from paracube.cost_models.context_dims import context_local
from paracube.cost_models.dims import Dims, local_params
from paracube.cost_models.event_compute import add_op_overhead, unit_compute
from paracube.cost_models.event_context import ring_ops
from paracube.cost_models.event_ops import Op, StageProgram
from paracube.cost_models.fsdp_program import prefetch_program
from paracube.cost_models.local_parameters import parameter_units
from paracube.cost_models.tpo import program_gemm_steps
from paracube.cost_models.traffic import act_split, micro_batch_events, stage_events, zero_group
from paracube.cost_models.validity import layout_arrays
from paracube.cost_models.window_stages import block_shares, block_units
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes import context
from paracube.modes.base import Collective
from paracube.modes.buckets import BUCKET_BYTES, release_counts
from paracube.modes.stages import schedule, stage_chunks, stage_layers

PER_STEP = ("grad_sync", "optimizer", "metrics")
BEFORE_FWD = ("X", "A", "bias", "in", "stats", "param")  # the rest (Y, g, out) come after the GEMM
# dkv: the attention's key / value gradients (a split sequence); bcastA / bcastX: SUMMA's backward broadcasts
BEFORE_BWD = ("dY", "out", "stats", "dkv", "bcastA", "bcastX")
AFTER_DX = ("dX", "f", "in")  # then dA GEMM, then dA / dbias / param


def _unit_of(label: str) -> tuple[int, str, str]:
    """(layer or -1, unit, suffix) of a traffic label."""
    parts = label.split(".")
    if parts[0] == "layers":
        return int(parts[1]), parts[2], parts[3] if len(parts) > 3 else ""
    return -1, parts[0], parts[1] if len(parts) > 1 else ""


def _units_fwd(units: tuple[str, ...], events: dict[str, list[CommEvent]], comp: dict, prefix: str,
               phase: str) -> list[Op]:
    ops: list[Op] = []
    for u in units:
        evs = events.get(u, [])
        ops += [Op("comm", e.label, event=e) for e in evs if _unit_of(e.label)[2] in BEFORE_FWD]
        f = comp.get(u, (0.0, 0.0, 0.0))[0]
        if f > 0:
            ops.append(Op("compute", f"{prefix}{u}.{phase}", f))
        ops += [Op("comm", e.label, event=e) for e in evs if _unit_of(e.label)[2] not in BEFORE_FWD]
    return ops


def _units_bwd(units: tuple[str, ...], events: dict[str, list[CommEvent]], comp: dict, prefix: str,
               overlap: bool) -> list[Op]:
    ops: list[Op] = []
    for u in reversed(units):
        evs = events.get(u, [])
        suffix = [(_unit_of(e.label)[2], e) for e in evs]
        _, dx, da = comp.get(u, (0.0, 0.0, 0.0))
        ops += [Op("comm", e.label, event=e) for s, e in suffix if s in BEFORE_BWD]
        late = [Op("comm", e.label, event=e, asynchronous=overlap) for s, e in suffix
                if s not in BEFORE_BWD and s not in AFTER_DX]
        dx_ops = [Op("compute", f"{prefix}{u}.dX", dx)] if dx > 0 else []
        dx_ops += [Op("comm", e.label, event=e) for s, e in suffix if s in AFTER_DX]
        da_ops = [Op("compute", f"{prefix}{u}.dA", da)] if da > 0 else []
        # overlap: dA first, its reduce-scatter runs while dX is computed (Bian et al. 2021, section 3)
        ops += da_ops + late + dx_ops if overlap else dx_ops + da_ops + late
    return ops


def _group(events: list[CommEvent]) -> tuple[dict[tuple[int, str], dict[str, list[CommEvent]]], list[Op]]:
    """Per (layer or -1, phase) and unit: the events of one micro-batch; and the per-step tail."""
    by_layer: dict[tuple[int, str], dict[str, list[CommEvent]]] = {}
    tail: list[Op] = []
    for e in events:
        if e.phase in PER_STEP:
            tail.append(Op("comm", e.label, event=e))
            continue
        layer, unit, _ = _unit_of(e.label)
        ph = "bwd" if e.phase == "bwd" else ("recompute" if e.phase == "recompute" else "fwd")
        if layer < 0:
            unit = {"tok_emb": "emb", "pos_emb": "emb", "embedding": "emb"}.get(unit, unit)
        by_layer.setdefault((layer, ph), {}).setdefault(unit, []).append(e)
    return by_layer, tail


GEMM_OP = {"f": "fwd", "dx": "dX", "da": "dA"}  # tpo GEMM -> the suffix of the unit's compute op holding it


def _apply_tpo(ops: list[Op], layout: Layout, d: Dims, comp: dict) -> list[Op]:
    """tpo: each overlappable collective of `ops` carries the seconds of its GEMM's chunks beside each of its
    exchanges (tpo.program_gemm_steps, per layer, phase and GEMM), moved out of its unit's compute op (of the same
    layer and phase; under full recomputation or rcm= the recompute op: event_compute.unit_compute)."""
    m = layout.tensor_mode
    decl = {(c.label, c.kind): c for c in (*m.layer_fwd(d), *m.layer_bwd(d)) if c.tpo}
    unit_of = {lin: unit for unit, lins in m.merged_units for lin in lins}
    out = list(ops)
    where = {op.name: i for i, op in enumerate(out) if op.kind == "compute"}
    calls: dict[tuple[int, str, str], list[tuple[int, Collective]]] = {}
    for i, op in enumerate(out):
        if op.kind != "comm" or op.event is None:
            continue
        layer, _, _ = _unit_of(op.event.label)
        local = op.event.label.split(".", 2)[2] if layer >= 0 else op.event.label
        c = decl.get((local, op.event.kind))
        if c is not None:
            calls.setdefault((layer, op.event.phase, c.tpo), []).append((i, c))
    for (layer, phase, tag), members in calls.items():
        lin, gemm = tag.split(".")
        prefix = f"layers.{layer}."
        target = prefix + ("recompute" if phase == "recompute" else f"{unit_of.get(lin, lin)}.{GEMM_OP[gemm]}")
        j = where.get(target)
        seconds = comp[lin][("f", "dx", "da").index(gemm)]
        if j is None or seconds <= 0:
            continue
        events = [out[i].event for i, _ in members]
        steps = program_gemm_steps([(c, e.group_size, e.payload_bytes / max(e.group_size, 1), seconds)
                                    for (_, c), e in zip(members, events, strict=True) if e is not None])
        for (i, _), alongside in zip(members, steps, strict=True):
            alongside = alongside if sum(alongside) <= out[j].seconds else ()  # never more than the op holds
            out[j] = replace(out[j], seconds=out[j].seconds - sum(alongside))
            out[i] = replace(out[i], gemm=sum(alongside), gemm_steps=alongside)
    return out


def _release_buckets(grads: list[Op], n: int, layer: int, ops: list[Op]) -> None:
    """Issue (asynchronously, into `ops`) the next `n` gradient buckets (all with n < 0), labelled by `layer`."""
    for op in grads[:len(grads) if n < 0 else n]:
        ev = replace(op.event, label=f"gradients.layers.{layer}")  # type: ignore[union-attr]
        ops.append(Op("comm", ev.label, event=ev, asynchronous=True))
    del grads[:len(grads) if n < 0 else n]


Grouped = dict[tuple[int, str], dict[str, list[CommEvent]]]
HEAD_UNITS = ("ln_f", "head", "loss")


def _chunk_fwd(by: Grouped, units: tuple[str, ...], comp: dict, own: list[dict], lo: int, hi: int, emb: bool,
               head: bool) -> list[Op]:
    """One micro-batch's forward through blocks lo..hi-1 (`own`: each block's units; the embedding before, the head
    after, from `comp`)."""
    ops = _units_fwd(("emb",), by.get((-1, "fwd"), {}), {}, "", "fwd") if emb else []
    for i in range(lo, hi):
        ops += _units_fwd(units, by.get((i, "fwd"), {}), own[i], f"layers.{i}.", "fwd")
    if head:
        ops += _units_fwd(HEAD_UNITS, by.get((-1, "fwd"), {}), comp, "", "fwd")
    return ops


def _layer_bwd(by: Grouped, units: tuple[str, ...], comp: dict, i: int, rec: float, overlap: bool) -> list[Op]:
    """Block i's backward, after its recomputation (full recomputation)."""
    ops: list[Op] = []
    if rec > 0 or (i, "recompute") in by:  # (rcm=mlp: its MLP's collectives again)
        ops += _units_fwd(units, by.get((i, "recompute"), {}), {}, f"layers.{i}.", "recompute")
    if rec > 0:
        ops.append(Op("compute", f"layers.{i}.recompute", rec))
    return ops + _units_bwd(units, by.get((i, "bwd"), {}), comp, f"layers.{i}.", overlap)


def build_stage(layout: Layout, d: Dims, mb: int, stage: int, g: GemmModel, overlap: bool = False,
                grad_overlap: bool | None = None, param_overlap: bool = False,
                fsdp_prefetch: bool = False, bucket_bytes: int = BUCKET_BYTES) -> StageProgram:
    """`overlap`: tp weight-gradient reduce-scatters hidden under dX; `grad_overlap` (default: `overlap`):
    data-parallel gradient buckets issued during the last backward; `param_overlap` (zero=1): the parameter
    all_gathers (the previous step's, in the steady state) issued asynchronously at the step's start, on every
    stage at once (`prog.gathers`, event_sim.Sim.device), and waited on when the stage's first chunk of its first
    forward ends (analytic_scores.py: max(0, gather - forward));
    `fsdp_prefetch` (zero=2/3): each unit's gather prefetched, its reduce-scatter asynchronous (fsdp_overlap.py);
    `bucket_bytes`: the gradient bucket limit (traffic.stage_events; the analytic engine is given the same)."""
    grad_overlap = overlap if grad_overlap is None else grad_overlap
    d = context_local(d, layout.cp, layout.cp_comm)  # a cp rank's view (dims.py)
    pp, v = layout.pp, layout.interleave
    kind = "first" if stage == 0 else ("last" if stage == pp - 1 else "middle")
    first, last = pp == 1 or stage == 0, pp == 1 or stage == pp - 1
    one = replace(d, global_batch=layout.dp * mb)
    # The per-step collectives (pipeline sends are rebuilt from the schedule instead); per micro-batch, the
    # first one's (kept gathers, no kept reduce-scatters) and the last one's (the other way round).
    _, tail = _group([e for e in stage_events(layout, one, mb, kind, bucket_bytes) if e.kind != "send"])
    early, _ = _group(micro_batch_events(layout, one, mb, kind, (0, 2)))
    late, _ = _group(micro_batch_events(layout, one, mb, kind, (1, 2)))
    comp = unit_compute(d, layout, mb, g)
    own = block_units(d, layout, mb, g, stage, comp)  # each block's, at its own window (window_stages.py)
    units = layout.tensor_mode.program_units
    sizes = [len(c) for c in stage_chunks(d.L, pp, v, stage)]  # modes/stages.py: uneven splits too
    layers = sum(sizes)
    bounds = [sum(sizes[:c]) for c in range(v + 1)]
    head = [last and c == v - 1 for c in range(v)]
    prog = StageProgram(stage, [_chunk_fwd(late, units, comp, own, bounds[c], bounds[c + 1], first and c == 0,
                                           head[c]) for c in range(v)],
                        [[] for _ in range(v)], [[] for _ in range(v)], tail,
                        fwd_first=[_chunk_fwd(early, units, comp, own, bounds[c], bounds[c + 1], first and c == 0,
                                              head[c]) for c in range(v)])
    grads = [op for op in tail if op.event and op.event.label == "gradients"]  # one per bucket, issue order
    buckets = grad_overlap and bool(grads)
    if buckets:
        for op in grads:
            tail.remove(op)
    for c in range(v):
        if head[c]:
            prog.bwd[c] += _units_bwd(HEAD_UNITS, early.get((-1, "bwd"), {}), comp, "", overlap)
            prog.bwd_last[c] += _units_bwd(HEAD_UNITS, late.get((-1, "bwd"), {}), comp, "", overlap)
        for i in reversed(range(bounds[c], bounds[c + 1])):
            prog.bwd[c] += _layer_bwd(early, units, own[i], i, own[i]["_recompute"][0], overlap)
        if first and c == 0:
            prog.bwd[c] += _units_bwd(("emb",), early.get((-1, "bwd"), {}), {}, "", False)
    # The last micro-batch's backward runs chunk v-1 first and chunk 0 last: the order the gradient buckets
    # (reverse registration order: head, blocks from the last, embedding) fill; each is issued once its elements
    # are produced (modes/buckets.release_counts, which the analytic engine reads too: grad_overlap.py).
    counts = release_counts(parameter_units(layout.mode, d, layout.tensor_size, layout.q,
                                            int(stage_layers(d.L, pp, v, int(first), int(last))), first, last),
                            first, last, zero_group(layout) if layout.zero == 1 else 1, bucket_bytes)
    j = 0
    for c in reversed(range(v)):
        for i in reversed(range(bounds[c], bounds[c + 1])):
            prog.bwd_last[c] += _layer_bwd(late, units, own[i], i, own[i]["_recompute"][0], overlap)
            if buckets and j < len(counts) - 1:
                _release_buckets(grads, counts[j], i, prog.bwd_last[c])
            j += 1
        if first and c == 0:
            prog.bwd_last[c] += _units_bwd(("emb",), late.get((-1, "bwd"), {}), {}, "", False)
        if buckets and c == 0:  # the rest once the stage's backward ends (the embedding's on the first stage)
            _release_buckets(grads, -1, bounds[0], prog.bwd_last[c])
    if buckets:
        tail.insert(0, Op("wait", "gradients.wait"))
    if param_overlap and layout.zero == 1:  # issued by every stage at the step's start (event_sim.Sim.device)
        gathers = [op for op in tail if op.event and op.event.label == "params"]
        for op in gathers:
            tail.remove(op)
        if gathers:
            prog.gathers = [replace(op, asynchronous=True) for op in gathers]
            prog.fwd_first[0].append(Op("wait", "params.wait"))
    if layout.cp > 1:  # the p2p ring alongside the attention blocks (event_context.py)
        unit, arrays = context.attention_unit(layout.tensor_mode), layout_arrays(layout, mb)
        shares = block_shares(d, layout, stage)  # each block's own attention beside its steps (window_stages.py)
        for lists in (prog.fwd, prog.fwd_first, prog.bwd, prog.bwd_last):
            lists[:] = [ring_ops(ops, d, layout.mode, arrays, g, unit, shares) for ops in lists]
    if layout.tpo:
        for lists in (prog.fwd, prog.fwd_first, prog.bwd, prog.bwd_last):
            lists[:] = [_apply_tpo(ops, layout, d, comp) for ops in lists]
    # reduce-scatters async with the layout's overlap; pp > 1: in line (exposed), as analytic.py prices them
    if layout.zero >= 2 and layout.pp == 1 and (fsdp_prefetch or grad_overlap):
        prefetch_program(prog, fsdp_prefetch, grad_overlap, (d.c, g.mem_bw * g.mem_eff))  # fsdp_copies.py
    # The optimizer step (compute.optimizer_time, as the analytic model prices it), after the gradients.
    n_local = local_params(d, layout.mode, layout.tensor_size, layout.q, layers, first, last)
    shard = zero_group(layout) if layout.zero else 1
    casts = fp8_step_time(d, layout.mode, layout_arrays(layout, mb), np.array([int(first)]), np.array([int(last)]), g)
    tail.append(Op("compute", "optimizer", float(optimizer_time(n_local, d.c, g, shard)) + float(casts[0])))
    add_op_overhead(layout, d, mb, g, first, last, prog)
    prog.send_bytes = d.c * mb * d.s * d.h // act_split(layout)
    prog.compute_fwd = sum(op.seconds for ch in prog.fwd for op in ch if op.kind == "compute")
    prog.compute_bwd = sum(op.seconds for ch in prog.bwd for op in ch if op.kind == "compute")
    return prog


__all__ = ["Op", "StageProgram", "build_stage", "schedule", "unit_compute"]
