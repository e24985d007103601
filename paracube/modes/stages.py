"""Pipeline stages: which blocks each (virtual) stage holds, and the order a stage runs its micro-batches.

Read by the cost models (layers per stage, schedule of the event engine) and by the executor (the blocks a
rank builds, executor/pipeline/schedule.py), so both split and schedule a pipeline the same way.

Layers per virtual stage (pp stages x v model chunks; virtual stage j = chunk c * pp + stage s, Narayanan
et al. 2021): base = ceil(L / (pp v)), deficit = pp v base - L.
- deficit 0: every virtual stage holds base blocks (the even split);
- deficit 1: the LAST virtual stage holds base - 1 (it also runs the final norm, head and loss);
- deficit 2: the first and the last virtual stage hold base - 1 (Llama 3, Dubey et al. 2024, sec. 3.3.2:
  "we reduce one Transformer layer each from the first and the last stages": 126 layers on 16 stages ->
  7, 8 x 14, 7);
- deficit d > 2: the first virtual stage holds base - 1, the other d - 1 blocks are taken from the end, the last
  virtual stage giving up to base - 1 of them, then the one before it, and so on (Megatron-core places any
  per-stage split, --pipeline-model-parallel-layout / --decoder-last-pipeline-num-layers; Megatron-Bridge's
  DeepSeek-V3 layouts put the remainder on the last stages: 61 blocks on pp = 16 -> 4, 4 x 14, 1; here 3, 4 x 14,
  2; on pp 8 x v 4 -> 1, 2 x 29, 1, 1);
a virtual stage left without blocks (base 1 with a deficit) is not a valid split (`split_ok`).
So a physical stage holds v base blocks less its virtual stages' shares of the deficit (`stage_layers`,
vectorized over layouts): with deficit <= 2, one on the first stage when deficit = 2 and one on the last when
deficit >= 1.

Schedule (`schedule`): 1F1B (v = 1) warms up with pp - 1 - s forwards; Megatron's interleaved 1F1B warms up
with (pp - 1 - s) 2 + (v - 1) pp chunk-forwards; then one forward, one backward, then the cool-down.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from paracube.modes.rows import unique_rows


def _base_deficit(L: Any, n: Any) -> tuple[Any, Any]:
    base = -(-L // n)
    return base, n * base - L


def split_ok(L: Any, pp: Any, v: Any) -> Any:
    """The split rule holds (ints or arrays): every virtual stage keeps a block (module docstring)."""
    base, deficit = _base_deficit(L, pp * v)
    return (deficit == 0) | (base >= 2)


def _taken(spill: Any, base: Any, i: Any) -> Any:
    """Blocks the virtual stage i places from the end gives up of the `spill` taken from the end."""
    return np.clip(spill - i * (base - 1), 0, np.maximum(base - 1, 0))


def chunk_layers(L: int, pp: int, v: int = 1) -> list[int]:
    """Blocks of every virtual stage j = 0 .. pp v - 1."""
    n = pp * v
    base, deficit = _base_deficit(L, n)
    out = [base] * n
    lead = int(deficit >= 2)
    out[0] -= lead
    spill, most = deficit - lead, max(base - 1, 0)
    for i in range(n):  # _taken on ints (numpy's clip on scalars cost the search ~0.1 s)
        out[n - 1 - i] -= int(min(max(spill - i * (base - 1), 0), most))
    return out


def stage_chunks(L: int, pp: int, v: int, stage: int) -> list[list[int]]:
    """Global block indices of each model chunk c = 0 .. v-1 on physical stage `stage`."""
    return [list(c) for c in _stage_chunks(L, pp, v, stage)]


@lru_cache(maxsize=4096)  # asked per layout and stage (the MoE search: ~10^5 times, a few hundred keys)
def _stage_chunks(L: int, pp: int, v: int, stage: int) -> tuple[tuple[int, ...], ...]:
    sizes = chunk_layers(L, pp, v)
    starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return tuple(tuple(range(starts[c * pp + stage], starts[c * pp + stage + 1])) for c in range(v))


def stage_layers(L: int, pp: Any, v: Any, first: Any, last: Any) -> Any:
    """Blocks on a stage with these edge flags (ints or arrays; pp = 1 is both first and last: L); neither flag:
    the fullest middle stage (stage 1, the farthest from the end's deficit)."""
    base, deficit = _base_deficit(L, pp * v)
    if np.all(deficit <= 2):  # the usual case, as before: one from the first (deficit 2) and the last
        return v * base - first * (deficit == 2) - last * (deficit >= 1)
    if any(np.ndim(x) for x in (pp, v, first, last)):  # arrays over layouts: each distinct stage once
        cols = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (pp, v, first, last)))
        # an evaluation asks again with the same arrays (each stage's cost models): answered from the last ones
        return _uneven_rows(int(L), cols[0].shape, *(np.ascontiguousarray(c).tobytes() for c in cols))
    return _uneven_layers(L, pp, v, first, last)


@lru_cache(maxsize=256)
def _uneven_rows(L: int, shape: tuple[int, ...], pp: bytes, v: bytes, first: bytes, last: bytes) -> np.ndarray:
    """stage_layers of int64 arrays (given by their bytes and common shape; a function of them only), read-only:
    the callers compute new arrays from it."""
    cols = [np.frombuffer(x, dtype=np.int64) for x in (pp, v, first, last)]
    keys, inverse = unique_rows(np.stack(cols, axis=1))
    per = np.array([_uneven_layers(L, *k) for k in keys.tolist()], dtype=np.int64)
    out = per[inverse.reshape(-1)].reshape(shape)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=4096)
def _uneven_layers(L: Any, pp: Any, v: Any, first: Any, last: Any) -> Any:
    """stage_layers where some split leaves a deficit > 2 (one stage: ints)."""
    base, deficit = _base_deficit(L, pp * v)
    lead = deficit >= 2
    spill = deficit - lead

    def loss(offset: Any) -> Any:  # a physical stage's virtual stages sit offset + c pp from the end
        return sum(np.where(c < v, _taken(spill, base, offset + c * pp), 0) for c in range(int(np.max(v))))

    middle = np.where(pp >= 3, loss(np.maximum(pp - 2, 0)), 0)
    return (v * base - first * (lead + loss(pp - 1)) - last * loss(0)
            - (1 - np.asarray(first)) * (1 - np.asarray(last)) * middle)


def _chunk(k: Any, pp: int, v: int, forward: bool) -> Any:
    """Model chunk of the k-th forward (or backward) of a stage (ints or arrays): chunks go up forward, down
    backward, pp micro-batches at a time."""
    c = (k % (pp * v)) // pp
    return c if forward else v - 1 - c


def schedule(pp: int, v: int, n_micro: int, stage: int) -> list[tuple[str, int, int]]:
    """Order of (F|B, chunk, micro-batch) on `stage`: 1F1B (v = 1) or Megatron's interleaved 1F1B."""
    total = n_micro * v

    def chunk(k: int, forward: bool) -> int:
        return _chunk(k, pp, v, forward)

    def micro(k: int) -> int:
        return (k // (pp * v)) * pp + k % pp if v > 1 else k

    warm = min(pp - stage - 1, n_micro) if v == 1 else min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    out: list[tuple[str, int, int]] = []
    f = b = 0
    for _ in range(warm):
        out.append(("F", chunk(f, True), micro(f)))
        f += 1
    while f < total:
        out.append(("F", chunk(f, True), micro(f)))
        f += 1
        out.append(("B", chunk(b, False), micro(b)))
        b += 1
    while b < total:
        out.append(("B", chunk(b, False), micro(b)))
        b += 1
    return out


@lru_cache(maxsize=1024)
def backward_spans(pp: int, v: int, n_micro: int) -> tuple[tuple[float, float], ...]:
    """Per model chunk c: (position of its first backward, position of its n_micro-th) among a stage's
    backward ops, inf where it has none or fewer. The backward ops come in the same order on every stage
    (`schedule` interleaves the forwards differently, not the backwards), so this is what `schedule` yields,
    read without walking its n_micro v ops (the planner asks for it once per layout shape)."""
    chunks = _chunk(np.arange(n_micro * v), pp, v, False)
    spans = []
    for c in range(v):
        at = np.flatnonzero(chunks == c)
        spans.append((float(at[0]) if at.size else np.inf, float(at[n_micro - 1]) if at.size >= n_micro else np.inf))
    return tuple(spans)


def run_lengths(items: list[Any]) -> list[tuple[Any, int]]:
    """Consecutive equal items counted, in order: [1, 2, 2, 1] -> [(1, 1), (2, 2), (1, 1)]."""
    runs: list[tuple[Any, int]] = []
    for item in items:
        if runs and runs[-1][0] == item:
            runs[-1] = (item, runs[-1][1] + 1)
        else:
            runs.append((item, 1))
    return runs


def split_text(L: int, pp: int, v: int = 1) -> str:
    """Blocks per virtual stage in order, runs counted, for messages: '1, 2 x 5, 1 x 50'."""
    return ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in run_lengths(chunk_layers(L, pp, v)))


__all__ = ["backward_spans", "chunk_layers", "run_lengths", "schedule", "split_ok", "split_text", "stage_chunks",
           "stage_layers"]
