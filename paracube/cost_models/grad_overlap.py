"""The exposed part of an overlapped data-parallel gradient reduction, per pipeline stage and model chunk.

With `overlap` each stage issues its gradient buckets (reverse registration order: head, blocks from the last,
embedding) on the data-parallel stream as the backward of its step's last micro-batch produces them, and, when
interleaved, per model chunk: chunk c's buckets once chunk c's last backward has produced them (Megatron-core
enables grad sync on each chunk's last micro-batch; the executor's grad_sync.py; the event engine simulates it:
event_program.build_stage's `bwd_last`). What the analytic model needs is how long after the pipeline's last
backward (stage 0's, chunk 0's) the queue of buckets drains.

Timing (times relative to the end of the pipeline's last backward, b = one micro-batch's backward on the stage,
all chunks, and slot = b / v one chunk's): in the interleaved 1F1B order (modes/stages.py; Narayanan et al. 2021,
Megatron's schedule) the last pp v backwards of every stage are the last micro-batch group, chunk v-1 first,
pp backwards per chunk, and stage s's last backward precedes stage 0's by s chunk slots (virtual stages s-1 .. 0
follow it). So chunk c of stage s ends its last backward at
    r_c = -(s + c pp) slot                                     (v = 1: -s b, the 1F1B cool-down)
and produces its buckets in proportion to that slot: the first after one block (fraction x1_c = v x1 of the
slot), the last (one block's, or the embedding's on the first stage: L_c) when it ends. A FIFO queue of bucket
times G_c (chunks in order v-1 .. 0; G_<c the chunks queued after c) fed so drains at
    finish = max over c of max(r_c - slot (1 - x1_c) + G_c + G_<c,  r_c + L_c + G_<c)
(either the queue never idles after chunk c's first bucket, or chunk c's last bucket is its tail); the exposed
time is max(0, finish), and the step pays the largest over its stages. With v = 1 on stage 0 this is the pp = 1
form max(0, G - b (1 - x1), xl G) (analytic.py's docstring). Chunks split a stage's blocks evenly; the
embedding's bytes (first stage, chunk 0) are its own term.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]


def exposed_grad_time(grad: Arr, backward: Arr, first_frac: Arr, last_frac: Arr, stage_index: Arr, pp: Arr,
                      v: Arr, has_embedding: Arr) -> Arr:
    """Per layout: seconds of one stage's overlapped gradient reduction left after the pipeline's last backward.
    grad: the stage's bucket time G; backward: b; first_frac: x1 (1 / blocks of the stage); last_frac: the
    fraction of G produced last (the embedding's on the first stage, else one block's); stage_index: s;
    has_embedding: the first stage's chunk 0 ends with the embedding (its last_frac is then the embedding's)."""
    v = np.maximum(v, 1).astype(np.float64)
    slot = backward / v
    emb = np.where(has_embedding, last_frac * grad, 0.0)
    per_chunk = (grad - emb) / v
    x1c = np.minimum(1.0, first_frac * v)
    # the last-produced bytes of a chunk without the embedding: one block's (last_frac where it is a block's)
    block = np.where(has_embedding, per_chunk * x1c, last_frac * grad)
    # Both terms are affine in c for c >= 1 (r_c and G_<c grow linearly, g_c and the tail do not depend on c),
    # so their maximum over chunks 1 .. v-1 is at c = 1 or c = v-1: three chunks priced instead of v (exact).
    finish = np.full_like(grad, -np.inf)
    for c in (0, 1, v - 1):
        live = (c < v) if np.isscalar(c) else (v > 1)
        later = per_chunk * c + emb  # chunks c-1 .. 0 (and the embedding) queue after chunk c
        first = np.asarray(c == 0)
        g_c = per_chunk + np.where(first, emb, 0.0)
        r = -(stage_index + c * pp) * slot
        tail = np.where(first & has_embedding, emb, np.minimum(block, per_chunk))
        terms = np.maximum(r - slot * (1.0 - x1c) + g_c + later - np.where(first, emb, 0.0),
                           r + tail + later - np.where(first, emb, 0.0))
        finish = np.where(live, np.maximum(finish, terms), finish)
    return np.maximum(0.0, finish)


__all__ = ["exposed_grad_time"]
