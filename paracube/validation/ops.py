"""Count the ops (torch dispatches) one training step of a plan launches on each rank.

What `cost_models.compute.ops_per_step` predicts, measured: each rank runs the executor's `train()` for two
steps and a TorchDispatchMode counts every dispatch of step 2 (step 1 also creates the optimizer state).
Collectives count as ops too (c10d dispatches), as they do in the formula's per-layer constants.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paracube.calibration.microbench import run_on_ranks
from paracube.plan import Plan


class DispatchCounter(TorchDispatchMode):
    """Counts dispatches by op name while active (this thread, and autograd's backward on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _count_rank(rank: int, world: int, device: torch.device, plan: Plan) -> dict[str, int]:
    from paracube.executor import step as step_module
    from paracube.executor.train import TrainConfig, train

    original = step_module.train_step
    seen: list[Counter[str]] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        counter = DispatchCounter()
        with counter:
            out = original(*args, **kwargs)
        seen.append(counter.counts)
        return out

    step_module.train_step = counted  # train() imports it at call time
    try:
        train(plan, rank, world, 2, config=TrainConfig(data="synthetic"), local_rank=rank)
    finally:
        step_module.train_step = original
    return dict(seen[-1])


def count_step_ops(plan: Plan, timeout_s: float = 300.0) -> list[dict[str, int]]:
    """Per rank: dispatches by op name of one steady-state training step of `plan` on local ranks."""
    return run_on_ranks(_count_rank, plan.layout.world_size, (plan,), plan.launch.backend, timeout_s, "count ops")


__all__ = ["DispatchCounter", "count_step_ops"]
