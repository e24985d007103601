"""Multi-head latent attention's parameters per rank, as the executor registers them (executor/layers/mla.py).

One block, registration order (the gradient buckets' order, reversed; traffic.parameter_units):
norm 1; q_a [h, r_q] and q_norm [r_q] (with q_lora_rank), q_b [r_q or h, H (d_n + d_r)], kv_a [h, r_kv + d_r],
kv_norm [r_kv], kv_b [r_kv, H (d_n + d_v)], proj [H d_v, h]; norm 2; the MLP's gate+up [h, 2f] and down [f, h].
Split as Megatron-core splits MLA in 1D (tensor modes none and 1D run it): the down projections and their norms
whole on every tensor rank, q_b and kv_b by columns (whole heads), proj by rows (the mode's `linear_shard`),
the block norms as the mode's vectors. The tensor-parallel collectives are the mode's declaration reading
Dims.attn_in_width (the latent's width) and Dims.attn_replicated (modes/one_d.py); the GEMMs and the attention
core are priced by cost_models/moe.attention_delta.
"""

from __future__ import annotations

from typing import Any

from paracube.cost_models.dims import Dims


def mla_layer_sizes(mode: Any, d: Dims, t: int, q: int) -> tuple[int, ...]:
    """Elements of one MLA block's local parameters on a rank of a t-way tensor group (registration order)."""
    m = d.mla
    assert m is not None
    h, nv = d.h, d.norm_vectors
    vec = mode.vector_shard(h, t, q)
    heads = d.heads
    sizes: list[int] = [vec] * nv
    if m.q_lora_rank:
        sizes += [h * m.q_lora_rank, m.q_lora_rank]
    sizes.append(mode.linear_shard(m.q_lora_rank or h, heads * m.qk_head_dim, False, False, t, q))
    sizes += [h * (m.kv_lora_rank + m.qk_rope_head_dim), m.kv_lora_rank]
    sizes.append(mode.linear_shard(m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim), False, False, t, q))
    sizes.append(mode.linear_shard(heads * m.v_head_dim, h, False, True, t, q))
    sizes += [vec] * nv
    for n, (_, h_in, h_out, _bias) in enumerate(d.linears[2:]):  # the MLP (llama family: no biases)
        sizes.append(mode.linear_shard(h_in, h_out, False, n == 1, t, q))
    return tuple(int(x) for x in sizes)


__all__ = ["mla_layer_sizes"]
