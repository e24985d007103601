"""What a training run is configured with and what it returns: TrainConfig, the LR schedule, TrainResult."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from paracube.modes.buckets import BUCKET_BYTES


class TrainingDiverged(RuntimeError):
    """The loss (or gradient norm) became NaN/inf."""


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup to `lr` over `warmup` steps, then cosine decay to `min_lr` at step `total`."""

    lr: float
    min_lr: float
    warmup: int
    total: int

    def __call__(self, step: int) -> float:
        if step <= self.warmup:
            return self.lr * step / max(1, self.warmup)
        frac = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * frac))


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and data settings that the plan does not fix."""

    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None  # None: 10% of the schedule, at least 1
    schedule_steps: int | None = None  # None: the run's `steps` (a resumed run keeps its checkpoint's)
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    seed: int = 0
    data: str = "text"  # data.py: synthetic | text | text:PATH
    on_nonfinite: Literal["stop", "skip"] = "stop"
    comm_timeout_s: float = 120.0
    overlap: bool = True  # False: never overlap, even where the plan's layout says `overlap` (same result)
    bucket_bytes: int = BUCKET_BYTES  # gradient bucket limit (paracube/modes/buckets.py)
    loss_scale: float = 2.0 ** 16  # fp16: initial dynamic loss scale (loss_scale.py)

    def schedule(self, steps: int) -> LRSchedule:
        total = self.schedule_steps or steps
        warmup = self.warmup_steps if self.warmup_steps is not None else max(1, total // 10)
        return LRSchedule(self.lr, self.lr * self.min_lr_ratio, warmup, total)


@dataclass
class TrainResult:
    metrics: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: str | None = None

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics]
