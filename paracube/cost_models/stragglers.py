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

Fitted and checked on the published runs (scale1, 2026-12-03; benchmarks/published_runs.py, topologies/
efficiency.py). The weak-scaling series' measured steps grow from their smallest to their largest run (Nemotron-4
15B FP8 16 -> 2048 GPUs +4.0%, 340B FP8 128 -> 2048 +10.4%, Llama 3.1 70B FP8 64 -> 2048 +5.1%, 8B bf16 8 -> 128
+3.0%; the A100 rd / rd-dp pairs, 1-8 against 128-1024 GPUs, do not) where the model stayed flat (+0.0, +2.5, +0.3,
0.0%). Priced since: the wait above; refit with Hopper's free figures on the fit rows: s 0.01396 (shipped 0.014),
eff_max 0.704, FP8 0.587, flash 0.344 (mem_eff at its bound); Ampere 0.0015 beside its drag (shipped 0), Blackwell
0. H100 fit 2.6 / 4.2 -> 2.6 / 4.4%, held out 3.4 / 8.8 -> 3.3 / 8.0%, H200 8.3 / 9.1 -> 6.9 / 7.6%, the other
lines' means within 0.1 point (Blackwell's fit max 9.8 -> 9.5%). Checked and not shipped (`s` refit with the same
figures, each row's layout held): NCCL's tuning model of the zero=1 reduce-scatters and gathers
(src/graph/tuning.cc, ring Simple: 8.4 us a call, 3.4 us an NVLink step, 14 us a network step, the inter-node steps
nodes - 1): held out 3.3 / 8.6%; serialized it adds 30 / 44 / 42 / 6 ms to those four series' largest runs over
their smallest, a third or less of their growth even if all exposed (bw9's 14 us on every step is not NCCL's model).
A per-GPU speed spread (the step times sigma E[max of the world's GPUs]): sigma 1.5%, held out 2.8 / 9.1%, but on
compute alone sigma goes to 4.6% with eff_max 0.78 (it trades against the efficiencies) and V100's own fit sends its
held-out row to 8%. The barrier over world / tp units (pipeline stages and cp ranks as independent replicas): held
out 2.7 / 9.2%, H200 4.4%, Blackwell 8.6% (borrowing s), but stages exchange every micro-batch: not independent.
Transformer Engine's delayed-scaling amax all_reduce over tp x dp x cp at every fp8_autocast exit (2 N v barriers a
step, s sqrt(K T) E[max of dp]): s 0.005, the 340B FP8 series flat (-3.0 .. -2.5%), H100 fit 1.5 / 4.7%, held out
2.8 / 9.2%, but the FP8 eff_max it frees (0.629) sends the H200 rows (torchtitan: no such barrier) to -11% and
Blackwell's held-out line to 12.5%. The 340B FP8 series grows about linearly in dp (+0.05, +0.05, +0.08, +0.15 s a
doubling), where E[max]'s increments shrink: no term checked has that shape.
"""

from __future__ import annotations

from functools import cache
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

Arr = NDArray[np.float64]


def expected_max(n: ArrayLike) -> Arr:
    """E[max of n independent standard normals] (Blom's approximation; 0 for n <= 1)."""
    n = np.asarray(n, dtype=np.float64)
    values, index = np.unique(n, return_inverse=True)  # a search asks for a few replica counts, many times each
    return np.array([_blom(float(v)) for v in values], dtype=np.float64)[index].reshape(n.shape)


@cache
def _blom(n: float) -> float:
    """Blom's Phi^-1((n - 0.375) / (n + 0.25)) by the standard library's inverse normal (Wichura's AS241, to
    about 1e-16: scipy.special.ndtri's accuracy, without the 0.15 s scipy.special import on the planner's path)."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


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
