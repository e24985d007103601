"""A compute device's spec-sheet figures (`DeviceSpec`), apart from the graph so that listing the presets
(`paracube topologies`) needs neither networkx nor numpy."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from paracube.errors import check

REQUIRED_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    # keys "fp32", "fp16", "bf16" (more allowed: "tf32", "fp8" where the device has FP8 tensor cores): dense
    # peak FLOP/s
    peak_flops: dict[str, float]
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    # Host seconds per dispatched op (Python dispatch, autograd, launch) priced without a calibration: 0 for
    # accelerators (hidden behind their kernels at the sizes planned for), set by the local-cpu preset.
    op_overhead_s: float = 0.0
    # Seconds per collective call beyond its ring steps, likewise: a CPU rank that shares its core waits for
    # the group's other ranks to be scheduled before the call can proceed.
    call_overhead_s: float = 0.0
    # Seconds per latency step of a collective whose ring has 3 or more ranks, likewise: each step waits for the
    # ring's ranks to be scheduled on shared cores (a pair exchanges without it: cost_models.collective).
    ring_wait_s: float = 0.0
    # Seconds a point-to-point message (a pipeline's hand-off) waits for its receiver to be scheduled beside
    # ranks that compute on its core, in place of a collective's waits where longer (compute.GemmModel.call_wait);
    # 0 for accelerators. Set by the local-cpu preset (topologies/local_cpu.py).
    send_wait_s: float = 0.0
    # The GEMM efficiency curve's half-efficiency dimension (compute.GemmModel m0 = n0 = k0) priced without a
    # calibration; 0: the model's default (64, accelerators). A CPU core reaches near its peak at small shapes.
    gemm_half_dim: float = 0.0
    # The device generation ("volta", "ampere", "hopper", "blackwell", ...): keys the fitted efficiencies
    # (topologies/efficiency.py); "" for devices outside the presets' table (a YAML device, local CPUs).
    generation: str = ""
    # CPU ranks that share each core (1: a device of its own, every accelerator): an idle pipeline stage's
    # ranks give their core share to the busy ones (cost_models/shared_cores.py). Set by the local-cpu preset.
    ranks_per_core: float = 1.0
    # Seconds the device idles per host wait on its results (the queue drained, then the host's next launch:
    # cost_models/host_sync.py, a dropless MoE block's expert counts); 0: none priced (the local CPU is its host).
    sync_s: float = 0.0
    # The GPU's link to its host CPU, bytes/s per direction, and its share of the host's memory (bytes): what
    # activation offloading moves over and fills (topologies/host_link.py, cost_models/offload.py); 0: none.
    host_bandwidth: float = 0.0
    host_memory_bytes: float = 0.0

    def __post_init__(self) -> None:
        missing = [k for k in REQUIRED_DTYPES if k not in self.peak_flops]
        check(not missing, f"device {self.name!r}: peak_flops lacks {', '.join(missing)}; "
              f"expected keys {', '.join(REQUIRED_DTYPES)}")
        for key, value in self.peak_flops.items():
            check(_positive(value),
                  f"device {self.name!r}: peak_flops[{key!r}]={value!r} must be a positive number")
        for attr in ("memory_bytes", "memory_bandwidth"):
            value = getattr(self, attr)
            check(_positive(value), f"device {self.name!r}: {attr}={value!r} must be a positive number")
        for attr in ("op_overhead_s", "call_overhead_s", "ring_wait_s", "send_wait_s", "gemm_half_dim", "sync_s",
                     "host_bandwidth", "host_memory_bytes"):
            value = getattr(self, attr)
            check(value == 0 or _positive(value), f"device {self.name!r}: {attr}={value!r} must be a number >= 0")
        check(_positive(self.ranks_per_core) and self.ranks_per_core >= 1,
              f"device {self.name!r}: ranks_per_core={self.ranks_per_core!r} must be a number >= 1")

    @property
    def has_fp8(self) -> bool:
        """FP8 tensor cores (a "fp8" peak): `--dtype fp8` is priced on this device."""
        return "fp8" in self.peak_flops

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "peak_flops": dict(self.peak_flops)}
        for attr in ("op_overhead_s", "call_overhead_s", "ring_wait_s", "send_wait_s", "gemm_half_dim", "sync_s",
                     "host_bandwidth", "host_memory_bytes"):
            if not out[attr]:  # files of devices without them stay as they were
                del out[attr]
        if not out["generation"]:
            del out["generation"]
        if out["ranks_per_core"] == 1:
            del out["ranks_per_core"]
        return out


def _positive(value: object) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0  # type: ignore[arg-type,operator]
