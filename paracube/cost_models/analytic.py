"""The analytic cost model for one layout: `estimate` (prepare, `evaluate`, finish) and its explicit event list.

`estimate` scores one layout with analytic_scores.py's closed forms (the module docstring there states them:
pipelines, overlaps, zero, per-call waits) through the same vectorized `evaluate` the planner runs, and attaches
its explicit CommEvents (traffic.py), its communication by mesh axes and kinds, and its notes. `prepare` and
`finish` are its two halves, which estimate_batch.py shares to price many layouts in one evaluation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from paracube.cost_models.analytic_scores import Scores, evaluate
from paracube.cost_models.collective import fastest_time
from paracube.cost_models.comm import Entry
from paracube.cost_models.comm_axes import axes_used
from paracube.cost_models.compute import GemmModel
from paracube.cost_models.context_dims import context_local
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import Dims, dims_of, padded_vocab, with_options, with_pins
from paracube.cost_models.links import SHARED, LinkCache, placement_of, shared_axes
from paracube.cost_models.model_flops import model_flops_per_step
from paracube.cost_models.moe import dense_part
from paracube.cost_models.moe_dispatch import DISPATCHERS
from paracube.cost_models.moe_step import with_moe
from paracube.cost_models.moe_violations import violations as moe_violations
from paracube.cost_models.offload import host_bytes
from paracube.cost_models.overlap_drag import DRAG
from paracube.cost_models.recompute_modules_cost import dense_modules
from paracube.cost_models.score_bounds import compute_lower_bound, step_lower_bound
from paracube.cost_models.stage_scores import STAGES, Links, StageScores
from paracube.cost_models.traffic import stage_events
from paracube.cost_models.validity import layout_arrays, resolve_micro_batch
from paracube.engine_options import EngineOptions, options_of
from paracube.errors import ParacubeError, check
from paracube.estimate import MemoryBreakdown, StepEstimate
from paracube.layout import Layout
from paracube.modes.stages import stage_layers
from paracube.workload import FP8_SCALINGS, SELECTIVE_RULES, ModelSpec, TrainingSpec


def layout_links(layout: Layout, cache: LinkCache) -> Links:
    """(bandwidth, latency) of every group the mode's closed forms use; HSDP splits dp into dp_shard (inner)
    and dp_replicate (Layout.groups), so the shard and replica groups are priced on their own ranks."""
    place = placement_of(layout)
    if layout.hybrid:
        i = [a for a, _ in place].index("dp")
        place = (*place[:i], ("dp_shard", layout.shard_size), ("dp_replicate", layout.dp // layout.shard_size),
                 *place[i + 1:])
    names = {a for a, _ in place}
    links: Links = {}
    for axes in axes_used(layout.mode, layout.hybrid, layout.cp > 1):
        wide = (*axes, "dp_shard", "dp_replicate") if "dp" in axes else axes
        axes_ok = tuple(a for a in wide if a in names)
        bw, lat = cache.get(place, axes_ok)
        links[axes] = (np.array([bw]), np.array([lat]))
    tensor, data = shared_axes(layout.tensor_mode.axes, layout.hybrid)
    links[SHARED] = tuple(np.array([x]) for x in cache.get_shared(place, tensor, data))  # type: ignore[assignment]
    f = cache.nvlink_share(place, layout.zero_axes)  # the data-parallel ring's hops in a node, and across nodes
    links[DRAG] = (np.array([f]), np.array([1.0 - f]))
    return links


def _breakdown(layout: Layout, chosen: StageScores, links: Links, g: GemmModel, i: int = 0,
               memo: dict | None = None) -> tuple[dict, dict]:
    """Communication time of one layout's chosen stage (row `i` of the scores) by mesh axes and by collective
    kind. `memo` (estimate_batch.py: the layouts of one evaluation): each entry's per-row times kept by stage
    and entry, so a batch computes every entry's vector once, not once per layout; the same floats (row i of
    the same vectorized calls; call_wait does not read the call's bytes)."""
    by_axis: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for k, e in enumerate(chosen.entries):
        if e.count[i] > 0:
            times = None if memo is None else memo.get((id(chosen), k))
            if times is None:
                times = _entry_times(e, links, g, layout.tensor_mode.alternating)
                if memo is not None:
                    memo[id(chosen), k] = times
            tm = float(times[0][i])
            tm += float(e.count[i] * times[1][i])
            by_axis[".".join(e.axes)] += tm
            by_kind[e.kind] += tm
    if chosen.ring is not None and chosen.ring[i] > 0:  # the exposed part of cp's p2p ring (context_parallel.py)
        by_axis["cp"] += float(chosen.ring[i])
        by_kind["send"] += float(chosen.ring[i])
    return dict(by_axis), dict(by_kind)


def _entry_times(e: Entry, links: Links, g: GemmModel, alternating: bool) -> tuple[np.ndarray, np.ndarray]:
    """(an entry's time per row, as _stage prices it: uncalibrated all_reduce the faster of ring and tree; its
    call wait per call, per row)."""
    tm = e.time(*links[e.axes], g.comm, alternating)
    if e.kind == "all_reduce" and not g.comm:  # as _stage prices it
        tm = fastest_time(e.kind, e.n, e.count, e.payload, *links[e.axes])
    return tm, g.call_wait(e.kind, e.n, e.payload / np.maximum(e.count, 1), e.dtype, alternating)


def _notes(layout: Layout, d: Dims, note: str | None, stage: str) -> list[str]:
    notes = [n for n in (note,) if n]
    if layout.pp > 1:
        notes.append(f"pipeline: events and time of the slowest stage ({stage}); memory of the most loaded")
    split = layout.tensor_mode.vocab_split(layout.tensor_size, layout.q)
    if padded_vocab(d.V, split) != d.V:
        notes.append(f"vocab {d.V} padded to {padded_vocab(d.V, split)} (Megatron's multiple of 128 x {split}; "
                     "padded logits masked out of the loss)")
    return notes


def estimate(model: ModelSpec, training: TrainingSpec, layout: Layout, topo: object, with_events: bool = True,
             cache: LinkCache | None = None, options: EngineOptions | None = None, **changes: object) -> StepEstimate:
    """Predict one training step of `layout` on `topo` (see the module docstrings of this package), run as the
    stack `options` describes (engine_options.py: its overlaps, gradient element and bucket, FP8 scaling and
    parameter gather, MoE dispatcher, selective rule; default: each field's default), with single fields changed
    by `changes` (`param_overlap=True`)."""
    o = options_of(options, changes)
    d, mb, note = prepare(model, training, layout, o)
    g = gemm_model(topo, training.dtype)  # type: ignore[arg-type]
    cache = cache or LinkCache(topo)
    links = layout_links(layout, cache)
    batch = layout_arrays(layout, mb)
    res = evaluate(d, layout.mode, batch, links, g, zero=layout.zero, overlap=layout.overlap,
                   kw=layout.keep_weights or 0, tpo=layout.tpo, shard=layout.shard, param_overlap=o.param_overlap,
                   fsdp_prefetch=o.fsdp_prefetch, bucket_bytes=o.bucket_bytes)
    return finish(model, layout, d, mb, note, res, 0, links, g, cache, with_events)


def prepare(model: ModelSpec, training: TrainingSpec, layout: Layout,
            options: EngineOptions | None = None) -> tuple[Dims, int, str | None]:
    """`estimate`'s dims (a cp rank's view, with the runtime's choices), micro-batch and its note; raises on an
    invalid layout or option."""
    from paracube.cost_models.validity import violations  # local: keeps the import graph one-way

    o = options or EngineOptions()
    check(o.moe_dispatch in DISPATCHERS, f"moe dispatcher {o.moe_dispatch!r}; valid: {', '.join(DISPATCHERS)}")
    check(o.fp8_scaling in FP8_SCALINGS, f"fp8 scaling {o.fp8_scaling!r}; valid: {', '.join(FP8_SCALINGS)}")
    check(o.selective in SELECTIVE_RULES, f"selective rule {o.selective!r}; valid: {', '.join(SELECTIVE_RULES)}")
    d = context_local(with_options(with_pins(dims_of(dense_part(model), training), layout), o),
                      layout.cp, layout.cp_comm)  # a cp rank's view; MoE / MLA: added by moe_step.with_moe
    if d.recompute_modules is not None and model.moe is not None:  # the MoE blocks' own: moe.py's
        d = replace(d, recompute_modules=dense_modules(d, True))
    mb, note = resolve_micro_batch(layout, d)
    bad = violations(layout, d, mb) + moe_violations(model, layout, o.fused_norms)
    if layout.a2ao and d.recompute == "full":  # Megatron-core refuses it; not priced (moe_a2a_overlap.py)
        bad.append("a2ao (the MoE all_to_all overlap) does not run with full recomputation; valid: rc=none/selective")
    if layout.zero >= 2 and layout.pp > 1 and d.tied:
        bad.append(f"zero={layout.zero} with pp={layout.pp} and tied embeddings is not priced (paracube's executor "
                   "shards the stages' tied copies at zero=0/1 only); untie them, or use pp=1 or zero=0/1")
    if bad:
        raise ParacubeError(f"layout {layout}: {'; '.join(bad)}")
    return d, mb, note


def finish(model: ModelSpec, layout: Layout, d: Dims, mb: int, note: str | None, res: Scores, i: int,
           links: Links, g: GemmModel, cache: LinkCache, with_events: bool = False,
           memo: dict | None = None) -> StepEstimate:
    """`estimate`'s result for the layout priced in row `i` of `res` (its links: `links`, arrays of res's rows;
    `memo`: shared by the layouts of one `res`, _breakdown)."""
    stage = STAGES[int(res.stage[i])]
    by_axis, by_kind = _breakdown(layout, res.stages[int(res.stage[i])], links, g, i, memo)
    world = layout.world_size
    flops = model_flops_per_step(d)
    step = float(res.step_time[i])
    events = tuple(stage_events(layout.with_(micro_batch=mb), d, mb, stage)) if with_events else ()
    comm = float(res.comm[i])
    exposed = step - float(res.compute[i]) - float(res.bubble[i])
    return with_moe(StepEstimate(
        layout=str(layout.with_(micro_batch=mb)),
        engine="analytic",
        step_time_s=step,
        compute_time_s=float(res.compute[i]),
        comm_time_s=comm,
        exposed_comm_time_s=exposed,
        bubble_time_s=float(res.bubble[i]),
        memory=MemoryBreakdown(**{k: float(v[i]) for k, v in res.memory_parts.items()}),
        comm_bytes_per_gpu=float(res.sent_bytes[i]),
        flops_per_gpu=flops / world,
        mfu=flops / (step * g.peak * world),
        comm_time_by_axis=by_axis,
        comm_time_by_kind=by_kind,
        events=events,
        notes=tuple(_notes(layout, d, note, stage)),
    ), res, model, d, layout.with_(micro_batch=mb), g, cache, i)


estimate_batch = evaluate  # the name the design notes use for the vectorized path



def host_memory(model: ModelSpec, training: TrainingSpec, layout: Layout, options: EngineOptions | None = None
                ) -> float:
    """Bytes one device keeps in host memory for the layout's offloaded activations (off=N): offload.host_bytes, as
    the planner checks them against DeviceSpec.host_memory_bytes (planner/offload_passes.py); 0 without off=."""
    if not layout.offload:
        return 0.0
    d, mb, _ = prepare(model, training, layout, options)
    b = layout_arrays(layout, mb)
    ones = np.ones_like(b.pp)
    return float(host_bytes(d, layout.mode, b, stage_layers(d.L, b.pp, b.v, ones, ones), np.ones(1))[0])


__all__ = ["Scores", "StageScores", "compute_lower_bound", "estimate", "estimate_batch", "evaluate", "finish",
           "host_memory", "layout_links", "prepare", "step_lower_bound"]
