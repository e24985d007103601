"""A cluster as a graph (link_graph.py; `graph`: networkx), and what a collective over a group of ranks sees on it.

Graph: nodes have `kind` in {"gpu", "nic", "switch", "cpu"}. A "gpu" node is the compute device that holds
one rank (a CPU process for `local-cpu`) and carries `node_index` and `local_rank`; rank r is local GPU
r % devices_per_node of node r // devices_per_node. Other nodes that belong to one machine (its NICs, CPUs,
NVSwitch) may carry `node_index` too; nodes without it form the network fabric (leaf and spine switches).
A GPU may name its NIC in a `nic` attribute; otherwise it uses the nearest NIC of its node. Edges carry
`bandwidth` (bytes/s in one direction; links are full duplex) and `latency` (s), both > 0.

Routing (`route`): inside a node, the shortest path in that node's own subgraph; between nodes,
GPU -> its NIC (inside the node) -> the NIC's fabric switch -> shortest fabric path -> the peer NIC -> GPU.
Graphs without that structure fall back to a shortest path on the whole graph. Paths are cached per pair.

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
`group_links` / `partition_links` answer many queries in one numpy pass (group_links.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from paracube.errors import check
from paracube.topologies.calibration import Calibration, as_calibration
from paracube.topologies.device import DeviceSpec, _positive
from paracube.topologies.group_links import GroupLink, cached_group_links, one_group_link, partition_links
from paracube.topologies.link_graph import LinkGraph
from paracube.topologies.link_loads import (
    HopParts,
    HopTable,
    channel_arrays,
    link_load,
    ring_channels_many,
    uniform_nics,
)
from paracube.topologies.ring_batch import RING_CHANNELS, nic_keys

NODE_KINDS: tuple[str, ...] = ("gpu", "nic", "switch", "cpu")
Edge = tuple[str, str]
Channels = tuple[tuple[int, int, float], ...]  # a ring hop: (sending rank, receiving rank, share) per channel


class Topology:
    """A homogeneous cluster: `num_nodes` machines of `devices_per_node` devices of one DeviceSpec.

    The graph is frozen on construction (queries are cached). `calibration` is what `paracube calibrate`
    measured (topologies.calibration.Calibration; a mapping in the YAML shape is parsed on assignment, a
    malformed one refused); it round-trips through YAML.
    """

    def __init__(self, name: str, graph: Any, device: DeviceSpec, num_nodes: int, devices_per_node: int,
                 calibration: Calibration | Mapping[str, Any] | None = None) -> None:
        check(isinstance(num_nodes, int) and num_nodes >= 1,
              f"topology {name!r}: nodes={num_nodes!r} must be >= 1")
        check(isinstance(devices_per_node, int) and devices_per_node >= 1,
              f"topology {name!r}: devices_per_node={devices_per_node!r} must be >= 1")
        self.name = name
        self.device = device
        self.num_nodes = num_nodes
        self.devices_per_node = devices_per_node
        self.calibration = calibration  # parsed by the setter
        # a LinkGraph (the builders': no networkx on the planning path) or a networkx.Graph, copied either way
        self._graph: Any = graph.copy() if isinstance(graph, LinkGraph) else _frozen(graph)
        self._ranks: list[str] = self._validate()
        g = self._graph
        self._adj: dict[str, tuple[str, ...]] = {u: tuple(g.adj[u]) for u in g.nodes}
        self._node_of: dict[str, int | None] = {u: g.nodes[u].get("node_index") for u in g.nodes}
        self._bw: dict[Edge, float] = {}
        self._lat: dict[Edge, float] = {}
        for u, v, data in g.edges(data=True):
            self._bw[(u, v)] = self._bw[(v, u)] = float(data["bandwidth"])
            self._lat[(u, v)] = self._lat[(v, u)] = float(data["latency"])
        self._paths: dict[tuple[str, str], tuple[str, ...]] = {}
        self._members: dict[int, list[str]] = {}
        for u, ni in self._node_of.items():
            if ni is not None:
                self._members.setdefault(ni, []).append(u)
        self._templates: dict[int, tuple[int, str]] = {}
        self._sig_ids: dict[tuple[frozenset, frozenset], int] = {}
        self._tpl_paths: dict[tuple[int, str, str], tuple[str, ...] | None] = {}
        self._fabric: dict[str, tuple[dict[str, str | None], deque[str]]] = {}  # source switch -> BFS so far
        self._egress: dict[str, str | None] = {}
        self._tpl_nics: dict[tuple[int, str], str | None] = {}
        # Per-instance caches (no global state): keyed by canonical (sorted) rank tuples.
        self._links: dict[tuple[tuple[int, ...], frozenset[tuple[int, ...]]], GroupLink] = {}  # group_link's
        self._partitions: dict[tuple, GroupLink] = {}  # partition_links' answers, by the array's bytes
        self._load_cached = lru_cache(maxsize=512)(self._link_load)
        self._in_node_paths: dict[tuple[str, str], tuple[str, ...] | None] = {}
        # Ring hop (rank a -> rank b): its directed edges as ids into _bw_arr, and its summed latency. Link loads
        # are bincounts of hop edge ids (one numpy call per set of concurrent groups, not a Counter of edges).
        self._eid: dict[Edge, int] = {e: i for i, e in enumerate(self._bw)}
        self._edges: list[Edge] = list(self._bw)  # id -> edge (route() reads the hop cache's ids)
        self._bw_arr = np.array(list(self._bw.values()), dtype=np.float64)
        self._hop_cache: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        self._channel_cache: dict[tuple[tuple[int, ...], tuple[int, ...], int, int], Channels] = {}  # crossings
        self._owner_cache: dict[tuple[int, ...], tuple[int, ...]] = {}  # a node's group members -> NIC owners
        self._lat_of: list[float] = [self._lat[e] for e in self._edges]  # id -> latency
        self._parts = HopParts(self)  # routes between nodes by cached pieces (link_loads.py)
        self._table = HopTable(self)  # every hop's edge ids as one array: link loads by numpy gathers
        self._nics_uniform: bool | None = None
        self._nic_key_arr: np.ndarray | None = None  # per rank, its NIC as an integer (ring_batch.nic_keys)

    @property
    def graph(self) -> Any:
        """The cluster as a frozen networkx.Graph (built on first use from a LinkGraph: link_graph.py)."""
        if isinstance(self._graph, LinkGraph):
            self._graph = self._graph.to_networkx()
        return self._graph

    @property
    def calibration(self) -> Calibration | None:
        return self._calibration

    @calibration.setter
    def calibration(self, value: Calibration | Mapping[str, Any] | None) -> None:
        self._calibration = as_calibration(value)

    # --- validation -----------------------------------------------------------------------------------
    def _validate(self) -> list[str]:
        # Each message is formatted only where its check fails (`if not ...: check(False, ...)`): a cluster of 1,024
        # GPUs has ~15k checks, and formatting every message took most of the ~8 ms this pass costs.
        g, where = self._graph, f"topology {self.name!r}"
        slots: dict[tuple[int, int], str] = {}
        n_nodes, dpn = self.num_nodes, self.devices_per_node
        for node, data in g.nodes(data=True):
            kind = data.get("kind")
            if kind not in NODE_KINDS:
                check(False, f"{where}: node {node!r} has kind={kind!r}; valid: {', '.join(NODE_KINDS)}")
            ni = data.get("node_index")
            if not (ni is None or (isinstance(ni, int) and 0 <= ni < n_nodes)):
                check(False, f"{where}: node {node!r} has node_index={ni!r}; valid: 0..{n_nodes - 1}")
            if kind != "gpu":
                continue
            lr = data.get("local_rank")
            if not (ni is not None and isinstance(lr, int) and 0 <= lr < dpn):
                check(False, f"{where}: device {node!r} needs node_index in 0..{n_nodes - 1} and local_rank in "
                      f"0..{dpn - 1}; got node_index={ni!r}, local_rank={lr!r}")
            if (ni, lr) in slots:
                check(False, f"{where}: devices {slots.get((ni, lr))!r} and {node!r} both claim "
                      f"node_index={ni}, local_rank={lr}")
            slots[(ni, lr)] = node
            nic = data.get("nic")
            if not (nic is None or (nic in g and g.nodes[nic].get("kind") == "nic")):
                check(False, f"{where}: device {node!r} names nic={nic!r}, which is not a nic node of the graph")
        expected = n_nodes * dpn
        check(len(slots) == expected, f"{where}: {len(slots)} devices on the graph, expected nodes x "
              f"devices_per_node = {n_nodes} x {dpn} = {expected}")
        for u, v, data in g.edges(data=True):
            for attr in ("bandwidth", "latency"):
                value = data.get(attr)
                if not _positive(value):
                    check(False, f"{where}: link {u!r}-{v!r} has {attr}={value!r}; "
                          "expected a positive number (bytes/s for bandwidth, seconds for latency)")
        ranks = [slots[(r // self.devices_per_node, r % self.devices_per_node)] for r in range(expected)]
        reachable, queue = {ranks[0]}, deque([ranks[0]])  # ranks[0]'s connected component
        while queue:
            for v in g.adj[queue.popleft()]:
                if v not in reachable:
                    reachable.add(v)
                    queue.append(v)
        for node in ranks:
            if node not in reachable:
                check(False, f"{where}: device {node!r} is disconnected from device {ranks[0]!r}")
        return ranks

    # --- basic queries --------------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def _rank(self, rank: object) -> int:
        if type(rank) is int and 0 <= rank < self.num_nodes * self.devices_per_node:  # fast path: no message
            return rank
        ok = hasattr(rank, "__index__") and not isinstance(rank, bool)  # int or numpy integer
        r = int(rank.__index__()) if ok else -1  # type: ignore[attr-defined]
        check(ok and 0 <= r < self.num_devices,
              f"rank {rank!r} is not on topology {self.name!r}; valid ranks: 0..{self.num_devices - 1}")
        return r

    def rank_node(self, rank: int) -> str:
        """Graph node of rank's device: rank r = GPU r % dpn of node r // dpn."""
        return self._ranks[self._rank(rank)]

    def route(self, a: int, b: int) -> list[Edge]:
        """Directed edges on the path from rank a's device to rank b's (empty when a == b)."""
        ids, _ = self._hops(self._rank(a), self._rank(b))  # the analytic model's hop cache, shared
        edges = self._edges
        return [edges[i] for i in ids.tolist()]

    # --- routing --------------------------------------------------------------------------------------
    # Machines are usually identical: paths inside a node are computed once per *template* (the node's
    # subgraph with the "n{i}." prefix stripped from names) and shared by every node with that template.
    def _template(self, ni: int) -> tuple[int, str]:
        if ni not in self._templates:
            members, prefix = self._members[ni], f"n{ni}."
            if not all(u.startswith(prefix) for u in members):
                prefix = ""  # irregular names: a template of its own
            cut = len(prefix)
            attrs, bw, lat, node_of = self._graph.nodes, self._bw, self._lat, self._node_of
            nodes = frozenset((u[cut:], attrs[u]["kind"], str(attrs[u].get("nic", ""))[cut:])
                              for u in members)
            edges = frozenset((u[cut:], v[cut:], bw[(u, v)], lat[(u, v)])  # both directions: no sorting
                              for u in members for v in self._adj[u] if node_of[v] == ni)
            sig = self._sig_ids.setdefault((nodes, edges), len(self._sig_ids))
            self._templates[ni] = (sig, prefix)
        return self._templates[ni]

    def _bfs(self, src: str, dst: str, ni: int | None = None) -> tuple[str, ...] | None:
        """Shortest path by hops (deterministic); with `ni`, only through nodes of machine `ni`."""
        parent: dict[str, str | None] = {src: None}
        queue = deque([src])
        while queue:
            u = queue.popleft()
            if u == dst:
                out = [u]
                while parent[out[-1]] is not None:
                    out.append(parent[out[-1]])  # type: ignore[arg-type]
                return tuple(reversed(out))
            for v in self._adj[u]:
                if v not in parent and (ni is None or self._node_of[v] == ni):
                    parent[v] = u
                    queue.append(v)
        return None

    def _in_node(self, src: str, dst: str) -> tuple[str, ...] | None:
        if (src, dst) in self._in_node_paths:  # a GPU's path to its NIC serves all of its cross-node hops
            return self._in_node_paths[src, dst]
        ni = self._node_of[src]
        assert ni is not None
        sig, prefix = self._template(ni)
        cut = len(prefix)
        key = (sig, src[cut:], dst[cut:])
        if key not in self._tpl_paths:
            path = self._bfs(src, dst, ni)
            self._tpl_paths[key] = None if path is None else tuple(u[cut:] for u in path)
        labels = self._tpl_paths[key]
        path = None if labels is None else tuple(prefix + u for u in labels)
        self._in_node_paths[src, dst] = path
        return path

    def _nic_of(self, gpu: str) -> str | None:
        """The GPU's `nic` attribute, else the nearest NIC of its node (BFS order breaks ties)."""
        if gpu not in self._egress:
            named = self._graph.nodes[gpu].get("nic")
            ni = self._node_of[gpu]
            sig, prefix = self._template(ni)  # type: ignore[arg-type]
            key = (sig, gpu[len(prefix):])
            if named is None and key in self._tpl_nics:  # same template, same answer
                label = self._tpl_nics[key]
                named = None if label is None else prefix + label
            elif named is None:
                seen, queue = {gpu}, deque([gpu])
                while queue and named is None:
                    u = queue.popleft()
                    for v in self._adj[u]:
                        if v not in seen and self._node_of[v] == ni:
                            if self._graph.nodes[v]["kind"] == "nic":
                                named = v
                                break
                            seen.add(v)
                            queue.append(v)
                self._tpl_nics[key] = None if named is None else named[len(prefix):]
            self._egress[gpu] = named
        return self._egress[gpu]

    def _fabric_path(self, nic_a: str, nic_b: str) -> tuple[str, ...] | None:
        """nic_a -> its (first) fabric switch -> shortest path over fabric nodes only -> nic_b."""
        ups_a = [v for v in self._adj[nic_a] if self._node_of[v] is None]
        ups_b = [v for v in self._adj[nic_b] if self._node_of[v] is None]
        if not ups_a or not ups_b:
            return None
        sa, sb = ups_a[0], ups_b[0]
        # One BFS tree per source switch, over fabric nodes only, grown lazily: the search pauses once `sb` is
        # found and resumes for a later destination. Parents are set at discovery in the same order as a full
        # BFS, so every path is the full tree's (a 16,384-GPU fabric: ~500 full BFS cost ~3 s).
        grown = self._fabric.get(sa)
        if grown is None:
            grown = self._fabric[sa] = ({sa: None}, deque([sa]))
        tree, queue = grown
        adj, node_of = self._adj, self._node_of
        while sb not in tree and queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in tree and node_of[v] is None:
                    tree[v] = u
                    queue.append(v)
        if sb not in tree:
            return None
        middle = [sb]
        while tree[middle[-1]] is not None:
            middle.append(tree[middle[-1]])  # type: ignore[arg-type]
        return (nic_a, *reversed(middle), nic_b)

    def _path(self, src: str, dst: str) -> tuple[str, ...]:
        key = (src, dst)
        cached = self._paths.get(key)
        if cached is not None:
            return cached
        path: tuple[str, ...] | None = None
        if self._node_of[src] == self._node_of[dst]:
            path = self._in_node(src, dst)
        else:
            nic_a, nic_b = self._nic_of(src), self._nic_of(dst)
            if nic_a is not None and nic_b is not None:
                first, last = self._in_node(src, nic_a), self._in_node(nic_b, dst)
                mid = self._fabric_path(nic_a, nic_b)
                if first and mid and last:
                    path = first[:-1] + mid + last[1:]
        if path is None:  # irregular graph: plain shortest path (connectivity was validated)
            path = self._bfs(src, dst)
        assert path is not None
        self._paths[key] = path
        return path

    # --- group queries --------------------------------------------------------------------------------
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

    def _hops(self, a: int, b: int) -> tuple[np.ndarray, float]:
        """Edge ids and summed latency of the ring hop from rank a to rank b (cached: groups of many layouts
        share hops)."""
        hops = self._hop_cache.get((a, b))
        if hops is None:
            dpn = self.devices_per_node
            parts = self._parts.hop(a, b) if a // dpn != b // dpn else None  # link_loads.HopParts: same route
            ids = None if parts is None else np.array(parts, dtype=np.int64)
            if ids is None:
                path = self._path(self._ranks[a], self._ranks[b])
                ids = np.array([self._eid[e] for e in zip(path, path[1:], strict=False)], dtype=np.int64)
            lat = self._lat_of
            hops = self._hop_cache[a, b] = (ids, sum(lat[i] for i in ids.tolist()))  # path order, as before
        return hops

    def route_hop(self, a: int, b: int) -> tuple[np.ndarray, float]:
        """`route(a, b)` as ids into `edges`, and its summed link latency (the analytic model's hop cache)."""
        return self._hops(self._rank(a), self._rank(b))

    @property
    def edges(self) -> list[Edge]:
        """Every directed edge, in the order of the ids route_hop returns."""
        return self._edges

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

    # --- export ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """YAML-serializable explicit form; `load_topology` of it gives an equal topology."""
        nodes = [{"id": n, **_plain(d)} for n, d in self._graph.nodes(data=True)]
        links = [{"a": u, "b": v, **_plain(d)} for u, v, d in self._graph.edges(data=True)]
        out: dict[str, Any] = {"name": self.name, "device": self.device.to_dict(), "nodes": self.num_nodes,
                               "devices_per_node": self.devices_per_node,
                               "graph": {"nodes": nodes, "links": links}}
        if self.calibration is not None:
            out["calibration"] = self.calibration.to_dict()
        return out

    def _canonical(self) -> tuple[Any, ...]:
        d = self.to_dict()
        nodes = sorted((n["id"], sorted(n.items())) for n in d["graph"]["nodes"])
        links = sorted((tuple(sorted((l["a"], l["b"]))), sorted(_attrs(l)))
                       for l in d["graph"]["links"])
        return d["name"], d["device"], d["nodes"], d["devices_per_node"], d.get("calibration"), nodes, links

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topology) and self._canonical() == other._canonical()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, {self.num_nodes} nodes x {self.devices_per_node} "
                f"{self.device.name}, {self._graph.number_of_nodes()} graph nodes)")

    def describe(self) -> dict[str, Any]:
        """Headline figures for `paracube topologies`."""
        dpn = self.devices_per_node
        node0 = self.group_link(range(dpn))
        out: dict[str, Any] = {
            "name": self.name, "device": self.device.name, "nodes": self.num_nodes, "devices_per_node": dpn,
            "devices": self.num_devices, "peak_flops": dict(self.device.peak_flops),
            "memory_bytes": self.device.memory_bytes, "memory_bandwidth": self.device.memory_bandwidth,
            "intra_node_bandwidth": node0.bandwidth, "intra_node_latency": node0.latency,
        }
        if self.num_nodes > 1:
            # One rank per node (local rank 0 on every node): what a cross-node ring of single GPUs gets.
            inter = self.group_link(range(0, self.num_devices, dpn))
            out.update(inter_node_bandwidth=inter.bandwidth, inter_node_latency=inter.latency)
            nics = [n for n in self._members.get(0, []) if self._graph.nodes[n]["kind"] == "nic"]
            out["nics_per_node"] = len(nics)
            out["injection_bandwidth_per_node"] = sum(
                self._bw[(n, v)] for n in nics for v in self._adj[n] if self._node_of[v] is None)
        if self.calibration is not None:
            out["calibrated"] = True
        return out


def _frozen(graph: Any) -> Any:
    """A frozen copy of a networkx graph (a caller's: networkx is loaded already)."""
    import networkx as nx

    return nx.freeze(graph.copy())


def _plain(attrs: dict[str, Any]) -> dict[str, Any]:
    """Attributes as YAML-safe Python scalars (numpy scalars become int/float)."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            value = value.item()
        out[key] = value
    return out


def _attrs(link: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in link.items() if k not in ("a", "b")]
