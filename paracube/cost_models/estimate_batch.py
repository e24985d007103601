"""`estimate` of many layouts with one vectorized evaluation per group of alike layouts: the same results.

The planner prices its ranking (~100 layouts) with analytic.estimate, one evaluate call per layout (~3 ms of
numpy overhead each). Layouts with the same dims (pins, recomputation, cp), mode, zero stage, overlap, kept
weights, tpo, HSDP shard and link axes go through one `evaluate` (every per-configuration quantity is computed
elementwise, so row i of the batch is the single layout's evaluation), and analytic.finish reads each one's row;
with MoE blocks or MLA, finish adds each layout's own expert and attention terms to its row (moe_step.with_moe: the
dense part does not depend on ep, etp or a2ao, which the key leaves out), so the MoE search (planner/experts.py)
prices its candidates here too. An invalid layout is left out (estimate raises for it).
tests/test_search_speed.py checks every ranked estimate against `estimate`, field by field, dense and MoE.
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.analytic import finish, layout_links, prepare
from paracube.cost_models.analytic_scores import evaluate
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.links import LinkCache
from paracube.cost_models.validity import layout_arrays
from paracube.engine_options import EngineOptions
from paracube.errors import ParacubeError
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.modes import LayoutBatch
from paracube.modes.batch import FIELDS
from paracube.workload import ModelSpec, TrainingSpec


class Batch:
    """Layouts' dense parts evaluated in a few vectorized calls (`add`), each layout's estimate finished when it is
    asked for (`estimate`: analytic.finish on its row, with its expert terms). A search that may ask for a layout adds
    it beforehand: one it never asks for costs its row of the evaluation only, not its finish (the MoE terms, about
    half of a MoE layout's estimate)."""

    def __init__(self, model: ModelSpec, training: TrainingSpec, topo: object, cache: LinkCache,
                 options: EngineOptions | None = None) -> None:
        self.model, self.training, self.cache = model, training, cache
        self.options = options or EngineOptions()
        self.g = gemm_model(topo, training.dtype)  # type: ignore[arg-type]
        self._rows: dict[str, tuple] = {}  # repr(layout) -> (its layout, dims, mb, note, scores, row, links, memo)
        self._links: dict[str, object] = {}  # repr(layout) -> its own analytic.layout_links
        self._done: dict[str, StepEstimate | None] = {}

    def add(self, layouts: list[Layout]) -> None:
        """Evaluate the dense parts of `layouts` not added yet (an invalid one is left out: estimate raises for it)."""
        o, groups = self.options, {}
        for lay in layouts:
            if repr(lay) in self._rows:
                continue
            try:
                d, mb, note = prepare(self.model, self.training, lay, o)
            except ParacubeError:
                continue
            links = layout_links(lay, self.cache)
            key = (d, lay.mode, lay.zero, lay.overlap, lay.keep_weights or 0, lay.tpo, lay.shard, tuple(links))
            groups.setdefault(key, {})[repr(lay)] = (lay, mb, note, links)  # a layout listed twice: once
        for (d, mode, zero, overlap, kw, tpo, shard, axes), alike in groups.items():
            items = list(alike.values())
            one = [layout_arrays(lay, mb) for lay, mb, _, _ in items]
            batch = LayoutBatch(**{f: np.concatenate([getattr(b, f) for b in one]) for f in FIELDS})
            links = {ax: tuple(np.concatenate([it[3][ax][k] for it in items]) for k in range(2)) for ax in axes}
            res = evaluate(d, mode, batch, links, self.g, zero=zero, overlap=overlap, kw=kw,  # type: ignore[arg-type]
                           tpo=tpo, shard=shard, param_overlap=o.param_overlap, fsdp_prefetch=o.fsdp_prefetch,
                           bucket_bytes=o.bucket_bytes)
            memo: dict = {}  # the group's entry times, computed once (analytic._breakdown)
            for i, (lay, mb, note, own) in enumerate(items):
                self._rows[repr(lay)] = (lay, d, mb, note, res, i, links, memo)
                self._links[repr(lay)] = own

    def estimate(self, layout: Layout) -> StepEstimate | None:
        """estimate(model, training, layout, topo, with_events=False, cache=cache, options=options) of an added
        layout; None for one not added, or refused (estimate raises for it, with its reason)."""
        key = repr(layout)
        if key not in self._done:
            if key not in self._rows:
                return None
            lay, d, mb, note, res, i, links, memo = self._rows[key]
            try:  # the expert terms (moe_step.with_moe) may refuse a layout as estimate does
                self._done[key] = finish(self.model, lay, d, mb, note, res, i, links, self.g, self.cache, memo=memo)
            except ParacubeError:
                self._done[key] = None
        return self._done[key]

    def links(self, layout: Layout) -> object:
        """The analytic.layout_links of an added layout."""
        return self._links[repr(layout)]


def estimate_many(model: ModelSpec, training: TrainingSpec, layouts: list[Layout], topo: object, cache: LinkCache,
                  options: EngineOptions | None = None, links_out: dict | None = None) -> dict[str, StepEstimate]:
    """repr(layout) -> estimate(model, training, layout, topo, with_events=False, cache=cache, options=options) of
    each valid layout (a Batch of them, each finished). `links_out`: filled with repr(layout) -> its
    analytic.layout_links (the caller's keys reuse them instead of asking again)."""
    batch = Batch(model, training, topo, cache, options)
    batch.add(layouts)
    out: dict[str, StepEstimate] = {}
    for lay in layouts:
        est = batch.estimate(lay)
        if est is not None:
            out[repr(lay)] = est
            if links_out is not None:
                links_out[repr(lay)] = batch.links(lay)
    return out


__all__ = ["Batch", "estimate_many"]
