"""The activation bytes one block keeps for its backward, one micro-batch, one rank, as memory.py counts them:
paracube's executor's count (activations.block_bytes) or Megatron-core's (`megatron_block_bytes`: Korthikanti et al.
2022 with the corrections memory.py's docstring states), per TrainingSpec.activations (`saved_block_bytes`). Read by
memory.py (a stage's activations) and offload.py (what an offloaded block sends to the host).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models import activations
from paracube.cost_models import recompute_modules_cost as rmc
from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch

Arr = np.ndarray


def saved_block_bytes(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    """Bytes one block keeps for its backward under `d.recompute`, by the count `d.activations` names, less what
    the recomputed modules other than core_attn no longer keep (recompute_modules_cost.dense_saved)."""
    kept = (activations.block_bytes(d, mode, b) if d.activations == "paracube"
            else megatron_block_bytes(d, mode, b, d.recompute))
    return kept - rmc.dense_saved(d, mode, b) if d.recompute == "selective" and d.recompute_modules else kept


def megatron_block_bytes(d: Dims, mode: str, b: LayoutBatch, recompute: str) -> Arr:
    """Korthikanti et al.'s bytes of one block (memory.py's formulas; per mode: TensorMode.megatron_block)."""
    if recompute == "selective" and d.selective == "op":  # torchtitan's per-op rule: what it saves (recompute.py)
        return activations.block_bytes(d, mode, b)
    t, q, depth, mb = (x.astype(float) for x in (b.t, b.q, b.depth, b.mb))
    m = MODES[mode]
    s, h = d.s, d.h
    sbh = mb * s * h
    # Korthikanti's 18 sbh less what grouped-query attention and llama recipes do not keep (_gqa_saving, _MASKS)
    own = 18 - _gqa_saving(d) - (_MASKS if d.family == "llama" else 0)
    X = own * sbh + (4 if d.family == "gpt" else 6) * mb * s * d.f
    if d.fp8:  # Transformer Engine saves each block linear's input as its FP8 cast (1 byte, not 2; _FP8_SAVED)
        X = X - _FP8_SAVED * sbh - mb * s * d.f
    whole, split = attention_widths(d)  # true attention widths beyond the dense part's (wide heads, MLA)
    X = X + split * mb * s
    # 5 a s^2 b: the unfused core's softmax and dropout (fa=0); flash (Transformer Engine's fused attention in
    # Megatron-core) keeps no s x s tensor, as selective recomputation drops it.
    # the core recomputed: the rule's, or rcm= naming core_attn (recompute_modules_cost.modules)
    core_again = recompute == "selective" and (d.recompute_modules is None or "core_attn" in d.recompute_modules)
    att = 5.0 * d.heads * s * s * mb if recompute != "full" and not core_again and not d.flash else 0.0
    scale = d.c / 2.0
    if recompute == "full":
        return scale * 2 * sbh / m.act_split(t, b.sp)
    # `whole`: tensors every tensor rank keeps whole without sp, sequence shards with it (MLA's latents)
    return m.megatron_block(d, X, att, sbh, mb * s, t, q, depth, b.sp, scale) + scale * whole * mb * s / m.act_split(
        t, b.sp)


# Korthikanti's per-block count assumes multi-head attention and dropout. Of its attention terms, K and V (2 sbh
# each) shrink to kv / heads of that with grouped-query attention (d.kv = kv_heads x head dim), a saving of
# 4 (1 - kv / h) sbh; its two 1-byte-per-element dropout masks (after the attention projection and the MLP, 2 sbh)
# are not kept by llama-family recipes (Megatron-core / NeMo llama and Nemotron configs: hidden_dropout 0).
_MASKS = 2
# With FP8 (fp8.py), Transformer Engine's linears save for the wgrad GEMM the FP8 cast of their input instead of
# the bf16 input (te.Linear / LayerNormLinear / LayerNormMLP save the quantized `inputmat` / `ln_out`): the QKV,
# projection and fc1 inputs (2 sbh each) and fc2's input (2 sbf: the GeLU or SwiGLU output) halve, 3 sbh + sbf
# less per block. Without sp, 1D keeps the QKV and fc1 inputs whole on every rank (one_d.megatron_block).
_FP8_SAVED = 3


def _gqa_saving(d: Dims) -> float:
    return 4.0 * (1.0 - d.kv / d.h)


def attention_widths(d: Dims) -> tuple[float, float]:
    """Bytes per token (16-bit, Korthikanti's units) one block's true attention keeps beyond the dense part's terms
    (queries h, keys and values kv, the projection's input h: split over the tensor ranks; the QKV input h: whole
    without sp), as (whole: kept whole on every tensor rank without sp, sequence shards with it; split: over the
    tensor ranks). Megatron-core 0.16.1, Transformer Engine modules, flash attention (the core saves q, k, v, its
    output and the softmax statistics; selective recomputation keeps them: they are the checkpoint's inputs):
    - a head width other than h / heads (Qwen3; attention.py): queries and the core's output (the projection's
      input) q_width = heads x head width: 4 (q_width - h) (keys and values, kv = kv heads x head width, are
      Korthikanti's terms already: _gqa_saving); with qk_norm the per-head RMSNorms keep their inputs, the queries
      and the keys (TE's RMSNorm saves its input): 2 (q_width + kv); with FP8 the projection keeps its input's FP8 cast,
      1 byte a column: - (q_width - h).
    - multi-head latent attention (multi_latent_attention.py; DeepSeek-V3's layer spec: q / kv down projections
      TELinear duplicated over the tensor group, the up projections TELayerNormColumnParallelLinear fusing
      q_layernorm / kv_layernorm, a separate input norm): the down projections share the input norm's output
      (Korthikanti's QKV input, counted); each up projection keeps its norm's input and its norm's output, whole
      on every tensor rank (sequence shards with sp: TE re-gathers them in backward): whole 4 (r_q + r_kv)
      (r_q = 0 without q_lora_rank: q_proj reads the shared input); per rank's heads the core keeps q and k,
      H (d_n + d_r) each (RoPE applied: new contiguous tensors; the up projections' outputs are not kept), v and
      its output H d_v each (the output is the projection's input): split 4 H (d_n + d_r) + 4 H d_v - 4 h - 4 kv.
      With FP8 each linear keeps its input's FP8 cast: the two down projections each their own cast of the
      input (2 h bytes, against the dense QKV's one h: whole + h), the up projections' norm outputs at 1 byte
      (whole - (r_q + r_kv)), the projection's input (split - (H d_v - h)).
    (0, 0) for attention of h / heads per head."""
    h, kv, heads, m = float(d.h), float(d.kv), float(d.heads), d.mla
    if m is not None:
        latent = float((m.q_lora_rank or 0) + m.kv_lora_rank)
        whole = 4 * latent + (h - latent if d.fp8 else 0.0)
        split = 4 * heads * (m.qk_head_dim + m.v_head_dim) - 4 * h - 4 * kv - (heads * m.v_head_dim - h if d.fp8 else 0)
        return whole, split
    qw = float(d.q_width)
    split = 4 * (qw - h) + (2 * (qw + kv) if d.qk_norm else 0.0) - (qw - h if d.fp8 else 0.0)
    return 0.0, split


__all__ = ["attention_widths", "megatron_block_bytes", "saved_block_bytes"]
