"""The attention correction of a model whose attention is not the dense part's: multi-head latent attention
(DeepSeek-V2, arXiv 2405.04434) or a head width other than hidden / heads (Qwen3).

The dense engines price `moe.dense_part(model)`: a head width other than hidden / heads with its linears at their
true widths (Dims.linears: qkv [h, q + 2 kv], proj [q, h]; their parameters, collectives and activations too), MLA's
attention as grouped-query attention of hidden / heads per head (qkv [h, h + 2 kv], proj [h, h]) with its own
parameters and collectives (cost_models/mla.py). Per block and micro-batch on one rank, this module gives what the
true attention adds to that: MLA's the difference between its linears and the dense part's at the dense part's
token count, and their parameters; both, the attention core at its true qk / v head widths (the dense core, which
compute.attention_core_time prices at h / heads per head, scaled by (qk + v) / (2 h / heads)); `delta_again` the
forward part a backward re-runs under recomputation. Read by
moe.stage_cost (analytic) and moe_program.with_blocks (event), so both engines add the same seconds. Split from
moe.py, which prices the experts.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from paracube.cost_models import recompute_modules_cost as rmc
from paracube.cost_models.compute import GemmModel, attention_core_time, core_scale
from paracube.cost_models.dims import Dims
from paracube.layout import Layout
from paracube.workload import ModelSpec


def attention_delta(model: ModelSpec, d: Dims, layout: Layout, mb: int, g: GemmModel) -> tuple[float, float, int]:
    """(forward s, backward s, parameters) one block's true attention adds to the dense part's (module doc)."""
    if model.mla is None and model.head_size is None:
        return 0.0, 0.0, 0
    return _delta_at(model, d, layout.tensor_size, layout.cp, mb, g)


@lru_cache(maxsize=4096)  # a search's layouts share a few (tensor size, cp): each priced once
def _delta_at(model: ModelSpec, d: Dims, t: int, cp: int, mb: int, g: GemmModel) -> tuple[float, float, int]:
    """`attention_delta` on a tensor group of t ranks and cp context ranks: all it depends on of the layout."""
    if model.mla is None:  # a head width other than h / heads: its linears are the dense engines' (Dims.linears)
        return (*_core_at(d, t, mb, g), 0)
    h = d.h
    T = mb * d.s * d.cp // cp  # a cp rank's tokens (d.s already s / cp in a cp rank's view: context_local)
    true = [(a, b) for _, a, b in model.mla.linears(h, model.heads)]
    dense = [(h, h + 2 * d.kv), (h, h)]

    def lin(shapes: list[tuple[int, int]]) -> tuple[float, float]:
        f = b = 0.0
        for a, o in shapes:
            y, dx, da = g.gemms(T, max(o // t, 1), a)
            f, b = f + float(y), b + float(dx + da)
        return f, b

    (tf, tb), (df, db) = lin(true), lin(dense)
    core_f, core_b = _core_at(d, t, mb, g)
    params = sum(a * o for a, o in true) - sum(a * o for a, o in dense)
    if model.attention_bias:  # qkv's bias at its true width (the dense part's is h + 2 kv: Dims.linears)
        params += true[0][1] - dense[0][1]
    # MLA's down projections and norms are whole on every tensor rank (Dims.attn_replicated; executor/layers/mla.py)
    rep = d.attn_replicated
    norms = rep - (h * (model.mla.q_lora_rank or 0) + h * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim))
    return tf - df + core_f, tb - db + core_b, (params - (rep - norms)) // t + rep


def _core_at(d: Dims, t: int, mb: int, g: GemmModel) -> tuple[float, float]:
    """(forward s, backward s) the attention core at its true qk / v head widths adds to the dense part's, on a
    tensor group of t ranks."""
    core_f, core_b = attention_core_time(d, mb, t, g)
    ratio = core_scale(d) - 1.0  # d: the dense part's, MLA and the head width kept (moe.dense_part)
    return ratio * float(np.asarray(core_f).ravel()[0]), ratio * float(np.asarray(core_b).ravel()[0])


def delta_again(model: ModelSpec, d: Dims, layout: Layout, mb: int, g: GemmModel, forward: float) -> float:
    """Forward seconds of the attention correction (`forward`: attention_delta's) the backward runs again: all of it
    under full recomputation; under selective recomputation of the attention core (recompute.py's "attention" rule,
    whose dense part re-runs the dense core) the core's correction: Megatron-core's core_attn checkpoint re-runs the
    whole core at its true head widths, MLA's too (multi_latent_attention.py: _checkpointed_attention_forward)."""
    if d.recompute == "full":
        return forward
    if rmc.core_recomputed(d) and (model.mla is not None or model.head_size):  # (rcm= naming core_attn too)
        return _core_at(d, layout.tensor_size, mb, g)[0]
    return 0.0


__all__ = ["attention_delta", "delta_again"]
