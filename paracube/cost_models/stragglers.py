"""The step's wait for the slowest data-parallel replica: per-rank jitter meeting the step's one barrier.

Every runtime ends a step with a barrier over its data-parallel replicas: the last gradient bucket's reduction,
the optimizer step and the next step's parameters (all_reduce / reduce_scatter + all_gather over dp, the grad-norm
all_reduce over every rank) need every replica to have finished its backward. A replica's time to get there is
its predicted work plus noise (kernel-time jitter, host launch delays, garbage-collection pauses, clock changes
under the power cap); the barrier waits for the slowest of the R = dp replicas. With independent noise
accumulating over the step like a random walk, sigma(T) = s sqrt(T) for T seconds of work (s in sqrt(s), one
figure per device generation: topologies/efficiency.STRAGGLER, fitted on the fit rows), the expected wait is

    wait = s sqrt(T) E[max of R standard normals]          (0 for one replica)

E[max]: Blom's (1958) approximation Phi^-1((R - 0.375) / (R + 0.25)), within 0.03 of the exact order-statistic
mean (exact 0.564, 1.029, 2.070, 3.044 at R = 2, 4, 32, 512; Blom 0.590, 1.049, 2.067, 3.031). Ranks inside a
replica (its tensor, context and pipeline groups) synchronize every layer or micro-batch: they are one noise
unit, whose extra waits the generation's efficiencies already absorb at any scale; only the replica count grows
with a weak-scaling series.
Both engines add `wait` to the step they price (analytic_scores.evaluate, event.simulate), T their own step
(with experts: the whole step, moe_step.with_moe re-pricing the dense part's wait with the experts' time in T).

Checked against the published weak-scaling series (benchmarks/published_runs.py; topologies/efficiency.py):
the measured steps grow 1-10% from their smallest to their largest run where the rest of the model stays flat.
Other barriers (Transformer Engine's FP8 amax all_reduce over tp x dp x cp at every fp8_autocast exit, two per
micro-batch and model chunk; NeMo's per-micro-batch loss average over dp) would add s sqrt(K T) E[max] for K
barriers a step: not priced (efficiency.py's docstring gives why).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtri

Arr = NDArray[np.float64]


def expected_max(n: ArrayLike) -> Arr:
    """E[max of n independent standard normals] (Blom's approximation; 0 for n <= 1)."""
    n = np.asarray(n, dtype=np.float64)
    safe = np.maximum(n, 2.0)
    return np.where(n > 1, ndtri((safe - 0.375) / (safe + 0.25)), 0.0)


def straggler_wait(step: ArrayLike, replicas: ArrayLike, s: float) -> Arr:
    """Seconds the step's barrier waits for the slowest of `replicas` data-parallel replicas, each T = `step`
    seconds of work with jitter s sqrt(T) (s: the generation's figure; 0: none)."""
    step = np.asarray(step, dtype=np.float64)
    if not s:
        return np.zeros_like(step)
    return s * np.sqrt(np.maximum(step, 0.0)) * expected_max(replicas)


def without_wait(step: ArrayLike, replicas: ArrayLike, s: float) -> Arr:
    """The step T before its wait, from T + s sqrt(T) E = `step` (the positive root: sqrt(T) = (sqrt(c^2 + 4 step)
    - c) / 2, c = s E): what moe_step.with_moe re-prices once the experts' time is added."""
    step = np.asarray(step, dtype=np.float64)
    c = s * expected_max(replicas)
    return ((np.sqrt(c * c + 4.0 * np.maximum(step, 0.0)) - c) / 2.0) ** 2


__all__ = ["expected_max", "straggler_wait", "without_wait"]
