"""Topology queries for the groups of a layout, cached by what actually determines them.

The ranks of a group over mesh axes A depend only on the placement (innermost first) of the axes of size
> 1 and on which of them belong to A. Adjacent axes with the same membership merge (a 2 x 4 block of
consecutive ranks is an 8 block), so thousands of layouts share a few hundred distinct queries. For each
distinct query we call `topo.group_link(groups[0], concurrent=groups[1:])` once.
`get_shared`: what two sets of groups keep of their bandwidth while both run (topologies/sharing.py), the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from paracube.cost_models.overlap_drag import nvlink_share
from paracube.layout import Layout
from paracube.topologies.sharing import ratios

SHARED = ("shared",)  # Links key of (tensor ratio, data-parallel ratio): LinkCache.get_shared of the two groups

Runs = tuple[tuple[int, bool], ...]


def runs_for(placement: Sequence[tuple[str, int]], axes: Sequence[str]) -> Runs:
    """Merged (size, member) runs, innermost first, of a placement given as (axis, size) pairs."""
    runs: list[list] = []
    for axis, size in placement:
        if size == 1:
            continue
        member = axis in axes
        if runs and runs[-1][1] == member:
            runs[-1][0] *= size
        else:
            runs.append([size, member])
    return tuple((s, m) for s, m in runs)


def groups_from_runs(runs: Runs) -> np.ndarray:
    """[n_groups, group_size] rank groups (the same sets as Layout.groups, member order innermost-minor)."""
    if not runs:  # a world of one rank: one group, itself (numpy cannot transpose the empty axis list)
        return np.zeros((1, 1), dtype=np.int64)
    world = math.prod(s for s, _ in runs)
    outer_first = list(reversed(runs))
    grid = np.arange(world).reshape([s for s, _ in outer_first])
    members = [i for i, (_, m) in enumerate(outer_first) if m]
    others = [i for i, (_, m) in enumerate(outer_first) if not m]
    size = math.prod(outer_first[i][0] for i in members) if members else 1
    return grid.transpose(others + members).reshape(-1, size)


class LinkCache:
    """(bandwidth B/s, latency s) of the groups over given axes, per placement; one topology query each."""

    def __init__(self, topo: object) -> None:
        self.topo = topo
        self._cache: dict[Runs, tuple[float, float]] = {}
        self.keyed: dict[bytes, tuple[float, float]] = {}  # get_keyed's answers
        self._shared: dict[tuple[Runs, Runs], tuple[float, float]] = {}
        self._nvlink: dict[Runs, float] = {}
        self.queries = 0
        self.memo: dict = {}  # derived queries over the same topology (cost_models/moe_a2a.py)

    def get_runs(self, runs: Runs) -> tuple[float, float]:
        hit = self._cache.get(runs)
        if hit is None:
            if not any(m for _, m in runs):
                hit = (math.inf, 0.0)  # a group of one rank: nothing is sent
            else:
                groups = groups_from_runs(runs)
                link = self.topo.group_link(groups[0], concurrent=groups[1:])  # type: ignore[attr-defined]
                hit = (float(link.bandwidth), float(link.latency))
                self.queries += 1
            self._cache[runs] = hit
        return hit

    def get_keyed(
        self, key: bytes, placement: Sequence[tuple[str, int]], axes: Sequence[str]
    ) -> tuple[float, float]:
        """Like get, memoized under a caller's precomputed key (the planner's encoded runs)."""
        hit = self.keyed.get(key)
        if hit is None:
            hit = self.keyed[key] = self.get(placement, axes)
        return hit

    def prefetch(self, items: Iterable[tuple[bytes, Sequence[tuple[str, int]], Sequence[str]]]) -> None:
        """get_keyed of every (key, placement, axes) item into `keyed`; the new topology queries asked together
        (topo.partition_links, where the topology has it: the same answers, in one numpy pass)."""
        todo: dict[bytes, Runs] = {}
        for key, place, axes in items:
            if key not in todo and key not in self.keyed:
                todo[key] = runs_for(place, axes)
        runs = [r for r in dict.fromkeys(todo.values()) if r not in self._cache and any(m for _, m in r)]
        if len(runs) > 1 and hasattr(self.topo, "partition_links"):  # each runs' groups: a partition of the ranks
            for r, link in zip(runs, self.topo.partition_links([groups_from_runs(r) for r in runs]), strict=True):
                self._cache[r] = (float(link.bandwidth), float(link.latency))
            self.queries += len(runs)
        for key, r in todo.items():
            self.keyed[key] = self.get_runs(r)

    def get(self, placement: Sequence[tuple[str, int]], axes: Sequence[str]) -> tuple[float, float]:
        return self.get_runs(runs_for(placement, axes))

    def get_shared(self, placement: Sequence[tuple[str, int]], a: Sequence[str],
                   b: Sequence[str]) -> tuple[float, float]:
        """(share of its bandwidth the groups over `a` keep, share the groups over `b` keep) while both run
        (1, 1 where they have no link in common, a group is one rank, or the topology has no link graph)."""
        key = (runs_for(placement, a), runs_for(placement, b))
        hit = self._shared.get(key)
        if hit is None:
            if not all(any(m for _, m in r) for r in key) or not hasattr(self.topo, "ring_loads"):
                hit = (1.0, 1.0)
            else:
                ga, gb = groups_from_runs(key[0]), groups_from_runs(key[1])
                hit = ratios(self.topo, ga[0], ga[1:], gb[0], gb[1:])
            self._shared[key] = hit
        return hit

    def nvlink_share(self, placement: Sequence[tuple[str, int]], axes: Sequence[str]) -> float:
        """overlap_drag.nvlink_share of the groups over `axes` (their first group; node-major placements make
        every group alike)."""
        runs = runs_for(placement, axes)
        hit = self._nvlink.get(runs)
        if hit is None:
            dpn = int(getattr(self.topo, "devices_per_node", 0) or 0)
            hit = self._nvlink[runs] = nvlink_share(groups_from_runs(runs)[0], dpn) if any(m for _, m in runs) \
                else 0.0
        return hit


def shared_axes(mode_axes: Sequence[str], hybrid: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two groups get_shared splits for a mode: its tensor axes and the data-parallel stream's (dp; HSDP: the
    shard group)."""
    return tuple(mode_axes), ("dp_shard",) if hybrid else ("dp",)


def placement_of(layout: Layout) -> tuple[tuple[str, int], ...]:
    return tuple((a, layout.axis_size(a)) for a in layout.effective_placement)
