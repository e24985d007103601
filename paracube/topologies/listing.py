"""The headline figures of a preset (`paracube topologies`) from the preset's own constants, no graph.

`describe_preset(name, nodes)` equals `load_topology(name, nodes=nodes).describe()` (tests/test_topologies.py
checks every preset) without importing networkx, numpy or pydantic, so that listing the presets starts fast.
It follows the routes of routing.py for the presets' shapes: the intra-node ring's worst hop, and the
inter-node ring of local rank 0 of every node, GPU -> its NIC -> leaf [-> spine -> leaf] -> NIC -> GPU; its
bandwidth is the narrowest link (one ring hop per directed link), its latency the path's summed latencies.
"""

from __future__ import annotations

from typing import Any

from paracube.errors import check, unknown
from paracube.topologies import presets as p
from paracube.topologies.device import DeviceSpec

Leg = tuple[float, float]  # (bandwidth bytes/s, latency s) of one link on a path


def _switched(name: str, nodes: int) -> dict[str, Any]:
    a = p.switched_links(name, p.PRESETS[name].devices_per_node)
    gpu_to_nic: list[Leg] = ([(a["pcie_bandwidth"], p.PCIE_LAT)] if a["nics_per_node"] == a["devices_per_node"]
                             else [(a["intra_bandwidth"], a["intra_latency"]), (a["pcie_bandwidth"], p.PCIE_LAT)])
    intra = [(a["intra_bandwidth"], a["intra_latency"])] * 2
    return _describe(name, a["device"], nodes, a["devices_per_node"], intra, gpu_to_nic + [
        (a["inter_bandwidth"], a["inter_latency"])], a["nics_per_node"], a["nodes_per_leaf"],
        p.DEVICE_EFF.get(a["device"].name) is not None)


def _longhorn(nodes: int) -> dict[str, Any]:
    intra = [(p.NVLINK2_X3, p.NVLINK_LAT), (p.XBUS, p.SMP_LAT), (p.NVLINK2_X3, p.NVLINK_LAT)]  # GPU1 -> GPU2
    to_leaf = [(p.NVLINK2_X3, p.NVLINK_LAT), (p.PCIE4_X16, p.PCIE_LAT), (p.EDR_IB, p.NIC_LAT)]
    return _describe("longhorn", p.V100_SXM2_16GB, nodes, 4, intra, to_leaf, 1, p.LEAF_NODES_36)


def _frontera_rtx(nodes: int) -> dict[str, Any]:
    intra = [(p.PCIE3_X16, p.PCIE_LAT)] * 2
    to_leaf = [(p.PCIE3_X16, p.PCIE_LAT), (p.PCIE3_X16, p.PCIE_LAT), (p.FDR_IB, p.NIC_LAT)]
    return _describe("frontera-rtx", p.RTX5000_16GB, nodes, 4, intra, to_leaf, 1, p.LEAF_NODES_36)


def _local_cpu(nodes: int) -> dict[str, Any]:
    check(nodes == 1, f"local-cpu: nodes={nodes!r}; valid: 1 (this machine)")
    processes = p.PRESETS["local-cpu"].devices_per_node
    intra = [p.local_cpu_link(processes)] * 2
    return _describe("local-cpu", p.local_cpu_device(processes), 1, processes, intra, [], 0, 1)


def _describe(name: str, device: DeviceSpec, nodes: int, dpn: int, intra: list[Leg], to_leaf: list[Leg],
              nics: int, per_leaf: int, calibrated: bool = False) -> dict[str, Any]:
    """Topology.describe()'s dict; `intra`: the worst intra-node ring hop's links; `to_leaf`: GPU 0 to its
    leaf switch (the last leg is the NIC's link)."""
    out: dict[str, Any] = {
        "name": name, "device": device.name, "nodes": nodes, "devices_per_node": dpn, "devices": nodes * dpn,
        "peak_flops": dict(device.peak_flops), "memory_bytes": device.memory_bytes,
        "memory_bandwidth": device.memory_bandwidth,
        "intra_node_bandwidth": min(b for b, _ in intra), "intra_node_latency": sum(lat for _, lat in intra),
    }
    if nodes > 1:
        nic_bandwidth = to_leaf[-1][0]
        spine = [(per_leaf * nic_bandwidth, p.SPINE_LAT)] * 2 if nodes > per_leaf else []  # several leaves
        path = to_leaf + spine + to_leaf[::-1]
        out.update(inter_node_bandwidth=min(b for b, _ in path), inter_node_latency=sum(lat for _, lat in path),
                   nics_per_node=nics, injection_bandwidth_per_node=sum([nic_bandwidth] * nics))
    if calibrated:
        out["calibrated"] = True
    return out


def preset_sources(name: str) -> dict[str, str]:
    """Where each efficiency figure a preset prices with came from (efficiency.sources): `paracube topologies`
    prints them, NOT FITTED where no run exercises the figure."""
    from paracube.topologies import efficiency, nvswitch

    check(name in p.PRESETS, f"unknown topology {name!r}; valid presets: {', '.join(p.PRESETS)}")
    if name in nvswitch.SYSTEMS:
        return efficiency.sources(nvswitch.SYSTEMS[name].device, *nvswitch.fabrics(name))
    device = {"longhorn": p.V100_SXM2_16GB, "frontera-rtx": p.RTX5000_16GB}.get(name)
    if device is None:  # local-cpu: probed on this machine, `paracube calibrate` measures the rest
        return {"all": "probed on this machine (cpu_probe.py); `paracube calibrate` measures the rest"}
    return efficiency.sources(device)


def describe_preset(name: str, nodes: int | None = None) -> dict[str, Any]:
    """A preset's headline figures at its default size (or `nodes` nodes of its default node size)."""
    if name not in p.PRESETS:
        raise unknown("topology", name, p.PRESETS)
    n = p.PRESETS[name].default_nodes if nodes is None else nodes
    check(isinstance(n, int) and n >= 1, f"{name}: nodes={nodes!r} must be >= 1")
    if name == "longhorn":
        return _longhorn(n)
    if name == "frontera-rtx":
        return _frontera_rtx(n)
    if name == "local-cpu":
        return _local_cpu(n)
    return _switched(name, n)
