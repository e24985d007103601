"""Megatron's interleaved 1F1B replayed over per-chunk costs: the analytic engine's bubble where layers split unevenly.

Narayanan et al.'s (pp - 1) / (v N) of the slowest stage's work (pipeline_bubble.py) assumes every model chunk equally
heavy. Where the layers do not split evenly over the pp v virtual stages (modes/stages.chunk_layers: llama3-70b on
pp 4 x v 3 -> 6, 7 x 10, 4), the schedule is paced chunk by chunk and the closed form misses both ways: llama3-70b on
64 H100s, dp=2,pp=4,tp=1d:8,mb=2 (4 micro-batches), the event engine (which runs the schedule) -6.5% from the closed
form at v = 3, -4.4% at v = 7, +1.4% at v = 6 (benchmarks/interleaved_bubble.py). There the step is the makespan of
modes/stages.schedule (the order the event engine and the executor run) with virtual stage j's forward and backward
of a micro-batch costing (1 - b) c_j and b c_j,
    c_j = layers_j p + [j = 0] e_first + [j = pp v - 1] e_last
p the middle stage's work per block (stage_layers' fullest middle stage; pp = 2: the first stage's), e_first / e_last
what the first / last stage's work exceeds its blocks' (embedding; head and loss) or, where it falls short, that
stage's work spread over its chunks by their blocks; b the backward's share (2/3, 3/4 under full recomputation, as
analytic.py's). Each op starts when its stage is free and its input has arrived (the forward of virtual stage j - 1,
the backward of j + 1; the sends are in the stage works already). The bubble is what the makespan exceeds the
slowest representative stage's N micro-batches. On even chunks without edge work the replay is the closed form
exactly (tests/test_pipeline_replay.py); even splits are priced by pipeline_bubble.py's sum over the other devices,
which is what this replay gives there where the extra work is the head's (within 0.3% on average,
tests/test_pipeline_replay.py), at no replay's cost.
Cost: 2 pp v N ops, replayed wavefront by wavefront over every layout of one (pp, v, N) at once. Beyond LONG pp
micro-batches the makespan is extrapolated linearly from SHORT pp and LONG pp: once the pipeline is full, each period
of pp micro-batches adds the same time, at least the slowest stage's pp micro-batches (a dependency cycle across
stages can make it longer).
Bounds (score_bounds.py) read the `lower` form, which no step falls below and which grows with every stage's work,
as the search's pruning needs (a layout's links no worse than any placement's give a bound): every chunk at the least
work per block of the three stages (no chunk costs less: edge work only adds, and each stage's own work per block is
at least the least), i.e. the replay in block units (cached per shape) scaled, exact up to LONG pp micro-batches, then
+ (N - LONG pp) x the slowest stage's micro-batch (each micro-batch more adds at least that stage's work); the replay
grows with every op's cost.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from paracube.modes.stages import chunk_layers, schedule

Arr = np.ndarray
SHORT, LONG = 3, 4  # the extrapolation's two replays, in periods of pp micro-batches (module docstring)
COLUMNS = 256  # layouts replayed at once: every op's end held, [ops, COLUMNS] floats
PER_OP = 10  # a wavefront's numpy calls cost about this many ops walked in Python: fewer layouts walk op by op


class _Program(NamedTuple):
    """The schedule's ops: virtual stage, is-backward, the op before it on its stage and the op it waits for (index
    n_ops: none, an end of 0), the wavefronts (ops whose two are in earlier ones) and the walk's links."""

    j: Arr
    back: Arr
    prev: Arr
    dep: Arr
    fronts: tuple[Arr, ...]
    links: list[tuple[int, int, int]]  # (op, before it on its stage, waited for), in `order`: the walk's


@lru_cache(maxsize=512)
def _program(pp: int, v: int, n_micro: int) -> _Program:
    """modes/stages.schedule of every stage, walked once: each stage runs its ops while their inputs are in."""
    orders = [schedule(pp, v, n_micro, s) for s in range(pp)]
    n, last = sum(len(o) for o in orders), pp * v - 1
    j, back, prev, dep = ([0] * n for _ in range(4))
    where: dict[tuple[str, int, int], int] = {}
    at, tail, order, level = [0] * pp, [n] * pp, [], [0] * (n + 1)
    while len(order) < n:
        walked = len(order)
        for s in range(pp):
            while at[s] < len(orders[s]):
                kind, c, m = orders[s][at[s]]
                k = c * pp + s
                wait = (None if k == 0 else ("F", k - 1, m)) if kind == "F" else \
                    (("F", k, m) if k == last else ("B", k + 1, m))
                if wait is not None and wait not in where:
                    break
                i = where[(kind, k, m)] = len(order)
                j[i], back[i], prev[i], dep[i] = k, kind == "B", tail[s], where[wait] if wait is not None else n
                level[i] = max(level[prev[i]], level[dep[i]]) + 1
                order.append(i)
                tail[s], at[s] = i, at[s] + 1
        if len(order) == walked:  # every stage waits on another: not a schedule that runs (stages.schedule's do)
            raise ValueError(f"pipeline schedule pp={pp}, v={v}, {n_micro} micro-batches deadlocks")
    lv = np.asarray(level[:n])
    fronts = tuple(np.flatnonzero(lv == k) for k in range(1, int(lv.max()) + 1))
    return _Program(*(np.asarray(x, dtype=np.int64) for x in (j, back, prev, dep)), fronts,
                    [(i, prev[i], dep[i]) for i in order])


def makespan(costs: Arr, backward: float, pp: int, v: int, n_micro: int) -> Arr:
    """Makespan per layout of the schedule with virtual stage j's micro-batch costing costs[j] (shape [pp v, n]):
    a few layouts op by op, many wavefront by wavefront, COLUMNS at a time (every op's end is held)."""
    prog = _program(pp, v, n_micro)
    share = np.where(prog.back, backward, 1.0 - backward)
    if costs.shape[1] * len(prog.j) < PER_OP * len(prog.fronts):
        return np.array([_walk(prog, (costs[prog.j, k] * share).tolist()) for k in range(costs.shape[1])])
    out = np.empty(costs.shape[1])
    for lo in range(0, costs.shape[1], COLUMNS):
        op = costs[prog.j, lo:lo + COLUMNS] * share[:, None]
        end = np.zeros((len(prog.j) + 1, op.shape[1]))
        for f in prog.fronts:
            end[f] = np.maximum(end[prog.prev[f]], end[prog.dep[f]]) + op[f]
        out[lo:lo + COLUMNS] = end[:-1].max(axis=0)
    return out


def _walk(prog: _Program, op: list[float]) -> float:
    """One layout's makespan, op by op in the program's order (op: each op's seconds)."""
    end = [0.0] * (len(op) + 1)
    for i, before, wait in prog.links:
        a, b = end[before], end[wait]
        end[i] = (a if a > b else b) + op[i]
    return max(end)


def chunk_costs(work: Arr, layers: int, pp: int, v: int, lower: bool = False) -> Arr:
    """[pp v, n] per-micro-batch cost of every virtual stage (module docstring) from the representative stages'
    per-micro-batch work [3, n] (first, middle, last); `lower`: every chunk at the least work per block of the three
    (no more than any chunk's own, and growing with each stage's work: the bounds')."""
    split = np.asarray(chunk_layers(layers, pp, v), dtype=np.float64)
    on_stage = split.reshape(v, pp).sum(axis=0)  # blocks per physical stage
    if lower:
        return split[:, None] * least_per_block(work, layers, pp, v)[None, :]
    per_block = work[1] / (on_stage[1] if pp > 2 else on_stage[0])
    costs = split[:, None] * per_block[None, :]
    for s, row, j in ((0, 0, 0), (pp - 1, 2, pp * v - 1)):
        extra = work[row] - on_stage[s] * per_block
        mine = np.arange(s, pp * v, pp)
        spread = split[mine, None] * (work[row] / on_stage[s])[None, :]
        costs[mine] = np.where(extra >= 0, costs[mine], spread)
        costs[j] += np.maximum(extra, 0.0)
    return costs


def least_per_block(work: Arr, layers: int, pp: int, v: int) -> Arr:
    """Per layout, the least of the first, middle (pp > 2) and last stage's work per block (`work` [3, n])."""
    on_stage = np.asarray(chunk_layers(layers, pp, v), dtype=np.float64).reshape(v, pp).sum(axis=0)
    least = np.minimum(work[0] / on_stage[0], work[2] / on_stage[-1])
    return np.minimum(least, work[1] / on_stage[1]) if pp > 2 else least


@lru_cache(maxsize=4096)
def uneven(layers: int, pp: int, v: int) -> bool:
    """Whether the layers split unevenly over the pp v virtual stages (the rows this replay prices)."""
    return len(set(chunk_layers(layers, pp, v))) > 1


@lru_cache(maxsize=4096)
def _unit_makespan(layers: int, pp: int, v: int, n_micro: int, backward: float) -> float:
    """The makespan with every virtual stage costing its blocks (one unit a block and micro-batch)."""
    split = np.asarray(chunk_layers(layers, pp, v), dtype=np.float64)
    return float(makespan(split[:, None], backward, pp, v, n_micro)[0])


def _spans(work: Arr, layers: int, pp: int, v: int, n: int, backward: float, lower: bool) -> Arr:
    """Makespan per layout of one (pp, v, N) group (module docstring), `work` [3, n] over the step."""
    slowest = work.max(axis=0) / n
    cap = min(n, LONG * pp)
    if lower:  # every chunk at the least work per block: the unit makespan scaled
        return least_per_block(work / n, layers, pp, v) * _unit_makespan(layers, pp, v, cap, backward) + \
            (n - cap) * slowest
    costs = chunk_costs(work / n, layers, pp, v)
    long = makespan(costs, backward, pp, v, cap)
    if n <= cap:
        return long
    short = makespan(costs, backward, pp, v, SHORT * pp)
    return long + (n - cap) / pp * np.maximum(long - short, pp * slowest)


def interleaved_bubble(work: Arr, layers: int, pp: Arr, v: Arr, N: Arr, backward: float = 2.0 / 3.0,
                       lower: bool = False) -> Arr:
    """Per layout: the replayed makespan less the slowest stage's N micro-batches (>= 0), `work` [3, n] each
    representative stage's work over the step's N micro-batches (v > 1 rows); `lower`: the bounds' form (module
    docstring)."""
    keys = np.stack([np.broadcast_to(np.asarray(x), work.shape[1:]) for x in (pp, v, np.rint(N))]).astype(np.int64)
    span = np.zeros(work.shape[1])
    for key in np.unique(keys, axis=1).T:
        rows = np.flatnonzero(np.all(keys == key[:, None], axis=0))
        span[rows] = _spans(work[:, rows], layers, *(int(x) for x in key), backward, lower)
    return np.maximum(span - work.max(axis=0), 0.0)


__all__ = ["chunk_costs", "interleaved_bubble", "least_per_block", "makespan", "uneven"]
