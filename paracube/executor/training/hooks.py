"""The explicit ways in to a training run: `TrainHooks`, given to `train()` (train.py).

Nothing in paracube replaces a function or patches torch at run time; what watches or perturbs a run
comes in through these fields, each optional:
- `before_step(step)`: called on every rank before step `step` (1-based) starts; tests inject faults here
  (a rank that kills itself at a given step), and may raise to stop the run.
- `wrap_step(train_step) -> train_step`: wraps the one-step function (step.py's `train_step`, same
  signature); validation counts a step's dispatched ops or marks step boundaries, tests poison a step.
- `after_step(row, last_checkpoint)`: called after each step with its metrics row (train.py) and the path
  of the last complete checkpoint (None if none), once that step's checkpoint (if any) is saved: progress
  reports (the launcher's status file), per-step callbacks.
- `observe_collective`: observers of every collective the executor issues (recorder.py): each is called
  with the CommEvent and returns the context manager the collective runs in (timing, counting).
- `after_shard_written(rank, step)`: called on a rank as soon as its checkpoint shard file is written, while
  the others may still be saving (checkpoint.py); tests kill a rank mid-save here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paracube.executor.recorder import CollectiveObserver

if TYPE_CHECKING:
    from paracube.executor.training.step import StepResult

StepFn = Callable[..., "StepResult"]  # step.train_step's signature


@dataclass(frozen=True)
class TrainHooks:
    before_step: Callable[[int], Any] | None = None
    wrap_step: Callable[[StepFn], StepFn] | None = None
    after_step: Callable[[dict[str, Any], str | None], Any] | None = None
    observe_collective: tuple[CollectiveObserver, ...] = ()
    after_shard_written: Callable[[int, int], Any] | None = None


NO_HOOKS = TrainHooks()

__all__ = ["NO_HOOKS", "StepFn", "TrainHooks"]
