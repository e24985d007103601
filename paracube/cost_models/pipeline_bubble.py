"""The pipeline bubble of a 1F1B schedule whose stages differ in work (analytic engine and the search's bounds).

With w_s a stage's forward and backward of one micro-batch, N micro-batches: a 1F1B step (v = 1) is the slowest
stage's N micro-batches plus, in the fill and the drain, one micro-batch of every other stage (the first
micro-batch's forward reaches stage s after the forwards of the stages before it, the last one's backward leaves it
after the backwards of the stages after it):
    bubble = (sum_s w_s - max_s w_s) / (v N)          (per step, in units of the per-step work W = N w)
= (pp - 1) / (v N) x W with equal stages (Narayanan et al. 2021, Sections 2.2 and 2.3). The first stage (embedding)
and the last (head and loss) do other work than the middle ones, so pp - 1 copies of the slowest stage over-count
the fill and drain by what the lighter stages lack (GPT-3 1.3B on two stages: the event engine, which replays every
stage, 2.2% under the old form, 0.1% above this one). Interleaved (v > 1), the fill and drain run one model chunk
of every other device (a v-th of its micro-batch): the same sum over v. Where the layers split evenly over the
pp v virtual stages this is what Megatron's schedule replayed over the chunks' costs gives (pipeline_replay.py,
the first and last stage's extra work on their edge chunks): 50 random even interleaved layouts on H100s (5 models,
pp 2-8, v 2-12, pp to 4 pp micro-batches) priced both ways agree within 0.05% on 44, within 0.5% on all but one
(1.1%). The old interleaved form, (pp - 1) copies of the slowest stage's chunk, put the event engine -5.0% to +3.3%
from the analytic step on them (mean |diff| 0.94%), this one -0.1% to +5.5% (mean 0.48%; its positive tail is the
pipeline sends of one-block chunks with few micro-batches: the replay leaves it too). Given the model's blocks
(`layers`), an uneven split has the schedule itself replayed over its chunks' costs (pipeline_replay.py).
The three representative stages of stage_scores.STAGES stand for pp stages: first, pp - 2 middle ones, last. The
bubble plus the slowest stage's work only grows when a stage's work grows (the sum form: total / (v N) +
(1 - 1 / (v N)) max; the replay's `lower` form for the bounds), so the search's bounds (score_bounds.py) stay
bounds on links no worse than any placement's.
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.pipeline_replay import interleaved_bubble, uneven

Arr = np.ndarray


def bubble_seconds(work: Arr, pp: Arr, v: Arr, N: Arr, share: Arr | float = 1.0,
                   middle_less: Arr | None = None, layers: int | None = None, backward: float = 2.0 / 3.0,
                   lower: bool = False) -> Arr:
    """`work`: [3, n] work of the first, middle and last stage over the step's N micro-batches; pp, v, N per layout;
    `share`: the part of the bubble paid (shared_cores.bubble_share; 1 on accelerators); `middle_less`: what the
    pp - 2 middle stages' own work falls short of pp - 2 copies of `work[1]` (sliding windows:
    window_stages.middle_excess; None: equal middle stages); `layers`: the model's blocks, to replay interleaved
    schedules (None: the closed form), `backward` the backward's share of a micro-batch and `lower` the bounds' form
    (pipeline_replay.py)."""
    pp = np.asarray(pp)
    total = work[0] + np.maximum(pp - 2, 0) * work[1] + work[2]
    if middle_less is not None:
        total = total - middle_less
    slowest = np.max(work, axis=0)
    others = np.where(pp > 1, total - slowest, 0.0) / (v * N)
    if layers is not None:
        pp_, v_ = (np.broadcast_to(np.asarray(x), slowest.shape) for x in (pp, v))
        shapes, which = np.unique(np.stack([pp_, v_]).astype(np.int64), axis=1, return_inverse=True)
        replayed = np.array([k > 1 and uneven(layers, int(p), int(k)) for p, k in shapes.T], dtype=bool)
        rows = np.flatnonzero(replayed[which.ravel()])
        if rows.size:
            others = np.array(np.broadcast_to(others, slowest.shape), dtype=np.float64)
            others[rows] = interleaved_bubble(work[:, rows], layers, pp_[rows], v_[rows],
                                              np.broadcast_to(np.asarray(N), slowest.shape)[rows], backward, lower)
    return share * others


__all__ = ["bubble_seconds"]
