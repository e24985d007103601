"""The FSDP units' totals of a pipeline stage (zero=2/3), per layout of a batch: what comm.StepTraffic prices and
memory.with_zero holds.

Per stage shape (t, q, blocks, edge flags, zero group n, pp, v, micro-batches N), from the stage's units
(modes/buckets.plan_units, padded to a multiple of n: `_padded_units`): their number, the sum of their padded
lengths, the padded length zero=3 gathers once per micro-batch (the last unit; tied embeddings on a stage with
both ends: the embedding too), the most fp32 gradient-buffer elements live at once and the most elements gathered
at once (data_parallel/sharded.py, fsdp.py). pp = 1: the largest consecutive pair (tied: the embedding plus the
largest pair of the others). pp > 1 (untied; nothing held from forward to backward): every unit's gradient buffer
lives from its chunk's first backward to the end of its N-th, so the peak is the running sum of the chunks'
births (+ chunk elements) and deaths (-) in backward order (modes.stages.backward_spans), and zero=3 gathers a
consecutive pair of one chunk's units; N = 1: that pair for both.

Each stage shape is computed once per process (lru caches: a search asks for a few 10k shapes, most of them again
in its later passes). Moved out of comm.py (comm.StepTraffic prices the units it returns)."""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from paracube.cost_models.dims import Dims
from paracube.cost_models.local_parameters import parameter_units
from paracube.cost_models.param_dims import param_dims
from paracube.modes import LayoutBatch
from paracube.modes.buckets import padded_numel
from paracube.modes.rows import unique_rows
from paracube.modes.stages import backward_spans, stage_chunks, stage_layers

Arr = np.ndarray


@lru_cache(maxsize=8192)
def _chunk_totals(padded: tuple[int, ...], first: bool, last: bool, pp: int, v: int,
                  L: int) -> tuple[tuple[int, ...], int]:
    """pp > 1: (each model chunk's padded unit elements, the largest consecutive pair within one chunk). Units
    come in segments, one per model chunk: the embedding with chunk 0, the final unit with the last."""
    seg, same = _unit_chunks(first, last, pp, v, L)
    units = np.asarray(padded, dtype=np.int64)  # integer sums: exact (element counts, far below 2^62)
    pair = int(units.max())
    if same.any():
        pair = max(pair, int((units[:-1] + units[1:])[same].max()))
    chunk = np.bincount(seg, weights=units.astype(np.float64), minlength=v)
    return tuple(int(x) for x in chunk), pair


@lru_cache(maxsize=4096)
def _unit_chunks(first: bool, last: bool, pp: int, v: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(each unit's model chunk, whether each consecutive pair of units shares one) of a pipeline stage: what
    _chunk_totals reads of the stage's shape (its padded lengths vary with the zero group; these do not)."""
    stage = 0 if first else (pp - 1 if last else 1)
    sizes = [len(c) for c in stage_chunks(L, pp, v, stage)]
    seg = np.array(([0] if first else []) + [c for c, k in enumerate(sizes) for _ in range(k)]
                   + ([v - 1] if last else []), dtype=np.int64)
    same = seg[1:] == seg[:-1]
    seg.flags.writeable = same.flags.writeable = False
    return seg, same


@lru_cache(maxsize=8192)  # stage shapes of other tensor shapes / zero groups pad to the same units (~60% repeats)
def _pipelined_units(padded: tuple[int, ...], first: bool, last: bool, pp: int, v: int, L: int,
                     n_micro: int) -> tuple[int, int]:
    """pp > 1 (data_parallel/sharded.py, fsdp.py): (the most fp32 gradient-buffer elements live at once, the most
    units' elements gathered at once). A chunk's buffers live from its first micro-batch's backward to the end of
    its last one (n_micro > 1; one micro-batch: the consecutive pair of its in-flight and filling units, as
    pp = 1), so the peak is at the end of some chunk's first backward, in the backward order of
    modes.stages.schedule (backward_spans); zero=3 holds a consecutive pair of one chunk's units."""
    chunk, pair = _chunk_totals(padded, first, last, pp, v, L)
    if n_micro == 1:
        return pair, pair
    # Walk the chunks' births (first backward) and deaths (n_micro-th) in backward order; n_micro > 1, so a
    # chunk's birth comes strictly before its death.
    live = itertools.accumulate(-chunk[c] if dies else chunk[c] for dies, c in _chunk_events(pp, v, n_micro))
    return max(0, max(live, default=0)), pair  # the most live at once (0 before the first birth)


@lru_cache(maxsize=4096)
def _chunk_events(pp: int, v: int, n_micro: int) -> tuple[tuple[int, int], ...]:
    """(dies, chunk) of the chunks' births (first backward) and deaths (n_micro-th), in backward order."""
    events = sorted((at, dies, c) for c, span in enumerate(backward_spans(pp, v, n_micro))
                    for dies, at in enumerate(span) if at != np.inf)
    return tuple((dies, c) for _, dies, c in events)


@lru_cache(maxsize=4096)
def _padded_units(mode: str, d: Dims, t: int, q: int, layers: int, first: bool, last: bool,
                  n: int) -> tuple[int, ...]:
    return tuple(padded_numel(sum(u), n) for u in parameter_units(mode, d, t, q, layers, first, last))


@lru_cache(maxsize=65536)  # the search asks for a few 10k stage shapes
def _unit_totals(mode: str, d: Dims, t: int, q: int, layers: int, first: bool, last: bool,
                 n: int, pp: int = 1, v: int = 1, n_micro: int = 1) -> tuple[int, int, int, int, int]:
    padded = _padded_units(mode, d, t, q, layers, first, last, n)
    if pp > 1:  # pipelines (untied): nothing held; gradient buffers accumulated across micro-batches
        return len(padded), sum(padded), 0, *_pipelined_units(padded, first, last, pp, v, d.L, n_micro)
    pairs = [a + b for a, b in zip(padded, padded[1:], strict=False)] or padded
    if not (d.tied and first and last):
        return len(padded), sum(padded), padded[-1], max(pairs), max(pairs)
    # Tied embeddings on one stage: the embedding unit stays gathered from its forward to its backward (the head
    # reuses the table, data_parallel/fsdp.py): gathered once per micro-batch, held next to the other units' pair.
    rest = [a + b for a, b in zip(padded[1:], padded[2:], strict=False)] or padded[1:] or [0]
    return len(padded), sum(padded), padded[-1] + padded[0], max(pairs), padded[0] + max(rest)


def unit_totals(d: Dims, mode: str, b: LayoutBatch, first: Arr, last: Arr,
                n: Arr) -> tuple[Arr, Arr, Arr, Arr, Arr]:
    """Per layout (zero=2/3, modes/buckets.plan_units): the stage's FSDP units, the sum of their lengths padded
    to a multiple of the zero group's n ranks, the padded length of the units zero=3 gathers once per micro-batch
    (the last; tied embeddings on the stage: the embedding too), the largest sum of two consecutive padded units
    (the fp32 gradient buffers live at once: data_parallel/sharded.py) and the most gathered at once
    (data_parallel/fsdp.py: that pair; tied: the embedding plus the largest pair of the others). Keyed by the
    stage's shape. Pipelines (pp > 1): nothing gathered once; buffers and gathers per chunk (_pipelined_units)."""
    cols = [np.broadcast_to(np.asarray(x, dtype=np.int64), b.dp.shape)
            for x in (b.t, b.q, stage_layers(d.L, b.pp, b.v, first, last), first, last, n, b.pp, b.v,
                      np.maximum(d.global_batch // (b.dp * b.mb), 1))]
    rows = np.stack(cols, axis=1)
    keys, inverse = unique_rows(rows)
    # Pipelines (data_parallel/sharded.py, fsdp.py; untied): no unit held from forward to backward, every unit's
    # fp32 gradient buffer alive through the step (accumulated unsharded, reduce-scattered at the end).
    pd = param_dims(d)  # the cache key: what sizes the parameters
    per = np.array([_unit_totals(mode, pd, t, q, n_layers, bool(f), bool(h), n_zero, pp, v, n_micro)
                    for t, q, n_layers, f, h, n_zero, pp, v, n_micro in keys.tolist()], dtype=np.int64)
    out = per[inverse.reshape(-1)]
    return out[:, 0], out[:, 1], out[:, 2], out[:, 3], out[:, 4]


def memory_units(totals: tuple[Arr, ...]) -> tuple[Arr, Arr, Arr]:
    """unit_totals' (summed, gradient-buffer pair, gathered at once): what memory.with_zero reads."""
    return totals[1], totals[3], totals[4]


__all__ = ["memory_units", "unit_totals"]
