"""Cluster presets from public spec sheets, with the node count (and GPUs per node) as parameters.

Link figures are nominal per-direction data rates (bytes/s); latencies are rough per-link figures (s).
`paracube calibrate` replaces both with measured values. Inter-node: NIC -> leaf switch -> spine, a
two-level fat tree; the spine is one aggregate node whose link to each leaf carries the leaf's whole
uplink capacity (ideal ECMP), `oversubscription` divides it. With several NICs per node the fabric is
rail-optimized: NIC k of every node in a block of `nodes_per_leaf` nodes goes to that block's leaf k.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paracube.errors import check
from paracube.topologies.device import DeviceSpec
from paracube.topologies.local_cpu import (  # noqa: F401  (re-exported: listing.py, tests)
    CPU_CALL_WAIT_S,
    CPU_OP_S,
    SHM_BANDWIDTH,
    SHM_LATENCY,
    host_cores,
    local_cpu_device,
    local_cpu_link,
    ranks_per_core,
)

if TYPE_CHECKING:  # networkx, numpy and the graph model load only when a topology is built (fast listing)
    import networkx as nx

    from paracube.topologies.calibration import Calibration
    from paracube.topologies.topology import Topology

# --- link rates (bytes/s, one direction) ------------------------------------------------------------------
NVLINK2_BRICK = 25e9  # NVLink 2.0: 25 GB/s per direction per brick (V100 whitepaper)
PCIE3_X16 = 8e9 * 16 * 128 / 130 / 8  # 8 GT/s x16, 128b/130b -> 15.75 GB/s
PCIE4_X16 = 2 * PCIE3_X16  # 31.5 GB/s
PCIE5_X16 = 4 * PCIE3_X16  # 63 GB/s
FDR_IB = 56e9 * 64 / 66 / 8  # FDR 4x: 56 Gb/s signalling, 64b/66b -> 6.79 GB/s
EDR_IB = 100e9 / 8  # 12.5 GB/s
HDR_IB = 200e9 / 8  # 25 GB/s
NDR_IB = 400e9 / 8  # 50 GB/s
NVLINK2_X3 = 3 * NVLINK2_BRICK  # AC922: 3 bricks GPU-CPU and GPU-GPU (75 GB/s each way)
XBUS = 32e9  # AC922 POWER9 X-bus: 64 GB/s quoted, 32 each way
LEAF_NODES_36 = 18  # 36-port EDR / FDR leaf: 18 nodes down, 18 up

# --- rough latencies per link (s) ---------------------------------------------------------------------------
NVLINK_LAT = 0.5e-6
PCIE_LAT = 1.0e-6
SMP_LAT = 0.5e-6  # CPU-CPU socket link
NIC_LAT = 1.0e-6  # NIC + cable + leaf port
SPINE_LAT = 0.3e-6  # leaf-spine hop

GiB = 2**30

# --- devices ------------------------------------------------------------------------------------------------
# V100 SXM2 datasheet: 125 TF tensor fp16, 15.7 TF fp32, 900 GB/s HBM2. No bf16 hardware: bf16 at fp32 speed.
V100_SXM2_16GB = DeviceSpec("V100-SXM2-16GB", {"fp32": 15.7e12, "fp16": 125e12, "bf16": 15.7e12},
                            16 * GiB, 900e9)
# V100 SXM3 32GB (DGX-2 datasheet: 2 PFLOPS fp16 tensor over 16 GPUs = 125 TF each), 900 GB/s HBM2.
V100_SXM3_32GB = DeviceSpec("V100-SXM3-32GB", {"fp32": 15.7e12, "fp16": 125e12, "bf16": 15.7e12},
                            32 * GiB, 900e9)
# Quadro RTX 5000 datasheet: 89.2 TF tensor fp16, 11.2 TF fp32, 448 GB/s GDDR6. No bf16 (Turing).
RTX5000_16GB = DeviceSpec("Quadro-RTX-5000-16GB", {"fp32": 11.2e12, "fp16": 89.2e12, "bf16": 11.2e12},
                          16 * GiB, 448e9)
# A100 SXM 80GB datasheet: 312 TF bf16/fp16 dense, 156 TF tf32, 19.5 TF fp32, 2039 GB/s HBM2e.
A100_SXM_80GB = DeviceSpec("A100-SXM-80GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                           80 * GiB, 2039e9)
# H100 SXM 80GB datasheet: 989 TF bf16/fp16 dense, 494.7 TF tf32, 67 TF fp32, 3.35 TB/s HBM3.
H100_SXM_80GB = DeviceSpec("H100-SXM-80GB", {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989e12, "bf16": 989e12},
                           80 * GiB, 3.35e12)

DEVICES: dict[str, DeviceSpec] = {
    d.name: d for d in (V100_SXM2_16GB, V100_SXM3_32GB, RTX5000_16GB, A100_SXM_80GB, H100_SXM_80GB)}


# --- efficiencies fitted once on the published runs ------------------------------------------------------
# Peaks above stay the spec sheets'. These few efficiencies, the same for every run, were fitted by
# `paracube calibrate --from-runs benchmarks/data/published_runs.csv` (calibration/from_runs.py; fit and
# held-out rows: benchmarks/published_runs.py). Per device: GEMM efficiency curve eff_max x m/(m+m0) x
# n/(n+m0) x k/(k+m0) (compute.GemmModel, m0 = n0 = k0) and the memory-bound efficiency mem_eff (fraction
# of HBM bandwidth the fused elementwise kernels and Adam reach). Per fabric: the fraction of the nominal
# per-direction rate a collective reaches (NCCL bus bandwidth / link rate).
# Fitted 2026-11 on the fit rows of benchmarks/data/published_runs.csv (eff_max and mem_eff end at the upper
# ends of their plausible ranges, 0.95 and 0.9; with m0 ~ 330 a 4096^3 fp16 GEMM runs at 75% of peak).
DEVICE_EFF: dict[str, dict[str, float]] = {
    "A100-SXM-80GB": {"eff_max": 0.95, "m0": 332.0, "mem_eff": 0.90},
    "V100-SXM3-32GB": {"eff_max": 0.95, "m0": 171.0, "mem_eff": 0.90},
}
FABRIC_EFF: dict[str, float] = {"nvlink2-nvswitch": 0.47, "nvlink3-nvswitch": 0.50, "hdr-ib": 0.78}
# Not exercised by any published run of the set: H100 / NVLink4 / NDR take the A100 generation's figures,
# EDR the HDR one (stated, not fitted).
DEVICE_EFF["H100-SXM-80GB"] = DEVICE_EFF["A100-SXM-80GB"]
FABRIC_EFF.update({"nvlink4-nvswitch": FABRIC_EFF["nvlink3-nvswitch"], "ndr-ib": FABRIC_EFF["hdr-ib"],
                   "edr-ib": FABRIC_EFF["hdr-ib"]})


def fabric_eff(name: str) -> float:
    """The fitted efficiency of a fabric (H100's NVLink4 / NDR default to the A100 generation's)."""
    return FABRIC_EFF.get(name, 1.0)


def published_calibration(device: DeviceSpec, eff: dict[str, float] | None = None) -> Calibration | None:
    """The device's fitted GEMM / memory efficiencies (or `eff`) as a calibration (None: no fit)."""
    eff = eff or DEVICE_EFF.get(device.name)
    if eff is None:
        return None
    from paracube.topologies.calibration import Calibration, GemmFit

    m0 = eff["m0"]
    return Calibration(gemm=GemmFit(eff_max=eff["eff_max"], m0=m0, n0=m0, k0=m0, mem_eff=eff["mem_eff"]))


@dataclass(frozen=True)
class Fit:
    """Efficiencies of one cluster (a device and its two fabrics), as fitted by calibration/from_runs.py;
    a preset built with `fit=` uses them instead of the shipped DEVICE_EFF / FABRIC_EFF."""

    eff_max: float
    m0: float
    mem_eff: float
    intra: float  # NVLink / NVSwitch: fraction of the nominal rate a collective reaches
    inter: float  # InfiniBand

    def device(self) -> dict[str, float]:
        return {"eff_max": self.eff_max, "m0": self.m0, "mem_eff": self.mem_eff}


def _eff(fit: Fit | None, fabric: str) -> float:
    if fit is None:
        return fabric_eff(fabric)
    return fit.intra if fabric.startswith("nvlink") else fit.inter


def _fitted(topo: Topology, fit: Fit | None = None) -> Topology:
    topo.calibration = published_calibration(topo.device, None if fit is None else fit.device())
    return topo


def _graph() -> nx.Graph:
    import networkx as nx

    return nx.Graph()


def _topology(*args: Any) -> Topology:
    from paracube.topologies.topology import Topology

    return Topology(*args)


def _gpu(g: nx.Graph, node: int, local: int, **attrs: object) -> str:
    name = f"n{node}.gpu{local}"
    g.add_node(name, kind="gpu", node_index=node, local_rank=local, **attrs)
    return name


def add_fat_tree(g: nx.Graph, nics: list[list[str]], nic_bandwidth: float, nic_latency: float = NIC_LAT,
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
    g = _graph()
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
            gpu = _gpu(g, i, j) if per_gpu or nic is None else _gpu(g, i, j, nic=nic)
            g.add_edge(gpu, switch, bandwidth=intra_bandwidth, latency=intra_latency)
            if nic is not None and per_gpu:
                g.add_edge(gpu, nic, bandwidth=pcie_bandwidth, latency=pcie_latency)
        if not per_gpu:
            for nic in nics:
                g.add_edge(nic, switch, bandwidth=pcie_bandwidth, latency=pcie_latency)
        all_nics.append(nics)
    add_fat_tree(g, all_nics, inter_bandwidth, inter_latency, nodes_per_leaf, oversubscription, spine_latency)
    return _topology(name, g, device, nodes, devices_per_node)


def longhorn(nodes: int = 16, gpus_per_node: int = 4, oversubscription: float = 1.0) -> Topology:
    """TACC Longhorn: IBM AC922 nodes, 2 POWER9 + 4 V100-SXM2-16GB, one Mellanox EDR HCA per node.

    AC922 4-GPU wiring (IBM Redpaper REDP-5472): each V100's 6 NVLink 2.0 bricks go 3 to its socket's
    POWER9 (75 GB/s each way) and 3 to the other GPU of that socket (75 GB/s each way); the sockets
    talk over the X-bus, 64 GB/s quoted, taken here as 32 GB/s each way. The EDR HCA (100 Gb/s, one per
    node as TACC lists it) sits in a PCIe Gen4 x16 slot of socket 0. Leaves: 36-port EDR, 18 nodes each.
    """
    check(1 <= gpus_per_node <= 4, f"longhorn: gpus_per_node={gpus_per_node!r}; valid: 1..4")
    g = _graph()
    nics: list[list[str]] = []
    for i in range(nodes):
        cpus = [f"n{i}.cpu0", f"n{i}.cpu1"]
        for cpu in cpus:
            g.add_node(cpu, kind="cpu", node_index=i)
        g.add_edge(cpus[0], cpus[1], bandwidth=XBUS, latency=SMP_LAT)
        gpus = [_gpu(g, i, j) for j in range(gpus_per_node)]
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
    return _topology("longhorn", g, V100_SXM2_16GB, nodes, gpus_per_node)


def frontera_rtx(nodes: int = 16, gpus_per_node: int = 4, oversubscription: float = 1.0) -> Topology:
    """TACC Frontera RTX nodes: 4 x Quadro RTX 5000 16GB on PCIe 3.0 x16, one FDR InfiniBand HCA (56 Gb/s).

    Simplification: one PCIe root per node (modelled as a "cpu" node) that all GPUs and the HCA hang off;
    GPU-to-GPU traffic crosses it at PCIe 3.0 x16 (15.75 GB/s each way). Leaves: 36-port FDR, 18 nodes each.
    """
    check(1 <= gpus_per_node <= 4, f"frontera-rtx: gpus_per_node={gpus_per_node!r}; valid: 1..4")
    g = _graph()
    nics: list[list[str]] = []
    for i in range(nodes):
        root = f"n{i}.cpu"
        g.add_node(root, kind="cpu", node_index=i)
        for j in range(gpus_per_node):
            g.add_edge(_gpu(g, i, j), root, bandwidth=PCIE3_X16, latency=PCIE_LAT)
        if nodes > 1:
            nic = f"n{i}.nic0"
            g.add_node(nic, kind="nic", node_index=i)
            g.add_edge(nic, root, bandwidth=PCIE3_X16, latency=PCIE_LAT)
            nics.append([nic])
    add_fat_tree(g, nics, FDR_IB, nodes_per_leaf=LEAF_NODES_36, oversubscription=oversubscription)
    return _topology("frontera-rtx", g, RTX5000_16GB, nodes, gpus_per_node)


def dgx_a100(nodes: int = 16, gpus_per_node: int = 8, oversubscription: float = 1.0,
             fit: Fit | None = None) -> Topology:
    """NVIDIA DGX A100 (datasheet): 8 x A100-SXM-80GB on NVSwitch, 600 GB/s bidirectional per GPU (300 each
    way); 8 x ConnectX-6 HDR 200 Gb/s compute NICs, one per GPU behind a PCIe Gen4 switch. SuperPOD
    reference architecture: rail-optimized, scalable units of 20 nodes on 40-port HDR leaves (20 down/20 up).
    """
    check(1 <= gpus_per_node <= 8, f"dgx-a100: gpus_per_node={gpus_per_node!r}; valid: 1..8")
    return _fitted(build_switched(nodes=nodes, oversubscription=oversubscription,
                                  **switched_links("dgx-a100", gpus_per_node, fit)), fit)


def dgx2_v100(nodes: int = 16, gpus_per_node: int = 16, oversubscription: float = 1.0,
              fit: Fit | None = None) -> Topology:
    """NVIDIA DGX-2 (datasheet): 16 x V100-SXM3-32GB on 12 NVSwitches, 6 NVLink 2.0 bricks per GPU = 150 GB/s
    each way; 8 x Mellanox EDR 100 Gb/s NICs (one per GPU pair, behind PCIe Gen3 switches)."""
    check(1 <= gpus_per_node <= 16, f"dgx2-v100: gpus_per_node={gpus_per_node!r}; valid: 1..16")
    return _fitted(build_switched(nodes=nodes, oversubscription=oversubscription,
                                  **switched_links("dgx2-v100", gpus_per_node, fit)), fit)


def dgx_h100(nodes: int = 16, gpus_per_node: int = 8, oversubscription: float = 1.0,
             fit: Fit | None = None) -> Topology:
    """NVIDIA DGX H100 (datasheet): 8 x H100-SXM-80GB on NVSwitch, 900 GB/s bidirectional per GPU (450 each
    way); 8 x ConnectX-7 NDR 400 Gb/s compute NICs, one per GPU (PCIe Gen5). SuperPOD: rail-optimized,
    scalable units of 32 nodes on 64-port NDR leaves (32 down/32 up).
    """
    check(1 <= gpus_per_node <= 8, f"dgx-h100: gpus_per_node={gpus_per_node!r}; valid: 1..8")
    return _fitted(build_switched(nodes=nodes, oversubscription=oversubscription,
                                  **switched_links("dgx-h100", gpus_per_node, fit)), fit)


def switched_links(name: str, gpus_per_node: int, fit: Fit | None = None) -> dict[str, Any]:
    """The device and link figures `build_switched` gets for a DGX preset (shared with listing.py)."""
    if name == "dgx-a100":
        return dict(name=name, device=A100_SXM_80GB, devices_per_node=gpus_per_node,
                    intra_bandwidth=300e9 * _eff(fit, "nvlink3-nvswitch"), intra_latency=NVLINK_LAT,
                    inter_bandwidth=HDR_IB * _eff(fit, "hdr-ib"), inter_latency=NIC_LAT,
                    nics_per_node=gpus_per_node, pcie_bandwidth=PCIE4_X16, nodes_per_leaf=20)
    if name == "dgx2-v100":
        return dict(name=name, device=V100_SXM3_32GB, devices_per_node=gpus_per_node,
                    intra_bandwidth=6 * NVLINK2_BRICK * _eff(fit, "nvlink2-nvswitch"), intra_latency=NVLINK_LAT,
                    inter_bandwidth=EDR_IB * _eff(fit, "edr-ib"), inter_latency=NIC_LAT,
                    nics_per_node=max(1, gpus_per_node // 2), pcie_bandwidth=PCIE3_X16, nodes_per_leaf=18)
    check(name == "dgx-h100", f"switched_links: unknown preset {name!r}; valid: dgx-a100, dgx2-v100, dgx-h100")
    return dict(name=name, device=H100_SXM_80GB, devices_per_node=gpus_per_node,
                intra_bandwidth=450e9 * _eff(fit, "nvlink4-nvswitch"), intra_latency=NVLINK_LAT,
                inter_bandwidth=NDR_IB * _eff(fit, "ndr-ib"), inter_latency=NIC_LAT,
                nics_per_node=gpus_per_node, pcie_bandwidth=PCIE5_X16, nodes_per_leaf=32)


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
    g = _graph()
    g.add_node("n0.shm", kind="cpu", node_index=0)
    for j in range(gpus_per_node):
        g.add_node(f"n0.proc{j}", kind="gpu", node_index=0, local_rank=j)
        g.add_edge(f"n0.proc{j}", "n0.shm", bandwidth=bandwidth, latency=latency)
    return _topology("local-cpu", g, device, 1, gpus_per_node)


@dataclass(frozen=True)
class Preset:
    name: str
    build: Callable[..., Topology]  # (nodes, gpus_per_node, oversubscription) -> Topology
    devices_per_node: int  # physical devices per node (local-cpu: the default process count)
    default_nodes: int
    description: str
    fixed_nodes: bool = False  # local-cpu: always one node, `gpus` sets the process count


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("longhorn", longhorn, 4, 16, "TACC Longhorn: 4 x V100-SXM2-16GB (NVLink 2.0 pairs), 1 x EDR IB"),
    Preset("frontera-rtx", frontera_rtx, 4, 16, "TACC Frontera RTX: 4 x Quadro RTX 5000, PCIe 3, 1 x FDR IB"),
    Preset("dgx2-v100", dgx2_v100, 16, 16, "DGX-2: 16 x V100-SXM3-32GB, NVSwitch 150 GB/s, 8 x EDR 100 Gb/s"),
    Preset("dgx-a100", dgx_a100, 8, 16, "DGX A100: 8 x A100-SXM-80GB, NVSwitch 300 GB/s, 8 x HDR 200 Gb/s"),
    Preset("dgx-h100", dgx_h100, 8, 16, "DGX H100: 8 x H100-SXM-80GB, NVSwitch 450 GB/s, 8 x NDR 400 Gb/s"),
    Preset("local-cpu", local_cpu, 8, 1, "this machine: 8 gloo CPU processes (calibrate to measure)",
           fixed_nodes=True),
]}
