"""The offloading ladder's exact pruning (planner/offload_passes.py): a configuration refused for device memory
without offloading is not scored once no offloaded layout of it could enter the ranking, be its mode's best or the
cp=1 runner-up.

Its floor at an offloaded count n (pp = 1: a stage of all L blocks, N = global_batch / (dp mb) micro-batches),
computed on the ladder's first pass after the probe (for what some count fits):
    floor(n) = C + n N (out + back)
C: score_bounds.compute_lower_bound without offloading on each axis set's best link over the structure's placements,
with the optimizer sharded as at zero >= 1 where the search allows it (no more than at zero=0; that bound holds at
any zero stage), the lesser of kw=0 and kw=1 unless pinned: no placement, zero stage or kept weights beats it.
out, back: what cost_models/offload.with_transfers adds to one offloaded block's forward and backward (the copies
in line, or what their overlap leaves exposed past the block's own compute), which compute.stage_compute_time
counts N times per offloaded block; the bound's other terms (per-micro-batch communication, the optimizer step)
offloading does not lower, and its straggler wait grows with the step (stragglers.py), so adding n N (out + back)
past it keeps a bound.
The bar (bars._bar) only falls as the search goes, so a configuration whose floor at the least count it may still
take exceeds the bar now would be pruned by scoring._within_bound in every pass it could fit (the same bar and
tolerance): marked lost (`mark_losers`), it stays on the ladder for its fit checks (what fits where, counted alike:
`rejected` and `enumerated` as without this pruning) but is not scored: where it fits it counts as pruned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from paracube.cost_models.analytic_scores import evaluate
from paracube.cost_models.comm import axes_used
from paracube.cost_models.compute import block_compute_time
from paracube.cost_models.offload import with_transfers
from paracube.cost_models.score_bounds import compute_lower_bound
from paracube.modes import MODES, LayoutBatch
from paracube.planner.bars import _bar
from paracube.planner.enumerate import Structure
from paracube.planner.search_state import _Search


def floors(s: _Search, mode: str, batch: LayoutBatch, owners: list[Structure], st_links: dict[Structure, np.ndarray],
           ovs: np.ndarray, tpos: np.ndarray) -> list[tuple[float, float]]:
    """Per configuration of `batch` (refused for device memory without offloading), its floor as (C, N (out + back))
    (module docstring); `st_links`: [placements, axes, (bw, lat)] per structure."""
    d = replace(s.d, offload_frac=0.0)  # the pass's dims without offloading
    best = {st: np.stack([m[:, :, 0].max(axis=0), m[:, :, 1].min(axis=0)], axis=1) for st, m in st_links.items()}
    mat = np.array([best[st] for st in owners])
    links = {ax: (mat[:, k, 0], mat[:, k, 1]) for k, ax in enumerate(axes_used(mode, cp=d.cp > 1))}
    rows = np.arange(len(batch))
    zero = np.full(len(batch), int(max(s.zeros) >= 1))
    kws = [int(s.kw_pin == 1)] if s.kw_pin is not None or not MODES[mode].keeps_weights else [0, 1]
    low = np.full(len(batch), np.inf)
    for kw in kws:
        res = evaluate(d, mode, batch, links, s.g, rows=rows, zero=zero, overlap=ovs, kw=kw, tpo=tpos, memory=False)
        low = np.minimum(low, compute_lower_bound(res, d, batch, rows, s.g.ranks_per_core, s.g.straggler))
    fwd, bwd = block_compute_time(d, mode, batch, s.g)
    f_all, b_all = with_transfers(replace(d, offload_frac=1.0), mode, batch, s.g.host_bw, fwd, bwd)
    per_block = (d.global_batch / (batch.dp * batch.mb)) * ((f_all - fwd) + (b_all - bwd))
    return list(zip(low.tolist(), np.broadcast_to(per_block, low.shape).tolist(), strict=True))


def mark_losers(s: _Search, mode: str, bounds: Callable[[list[tuple[int, ...]]], list[tuple[float, float]]]) -> None:
    """On a ladder's offloading pass (s.offload blocks, the fewest any pending configuration may still take), mark
    lost (s.offload_lost) the mode's pending configurations whose floor exceeds the mode's bar now (module
    docstring); `bounds(rows)`: the floors of pending configurations, asked once per configuration (all of the
    mode's at its first such pass, after the probe has left only what some count fits)."""
    pending = (s.offload_pending or {}).get(mode, {})
    floor = s.offload_floors.setdefault(mode, {})  # type: ignore[union-attr]
    new = [r for r in pending if r not in floor]
    if new:
        floor.update(zip(new, bounds(new), strict=True))
    bar = _bar(s, mode) * (1 + 1e-9)  # the bar's own configuration stays despite rounding (as _within_bound)
    lost = s.offload_lost.setdefault(mode, set())  # type: ignore[union-attr]
    lost.update(r for r in pending if r not in lost and floor[r][0] + s.offload * floor[r][1] > bar)


__all__ = ["floors", "mark_losers"]
