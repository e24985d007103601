"""Sliding windows per pipeline stage: a stage's blocks priced with their own attention, in both engines.

compute.attention_core_time prices a block at the model's mean windowed share (attention_window.window_share with
f = Dims.window_frac), right for the model's whole work, not for a stage: a stage holds its own blocks
(modes/stages.stage_chunks; with v > 1 chunks, a rank's non-contiguous block ranges), k of its Ls blocks windowed
(Dims.window_pattern, repeated from block 0: ModelSpec.attention_window). GPT-OSS's "WF" on an even number of blocks
per stage puts k = Ls / 2 everywhere (the mean: exact before this module); Gemma 3's "WWWWWF", or an odd number of
blocks per stage, does not: L = 8 blocks of "WWWWWF" on pp = 4 put the full block 5 on stage 2 alone, which then
does more attention work than the others, and the step follows it (the bubble the others); GPT-OSS-120B's 36 blocks
on pp = 4 put 9 on a stage, 5 windowed on stages 0 and 2, 4 on stages 1 and 3.

Per stage, one micro-batch, one rank, with T(x) = forward + backward (+ the forward again under full recomputation;
selective recomputation's re-run is in the backward, compute.block_compute_time) of one block priced at windowed
share x (Dims.window_frac = x: 1 a windowed block, 0 a full one, f the model's mean):
    own blocks                  = k T(1) + (Ls - k) T(0)
    correction (`stage_delta`)  = own blocks - Ls T(f)
the same correction in kind as mlp_delta.py's per-block MLP widths. The analytic engine adds it to each of its three
representative stages (stage_scores.STAGES), standing for: the first stage (0), the last (pp - 1), and of the
middle ones the fullest (modes/stages.stage_layers' block count, which prices the middle's other terms) with the
fewest windowed blocks, the slowest of them (a windowed block costs less than a full one). Only a split leaving more
than 2 blocks short (stage_layers) has middle stages of unequal counts, where a less full one with fewer windowed
blocks could be the slower; the event engine, which runs every stage, prices that. The event engine builds every stage's
program from its own blocks (`block_units`: each block's units at its own share, event_compute.unit_compute). Without
windows, with every block windowed (f = 1) or none (the window no shorter than the sequence, the unfused core,
fa=0, which masks the whole s x s scores) every block prices alike: no correction, the same floats as before.

The analytic bubble (pipeline_bubble.py, v = 1) sums every other stage's micro-batch: its pp - 2 middle stages are
the represented one less `middle_excess`, what their own windowed blocks save against it. Context parallelism's p2p
ring steps run beside each block's own attention (`stage_ring`; the event engine: event_context.ring_ops with
`block_shares`): a windowed block hides less of its exchange. Left at the mean share: a MoE block's host issue time
(host_issue.py).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np

from paracube.cost_models.compute import GemmModel, block_compute_time
from paracube.cost_models.context_parallel import ring_time
from paracube.cost_models.dims import Dims
from paracube.cost_models.event_compute import unit_compute
from paracube.layout import Layout
from paracube.modes import LayoutBatch
from paracube.modes.rows import unique_rows
from paracube.modes.stages import stage_chunks, stage_layers

Arr = np.ndarray


def stages_differ(d: Dims) -> bool:
    """Blocks of `d` price differently by their own window (module docstring): flash attention, a window shorter
    than the sequence, some blocks windowed and some not."""
    return bool(d.flash and d.window and 0.0 < d.window_frac < 1.0 and d.window < d.s * d.cp)


def is_windowed(pattern: str, i: int) -> bool:
    """Block i windowed under Dims.window_pattern ("": every block; ModelSpec.attention_window's rule)."""
    pattern = pattern or "W"
    return pattern[i % len(pattern)] == "W"


@lru_cache(maxsize=4096)
def stage_windowed(pattern: str, L: int, pp: int, v: int, stage: int) -> int:
    """Windowed blocks of `stage`'s chunks (modes/stages.stage_chunks)."""
    return sum(is_windowed(pattern, i) for chunk in stage_chunks(L, pp, v, stage) for i in chunk)


@lru_cache(maxsize=4096)
def represented_windowed(pattern: str, L: int, pp: int, v: int, first: int, last: int) -> int:
    """Windowed blocks of the stage the analytic engine's edge flags stand for (module docstring): the first, the
    last, or the fullest middle stage with the fewest; at pp = 1 the whole model."""
    if first or last:
        return stage_windowed(pattern, L, pp, v, 0 if first else pp - 1)
    middle = range(1, pp - 1)
    sizes = {s: sum(len(c) for c in stage_chunks(L, pp, v, s)) for s in middle}
    fullest = max(sizes.values())
    return min(stage_windowed(pattern, L, pp, v, s) for s in middle if sizes[s] == fullest)


def _per_block(fb: tuple[Arr, Arr], full: bool) -> Arr:
    """One block's seconds per micro-batch from its (forward, backward): full recomputation runs its forward again."""
    f, b = fb
    return f + b + (f if full else 0.0)


def _kinds(d: Dims, mode: str, b: LayoutBatch, g: GemmModel) -> tuple[Arr, Arr]:
    """(T(1), T(0)) per configuration of `b`: one windowed block's and one full block's seconds (module docstring)."""
    full = d.recompute == "full"
    return tuple(_per_block(block_compute_time(replace(d, window_frac=x), mode, b, g), full)  # type: ignore[return-value]
                 for x in (1.0, 0.0))


def _per_config(b: LayoutBatch, first: Arr | int, last: Arr | int, count: Any) -> Arr:
    """count(pp, v, first, last) per configuration of `b`, once per distinct row."""
    cols = np.stack(np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (b.pp, b.v, first, last))), axis=1)
    keys, inverse = unique_rows(cols)
    return np.array([count(*key) for key in keys.tolist()], dtype=float)[inverse.reshape(-1)]


def stage_delta(d: Dims, mode: str, b: LayoutBatch, g: GemmModel, first: Arr, last: Arr,
                blocks: tuple[Arr, Arr]) -> Arr:
    """Seconds per step, per configuration of `b`, that a stage's own blocks add to its Ls blocks at the mean share
    (module docstring: N (k T(1) + (Ls - k) T(0) - Ls T(f))); `first` / `last` its edge flags, `blocks` the batch's
    compute.block_compute_time of `d`. Call it where `stages_differ(d)`."""
    per_w, per_f = _kinds(d, mode, b, g)
    Ls = stage_layers(d.L, b.pp, b.v, first, last)
    k = _per_config(b, first, last, lambda pp, v, f, h: represented_windowed(d.window_pattern, d.L, pp, v, f, h))
    N = d.global_batch // (b.dp * b.mb)
    return N * (k * per_w + (Ls - k) * per_f - Ls * _per_block(blocks, d.recompute == "full"))


def _middle_windowed(pattern: str, L: int, pp: int, v: int) -> int:
    """Windowed blocks of the middle stages 1 .. pp - 2 together, beyond pp - 2 times the represented one's."""
    if pp < 3:
        return 0
    own = sum(stage_windowed(pattern, L, pp, v, s) for s in range(1, pp - 1))
    return own - (pp - 2) * represented_windowed(pattern, L, pp, v, 0, 0)


def middle_excess(d: Dims, mode: str, b: LayoutBatch, g: GemmModel) -> Arr:
    """Seconds per step, per configuration of `b`, by which pp - 2 copies of the represented middle stage exceed the
    middle stages' own work (pipeline_bubble.bubble_seconds' `middle_less`): N (sum_s k_s - (pp - 2) k) (T(0) - T(1)),
    each middle stage taken at the represented one's block count. Call it where `stages_differ(d)`."""
    per_w, per_f = _kinds(d, mode, b, g)
    extra = _per_config(b, 0, 0, lambda pp, v, f, h: _middle_windowed(d.window_pattern, d.L, pp, v))
    return d.global_batch // (b.dp * b.mb) * extra * (per_f - per_w)


def block_shares(d: Dims, layout: Layout, stage: int) -> list[float] | None:
    """Each block of `stage`'s windowed share (1.0 windowed, 0.0 full), in the event program's order (its chunks'
    blocks, named 0.. by event_program.build_stage); None where `stages_differ(d)` is not: every block at the mean."""
    if not stages_differ(d):
        return None
    chunks = stage_chunks(d.L, layout.pp, layout.interleave, stage)
    return [1.0 if is_windowed(d.window_pattern, i) else 0.0 for c in chunks for i in c]


def block_units(d: Dims, layout: Layout, mb: int, g: GemmModel, stage: int,
                comp: dict[str, tuple[float, float, float]]) -> list[dict[str, Any]]:
    """The event engine's units (event_compute.unit_compute) of each block of `stage`, in the program's order: each at
    its own windowed share (`block_shares`), else `comp` (the mean block's) for all."""
    shares = block_shares(d, layout, stage)
    if shares is None:
        return [comp] * sum(len(c) for c in stage_chunks(d.L, layout.pp, layout.interleave, stage))
    own = {x: unit_compute(replace(d, window_frac=x), layout, mb, g) for x in (0.0, 1.0)}
    return [own[x] for x in shares]


def stage_ring(d: Dims, mode: str, b: LayoutBatch, bw: Arr, lat: Arr, g: GemmModel, first: Arr, last: Arr,
               rows: Arr) -> Arr:
    """context_parallel.ring_time's exposed seconds of a stage's p2p ring, per layout, each block's ring steps beside
    its own attention blocks: k windowed and Ls - k full blocks (the bytes are the same). Call it where
    `stages_differ(d)`."""
    Ls = stage_layers(d.L, b.pp, b.v, first, last)
    k = _per_config(b, first, last, lambda pp, v, f, h: represented_windowed(d.window_pattern, d.L, pp, v, f, h))
    return (ring_time(replace(d, window_frac=1.0), mode, b, bw, lat, g, k, rows)[0]
            + ring_time(replace(d, window_frac=0.0), mode, b, bw, lat, g, Ls - k, rows)[0])


__all__ = ["block_shares", "block_units", "is_windowed", "middle_excess", "represented_windowed", "stage_delta",
           "stage_ring", "stage_windowed", "stages_differ"]
