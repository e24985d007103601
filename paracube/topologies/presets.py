"""Cluster presets from public spec sheets, with the node count (and GPUs per node) as parameters.

Link figures are nominal per-direction data rates (bytes/s, rates.py); latencies are rough per-link figures
(s). `paracube calibrate` replaces both with measured values. Devices: devices.py; graph builders (NVSwitch
nodes on a rail-optimized two-level fat tree): fabric.py; the NVSwitch systems (DGX, GB200 NVL72):
nvswitch.py; fitted efficiencies and where each came from: efficiency.py. Here: the TACC machines, this
machine, and the `PRESETS` table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paracube.errors import check
from paracube.topologies.devices import (  # noqa: F401  (re-exported)
    A100_SXM_80GB,
    B200_GB200_186GB,
    B200_SXM_180GB,
    DEVICES,
    H100_SXM_80GB,
    H200_SXM_141GB,
    RTX5000_16GB,
    V100_SXM2_16GB,
    V100_SXM3_32GB,
)
from paracube.topologies.efficiency import (  # noqa: F401  (re-exported: listing.py, from_runs.py, tests)
    DEVICE_EFF,
    FABRIC_EFF,
    fabric_eff,
)
from paracube.topologies.efficiency_calibration import Fit, published_calibration  # noqa: F401  (re-exported)
from paracube.topologies.fabric import add_fat_tree, add_gpu, build_switched, make_topology, new_graph  # noqa: F401
from paracube.topologies.local_cpu import (  # noqa: F401  (re-exported: listing.py, tests)
    CPU_OP_S,
    CPU_STEP_WAIT_S,
    SHM_BANDWIDTH,
    SHM_LATENCY,
    host_cores,
    local_cpu_device,
    local_cpu_link,
    ranks_per_core,
)
from paracube.topologies.nvswitch import (  # noqa: F401  (re-exported)
    dgx2_v100,
    dgx_a100,
    dgx_b200,
    dgx_h100,
    dgx_h200,
    gb200_nvl72,
    switched_links,
)
from paracube.topologies.rates import (  # noqa: F401  (re-exported: listing.py, tests)
    EDR_IB,
    FDR_IB,
    HDR_IB,
    LEAF_NODES_36,
    NDR_IB,
    NIC_LAT,
    NVLINK2_BRICK,
    NVLINK2_X3,
    NVLINK_LAT,
    PCIE3_X16,
    PCIE4_X16,
    PCIE5_X16,
    PCIE_LAT,
    SMP_LAT,
    SPINE_LAT,
    XBUS,
    XDR_IB,
    GiB,
)

if TYPE_CHECKING:
    from paracube.topologies.topology import Topology


def longhorn(nodes: int = 16, gpus_per_node: int = 4, oversubscription: float = 1.0) -> Topology:
    """TACC Longhorn: IBM AC922 nodes, 2 POWER9 + 4 V100-SXM2-16GB, one Mellanox EDR HCA per node.

    AC922 4-GPU wiring (IBM Redpaper REDP-5472): each V100's 6 NVLink 2.0 bricks go 3 to its socket's
    POWER9 (75 GB/s each way) and 3 to the other GPU of that socket (75 GB/s each way); the sockets
    talk over the X-bus, 64 GB/s quoted, taken here as 32 GB/s each way. The EDR HCA (100 Gb/s, one per
    node as TACC lists it) sits in a PCIe Gen4 x16 slot of socket 0. Leaves: 36-port EDR, 18 nodes each.
    """
    check(1 <= gpus_per_node <= 4, f"longhorn: gpus_per_node={gpus_per_node!r}; valid: 1..4")
    g = new_graph()
    nics: list[list[str]] = []
    for i in range(nodes):
        cpus = [f"n{i}.cpu0", f"n{i}.cpu1"]
        for cpu in cpus:
            g.add_node(cpu, kind="cpu", node_index=i)
        g.add_edge(cpus[0], cpus[1], bandwidth=XBUS, latency=SMP_LAT)
        gpus = [add_gpu(g, i, j) for j in range(gpus_per_node)]
        for j, gpu in enumerate(gpus):
            g.add_edge(gpu, cpus[j // 2], bandwidth=NVLINK2_X3, latency=NVLINK_LAT)
            if j % 2 == 1:
                g.add_edge(gpus[j - 1], gpu, bandwidth=NVLINK2_X3, latency=NVLINK_LAT)
        if nodes > 1:
            nic = f"n{i}.nic0"
            g.add_node(nic, kind="nic", node_index=i)
            g.add_edge(nic, cpus[0], bandwidth=PCIE4_X16, latency=PCIE_LAT)
            nics.append([nic])
    add_fat_tree(g, nics, EDR_IB, nodes_per_leaf=LEAF_NODES_36, oversubscription=oversubscription)
    return make_topology("longhorn", g, V100_SXM2_16GB, nodes, gpus_per_node)


def frontera_rtx(nodes: int = 16, gpus_per_node: int = 4, oversubscription: float = 1.0) -> Topology:
    """TACC Frontera RTX nodes: 4 x Quadro RTX 5000 16GB on PCIe 3.0 x16, one FDR InfiniBand HCA (56 Gb/s).

    Simplification: one PCIe root per node (modelled as a "cpu" node) that all GPUs and the HCA hang off;
    GPU-to-GPU traffic crosses it at PCIe 3.0 x16 (15.75 GB/s each way). Leaves: 36-port FDR, 18 nodes each.
    """
    check(1 <= gpus_per_node <= 4, f"frontera-rtx: gpus_per_node={gpus_per_node!r}; valid: 1..4")
    g = new_graph()
    nics: list[list[str]] = []
    for i in range(nodes):
        root = f"n{i}.cpu"
        g.add_node(root, kind="cpu", node_index=i)
        for j in range(gpus_per_node):
            g.add_edge(add_gpu(g, i, j), root, bandwidth=PCIE3_X16, latency=PCIE_LAT)
        if nodes > 1:
            nic = f"n{i}.nic0"
            g.add_node(nic, kind="nic", node_index=i)
            g.add_edge(nic, root, bandwidth=PCIE3_X16, latency=PCIE_LAT)
            nics.append([nic])
    add_fat_tree(g, nics, FDR_IB, nodes_per_leaf=LEAF_NODES_36, oversubscription=oversubscription)
    return make_topology("frontera-rtx", g, RTX5000_16GB, nodes, gpus_per_node)


def local_cpu(nodes: int = 1, gpus_per_node: int = 8, oversubscription: float = 1.0) -> Topology:
    """This machine: `gpus_per_node` CPU processes (kind "gpu": the rank's device) talking gloo through
    shared memory / loopback, modelled as a hub. Figures until `paracube calibrate` measures them: a core's
    fp32 GEMM peak, per-op and per-call overheads probed once on this machine and cached (local_cpu.py,
    cpu_probe.py; fixed figures with PARACUBE_NO_CPU_PROBE=1: 100 GFLOP/s, 4 us, 1.1 ms), fp16/bf16 at a
    quarter of fp32 (CPUs rarely have fast half-precision GEMMs), 2 GB/s and 50 us per message between two
    processes (25 us per link of the hub), host memory split evenly; with more processes than cores, each
    process's share of a core (local_cpu_device, local_cpu_link)."""
    del oversubscription  # no network
    check(nodes == 1, f"local-cpu: nodes={nodes!r}; valid: 1 (this machine)")
    check(gpus_per_node >= 1, f"local-cpu: devices={gpus_per_node!r} must be >= 1")
    device = local_cpu_device(gpus_per_node)
    bandwidth, latency = local_cpu_link(gpus_per_node)
    g = new_graph()
    g.add_node("n0.shm", kind="cpu", node_index=0)
    for j in range(gpus_per_node):
        g.add_node(f"n0.proc{j}", kind="gpu", node_index=0, local_rank=j)
        g.add_edge(f"n0.proc{j}", "n0.shm", bandwidth=bandwidth, latency=latency)
    return make_topology("local-cpu", g, device, 1, gpus_per_node)


@dataclass(frozen=True)
class Preset:
    name: str
    build: Callable[..., Topology]  # (nodes, gpus_per_node, oversubscription) -> Topology
    devices_per_node: int  # physical devices per node (local-cpu: the default process count)
    default_nodes: int
    description: str
    fixed_nodes: bool = False  # local-cpu: always one node, `gpus` sets the process count
    # GPUs per host where a node (NVLink domain) spans several hosts: such a node may be used in part, in whole
    # hosts (gb200-nvl72: 4 per compute tray); 0: nodes are used whole
    devices_per_host: int = 0


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("longhorn", longhorn, 4, 16, "TACC Longhorn: 4 x V100-SXM2-16GB (NVLink 2.0 pairs), 1 x EDR IB"),
    Preset("frontera-rtx", frontera_rtx, 4, 16, "TACC Frontera RTX: 4 x Quadro RTX 5000, PCIe 3, 1 x FDR IB"),
    Preset("dgx2-v100", dgx2_v100, 16, 16, "DGX-2: 16 x V100-SXM3-32GB, NVSwitch 150 GB/s, 8 x EDR 100 Gb/s"),
    Preset("dgx-a100", dgx_a100, 8, 16, "DGX A100: 8 x A100-SXM-80GB, NVSwitch 300 GB/s, 8 x HDR 200 Gb/s"),
    Preset("dgx-h100", dgx_h100, 8, 16, "DGX H100: 8 x H100-SXM-80GB, NVSwitch 450 GB/s, 8 x NDR 400 Gb/s"),
    Preset("dgx-h200", dgx_h200, 8, 16, "DGX H200: 8 x H200 141 GB (4.8 TB/s), NVSwitch 450 GB/s, 8 x NDR"),
    Preset("dgx-b200", dgx_b200, 8, 16, "DGX B200: 8 x B200 180 GB (8 TB/s), NVLink 5 900 GB/s, 8 x NDR"),
    Preset("gb200-nvl72", gb200_nvl72, 72, 2, "GB200 NVL72: 72 x B200 in one NVLink 5 domain (900 GB/s), "
           "4 per Grace host, 72 x NDR per rack", devices_per_host=4),
    Preset("local-cpu", local_cpu, 8, 1, "this machine: 8 gloo CPU processes (calibrate to measure)",
           fixed_nodes=True),
]}
