"""The exposed part of an overlapped data-parallel gradient reduction, per pipeline stage and model chunk.

With `overlap` each stage issues its gradient buckets (reverse registration order: head, blocks from the last,
embedding) on the data-parallel stream as the backward of its step's last micro-batch produces them, and, when
interleaved, per model chunk: chunk c's blocks during chunk c's last backward (Megatron-core enables grad sync on
each chunk's last micro-batch; the executor's grad_sync.py; the event engine simulates it:
event_program.build_stage's `bwd_last`). What the analytic model needs is how long after the pipeline's last
backward (stage 0's, chunk 0's) the queue of buckets drains.

Which bucket leaves when: modes/buckets.release_counts, read by both engines. A bucket is issued at the end of
the block whose backward completes its elements, so
- the head's gradients leave with the first block's, and a bucket that straddles two blocks waits for the
  second: the queue lags the backward by up to one bucket;
- the last release, when the stage's backward ends, carries the last block's gradients, the remainder of the
  bucket it completes and (first stage) the embedding's, whose backward has no GEMM to hide them behind.
Pricing the tail at the embedding's bucket alone (this module before 2026-12) hid one block and one bucket
more than the simulated queue: 5-9% of a step once rings crossing nodes used every NIC (fit4) and made the
gradient stream about as fast as the backward, where the queue, not the stream, decides.

Timing (times relative to the end of the pipeline's last backward, b = one micro-batch's backward on the stage,
all chunks, slot = b / v one chunk's): in the interleaved 1F1B order (modes/stages.py; Narayanan et al. 2021,
Megatron's schedule) the last pp v backwards of every stage are the last micro-batch group, chunk v-1 first,
pp backwards per chunk, and stage s's last backward precedes stage 0's by s chunk slots. So chunk c of stage s
ends its last backward at r_c = -(s + c pp) slot (v = 1: -s b, the 1F1B cool-down), and a release after a
fraction f of that chunk's blocks happens at r_c - slot (1 - f) (blocks evenly timed, the head's backward
spread over them). A FIFO stream fed releases j at times t_j with S_j the fraction of the stage's bucket time G
released at or after j drains at
    finish = max over j of (t_j + S_j G)
(exact: the last idle moment of the stream precedes some release); the exposed time is max(0, finish), and the
step pays the largest over its stages. With one bucket per block and v = 1 on stage 0 this is the pp = 1 form
max(0, G - b (1 - x1), xl G) (analytic_scores.py's docstring; x1 = 1 / blocks, xl the last release's share).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from paracube.cost_models.dims import Dims
from paracube.cost_models.local_parameters import parameter_units
from paracube.cost_models.param_dims import param_dims
from paracube.modes.buckets import bucket_plan
from paracube.modes.rows import unique_rows

Arr = NDArray[np.float64]
Profile = tuple[Arr, Arr, Arr]  # per layout and release: chunk, fraction of the chunk's blocks done, S_j


@lru_cache(maxsize=4096)
def _buckets(mode: str, d: Dims, t: int, q: int, layers: int, first: bool, last: bool, dp: int,
             bucket_bytes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(releases per block, bytes of the buckets from each one on) of a stage: its interleavings v share them
    (a search asks for ~5 v per stage)."""
    units = parameter_units(mode, d, t, q, layers, first, last)
    sizes, counts = bucket_plan(units, first, last, dp, bucket_bytes)  # = padded bucket_numels, release_counts
    after = [*itertools.accumulate(reversed(sizes))][::-1] + [0]  # after[i] = sum(sizes[i:]), exact (ints)
    return tuple(counts), tuple(after)


@lru_cache(maxsize=4096)
def _release_table(mode: str, d: Dims, t: int, q: int, layers: int, first: bool, last: bool, dp: int, v: int,
                   bucket_bytes: int) -> NDArray[np.float64]:
    """_releases as a read-only [releases, 3] array (release_profile gathers its rows from these), built by numpy:
    the points are _release_points' floats, and S_j = after[issued_j] / total divides the same integers (below
    2^53: exact as float64) in float64, the correctly rounded quotient Python's int division gives too."""
    counts, after, issued = _bucket_arrays(mode, d, t, q, layers, first, last, dp, bucket_bytes)
    if after is None:  # byte counts past 2^53 (never in practice): Python's division
        out = np.array(_releases(mode, d, t, q, layers, first, last, dp, v, bucket_bytes),
                       dtype=np.float64).reshape(-1, 3)
    else:
        live = counts != 0
        points = np.array(_release_points(layers, v, len(counts)), dtype=np.float64).reshape(-1, 2)
        out = np.concatenate([points[live], (after[issued[live]] / max(int(after[0]), 1))[:, None]], axis=1)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=4096)
def _bucket_arrays(mode: str, d: Dims, t: int, q: int, layers: int, first: bool, last: bool, dp: int,
                   bucket_bytes: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """_buckets as arrays: (releases per block, bytes from each bucket on as float64 (None past 2^53), the
    buckets issued before each block's release); its interleavings v share them."""
    counts, after = _buckets(mode, d, t, q, layers, first, last, dp, bucket_bytes)
    c = np.array(counts, dtype=np.int64)
    exact = max(after) < 2**53
    return c, np.array(after, dtype=np.float64) if exact else None, np.cumsum(c) - c


@lru_cache(maxsize=4096)
def _releases(mode: str, d: Dims, t: int, q: int, layers: int, first: bool, last: bool, dp: int, v: int,
              bucket_bytes: int) -> tuple[tuple[float, float, float], ...]:
    """(chunk, fraction of its blocks done, share of the bucket bytes released then or later) per release."""
    counts, after = _buckets(mode, d, t, q, layers, first, last, dp, bucket_bytes)
    total = max(after[0], 1)
    at = _release_points(layers, v, len(counts))
    issued = itertools.accumulate(counts, initial=0)  # buckets issued before each release (one more: the total)
    return tuple((*p, after[i] / total) for p, n, i in zip(at, counts, issued, strict=False) if n)


@lru_cache(maxsize=1024)
def _release_points(layers: int, v: int, n: int) -> tuple[tuple[float, float], ...]:
    """(chunk, fraction of its blocks done) of a release at the end of backward block j = 0 .. n - 1 (the stage's
    other releases share them: they depend on its blocks and v only)."""
    per = max(layers, 1) / v  # blocks per chunk (analytic: an even split)
    out = []
    for j in range(n):
        done = min(j + 1, max(layers, 1))  # blocks finished (the final release: all of them)
        chunk = v - 1 - min(int((done - 1) // per), v - 1)
        out.append((float(chunk), (done - (v - 1 - chunk) * per) / per))
    return tuple(out)


def release_profile(mode: str, d: Dims, t: Arr, q: Arr, layers: Arr, first: Arr, last: Arr, dp: Arr, v: Arr,
                    bucket_bytes: int) -> Profile:
    """Per layout (arrays alike), padded to the most releases: (chunk, fraction, S); S = 0 pads."""
    profile, _, inverse = release_keys(mode, d, t, q, layers, first, last, dp, v, bucket_bytes)
    return tuple(x[inverse] for x in profile)  # type: ignore[return-value]


def release_keys(mode: str, d: Dims, t: Arr, q: Arr, layers: Arr, first: Arr, last: Arr, dp: Arr, v: Arr,
                 bucket_bytes: int) -> tuple[Profile, Arr, Arr]:
    """release_profile once per distinct stage shape: (the profile, a row per shape; each shape's v; each layout's
    row), so that callers gather the rows their layouts read instead of a [layouts, releases] copy per stage."""
    cols = [np.broadcast_to(np.asarray(x, dtype=np.int64), np.shape(t)) for x in (t, q, layers, first, last, dp, v)]
    keys = np.stack(cols, axis=-1).reshape(-1, len(cols))
    uniq, inverse = unique_rows(keys)
    d = param_dims(d)  # the cache key: what sizes the parameters (the search's passes share it)
    rel = [_release_table(mode, d, t_, q_, n, bool(f), bool(h), dp_, v_, bucket_bytes)
           for t_, q_, n, f, h, dp_, v_ in uniq.tolist()]
    lens = np.array([len(r) for r in rel], dtype=np.int64)
    table = np.zeros((len(uniq), max(int(lens.max(initial=0)), 1), 3))
    if lens.sum():  # every key's releases at once: row i, columns 0 .. len - 1
        row = np.repeat(np.arange(len(rel)), lens)
        table[row, np.arange(len(row)) - np.repeat(np.cumsum(lens) - lens, lens)] = np.concatenate(rel)
    return (table[..., 0], table[..., 1], table[..., 2]), uniq[:, 6], inverse.reshape(-1)


def exposed_grad_time(grad: Arr, backward: Arr, stage_index: Arr, pp: Arr, v: Arr, profile: Profile) -> Arr:
    """Per layout: seconds of one stage's overlapped gradient reduction left after the pipeline's last backward.
    grad: the stage's bucket time G; backward: b; stage_index: s; profile: release_profile's (rows per layout)."""
    chunk, frac, share = profile
    slot = (backward / np.maximum(v, 1))[:, None]
    at = -(stage_index[:, None] + chunk * pp[:, None]) * slot - slot * (1.0 - frac)
    finish = np.where(share > 0, at + share * grad[:, None], -np.inf).max(axis=1)
    return np.maximum(0.0, finish)


def stream_window(profile: Profile, v: Arr) -> tuple[Arr, Arr]:
    """Per layout: (x1, the share of the stage's last backward done at its first release; s_end, the share of its
    bucket time still queued when that backward ends): the stream can be busy beside the backward only between
    the two, for at most (1 - s_end) G (contention.py)."""
    chunk, frac, share = profile
    v = np.maximum(v, 1)
    x1 = np.where(share[:, 0] > 0, (v - 1 - chunk[:, 0] + frac[:, 0]) / v, 1.0)
    s_end = np.where((chunk == 0) & (frac >= 1.0), share, 0.0).max(axis=1)
    return x1, s_end


__all__ = ["Profile", "exposed_grad_time", "release_keys", "release_profile", "stream_window"]
