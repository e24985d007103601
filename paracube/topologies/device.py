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
    peak_flops: dict[str, float]  # keys "fp32", "fp16", "bf16" (more allowed, e.g. "tf32"): dense peak FLOP/s
    memory_bytes: float
    memory_bandwidth: float  # bytes/s

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

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "peak_flops": dict(self.peak_flops)}


def _positive(value: object) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0  # type: ignore[arg-type,operator]
