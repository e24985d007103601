"""Fast paths for what topology.Topology computes per ring hop and per group: same answers, less Python.

A 16,384-GPU job asks for the link loads of every group of a mesh axis (~16k ring hops per axis, ~65k distinct
rank pairs over the analytic and event engines). Three exact shortcuts (issue 26):

- Hop routes by parts (`HopParts.hop`): a hop between nodes is routed by Topology._path as
  (GPU -> its NIC inside the node) + (NIC -> its fabric switch -> BFS over the fabric -> the peer's switch -> NIC)
  + (NIC -> GPU inside the node), so its edge ids are the concatenation of three pieces cached per GPU and per
  (switch, switch) pair, instead of one path and one dict lookup per edge per rank pair. Where a piece is missing
  (no NIC, no fabric switch, an irregular graph) it answers None and the topology routes the pair as before.
  Its latency is summed edge by edge in path order (the same float additions as before).
- Translated rings (`ring_channels_many`, channels as tuples): Topology._ring_channels of a sorted group depends
  only on which node each member sits in and on which members share a NIC (the first member per NIC opens a
  channel). Where every node splits its local ranks over its NICs the same way, a group g = h + d x
  devices_per_node (h another group of the same offsets and the same local rank of its first member) has h's
  channels shifted by that many ranks. So the channels are computed once per class of groups (offsets from the
  first rank, its local rank) and shifted with numpy; anywhere else every group is computed directly. The flat
  channels of a query's groups (`channel_arrays`, what the link loads read) come from ring_batch.py: all at once.
- One array of routes (`HopTable`): every rank pair routed so far keeps its edge ids in one CSR array, so the
  edges of all channels of all groups are one numpy gather, concatenated in the loop's order (group, hop,
  channel, edge). `link_load` bincounts them: whole hops as integers, split hops weighted by their share, the same
  additions in the same order as Topology._link_load's loop did, so the floats are bit-identical. The event
  engine's LinkTable scores its templates from the same gathers (topology.hop_edges, ring_channel_arrays).

tests/test_link_loads.py compares every fast path with the direct per-pair / per-group computation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paracube.topologies.hop_batch import NodeRoutes, PartRoutes
from paracube.topologies.ring_batch import ring_channel_table

# topology.Topology (not imported: it imports this module); reads its route caches (_ranks, _nic_of, _in_node ...)
Topology = Any
Channels = tuple[tuple[int, int, float], ...]  # a ring hop: (sending rank, receiving rank, share) per channel
_MISSING = object()
DENSE_PAIRS = 1 << 22  # HopTable's dense pair index up to 2,048 ranks (16 MiB of int32); a sorted index beyond


class HopParts:
    """Cached pieces of the routes between nodes (edge ids into Topology._bw_arr): per GPU its path to its NIC and
    on to the NIC's fabric switch (and back), per switch pair the fabric path between them."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._up: dict[int, tuple[list[int], str] | None] = {}  # rank -> (ids GPU -> NIC -> switch, switch)
        self._down: dict[int, tuple[list[int], str] | None] = {}  # rank -> (ids switch -> NIC -> GPU, switch)
        self._fabric: dict[tuple[str, str], list[int] | None] = {}  # (switch a, switch b) -> ids between

    def _side(self, rank: int, up: bool) -> tuple[list[int], str] | None:
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
                hit = ([eid[e] for e in zip(path, path[1:], strict=False)], switches[0])
            cache[rank] = hit
        return hit  # type: ignore[return-value]

    def _middle(self, a: int, b: int, sa: str, sb: str) -> list[int] | None:
        """Edge ids of _fabric_path between the switches (one per switch pair: every NIC pair shares it)."""
        hit = self._fabric.get((sa, sb), _MISSING)
        if hit is _MISSING:
            t = self.topo
            nic_a, nic_b = t._nic_of(t._ranks[a]), t._nic_of(t._ranks[b])
            path = t._fabric_path(nic_a, nic_b)  # type: ignore[arg-type]  # (nic_a, sa, ..., sb, nic_b) or None
            hit = None if path is None else [t._eid[e] for e in zip(path[1:-1], path[2:-1], strict=False)]
            self._fabric[sa, sb] = hit
        return hit  # type: ignore[return-value]

    def hop(self, a: int, b: int) -> list[int] | None:
        """Edge ids of the route from rank a to rank b on different nodes, as Topology._path finds it; None where
        the route is not GPU -> NIC -> fabric -> NIC -> GPU (the topology then routes it itself)."""
        up, down = self._side(a, True), self._side(b, False)
        if up is None or down is None:
            return None
        mid = self._middle(a, b, up[1], down[1])
        if mid is None:
            return None
        return up[0] + mid + down[0]


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
    classes = _classes(topo, groups)
    if classes is None:
        return [topo._ring_channels(g) for g in groups]
    arr, rep_of, inverse = classes
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


def _classes(topo: Topology, groups: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(groups as an array, each class's representative row, each row's class) where translated groups share
    channels (module docstring); None where they may not."""
    size = len(groups[0])
    if size < 2 or len(groups) < 4 or any(len(g) != size for g in groups) or not topo._uniform_nics():
        return None
    arr = np.array(groups, dtype=np.int64)
    first = arr[:, :1]
    key = np.ascontiguousarray(np.concatenate((first % topo.devices_per_node, arr - first), axis=1))
    # classes by each row's bytes (a dict: np.unique(axis=0) sorts structured rows, slowly); the first row of each
    # class represents it, as np.unique's return_index would
    seen: dict[bytes, int] = {}
    width = key.shape[1] * key.itemsize
    raw = key.tobytes()
    inverse = np.array([seen.setdefault(raw[i * width:(i + 1) * width], len(seen)) for i in range(len(key))],
                       dtype=np.int64)
    reps = np.full(len(seen), len(key), dtype=np.int64)
    np.minimum.at(reps, inverse, np.arange(len(key)))
    return arr, reps, inverse


def channel_arrays(topo: Topology, groups: list[tuple[int, ...]]) -> tuple[np.ndarray, ...]:
    """Every channel of every group's ring, flattened in the order Topology._link_load's loop visits them
    (groups in order, hops in ring order, channels in order): (senders, receivers, shares, whether the channel is
    its hop's only one, the index of its group). Groups of one size (a mesh axis' groups): all at once
    (ring_batch.py); else group by group."""
    empty = np.zeros(0, dtype=np.int64)
    if not groups:
        return empty, empty, np.zeros(0), np.zeros(0, dtype=bool), empty
    if len({len(g) for g in groups}) == 1:
        return ring_channel_table(topo, np.array(groups, dtype=np.int64), topo._nic_keys())
    flat = [(s, r, share, len(hop) == 1, i) for i, g in enumerate(groups) for hop in topo._ring_channels(g)
            for s, r, share in hop]
    return _columns(flat)


def _columns(flat: list[tuple[int, int, float, bool, int]]) -> tuple[np.ndarray, ...]:
    return (np.array([c[0] for c in flat], dtype=np.int64), np.array([c[1] for c in flat], dtype=np.int64),
            np.array([c[2] for c in flat], dtype=np.float64), np.array([c[3] for c in flat], dtype=bool),
            np.array([c[4] for c in flat], dtype=np.int64))


class HopTable:
    """Edge ids of every rank pair asked so far, as one growing CSR (flat ids; start and length per pair), so that
    the edges of many hops are one numpy gather (in hop order: the same concatenation as a Python loop)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.n = topo.num_devices
        self._keys = np.zeros(0, dtype=np.int64)  # a * n + b, sorted
        self._rows = np.zeros(0, dtype=np.int64)  # their rows in start/length
        # up to DENSE_PAIRS rank pairs: every pair's row (-1: not routed yet) in one array, looked up by key
        # (a gather, not a binary search per hop: a search looks up ~600k hops)
        self._dense = np.full(self.n * self.n, -1, dtype=np.int32) if self.n * self.n <= DENSE_PAIRS else None
        self.flat = np.zeros(1024, dtype=np.int64)
        self.used = 0
        self._latency = np.zeros(0)  # each row's summed link latency (Topology._hops)
        self._parts: PartRoutes | None = None  # built at the first pairs routed
        self._nodes: NodeRoutes | None = None
        self._start = np.zeros(0, dtype=np.int64)
        self._length = np.zeros(0, dtype=np.int64)

    def rows(self, send: np.ndarray, recv: np.ndarray) -> np.ndarray:
        keys = send * self.n + recv
        if self._dense is not None:
            rows = self._dense[keys]
            new = rows < 0
            if new.any():
                self._add(np.unique(keys[new]))
                rows = self._dense[keys]
            return rows
        pos = np.searchsorted(self._keys, keys)
        known = pos < len(self._keys)
        known[known] = self._keys[pos[known]] == keys[known]
        if not known.all():
            self._add(np.unique(keys[~known]))
            pos = np.searchsorted(self._keys, keys)
        return self._rows[pos]

    def _add(self, keys: np.ndarray) -> None:
        """Route the new pairs and append them: those whose route splits into parts all at once
        (hop_batch.PartRoutes), those inside one node by its template (hop_batch.NodeRoutes), the rest as
        Topology._hops does (same ids, same latency additions)."""
        t, n = self.topo, self.n
        a, b = keys // n, keys % n
        if self._parts is None:
            self._parts, self._nodes = PartRoutes(t), NodeRoutes(t)
        ok, fast_ids, fast_lens, fast_lat = self._parts.route(a, b)
        inner, in_ids, in_lens, in_lat = self._nodes.route(a[~ok], b[~ok])  # pairs inside one node, by template
        if inner.any():  # routed by parts, then inside nodes, then the rest: rows in that order (`added`)
            rest = np.nonzero(~ok)[0]
            keys = np.concatenate((keys[ok], keys[rest[inner]], keys[rest[~inner]]))
            a, b = keys // n, keys % n
            ok = np.arange(len(keys)) < len(fast_lens) + len(in_lens)
            fast_ids, fast_lens = np.concatenate((fast_ids, in_ids)), np.concatenate((fast_lens, in_lens))
            fast_lat = np.concatenate((fast_lat, in_lat))
        slow_ids: list[int] = []
        slow_lens, slow_lat = [], []
        for x, y in zip(a[~ok].tolist(), b[~ok].tolist(), strict=True):
            arr, lat = t._hops(x, y)
            slow_ids += arr.tolist()
            slow_lens.append(len(arr))
            slow_lat.append(lat)
        new = np.concatenate((fast_ids, np.array(slow_ids, dtype=np.int64)))
        lens = np.concatenate((fast_lens, np.array(slow_lens, dtype=np.int64)))
        end = self.used + len(new)
        if end > len(self.flat):
            self.flat = np.concatenate((self.flat, np.zeros(max(end, 2 * len(self.flat)), dtype=np.int64)))
        self.flat[self.used:end] = new
        starts = self.used + np.cumsum(lens) - lens
        self.used = end
        rows = np.arange(len(self._start), len(self._start) + len(keys), dtype=np.int64)
        added = np.concatenate((keys[ok], keys[~ok]))  # rows: the routed-by-parts pairs first
        if self._dense is not None:
            self._dense[added] = rows
        else:
            merged = np.concatenate((self._keys, added))
            order = np.argsort(merged, kind="stable")
            self._keys, self._rows = merged[order], np.concatenate((self._rows, rows))[order]
        self._start, self._length = np.concatenate((self._start, starts)), np.concatenate((self._length, lens))
        self._latency = np.concatenate((self._latency, fast_lat, np.array(slow_lat, dtype=np.float64)))

    def latencies(self, rows: np.ndarray) -> np.ndarray:
        return self._latency[rows]

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the rows' edge ids, concatenated in order; each row's edge count)."""
        lens = self._length[rows]
        total = int(lens.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64), lens
        ends = np.cumsum(lens)
        at = np.arange(total, dtype=np.int64) + np.repeat(self._start[rows] - (ends - lens), lens)
        return self.flat[at], lens


def link_load(topo: Topology, table: HopTable, groups: list[tuple[int, ...]]) -> np.ndarray:
    """Topology._link_load of the groups (in this order) by numpy gathers: whole hops counted as integers, split
    hops' shares summed in the loop's order (the same floats)."""
    n = len(topo._bw_arr)
    send, recv, share, whole, _ = channel_arrays(topo, groups)
    rows = table.rows(send, recv) if len(send) else np.zeros(0, dtype=np.int64)
    counted = table.gather(rows[whole])[0] if whole.any() else None
    load = np.bincount(counted, minlength=n) if counted is not None else np.zeros(n, dtype=np.int64)
    if not whole.all():
        ids, lens = table.gather(rows[~whole])
        load = load + np.bincount(ids, weights=np.repeat(share[~whole], lens), minlength=n)
    return load


__all__ = ["HopParts", "HopTable", "channel_arrays", "link_load", "ring_channels_many", "uniform_nics"]
