"""link_graph.LinkGraph against networkx.Graph (reference vs candidate): the same operations give the same nodes,
edges, adjacency orders and attributes, and a Topology built on either routes, numbers its links and prices its
groups identically (the builders fill a LinkGraph so that planning imports no networkx)."""

from __future__ import annotations

import networkx as nx
import numpy as np

from paracube.topologies.devices import A100_SXM_80GB
from paracube.topologies.fabric import add_fat_tree, add_gpu
from paracube.topologies.link_graph import LinkGraph
from paracube.topologies.topology import Topology


def _rail_cluster(g: object, nodes: int, dpn: int, nics: int) -> None:
    """The op sequence of fabric.build_switched (NVSwitch, NICs off the GPUs or the switch), 2 nodes per leaf so
    that the fabric has several leaves and a spine; a re-added node and a re-added edge update attributes."""
    all_nics = []
    for i in range(nodes):
        switch = f"n{i}.switch"
        g.add_node(switch, kind="switch", node_index=i)  # type: ignore[attr-defined]
        names = [f"n{i}.nic{k}" for k in range(nics)]
        for nic in names:
            g.add_node(nic, kind="nic", node_index=i)  # type: ignore[attr-defined]
        for j in range(dpn):
            gpu = add_gpu(g, i, j) if nics == dpn else add_gpu(g, i, j, nic=names[j * nics // dpn])  # type: ignore
            g.add_edge(gpu, switch, bandwidth=300e9, latency=1e-6)  # type: ignore[attr-defined]
            if nics == dpn:
                g.add_edge(gpu, names[j], bandwidth=32e9, latency=2e-6)  # type: ignore[attr-defined]
        if nics != dpn:
            for nic in names:
                g.add_edge(nic, switch, bandwidth=32e9, latency=2e-6)  # type: ignore[attr-defined]
        all_nics.append(names)
    g.add_node("n0.switch", kind="switch", node_index=0)  # type: ignore[attr-defined]
    g.add_edge("n0.gpu1", "n0.switch", latency=1e-6)  # type: ignore[attr-defined]
    add_fat_tree(g, all_nics, 25e9, 3e-6, nodes_per_leaf=2)  # type: ignore[arg-type]


def _orders(g: object) -> tuple[list, list, dict]:
    return (list(g.nodes(data=True)), list(g.edges(data=True)),  # type: ignore[attr-defined]
            {u: list(g.adj[u].items()) for u in g.nodes})  # type: ignore[attr-defined]


def test_link_graph_keeps_networkx_orders() -> None:
    for nics in (8, 2):
        ref, cand = nx.Graph(), LinkGraph()
        _rail_cluster(ref, 4, 8, nics)
        _rail_cluster(cand, 4, 8, nics)
        assert _orders(cand) == _orders(ref)
        assert _orders(cand.copy()) == _orders(ref.copy())
        assert _orders(cand.to_networkx()) == _orders(nx.freeze(ref.copy()))
        assert ("n0.gpu0" in cand, "nope" in cand, cand.has_edge("n0.switch", "n0.gpu0"),
                cand.number_of_nodes()) == ("n0.gpu0" in ref, "nope" in ref, ref.has_edge("n0.switch", "n0.gpu0"),
                                            ref.number_of_nodes())


def test_topology_on_a_link_graph_equals_one_on_networkx() -> None:
    """Edge ids, routes, ring channels, group links (alone and with concurrent groups) and the explicit form."""
    for nics in (8, 2):
        ref_g, cand_g = nx.Graph(), LinkGraph()
        _rail_cluster(ref_g, 4, 8, nics)
        _rail_cluster(cand_g, 4, 8, nics)
        ref, cand = Topology("t", ref_g, A100_SXM_80GB, 4, 8), Topology("t", cand_g, A100_SXM_80GB, 4, 8)
        assert cand.edges == ref.edges and cand.to_dict() == ref.to_dict() and cand == ref
        assert _orders(cand.graph) == _orders(ref.graph)
        for a, b in [(0, 1), (0, 9), (3, 30), (31, 0), (8, 17)]:
            assert cand.route(a, b) == ref.route(a, b)
            ids_c, lat_c = cand.route_hop(a, b)
            ids_r, lat_r = ref.route_hop(a, b)
            assert ids_c.tolist() == ids_r.tolist() and lat_c == lat_r
        ranks = np.arange(32)
        for groups in (ranks.reshape(-1, 4), ranks.reshape(4, 8).T, ranks.reshape(2, 16), ranks.reshape(8, 4).T):
            assert cand.group_link(groups[0], concurrent=groups[1:]) == ref.group_link(groups[0],
                                                                                       concurrent=groups[1:])
            assert cand.ring_channels(groups[0]) == ref.ring_channels(groups[0])
        assert cand.describe() == ref.describe()
