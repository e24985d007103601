"""The ring hops of many groups at once, as numbered directed edges: a topology query's link load in a few array ops.

A `group_link` query (topology.py) counts, per directed link, the ring hops of every concurrent group that cross
it: on 1,024 ranks that is ~1,000 hops per query, and a planner search makes hundreds of distinct queries. Here
each distinct hop (rank a -> rank b) is routed once (the topology's `route`, via the callable given) and stored
as a row of a CSR table of edge ids (its latency, the sum of its links' latencies in path order, beside it);
a set of groups becomes arrays of hop ids (one sorted-key lookup), and the load is one bincount over their
edges. The counts, and so every bandwidth and latency derived from them, are exactly those of routing each hop
in Python: integer counts, the same sums in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


class HopTable:
    """Distinct ring hops of a topology: edge ids per hop (CSR) and the hop's summed latency."""

    def __init__(self, n_ranks: int, n_edges: int, route: Callable[[int, int], list[int]],
                 latency: Callable[[list[int]], float]) -> None:
        self.n_ranks, self.n_edges = n_ranks, n_edges
        self._route, self._latency = route, latency
        self._keys = np.zeros(0, dtype=np.int64)  # sorted a * n_ranks + b of known hops
        self._ids = np.zeros(0, dtype=np.int64)  # hop id of each sorted key
        self._ptr = np.zeros(1, dtype=np.int64)  # hop h's edges: edges[ptr[h]:ptr[h + 1]]
        self._edges = np.zeros(0, dtype=np.int64)
        self.hop_latency = np.zeros(0, dtype=np.float64)

    def hops(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Hop ids of the hops a[i] -> b[i], routing (once) the ones not seen yet."""
        keys = a.astype(np.int64) * self.n_ranks + b
        pos = np.searchsorted(self._keys, keys)
        found = (pos < len(self._keys)) & (self._keys[np.minimum(pos, len(self._keys) - 1)] == keys
                                           if len(self._keys) else np.zeros(len(keys), dtype=bool))
        if not found.all():
            self._add(np.unique(keys[~found]))
            pos = np.searchsorted(self._keys, keys)
        return self._ids[pos]

    def _add(self, new: np.ndarray) -> None:
        first = len(self.hop_latency)
        routes = [self._route(int(k) // self.n_ranks, int(k) % self.n_ranks) for k in new]
        lengths = np.array([len(r) for r in routes], dtype=np.int64)
        self._ptr = np.concatenate([self._ptr, self._ptr[-1] + np.cumsum(lengths)])
        self._edges = np.concatenate([self._edges, np.array([e for r in routes for e in r], dtype=np.int64)])
        self.hop_latency = np.concatenate([self.hop_latency, np.array([self._latency(r) for r in routes])])
        keys = np.concatenate([self._keys, new])
        ids = np.concatenate([self._ids, np.arange(first, first + len(new), dtype=np.int64)])
        order = np.argsort(keys, kind="stable")
        self._keys, self._ids = keys[order], ids[order]

    def edges(self, hops: np.ndarray) -> np.ndarray:
        """The edge ids of `hops`, concatenated (with repeats)."""
        starts, lengths = self._ptr[hops], self._ptr[hops + 1] - self._ptr[hops]
        total = int(lengths.sum())
        offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        return self._edges[offsets + np.arange(total, dtype=np.int64)]

    def ring_hops(self, groups: Iterable[tuple[int, ...]]) -> np.ndarray:
        """Hop ids of every ring of `groups` (sorted rank tuples): g0 -> g1 -> ... -> g0; two ranks: both ways."""
        by_size: dict[int, list[tuple[int, ...]]] = {}
        for g in groups:
            if len(g) >= 2:
                by_size.setdefault(len(g), []).append(g)
        parts = []
        for rows in by_size.values():
            arr = np.array(rows, dtype=np.int64)
            parts.append(self.hops(arr.ravel(), np.roll(arr, -1, axis=1).ravel()))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def load(self, groups: Iterable[tuple[int, ...]]) -> np.ndarray:
        """Per edge id: how many ring hops of `groups` cross it."""
        return np.bincount(self.edges(self.ring_hops(groups)), minlength=self.n_edges)


__all__ = ["HopTable"]
