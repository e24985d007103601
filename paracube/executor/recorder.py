"""The record of a rank's collectives, and the supported way to watch them.

`CommRecorder` appends one CommEvent (paracube/estimate.py: payload rules) per collective the executor issues
(comm.py); `phase` tags them (fwd, bwd, recompute, grad_sync, optimizer, metrics). Observers are callables
`observer(event) -> context manager` given at construction: comm.py issues the collective inside the
context of every observer, so an observer can time it (validation) or count it; they cannot change it.
No torch.distributed here: the mesh (mesh.py) and the collectives (comm.py) both import this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext

from torch import Tensor

from paracube.estimate import CommEvent

Axes = tuple[str, ...]
CollectiveObserver = Callable[[CommEvent], AbstractContextManager[object]]


class CommRecorder:
    """Appends a CommEvent per collective; `phase` tags them; `observers` wrap every collective call."""

    def __init__(self, observers: Sequence[CollectiveObserver] = ()) -> None:
        self.events: list[CommEvent] = []
        self.current_phase: str = ""
        self.observers: tuple[CollectiveObserver, ...] = tuple(observers)

    def reset(self) -> None:
        self.events.clear()

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
        return event

    def issue(self, kind: str, axes: Axes, group_size: int, t: Tensor, payload_numel: int,
              backward: bool, label: str) -> AbstractContextManager[object]:
        """Record the collective; the returned context (every observer's, nested) is where it runs."""
        event = self.record(kind, axes, group_size, t, payload_numel, backward, label)
        if not self.observers:
            return nullcontext()
        if len(self.observers) == 1:
            return self.observers[0](event)
        stack = ExitStack()
        for observer in self.observers:
            stack.enter_context(observer(event))
        return stack


__all__ = ["Axes", "CollectiveObserver", "CommRecorder"]
