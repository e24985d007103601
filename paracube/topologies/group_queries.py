"""What a collective over a group of ranks sees on a cluster: `GroupQueries`, the group queries of
`topology.Topology` (a mixin; routes are routing.py's).

`group_link(ranks, concurrent)`: the group runs a ring in node-major order (ranks sorted by node, then local
rank, i.e. by rank), so only node boundaries cross the network. Every hop of that ring, and of the rings
of all `concurrent` groups (other groups of the same mesh axis that run at the same time; the group itself
may be listed among them, it is counted once), is routed with `route`. Each directed link's bandwidth is
shared equally by the ring hops that cross it. The group's bandwidth is the minimum over its own hops of the
bottleneck (link bandwidth / hops sharing it) along the hop's path; its latency is the maximum over its own
hops of the summed link latencies on the path. A group of one rank: infinite bandwidth, zero latency.

Channels (`ring_channels`): NCCL splits a collective over several channels, each a ring of its own that crosses a
node boundary from a different GPU, so a ring crosses the boundary through every NIC its members own on both
sides (NCCL's ring graph search, nccl/src/graph/search.cc, puts one NIC per channel on rail-optimized DGX).
A hop that crosses nodes is therefore routed as C = min(distinct NICs of the group's members on the sending
node, on the receiving node, RING_CHANNELS) parallel channels, the i-th sending member to the i-th receiving
member (first member per NIC, by rank: same rail on DGX), each carrying 1/C of the hop's bytes. A link's load
is the summed fraction of the hops crossing it, so concurrent rings through one node share its NICs; a group
with one member per node (tp=8 inside the node) has one channel, as before.
Results are cached per (sorted group, set of sorted concurrent groups), so reordered queries hit the cache;
`group_links` / `partition_links` answer many queries in one numpy pass (group_links.py). The caches are
`Topology.__init__`'s (topology.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from paracube.errors import check
from paracube.topologies.group_links import GroupLink, cached_group_links, one_group_link, partition_links
from paracube.topologies.link_loads import Channels, channel_arrays, link_load, ring_channels_many, uniform_nics
from paracube.topologies.ring_batch import RING_CHANNELS, nic_keys


class GroupQueries:
    """Rings of rank groups: their channels, link loads, and bandwidth and latency when groups share links."""
    def _group(self, ranks: Iterable[object]) -> tuple[int, ...]:
        arr = np.asarray(ranks) if isinstance(ranks, (list, tuple, np.ndarray)) else None
        if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":  # the usual case, vectorized
            bad = arr[(arr < 0) | (arr >= self.num_devices)]
            if bad.size:
                self._rank(int(bad[0]))  # raises, naming the rank
            group = tuple(np.sort(arr).tolist())
        else:
            group = tuple(sorted(self._rank(r) for r in ranks))
        check(len(set(group)) == len(group), f"group {list(group)} lists a rank twice")
        return group

    @staticmethod
    def _ring(group: tuple[int, ...]) -> list[tuple[int, int]]:
        if len(group) < 2:
            return []
        # Two ranks: a->b and b->a, both directions of the path are used.
        return list(zip(group, group[1:] + group[:1], strict=True))

    def _uniform_nics(self) -> bool:
        if self._nics_uniform is None:
            self._nics_uniform = uniform_nics(self)
        return self._nics_uniform

    def _nic_keys(self) -> np.ndarray:
        if self._nic_key_arr is None:
            self._nic_key_arr = nic_keys(self)
        return self._nic_key_arr

    def _owners(self, members: tuple[int, ...]) -> tuple[int, ...]:
        """The first member (by rank) of each distinct NIC the members use."""
        out = self._owner_cache.get(members)
        if out is None:
            seen: dict[str | None, int] = {}
            for r in members:
                seen.setdefault(self._nic_of(self._ranks[r]), r)
            out = self._owner_cache[members] = tuple(seen.values())
        return out

    def _crossing(self, src: tuple[int, ...], dst: tuple[int, ...], a: int, b: int) -> Channels:
        """Channels of hop a -> b between nodes whose group members are `src` and `dst` (module docstring)."""
        key = (src, dst, a, b)
        out = self._channel_cache.get(key)
        if out is None:
            senders, receivers = self._owners(src), self._owners(dst)
            c = max(1, min(len(senders), len(receivers), RING_CHANNELS))
            pairs = [(a, b)] if c == 1 else list(zip(senders[:c], receivers[:c], strict=False))
            out = self._channel_cache[key] = tuple((s, r, 1.0 / c) for s, r in pairs)
        return out

    def _ring_channels(self, group: tuple[int, ...]) -> list[Channels]:
        """Per hop of the (sorted) group's node-major ring: its channels as (sender, receiver, share of the
        hop's bytes); one channel, the hop itself, inside a node."""
        dpn = self.devices_per_node
        by_node: dict[int, list[int]] = {}
        for r in group:
            by_node.setdefault(r // dpn, []).append(r)
        if len(by_node) == 1:
            return [((a, b, 1.0),) for a, b in self._ring(group)]
        members = {n: tuple(m) for n, m in by_node.items()}
        return [((a, b, 1.0),) if a // dpn == b // dpn else self._crossing(members[a // dpn], members[b // dpn], a, b)
                for a, b in self._ring(group)]

    def ring_channels(self, ranks: Sequence[int]) -> list[Channels]:
        """The channels of each hop of the group's node-major ring (ranks sorted; module docstring): per hop,
        (sending rank, receiving rank, share of the hop's bytes) of each channel; route(s, r) is its path."""
        return self._ring_channels(self._group(ranks))

    def ring_channels_many(self, groups: np.ndarray) -> list[list[Channels]]:
        """`ring_channels` of each row of an [n_groups, size] rank array (translated groups computed once)."""
        arr = np.asarray(groups)
        rows = (self._sorted_rows(arr) if arr.ndim == 2 and arr.dtype.kind in "iu" and arr.size
                else [self._group(g) for g in groups])
        return ring_channels_many(self, rows)

    def ring_channel_arrays(self, groups: np.ndarray) -> tuple[np.ndarray, ...]:
        """Every channel of the rings of an [n_groups, size] rank array's rows, flattened (group, hop, channel
        order): (senders, receivers, shares, whether the channel is its hop's only one, its row)."""
        return channel_arrays(self, self._sorted_rows(np.asarray(groups)))

    def hop_edges(self, send: np.ndarray, recv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Routes of the hops send[i] -> recv[i] (valid, distinct ranks): (their edge ids, as route_hop's,
        concatenated in order; edges per hop; each hop's summed latency)."""
        rows = self._table.rows(np.asarray(send, dtype=np.int64), np.asarray(recv, dtype=np.int64))
        ids, lens = self._table.gather(rows)
        return ids, lens, self._table.latencies(rows)

    def _link_load(self, groups: frozenset[tuple[int, ...]]) -> np.ndarray:
        """Ring hops crossing each directed edge (indexed like _bw_arr) when `groups` run at once; a hop split
        into C channels puts 1/C on each channel's edges."""
        return link_load(self, self._table, list(groups))  # link_loads.py: numpy gathers, the loop's floats

    def _group_link_uncached(self, group: tuple[int, ...], groups: frozenset[tuple[int, ...]]) -> GroupLink:
        return one_group_link(self, group, groups)  # group_links.py

    def ring_loads(self, ranks: Sequence[int], concurrent: Sequence[Sequence[int]] = ()) -> tuple[np.ndarray, ...]:
        """(edge ids of the group's ring hops, ring hops crossing every edge with `concurrent` running, every
        edge's bandwidth): what topologies/sharing.py splits between two sets of groups running at once."""
        group = self._group(ranks)
        # its channels' edges (the set: np.unique sorts), by the hop table (each pair's _hops ids; ring_batch.py's
        # channels are _ring_channels', in its order)
        send, recv = channel_arrays(self, [group])[:2]
        ids = self._table.gather(self._table.rows(send, recv))[0] if len(send) else np.zeros(0, dtype=np.int64)
        edges = np.unique(ids)
        return edges, self._load_cached(self._groups(concurrent) | {group}), self._bw_arr

    def group_link(self, ranks: Sequence[int], concurrent: Sequence[Sequence[int]] = ()) -> GroupLink:
        """Ring bandwidth and per-step latency of `ranks`, sharing links with `concurrent` groups."""
        return self.group_links([(ranks, concurrent)])[0]

    def group_links(self, queries: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]) -> list[GroupLink]:
        """group_link of each (ranks, concurrent) query; the new ones computed together (group_links.py)."""
        keys = []
        for ranks, concurrent in queries:
            group = self._group(ranks)
            keys.append((group, self._groups(concurrent) | {group}))
        return cached_group_links(self, keys, self._links)

    def partition_links(self, parts: Sequence[np.ndarray]) -> list[GroupLink]:
        """group_link(p[0], concurrent=p[1:]) of each [n_groups, size] rank array of disjoint sorted rows (a mesh
        axis' groups); the same answers, without a frozenset per query (group_links.py: partition_links)."""
        return partition_links(self, parts, self._partitions)

    def _groups(self, concurrent: Sequence[Sequence[int]]) -> frozenset[tuple[int, ...]]:
        """Canonical (sorted) groups; vectorized for the usual [n_groups, size] integer array."""
        if len(concurrent) == 0:
            return frozenset()
        try:
            arr = np.asarray(concurrent)
        except ValueError:  # ragged lists
            arr = None
        if arr is None or arr.ndim != 2 or arr.dtype.kind not in "iu" or arr.size == 0:
            return frozenset(self._group(g) for g in concurrent)
        return frozenset(self._sorted_rows(arr))

    def _sorted_rows(self, arr: np.ndarray) -> list[tuple[int, ...]]:
        """Each row of a 2-D integer rank array as a sorted tuple, checked like _group."""
        arr = np.sort(arr, axis=1)
        bad = arr[(arr < 0) | (arr >= self.num_devices)]
        if bad.size:
            self._rank(int(bad[0]))  # raises, naming the rank
        dup = np.nonzero((np.diff(arr, axis=1) == 0).any(axis=1))[0]
        check(dup.size == 0, f"group {arr[dup[0]].tolist() if dup.size else []} lists a rank twice")
        return list(map(tuple, arr.tolist()))
