"""A cluster as a graph (link_graph.py; `graph`: networkx): `Topology`, its construction, checks and YAML form.

Graph: nodes have `kind` in {"gpu", "nic", "switch", "cpu"}. A "gpu" node is the compute device that holds
one rank (a CPU process for `local-cpu`) and carries `node_index` and `local_rank`; rank r is local GPU
r % devices_per_node of node r // devices_per_node. Other nodes that belong to one machine (its NICs, CPUs,
NVSwitch) may carry `node_index` too; nodes without it form the network fabric (leaf and spine switches).
A GPU may name its NIC in a `nic` attribute; otherwise it uses the nearest NIC of its node. Edges carry
`bandwidth` (bytes/s in one direction; links are full duplex) and `latency` (s), both > 0 (graph_validation.py
checks them). How a hop is routed is routing.py's; what a collective over a group of ranks sees, group_queries.py's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from paracube.errors import check
from paracube.topologies.calibration import Calibration, as_calibration
from paracube.topologies.device import DeviceSpec
from paracube.topologies.graph_validation import validate_graph
from paracube.topologies.group_links import GroupLink
from paracube.topologies.group_queries import GroupQueries
from paracube.topologies.link_graph import LinkGraph
from paracube.topologies.link_loads import Channels, HopParts, HopTable
from paracube.topologies.routing import Edge, Routing


class Topology(Routing, GroupQueries):
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
        self._ranks: list[str] = validate_graph(self._graph, name, num_nodes, devices_per_node)
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
