"""Fast paths for what topology.Topology computes per ring hop and per group: same answers, less Python.

A 16,384-GPU job asks for the link loads of every group of a mesh axis (~16k ring hops per axis, ~65k distinct
rank pairs over the analytic and event engines). Two exact shortcuts (issue 26):

- Hop routes by parts (`HopParts.hop`): a hop between nodes is routed by Topology._path as
  (GPU -> its NIC inside the node) + (NIC -> its fabric switch -> BFS over the fabric -> the peer's switch -> NIC)
  + (NIC -> GPU inside the node), so its edge ids are the concatenation of three pieces cached per GPU and per
  (switch, switch) pair, instead of one path and one dict lookup per edge per rank pair. Where a piece is missing
  (no NIC, no fabric switch, an irregular graph) it answers None and the topology routes the pair as before.
  Its latency is summed edge by edge in path order (the same float additions as before).
- Translated rings (`ring_channels_many`): Topology._ring_channels of a sorted group depends only on which
  node each member sits in and on which members share a NIC (the first member per NIC opens a channel). Where
  every node splits its local ranks over its NICs the same way, a group g = h + d x devices_per_node (h another
  group of the same offsets and the same local rank of its first member) has h's channels shifted by that many
  ranks. So the channels are computed once per class of groups (offsets from the first rank, its local rank) and
  shifted with numpy; anywhere else every group is computed directly.

The loads built from these are the per-group loop's, element for element, in the same order: the floats are
bit-identical (tests/test_link_loads.py compares against the direct computation).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# topology.Topology (not imported: it imports this module); reads its route caches (_ranks, _nic_of, _in_node ...)
Topology = Any
Channels = tuple[tuple[int, int, float], ...]  # a ring hop: (sending rank, receiving rank, share) per channel
_MISSING = object()


class HopParts:
    """Cached pieces of the routes between nodes (edge ids into Topology._bw_arr): per GPU its path to its NIC and
    on to the NIC's fabric switch (and back), per switch pair the fabric path between them."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._up: dict[int, tuple[np.ndarray, str] | None] = {}  # rank -> (ids GPU -> NIC -> switch, switch)
        self._down: dict[int, tuple[np.ndarray, str] | None] = {}  # rank -> (ids switch -> NIC -> GPU, switch)
        self._fabric: dict[tuple[str, str], np.ndarray | None] = {}  # (switch a, switch b) -> ids between

    def _side(self, rank: int, up: bool) -> tuple[np.ndarray, str] | None:
        cache = self._up if up else self._down
        hit = cache.get(rank, _MISSING)
        if hit is _MISSING:
            t = self.topo
            gpu = t._ranks[rank]
            nic = t._nic_of(gpu)
            path = None if nic is None else (t._in_node(gpu, nic) if up else t._in_node(nic, gpu))
            switches = [] if nic is None else [v for v in t._adj[nic] if t._node_of[v] is None]  # as _fabric_path
            if not path or not switches:  # _path's `first and mid and last` fails: the topology routes it itself
                hit = None
            else:
                path = (*path, switches[0]) if up else (switches[0], *path)
                eid = t._eid
                hit = (np.array([eid[e] for e in zip(path, path[1:], strict=False)], dtype=np.int64), switches[0])
            cache[rank] = hit
        return hit  # type: ignore[return-value]

    def _middle(self, a: int, b: int, sa: str, sb: str) -> np.ndarray | None:
        """Edge ids of _fabric_path between the switches (one per switch pair: every NIC pair shares it)."""
        hit = self._fabric.get((sa, sb), _MISSING)
        if hit is _MISSING:
            t = self.topo
            nic_a, nic_b = t._nic_of(t._ranks[a]), t._nic_of(t._ranks[b])
            path = t._fabric_path(nic_a, nic_b)  # type: ignore[arg-type]  # (nic_a, sa, ..., sb, nic_b) or None
            hit = None if path is None else np.array(
                [t._eid[e] for e in zip(path[1:-1], path[2:-1], strict=False)], dtype=np.int64)
            self._fabric[sa, sb] = hit
        return hit  # type: ignore[return-value]

    def hop(self, a: int, b: int) -> np.ndarray | None:
        """Edge ids of the route from rank a to rank b on different nodes, as Topology._path finds it; None where
        the route is not GPU -> NIC -> fabric -> NIC -> GPU (the topology then routes it itself)."""
        up, down = self._side(a, True), self._side(b, False)
        if up is None or down is None:
            return None
        mid = self._middle(a, b, up[1], down[1])
        if mid is None:
            return None
        return np.concatenate((up[0], mid, down[0]))


def uniform_nics(topo: Topology) -> bool:
    """Whether every node splits its local ranks over its NICs the same way (ring channels are then invariant
    under a shift by whole nodes); False for one node (nothing crosses)."""
    dpn, ranks = topo.devices_per_node, topo._ranks
    if topo.num_nodes < 2:
        return False
    first: tuple[int, ...] | None = None
    for node in range(topo.num_nodes):
        seen: dict[str | None, int] = {}
        labels = tuple(seen.setdefault(topo._nic_of(ranks[node * dpn + j]), j) for j in range(dpn))
        if first is None:
            first = labels
        elif labels != first:
            return False
    return True


def ring_channels_many(topo: Topology, groups: list[tuple[int, ...]]) -> list[list[Channels]]:
    """Topology._ring_channels of each sorted group, computed once per class of translated groups."""
    if not groups:
        return []
    size = len(groups[0])
    if size < 2 or len(groups) < 4 or any(len(g) != size for g in groups) or not topo._uniform_nics():
        return [topo._ring_channels(g) for g in groups]
    dpn = topo.devices_per_node
    arr = np.array(groups, dtype=np.int64)
    first = arr[:, :1]
    key = np.concatenate((first % dpn, arr - first), axis=1)
    _, rep_of, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    out: list[list[Channels]] = [[] for _ in groups]
    for cls, rep in enumerate(rep_of.tolist()):
        chans = topo._ring_channels(groups[rep])
        rows = np.nonzero(inverse == cls)[0]
        # one [n_rows, channels] array per field: senders, receivers (shifted by whole nodes), shares
        flat = [c for hop in chans for c in hop]
        counts = [len(hop) for hop in chans]
        base = np.array([[s for s, _, _ in flat], [r for _, r, _ in flat]], dtype=np.int64)
        shift = (arr[rows, 0] - arr[rep, 0])[:, None]
        send, recv = (base[0][None, :] + shift).tolist(), (base[1][None, :] + shift).tolist()
        shares = [share for _, _, share in flat]
        whole = all(n == 1 for n in counts)
        for i, row in enumerate(rows.tolist()):
            if row == rep:
                out[row] = chans
                continue
            triples = list(zip(send[i], recv[i], shares, strict=True))
            if whole:
                out[row] = [(t,) for t in triples]
                continue
            hops: list[Channels] = []
            at = 0
            for n in counts:
                hops.append(tuple(triples[at:at + n]))
                at += n
            out[row] = hops
    return out


__all__ = ["HopParts", "ring_channels_many", "uniform_nics"]
