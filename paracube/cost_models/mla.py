"""Multi-head latent attention's parameters per rank, as the executor registers them (executor/layers/mla.py).

One block, registration order (the gradient buckets' order, reversed; local_parameters.parameter_units):
norm 1; q_a [h, r_q] and q_norm [r_q] (with q_lora_rank), q_b [r_q or h, H (d_n + d_r)], kv_a [h, r_kv + d_r],
kv_norm [r_kv], kv_b [r_kv, H (d_n + d_v)], proj [H d_v, h]; norm 2; the MLP's gate+up [h, 2f] and down [f, h].
Split as Megatron-core splits MLA in 1D (tensor modes none and 1D run it): the down projections and their norms
whole on every tensor rank, q_b and kv_b by columns (whole heads), proj by rows (the mode's `linear_shard`),
the block norms as the mode's vectors. The tensor-parallel collectives are the mode's declaration reading
Dims.attn_in_width (the latent's width) and Dims.attn_replicated (modes/one_d.py); the GEMMs and the attention
core are priced by cost_models/attention_correction.attention_delta.

--dtype fp8 (`fp8_linears`, read by cost_models/fp8.py): every one of these linears runs FP8 GEMMs in the executor
(executor/layers/mla.py), so a block's casts, FP8 weight copies and amaxes are those of its 7 linears (6 without
q_lora_rank), the replicated down projections whole on every tensor rank.
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


def fp8_linears(d: Dims) -> list[tuple[int, int, str]]:
    """(h_in, h_out, split) of one MLA block's FP8 linears in registration order; split: "replicated" (whole on
    every tensor rank), "column" or "row" (the mode's split)."""
    m = d.mla
    assert m is not None
    h, H = d.h, d.heads
    out = [(h, m.q_lora_rank, "replicated")] if m.q_lora_rank else []
    out += [(m.q_lora_rank or h, H * m.qk_head_dim, "column"), (h, m.kv_lora_rank + m.qk_rope_head_dim, "replicated"),
            (m.kv_lora_rank, H * (m.qk_nope_head_dim + m.v_head_dim), "column"), (H * m.v_head_dim, h, "row")]
    return out + [(h_in, h_out, "column" if n == 0 else "row") for n, (_, h_in, h_out, _) in enumerate(d.linears[2:])]


def fp8_block_weights(mode: Any, d: Dims, T: Any, t: Any, q: Any, depth: Any) -> Any:
    """Weight elements (k x n) one rank's FP8 GEMMs of one MLA block see (cost_models/fp8.weight_elements)."""
    total = 0
    for h_in, h_out, split in fp8_linears(d):
        if split == "replicated":
            total = total + h_in * h_out
        else:
            _, cols, rows = mode.gemm_shape(T, h_in, h_out, split == "column", t, q, depth)
            total = total + rows * cols
    return total


__all__ = ["fp8_block_weights", "fp8_linears", "mla_layer_sizes"]
