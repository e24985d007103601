"""Counting the ops (torch dispatches) a piece of executor code launches.

`DispatchCounter` is a TorchDispatchMode: while active it counts every dispatch by op name on this thread
(and autograd's backward on CPU). Collectives count too (c10d dispatches), as they do in the per-layer
constants of `cost_models.step_ops.ops_per_step`, which validation and calibration compare with it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class DispatchCounter(TorchDispatchMode):
    """Counts dispatches by op name while active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


__all__ = ["DispatchCounter"]
