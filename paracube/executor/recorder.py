"""The record of a rank's collectives, and the supported way to watch them.

`CommRecorder` appends one CommEvent (paracube/estimate.py: payload rules) per collective the executor issues
(comm.py); `phase` tags them (fwd, bwd, recompute, grad_sync, optimizer, metrics). Observers are callables
`observer(event) -> context manager` given at construction: comm.py issues the collective inside the
context of every observer, so an observer can time it (validation) or count it; they cannot change it.
`spans[i]` holds the start and end (time.perf_counter, seconds) of `events[i]`. A collective run as a ring of
point-to-point steps (tpo, executor/layers/ring.py) is ONE event (the unoverlapped collective's key: the cost
models' bytes) plus one `RingStep` per step in `ring_steps`: its bytes, when it was issued and completed, and
the GEMM chunk that ran while it was in flight (benchmarks/executor_step.py --overlap-tp reads them).
An all-to-all with uneven splits (MoE dispatch / combine, executor/layers/experts.py) adds one `SplitSizes` per
event in `splits`: the bytes it sent to and received from each peer (the event's bytes: the sum of those sent).
No torch.distributed here: the mesh (mesh.py) and the collectives (comm.py) both import this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

from torch import Tensor

from paracube.estimate import CommEvent

Axes = tuple[str, ...]
CollectiveObserver = Callable[[CommEvent], AbstractContextManager[object]]


@dataclass(frozen=True)
class RingStep:
    """One point-to-point step of a ring collective (tpo): `event` indexes CommRecorder.events."""

    event: int
    step: int
    sent_bytes: int
    start: float  # issued (perf_counter seconds)
    end: float  # completed (waited for)
    gemm: tuple[float, float] | None  # start, end of the GEMM chunk run while it was in flight


@dataclass(frozen=True)
class SplitSizes:
    """The per-peer sizes of one all-to-all (`event` indexes CommRecorder.events), in bytes, by group index."""

    event: int
    sent: tuple[int, ...]
    received: tuple[int, ...]


class CommRecorder:
    """Appends a CommEvent per collective; `phase` tags them; `observers` wrap every collective call."""

    def __init__(self, observers: Sequence[CollectiveObserver] = ()) -> None:
        self.events: list[CommEvent] = []
        self.spans: list[list[float]] = []  # [start, end] of each event (perf_counter seconds)
        self.ring_steps: list[RingStep] = []
        self.splits: list[SplitSizes] = []
        self.current_phase: str = ""
        self.observers: tuple[CollectiveObserver, ...] = tuple(observers)

    def reset(self) -> None:
        self.events.clear()
        self.spans.clear()
        self.ring_steps.clear()
        self.splits.clear()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous, self.current_phase = self.current_phase, name
        try:
            yield
        finally:
            self.current_phase = previous

    def record(self, kind: str, axes: Axes, group_size: int, t: Tensor, payload_numel: int,
               backward: bool, label: str) -> CommEvent:
        phase = self.current_phase
        if backward:
            phase = "bwd"
        elif phase == "bwd":
            # A forward collective issued while backward runs: activation recomputation.
            phase = "recompute"
        event = CommEvent(kind, tuple(axes), group_size, payload_numel * t.element_size(),
                          str(t.dtype).removeprefix("torch."), phase, label)
        self.events.append(event)
        self.spans.append([time.perf_counter(), float("nan")])
        return event

    @contextmanager
    def issue(self, kind: str, axes: Axes, group_size: int, t: Tensor, payload_numel: int,
              backward: bool, label: str) -> Iterator[int]:
        """Record the collective; the context (every observer's, nested) is where it runs; yields the event's index
        (for ring_step). Its span ends when the context exits."""
        event = self.record(kind, axes, group_size, t, payload_numel, backward, label)
        index = len(self.events) - 1
        with ExitStack() as stack:
            for observer in self.observers:
                stack.enter_context(observer(event))
            yield index
        self.spans[index][1] = time.perf_counter()

    def ring_step(self, event: int, step: int, sent_bytes: int, start: float, end: float,
                  gemm: tuple[float, float] | None) -> None:
        self.ring_steps.append(RingStep(event, step, sent_bytes, start, end, gemm))


    def split_sizes(self, event: int, sent: Sequence[int], received: Sequence[int]) -> None:
        self.splits.append(SplitSizes(event, tuple(sent), tuple(received)))


__all__ = ["Axes", "CollectiveObserver", "CommRecorder", "RingStep", "SplitSizes"]
