"""The planner's exact pruning bounds on `analytic_scores.evaluate`'s Scores: a step time no placement of a
configuration beats (`step_lower_bound`, on links no worse than any placement's) and one no zero stage beats
(`compute_lower_bound`: compute, in-line communication and the optimizer step only); planner/scoring.py skips
what they prove slower."""

from __future__ import annotations

import numpy as np

from paracube.cost_models.analytic_scores import Scores
from paracube.cost_models.dims import Dims
from paracube.cost_models.pipeline_bubble import bubble_seconds
from paracube.cost_models.shared_cores import bubble_share
from paracube.cost_models.stragglers import straggler_wait
from paracube.modes import LayoutBatch

Arr = np.ndarray


def step_lower_bound(scores: Scores, d: Dims, b: LayoutBatch, rows: Arr, overlap: bool | Arr = False,
                     ranks_per_core: float = 1.0, straggler: float = 0.0) -> Arr:
    """Per layout of `scores` (`evaluate` on links no worse on any axis set than every placement's: the most
    bandwidth and the least latency over the placements), a step time that no placement of it beats. Every
    collective's time grows with latency and falls with bandwidth (calibrated pairs and the per-call overhead
    are the same on every placement), so each stage's per-micro-batch communication is at most any
    placement's: the slowest stage's work W and the bubble (pipeline_bubble.py, growing with every stage's work;
    times shared_cores.bubble_share where
    CPU ranks share cores, as evaluate prices it) are bounds. Of the per-step part,
    the slowest stage pays its communication (less the gradient reduction when overlapped: what overlap hides
    depends on the backward) and optimizer step, at least their least sum over the stages. The planner skips
    the placements of a configuration whose bound exceeds a step time it has already found (planner/search.py).
    `straggler`: the generation's jitter figure; evaluate's slowest-replica wait grows with the step it is added to
    (stragglers.py), so the wait on the bound is a bound of it."""
    work = np.stack([s.compute + s.micro for s in scores.stages])
    per_step = np.min([s.step - s.grad * np.asarray(overlap) + s.optim for s in scores.stages], axis=0)
    N = d.global_batch / (b.dp * b.mb)[rows]
    share = bubble_share(b.pp[rows], ranks_per_core)
    bound = work.max(axis=0) + bubble_seconds(work, b.pp[rows], b.v[rows], N, share, scores.middle_less, d.L,
                                              d.backward_share, lower=True) + per_step
    return bound + straggler_wait(bound, b.dp[rows], straggler)


def compute_lower_bound(scores: Scores, d: Dims, b: LayoutBatch, rows: Arr, ranks_per_core: float = 1.0,
                        straggler: float = 0.0) -> Arr:
    """Per layout of `scores` (`evaluate` with zero priced per configuration, as the search's bound pass: no FSDP unit
    collectives; on links no worse than any placement's), a step time that no placement of it beats at zero=2/3 (or
    any zero): the slowest stage's compute and per-micro-batch communication W with its bubble (pipeline_bubble.py;
    x bubble_share), plus the least optimizer step over the stages. zero=2/3 keep every per-micro-batch collective of
    zero=0 (the tensor-parallel and context-parallel ones, the pipeline sends: comm.StepTraffic.entries adds the
    unit collectives to them, over the zero group, on which no declared per-micro-batch collective runs) and their
    time falls with better links (step_lower_bound); evaluate then adds only terms >= 0 to a zero=2/3 stage (the
    unit collectives, in line with pipelines; with pp = 1 fsdp_overlap.prefetched_micro replaces just their seconds
    by its exposed seconds, clipped at 0, and the copy kernels add to compute; contention's extras are clipped at
    0). Compute and the optimizer step do not depend on the links, nor compute on zero (the optimizer's shard is the
    row's own zero); the per-step part loses at most the gradient reduction and the replica all_reduce it contains,
    so it is >= 0. The step is at least this. The planner prunes zero=2/3 configurations by it (their exact price
    needs their own evaluation: planner/scoring.py). `straggler`: as step_lower_bound adds it."""
    work = np.stack([s.compute + s.micro for s in scores.stages])
    optim = np.min([s.optim for s in scores.stages], axis=0)
    N = d.global_batch / (b.dp * b.mb)[rows]
    share = bubble_share(b.pp[rows], ranks_per_core)
    bound = work.max(axis=0) + bubble_seconds(work, b.pp[rows], b.v[rows], N, share, scores.middle_less, d.L,
                                              d.backward_share, lower=True) + optim
    return bound + straggler_wait(bound, b.dp[rows], straggler)


__all__ = ["compute_lower_bound", "step_lower_bound"]
