"""The NVSwitch presets (DGX systems, GB200 NVL72): one table of datasheet figures, one builder.

A node is one NVLink domain: the 8 (DGX-2: 16) GPUs of a DGX on its NVSwitches, or the 72 GPUs of a GB200
NVL72 rack on its NVLink switch trays (18 compute trays, each 2 Grace CPUs + 4 B200: 4 GPUs per Grace host
board, `devices_per_host`). Every GPU reaches its node's switch at its NVLink rate (one direction) times the
fabric's efficiency; the compute NICs go to a rail-optimized fat tree (fabric.build_switched), one per GPU
(DGX-2: one per GPU pair) at the InfiniBand rate times its efficiency. Efficiencies: efficiency.py (fitted,
or borrowed and flagged). `fit=` (calibration/from_runs.py) replaces the device's and both fabrics' figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paracube.errors import check
from paracube.topologies import devices as dev
from paracube.topologies import rates as r
from paracube.topologies.device import DeviceSpec
from paracube.topologies.efficiency import fabric_eff
from paracube.topologies.efficiency_calibration import Fit, published_calibration
from paracube.topologies.fabric import build_switched

if TYPE_CHECKING:
    from paracube.topologies.topology import Topology


@dataclass(frozen=True)
class Switched:
    device: DeviceSpec
    gpus: int  # GPUs per NVLink domain (node)
    nvlink: float  # bytes/s per GPU to the switch, one direction (nominal)
    intra: str  # fabric name (efficiency.FABRICS)
    nic: float  # bytes/s per NIC, one direction (nominal)
    inter: str
    gpus_per_nic: int
    pcie: float  # GPU (or NVSwitch) to NIC
    nodes_per_leaf: int  # nodes whose NIC k share leaf k (the reference architecture's scalable unit)
    source: str
    devices_per_host: int = 0  # GPUs per host OS (0: the node); GB200 NVL72: 4 per compute tray


SYSTEMS: dict[str, Switched] = {
    "dgx2-v100": Switched(
        dev.V100_SXM3_32GB, 16, 6 * r.NVLINK2_BRICK, "nvlink2-nvswitch", r.EDR_IB, "edr-ib", 2, r.PCIE3_X16, 18,
        "NVIDIA DGX-2 (datasheet): 16 x V100-SXM3-32GB on 12 NVSwitches, 6 NVLink 2.0 bricks per GPU = 150 GB/s "
        "each way; 8 x Mellanox EDR 100 Gb/s NICs (one per GPU pair, behind PCIe Gen3 switches)."),
    "dgx-a100": Switched(
        dev.A100_SXM_80GB, 8, r.NVLINK3_GPU, "nvlink3-nvswitch", r.HDR_IB, "hdr-ib", 1, r.PCIE4_X16, 20,
        "NVIDIA DGX A100 (datasheet): 8 x A100-SXM-80GB on NVSwitch, 600 GB/s bidirectional per GPU (300 each "
        "way); 8 x ConnectX-6 HDR 200 Gb/s compute NICs, one per GPU behind a PCIe Gen4 switch. SuperPOD "
        "reference architecture: rail-optimized, scalable units of 20 nodes on 40-port HDR leaves (20 down/20 up)."),
    "dgx-h100": Switched(
        dev.H100_SXM_80GB, 8, r.NVLINK4_GPU, "nvlink4-nvswitch", r.NDR_IB, "ndr-ib", 1, r.PCIE5_X16, 32,
        "NVIDIA DGX H100 (datasheet): 8 x H100-SXM-80GB on NVSwitch, 900 GB/s bidirectional per GPU (450 each "
        "way); 8 x ConnectX-7 NDR 400 Gb/s compute NICs, one per GPU (PCIe Gen5). SuperPOD: rail-optimized, "
        "scalable units of 32 nodes on 64-port NDR leaves (32 down/32 up)."),
    "dgx-h200": Switched(
        dev.H200_SXM_141GB, 8, r.NVLINK4_GPU, "nvlink4-nvswitch", r.NDR_IB, "ndr-ib", 1, r.PCIE5_X16, 32,
        "NVIDIA DGX H200 (datasheet, 2024): 8 x H200 141 GB HBM3e (4.8 TB/s) on 4 NVSwitches, 900 GB/s "
        "bidirectional NVLink 4 per GPU (450 each way); 8 x ConnectX-7 400 Gb/s NDR compute NICs, one per GPU "
        "(PCIe Gen5). SuperPOD: the DGX H100 one (scalable units of 32 nodes on 64-port NDR leaves)."),
    "dgx-b200": Switched(
        dev.B200_SXM_180GB, 8, r.NVLINK5_GPU, "nvlink5-nvswitch", r.NDR_IB, "ndr-ib", 1, r.PCIE5_X16, 32,
        "NVIDIA DGX B200 (datasheet, 2024): 8 x B200 (180 GB HBM3e, 8 TB/s each) on 2 NVLink 5 switches, "
        "14.4 TB/s aggregate = 1.8 TB/s bidirectional per GPU (900 GB/s each way); 8 single-port ConnectX-7 "
        "400 Gb/s NDR compute NICs (4 OSFP cages), one per GPU. SuperPOD: scalable units of 32 nodes."),
    "gb200-nvl72": Switched(
        dev.B200_GB200_186GB, 72, r.NVLINK5_GPU, "nvlink5-nvswitch", r.NDR_IB, "ndr-ib", 1, r.PCIE5_X16, 8,
        "NVIDIA GB200 NVL72 (datasheet, 2024): one NVLink domain of 72 B200 (186 GB HBM3e, 8 TB/s each) and 36 "
        "Grace CPUs, 18 compute trays of 2 GB200 superchips (4 GPUs per Grace host board), 9 NVLink 5 switch "
        "trays: 130 TB/s, 1.8 TB/s bidirectional per GPU (900 GB/s each way). Across racks (DGX GB200: 72 "
        "ConnectX-7 400 Gb/s NDR per rack, one per GPU; ConnectX-8 XDR 800 Gb/s with nic='xdr'): rail-optimized, "
        "scalable units of 8 racks (576 GPUs, DGX SuperPOD GB200).", devices_per_host=4),
}
NICS = {"ndr": (r.NDR_IB, "ndr-ib"), "xdr": (r.XDR_IB, "xdr-ib")}


def switched_links(name: str, gpus_per_node: int, fit: Fit | None = None, nic: str = "") -> dict[str, Any]:
    """The device and link figures `build_switched` gets for an NVSwitch preset (shared with listing.py)."""
    check(name in SYSTEMS, f"switched_links: unknown preset {name!r}; valid: {', '.join(SYSTEMS)}")
    s = SYSTEMS[name]
    check(not nic or nic in NICS, f"{name}: nic={nic!r}; valid: {', '.join(NICS)}")
    nic_rate, inter = NICS[nic] if nic else (s.nic, s.inter)
    return dict(name=name, device=s.device, devices_per_node=gpus_per_node,
                intra_bandwidth=s.nvlink * _eff(fit, s.intra), intra_latency=r.NVLINK_LAT,
                inter_bandwidth=nic_rate * _eff(fit, inter), inter_latency=r.NIC_LAT,
                nics_per_node=max(1, gpus_per_node // s.gpus_per_nic), pcie_bandwidth=s.pcie,
                nodes_per_leaf=s.nodes_per_leaf)


def fabrics(name: str) -> tuple[str, str]:
    """(intra-node, inter-node) fabric names of an NVSwitch preset."""
    return SYSTEMS[name].intra, SYSTEMS[name].inter


def _eff(fit: Fit | None, fabric: str) -> float:
    if fit is None:
        return fabric_eff(fabric)
    return fit.intra if fabric.startswith("nvlink") else fit.inter


def build(name: str, nodes: int = 16, gpus_per_node: int | None = None, oversubscription: float = 1.0,
          fit: Fit | None = None, nic: str = "") -> Topology:
    """An NVSwitch preset of `nodes` NVLink domains of `gpus_per_node` GPUs (default: the whole domain)."""
    s = SYSTEMS[name]
    per = s.gpus if gpus_per_node is None else gpus_per_node
    check(1 <= per <= s.gpus, f"{name}: gpus_per_node={per!r}; valid: 1..{s.gpus}")
    topo = build_switched(nodes=nodes, oversubscription=oversubscription, **switched_links(name, per, fit, nic))
    inter = NICS[nic][1] if nic else s.inter
    topo.calibration = published_calibration(topo.device, None if fit is None else fit.device(), inter)
    if s.devices_per_host and per > s.devices_per_host:  # launch one process group per host (plan's launch)
        topo.devices_per_host = s.devices_per_host  # type: ignore[attr-defined]
    return topo


def _preset(name: str) -> Any:
    """The preset's builder, its datasheet source as its docstring."""

    def make(nodes: int = 16, gpus_per_node: int | None = None, oversubscription: float = 1.0,
             fit: Fit | None = None, nic: str = "") -> Topology:
        return build(name, nodes, gpus_per_node, oversubscription, fit, nic)

    make.__name__ = make.__qualname__ = name.replace("-", "_")
    make.__doc__ = SYSTEMS[name].source
    return make


dgx2_v100, dgx_a100, dgx_h100, dgx_h200, dgx_b200, gb200_nvl72 = (_preset(n) for n in SYSTEMS)
