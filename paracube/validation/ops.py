"""Count the ops (torch dispatches) one training step of a plan launches on each rank.

What `cost_models.step_ops.ops_per_step` predicts, measured: each rank runs the executor's `train()` for two
steps; a `wrap_step` hook (executor/training/hooks.py) runs each step under a DispatchCounter (executor/op_count.py)
and the counts of step 2 are kept (step 1 also creates the optimizer state). Collectives count as ops too
(c10d dispatches), as they do in the formula's per-layer constants.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from paracube.executor.launch.local_ranks import run_on_ranks
from paracube.executor.op_count import DispatchCounter
from paracube.executor.training.hooks import StepFn, TrainHooks
from paracube.plan import Plan


def counting(seen: list[Counter[str]]) -> TrainHooks:
    """Hooks that append each step's dispatch counts to `seen`."""

    def wrap(step: StepFn) -> StepFn:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counter = DispatchCounter()
            with counter:
                out = step(*args, **kwargs)
            seen.append(counter.counts)
            return out

        return counted

    return TrainHooks(wrap_step=wrap)


def _count_rank(rank: int, world: int, device: torch.device, plan: Plan) -> dict[str, int]:
    from paracube.executor.training.loop import TrainConfig, train

    seen: list[Counter[str]] = []
    train(plan, rank, world, 2, config=TrainConfig(data="synthetic"), local_rank=rank, hooks=counting(seen))
    return dict(seen[-1])


def count_step_ops(plan: Plan, timeout_s: float = 300.0) -> list[dict[str, int]]:
    """Per rank: dispatches by op name of one steady-state training step of `plan` on local ranks."""
    return run_on_ranks(_count_rank, plan.layout.world_size, (plan,), plan.launch.backend, timeout_s, "count ops",
                        preload=(__name__,))


__all__ = ["count_step_ops", "counting"]
