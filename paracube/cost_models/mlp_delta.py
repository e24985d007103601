"""Each block's MLP at its own width against the dense part's stand-in (both engines: moe.stage_cost, moe_program.py).

The dense engines price `moe.dense_part(model)`, whose every block has an MLP of the blocks' mean width f_mean (the
dense blocks' ffn_hidden and the MoE blocks' shared expert, averaged, at least moe.MIN_WIDTH): right for the model's
whole FLOPs, not for a stage. A stage holds its own blocks: DeepSeek-V3's 3 dense blocks (18432 wide) sit on the
first stages, its MoE blocks' shared expert is 2048 wide, so a stage of MoE blocks ran a 2816-wide stand-in, 1.375x
the shared expert's GEMMs; a MoE block without a shared expert (Mixtral, Qwen3-MoE) runs no dense MLP at all
(moe_unshared.py drops its collectives), where the stand-in kept a 128-wide one.

Correction per block i on the stage, one micro-batch, one rank: its true width f_i (ModelSpec.ffn_hidden for a dense
block, MoESpec.shared_ffn for a MoE block, 0 without a shared expert) priced exactly as the dense engines price the
stand-in (compute.stage_compute_time: the gated MLP's fc [h, 2 f] and fc2 [f, h] at the mode's local shapes,
GemmModel.linear_time with the FP8 casts where the dtype has them; the SwiGLU's share of compute.elementwise_forward,
4 c T f / t bytes forward, twice that backward), minus the stand-in's:
    forward  = L(f_i) - L(f_mean),   backward = B(f_i) - B(f_mean)
with the forward run again in backward under full recomputation; under the "op" selective rule (recompute.py) the
elementwise part's (it re-runs every elementwise op; its re-run matmuls stay the stand-in's, as recompute.py prices
them); and its whole true forward L(f_i) under rcm= naming the block's MLP (recompute_modules_cost.py: mlp a dense
block's, shared_experts / moe a MoE block's shared expert), a dense block's with its pre-MLP norm under fused norms
(recompute_modules_cost.mlp_norm_time: the norm inside fc, re-run with it).
The tensor-parallel collectives of the MLP carry T h, whatever the width: unchanged. A dense model (no MoE
blocks) is its own dense part: no correction.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from paracube.cost_models import fp8
from paracube.cost_models.compute import GemmModel, local_shape
from paracube.cost_models.dims import Dims
from paracube.cost_models.recompute_modules_cost import layout_shards, mlp_norm_time, moe_side
from paracube.layout import Layout
from paracube.modes import LayoutBatch
from paracube.workload import ModelSpec


def true_width(model: ModelSpec, block: int) -> int:
    """Block `block`'s dense MLP width: the dense blocks' ffn_hidden, a MoE block's shared expert (0: none)."""
    moe = model.moe
    if moe is None or not moe.is_moe_layer(block):
        return model.ffn_hidden
    return moe.shared_ffn


def _mlp(d: Dims, layout: Layout, mb: int, g: GemmModel, f: int) -> tuple[float, float, float]:
    """(forward s, backward s, the forward's elementwise s) of one block's gated MLP of width f, one micro-batch, one
    rank (module docstring)."""
    return _mlp_at(d, layout.mode, layout.tensor_size, layout.q, layout.depth, mb, g, f)


@lru_cache(maxsize=4096)  # a search's layouts share a few tensor shapes: each MLP priced once per shape
def _mlp_at(d: Dims, mode: str, t: int, q: int, depth: int, mb: int, g: GemmModel, f: int
            ) -> tuple[float, float, float]:
    """`_mlp` on a tensor group of t ranks (q, depth: the mode's grid): all its GEMM shapes depend on
    (compute.local_shape)."""
    if f <= 0:
        return 0.0, 0.0, 0.0
    b = LayoutBatch.one(dp=1, pp=1, t=t, q=q, depth=depth, mb=mb, v=1, sp=0)
    T = (b.mb * d.s).astype(float)
    fwd = bwd = 0.0
    for name, h_in, h_out, column in (("fc", d.h, 2 * f, True), ("fc2", f, d.h, False)):
        lf, lb = g.linear_time(*local_shape(mode, T, h_in, h_out, column, b),
                               fp8.weight_cast_per_micro_batch(d), fp8.cast_bytes(d, name))
        fwd, bwd = fwd + float(np.ravel(lf)[0]), bwd + float(np.ravel(lb)[0])
    elem = float(np.ravel(d.c * 4 * T * f / b.t / (g.mem_bw * g.mem_eff))[0])  # elementwise_forward's f term
    return fwd + elem, bwd + 2 * elem, elem


def block_deltas(model: ModelSpec, d: Dims, layout: Layout, mb: int, g: GemmModel,
                 blocks: list[int]) -> list[tuple[float, float]]:
    """Per block of `blocks` (global indices): (forward s, backward s) its true MLP adds to the stand-in's, one
    micro-batch, one rank, the backward with any recomputed forward (module docstring); zeros for a model without
    MoE blocks."""
    if model.moe is None:
        return [(0.0, 0.0)] * len(blocks)
    full = d.recompute == "full"
    op = d.recompute == "selective" and d.selective == "op"
    stand = _mlp(d, layout, mb, g, d.f)
    mods = moe_side(layout)  # rcm=: mlp re-runs a dense block's, shared_experts / moe a MoE block's shared expert
    # a dense block's pre-MLP norm with it under fused norms (inside fc); a shared expert's region holds no norm
    norm = float(mlp_norm_time(d, float(mb * d.s), layout_shards(layout), g.mem_bw * g.mem_eff))
    cache: dict[tuple[int, bool, bool], tuple[float, float]] = {}
    out = []
    for i in blocks:
        f, dense = true_width(model, i), not model.moe.is_moe_layer(i)
        again = ("mlp" in mods) if dense else bool({"shared_experts", "moe"} & set(mods))
        if (f, again, dense) not in cache:
            true = _mlp(d, layout, mb, g, f)
            tf, tb, te = (a - b for a, b in zip(true, stand, strict=True))
            rerun = true[0] + (norm if dense else 0.0) if again else 0.0
            cache[f, again, dense] = (tf, tb + (tf if full else te if op else 0.0) + rerun)
        out.append(cache[f, again, dense])
    return out


def mlp_delta(model: ModelSpec, d: Dims, layout: Layout, mb: int, g: GemmModel, blocks: list[int]) -> float:
    """Seconds the true MLPs of `blocks` add to the stand-in's, one micro-batch, one rank (`block_deltas` summed)."""
    return sum(f + b for f, b in block_deltas(model, d, layout, mb, g, blocks))


__all__ = ["block_deltas", "mlp_delta", "true_width"]
