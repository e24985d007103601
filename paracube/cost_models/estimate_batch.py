"""`estimate` of many layouts with one vectorized evaluation per group of alike layouts: the same results.

The planner prices its ranking (~100 layouts) with analytic.estimate, one evaluate call per layout (~3 ms of
numpy overhead each). Layouts with the same dims (pins, recomputation, cp), mode, zero stage, overlap, kept
weights, tpo, HSDP shard and link axes go through one `evaluate` (every per-configuration quantity is computed
elementwise, so row i of the batch is the single layout's evaluation), and analytic.finish reads each one's row.
Dense models only (MoE / MLA add per-layout terms: moe_step.with_moe); an invalid layout is left out (estimate
raises for it). tests/test_search_speed.py checks every ranked estimate against `estimate`, field by field.
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.analytic import finish, layout_links, prepare
from paracube.cost_models.analytic_scores import evaluate
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.links import LinkCache
from paracube.cost_models.moe import priced
from paracube.cost_models.validity import layout_arrays
from paracube.engine_options import EngineOptions
from paracube.errors import ParacubeError
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.modes import LayoutBatch
from paracube.modes.batch import FIELDS
from paracube.workload import ModelSpec, TrainingSpec


def estimate_many(model: ModelSpec, training: TrainingSpec, layouts: list[Layout], topo: object, cache: LinkCache,
                  options: EngineOptions | None = None, links_out: dict | None = None) -> dict[str, StepEstimate]:
    """repr(layout) -> estimate(model, training, layout, topo, with_events=False, cache=cache, options=options) of
    each valid layout; empty for MoE / MLA models. `links_out`: filled with repr(layout) -> its
    analytic.layout_links (the caller's keys reuse them instead of asking again)."""
    o = options or EngineOptions()
    if priced(model):
        return {}
    groups: dict[tuple, list[tuple]] = {}
    for lay in layouts:
        try:
            d, mb, note = prepare(model, training, lay, o)
        except ParacubeError:
            continue
        links = layout_links(lay, cache)
        key = (d, lay.mode, lay.zero, lay.overlap, lay.keep_weights or 0, lay.tpo, lay.shard, tuple(links))
        groups.setdefault(key, []).append((lay, mb, note, links))
    g = gemm_model(topo, training.dtype)  # type: ignore[arg-type]
    out: dict[str, StepEstimate] = {}
    for (d, mode, zero, overlap, kw, tpo, shard, axes), items in groups.items():
        one = [layout_arrays(lay, mb) for lay, mb, _, _ in items]
        batch = LayoutBatch(**{f: np.concatenate([getattr(b, f) for b in one]) for f in FIELDS})
        links = {ax: tuple(np.concatenate([it[3][ax][k] for it in items]) for k in range(2)) for ax in axes}
        res = evaluate(d, mode, batch, links, g, zero=zero, overlap=overlap, kw=kw, tpo=tpo,  # type: ignore[arg-type]
                       shard=shard, param_overlap=o.param_overlap, fsdp_prefetch=o.fsdp_prefetch,
                       bucket_bytes=o.bucket_bytes)
        memo: dict = {}  # the group's entry times, computed once (analytic._breakdown)
        for i, (lay, mb, note, own) in enumerate(items):
            out[repr(lay)] = finish(model, lay, d, mb, note, res, i, links, g, cache, memo=memo)
            if links_out is not None:
                links_out[repr(lay)] = own
    return out


__all__ = ["estimate_many"]
