"""A minimal two-level topology with the `paracube.topologies.Topology` query interface.

Used by the cost-model tests (hand-derivable numbers) and by benchmarks/search_speed.py when the real
presets are not importable. Every rank has one intra-node link (bandwidth, latency) and one NIC; a group
inside one node sees the intra link, a group spanning nodes the NIC (a hierarchical ring is limited by it).
Concurrent groups are ignored (no contention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from paracube.topologies.calibration import Calibration, as_calibration


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_flops: dict[str, float]
    memory_bytes: float
    memory_bandwidth: float


@dataclass(frozen=True)
class GroupLink:
    bandwidth: float
    latency: float
    nodes: int
    ranks_per_node: int


@dataclass(frozen=True)
class UniformTopology:
    device: DeviceSpec
    num_devices: int
    devices_per_node: int
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    calibration: Calibration | None = field(default=None)  # a mapping in the YAML shape is parsed

    def __post_init__(self) -> None:
        object.__setattr__(self, "calibration", as_calibration(self.calibration))

    @property
    def num_nodes(self) -> int:
        return -(-self.num_devices // self.devices_per_node)

    def group_link(self, ranks: Sequence[int], concurrent: Sequence[Sequence[int]] = ()) -> GroupLink:
        nodes = {r // self.devices_per_node for r in ranks}
        per_node = -(-len(ranks) // len(nodes))
        if len(nodes) == 1:
            return GroupLink(self.intra_bandwidth, self.intra_latency, 1, per_node)
        return GroupLink(self.inter_bandwidth, self.inter_latency, len(nodes), per_node)


def dgx_a100_like(gpus: int) -> UniformTopology:
    """DGX A100 from public specs: 8 x A100-80GB per node (312 TFLOP/s bf16/fp16, 19.5 fp32, 2.0 TB/s HBM),
    NVLink 3 via NVSwitch (300 GB/s per direction per GPU), 8 x 200 Gb/s HDR InfiniBand (25 GB/s per GPU)."""
    dev = DeviceSpec("A100-80GB", {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12}, 80e9, 2.0e12)
    return UniformTopology(dev, gpus, 8, 300e9, 3e-6, 25e9, 8e-6)
