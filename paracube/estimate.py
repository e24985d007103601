"""What a cost model predicts and what the executor records: CommEvent, MemoryBreakdown, StepEstimate.

A CommEvent is one collective call. `payload_bytes` is the size of the whole (unsharded) tensor the
collective is about: the *output* of an all-gather, the *input* of a reduce-scatter, the tensor of an
all-reduce / broadcast / reduce, the message of a send. Bytes a rank actually sends follow from it
(`sent_bytes`, `ring_sent_factor`: ring algorithms). The executor and the analytic model must produce equal multisets of
`key()` for one training step (tests/test_fidelity.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send"]
COLLECTIVE_KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                                     "all_to_all", "send")


@dataclass(frozen=True)
class CommEvent:
    kind: str
    axes: tuple[str, ...]  # mesh axes of the group, first major; ("dp",), ("x", "y"), ...
    group_size: int
    payload_bytes: int
    dtype: str = "float32"  # torch dtype name without the "torch." prefix
    phase: str = ""  # fwd | bwd | recompute | grad_sync | optimizer | metrics | pipeline: for breakdowns only
    label: str = ""  # where in the model (e.g. "layers.0.mlp.fc.dA"): for humans only

    def key(self) -> tuple[str, tuple[str, ...], int, str]:
        """What must agree between prediction and execution."""
        return (self.kind, self.axes, self.payload_bytes, self.dtype)

    def sent_bytes(self) -> float:
        """Bytes one rank sends with the bandwidth-optimal ring algorithm (ring_sent_factor)."""
        return float(ring_sent_factor(self.kind, self.group_size) * self.payload_bytes)


def ring_sent_factor(kind: str, n: Any) -> Any:
    """Bytes one rank sends per payload byte in a ring over n ranks (n: a number or a numpy array):
    all_reduce 2(n-1)/n (reduce-scatter then all-gather); all_gather, reduce_scatter, all_to_all, and
    broadcast / reduce as a pipelined ring (every rank but one forwards each chunk) (n-1)/n; send 1;
    0 for a group of one rank. Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009.

    It lives here, with the payload convention it completes, because the executor records bytes sent with
    it (CommEvent.sent_bytes) and the cost models price them with it (cost_models/collective.py builds
    its latency and time terms on it): one formula for both sides of the traffic contract.
    """
    n = np.asarray(n, dtype=float)
    if kind == "all_reduce":
        factor = 2.0 * (n - 1) / n
    elif kind == "send":
        factor = np.ones_like(n)
    else:
        factor = (n - 1) / n
    return np.where(n > 1, factor, 0.0)


EventKey = tuple[str, tuple[str, ...], int, str]


def traffic_counter(events: Iterable[CommEvent | EventKey]) -> Counter[EventKey]:
    return Counter(e.key() if isinstance(e, CommEvent) else e for e in events)


def traffic_difference(predicted: Iterable[CommEvent | EventKey],
                       recorded: Iterable[CommEvent | EventKey]) -> dict[str, Counter]:
    """Events predicted but not recorded, and recorded but not predicted (both empty means equal)."""
    p, r = traffic_counter(predicted), traffic_counter(recorded)
    return {"missing_in_executor": p - r, "unpredicted": r - p}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device at the peak of a training step."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    temporaries: float = 0.0  # gathered weights / activations alive only inside one layer

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.temporaries

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class StepEstimate:
    """One training step of one layout, as a cost model (analytic or event) predicts it."""

    layout: str
    engine: str
    step_time_s: float
    compute_time_s: float
    comm_time_s: float  # all communication time, as if serialized
    exposed_comm_time_s: float  # communication not hidden under compute
    bubble_time_s: float
    memory: MemoryBreakdown
    comm_bytes_per_gpu: float  # sent by one device in one step
    flops_per_gpu: float  # model FLOPs (recomputation excluded) per device per step
    mfu: float
    comm_time_by_axis: dict[str, float] = field(default_factory=dict)
    comm_time_by_kind: dict[str, float] = field(default_factory=dict)
    events: tuple[CommEvent, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self, with_events: bool = False) -> dict[str, Any]:
        out = {
            "layout": self.layout,
            "engine": self.engine,
            "step_time_s": self.step_time_s,
            "compute_time_s": self.compute_time_s,
            "comm_time_s": self.comm_time_s,
            "exposed_comm_time_s": self.exposed_comm_time_s,
            "bubble_time_s": self.bubble_time_s,
            "memory_per_gpu_bytes": self.memory.total,
            "memory_breakdown_bytes": self.memory.to_dict(),
            "comm_bytes_per_gpu": self.comm_bytes_per_gpu,
            "flops_per_gpu": self.flops_per_gpu,
            "mfu": self.mfu,
            "comm_time_by_axis": dict(self.comm_time_by_axis),
            "comm_time_by_kind": dict(self.comm_time_by_kind),
            "notes": list(self.notes),
        }
        if with_events:
            out["events"] = [{**asdict(e), "axes": list(e.axes)} for e in self.events]
        return out
