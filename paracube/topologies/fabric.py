"""The graph builders the presets share: GPUs on a node switch, NICs on a two-level fat tree.

Inter-node: NIC -> leaf switch -> spine, a two-level fat tree; the spine is one aggregate node whose link to
each leaf carries the leaf's whole uplink capacity (ideal ECMP), `oversubscription` divides it. With several
NICs per node the fabric is rail-optimized: NIC k of every node in a block of `nodes_per_leaf` nodes goes to
that block's leaf k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paracube.errors import check
from paracube.topologies.device import DeviceSpec
from paracube.topologies.rates import NIC_LAT, PCIE4_X16, PCIE_LAT, SPINE_LAT

if TYPE_CHECKING:  # numpy and the graph model load only when a topology is built (fast listing)
    from paracube.topologies.link_graph import LinkGraph
    from paracube.topologies.topology import Topology


def new_graph() -> LinkGraph:
    """An empty graph for a builder (link_graph.py: networkx's subset, without importing networkx)."""
    from paracube.topologies.link_graph import LinkGraph

    return LinkGraph()


def make_topology(*args: Any) -> Topology:
    from paracube.topologies.topology import Topology

    return Topology(*args)


def add_gpu(g: LinkGraph, node: int, local: int, **attrs: object) -> str:
    name = f"n{node}.gpu{local}"
    g.add_node(name, kind="gpu", node_index=node, local_rank=local, **attrs)
    return name


def add_fat_tree(g: LinkGraph, nics: list[list[str]], nic_bandwidth: float, nic_latency: float = NIC_LAT,
                 nodes_per_leaf: int | None = None, oversubscription: float = 1.0,
                 spine_latency: float = SPINE_LAT) -> None:
    """Connect NIC k of node i to leaf `leaf{i // nodes_per_leaf}[.rail{k}]`, and leaves to one spine."""
    check(oversubscription >= 1.0, f"oversubscription={oversubscription!r} must be >= 1 (1 = non-blocking)")
    per_leaf = nodes_per_leaf or max(1, len(nics))
    check(per_leaf >= 1, f"nodes_per_leaf={nodes_per_leaf!r} must be >= 1")
    rails = max((len(n) for n in nics), default=0)
    leaves: set[str] = set()
    for i, node_nics in enumerate(nics):
        for k, nic in enumerate(node_nics):
            leaf = f"leaf{i // per_leaf}" + (f".rail{k}" if rails > 1 else "")
            if leaf not in leaves:
                g.add_node(leaf, kind="switch")
                leaves.add(leaf)
            g.add_edge(nic, leaf, bandwidth=nic_bandwidth, latency=nic_latency)
    if len(leaves) > 1:  # ideal ECMP over the spine layer: one aggregate uplink per leaf
        g.add_node("spine", kind="switch")
        uplink = per_leaf * nic_bandwidth / oversubscription
        for leaf in sorted(leaves):
            g.add_edge(leaf, "spine", bandwidth=uplink, latency=spine_latency)


def build_switched(name: str, device: DeviceSpec, nodes: int, devices_per_node: int, intra_bandwidth: float,
                   intra_latency: float, inter_bandwidth: float, inter_latency: float, nics_per_node: int = 1,
                   pcie_bandwidth: float = PCIE4_X16, pcie_latency: float = PCIE_LAT,
                   nodes_per_leaf: int | None = None, oversubscription: float = 1.0,
                   spine_latency: float = SPINE_LAT) -> Topology:
    """Nodes whose GPUs share one switch (NVSwitch or PCIe switch) + a fat tree.

    nics_per_node == devices_per_node: NIC k hangs off GPU k (rail-optimized, as in DGX); otherwise the NICs
    hang off the node switch and GPU j uses NIC j * nics_per_node // devices_per_node.
    """
    check(nodes >= 1, f"{name}: nodes={nodes!r} must be >= 1")
    check(devices_per_node >= 1, f"{name}: devices_per_node={devices_per_node!r} must be >= 1")
    check(nics_per_node >= 1 or nodes == 1, f"{name}: nics_per_node={nics_per_node!r} must be >= 1")
    g = new_graph()
    all_nics: list[list[str]] = []
    per_gpu = nics_per_node == devices_per_node
    for i in range(nodes):
        switch = f"n{i}.switch"
        g.add_node(switch, kind="switch", node_index=i)
        nics = [f"n{i}.nic{k}" for k in range(nics_per_node)] if nodes > 1 else []
        for nic in nics:
            g.add_node(nic, kind="nic", node_index=i)
        for j in range(devices_per_node):
            nic = nics[j * nics_per_node // devices_per_node] if nics else None
            gpu = add_gpu(g, i, j) if per_gpu or nic is None else add_gpu(g, i, j, nic=nic)
            g.add_edge(gpu, switch, bandwidth=intra_bandwidth, latency=intra_latency)
            if nic is not None and per_gpu:
                g.add_edge(gpu, nic, bandwidth=pcie_bandwidth, latency=pcie_latency)
        if not per_gpu:
            for nic in nics:
                g.add_edge(nic, switch, bandwidth=pcie_bandwidth, latency=pcie_latency)
        all_nics.append(nics)
    add_fat_tree(g, all_nics, inter_bandwidth, inter_latency, nodes_per_leaf, oversubscription, spine_latency)
    return make_topology(name, g, device, nodes, devices_per_node)
