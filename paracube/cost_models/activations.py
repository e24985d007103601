"""Activation bytes that paracube's executor keeps for backward, per rank, vectorized over layouts.

Counted from what autograd really saves in paracube/executor (tests/test_fidelity.py and
tests/test_sp_recompute.py measure it with saved_tensors_hooks and hold this model to 2%). Parameters live in
the compute dtype (c bytes; fp32 masters live in the optimizer, no autocast, executor/layers/functional.py), so every
mode keeps, as Megatron does, the residual stream, LayerNorm inputs, the matmul operands and the bias-added
linear outputs in the compute dtype; LayerNorm statistics (mean, rstd) are fp32 (8 bytes per token and norm,
as Megatron's fused LayerNorm saves them on GPU; RMSNorm: rstd, 4 bytes; CPU's layer_norm keeps them in the
compute dtype for none / 1D: 4 bytes fewer per token, < 1% of a block at h >= 64). Attention (Layout `fa`,
Dims.flash): flash (scaled_dot_product_attention) saves q, k, v (views of the qkv output), its output and a
[b, heads, s] fp32 log-sum-exp, never the s x s scores; unfused (fa=0, Megatron's core attention,
executor/layers/functional.py) saves contiguous copies of q, k, v, the softmax output (c per score) and, with
attention dropout, its boolean mask and the dropped probabilities (1 + c per score): 5 a s^2 b / t at c = 2,
as Korthikanti et al. count. Dropout (ModelSpec.dropout, executor/layers/dropout.py) keeps one boolean mask per
dropout: two [T, h] per block (after the attention projection and after the MLP), one on the first stage
(embedding_dropout). Per block, T = b*s tokens of the micro-batch, t = tensor ranks, k = t with 1D sequence
parallelism (sp) else 1:

- 2 LayerNorm inputs (+ fp32 mean, rstd): serial/1D 2 (c T h + 8 T) / k; 2D/3D 2 (c T h / t + 8 T / tokens
  split) + each norm's fp32 gathered gamma, 4 h / hidden split (the gather runs in fp32, as priced).
- linear inputs: serial/1D c T (2h / k + f / t) (qkv and fc inputs: whole, or with sp their sequence shard,
  re-gathered in backward as Megatron does; fc2's split; proj's input is the attention output); 2D/2.5D the
  gathered X of all four linears, c T sum(h_in) / t_q; 3D c T sum(h_in) / q^2.
- gathered weights (the all-gathered weight operands the 2D/3D linears save for backward): 2D
  c sum(h_in h_out) / q; 3D c sum(h_in h_out) / q^2; none for serial/1D (their weights are the parameters).
- q, k, v, attention output and the core's own tensors: c T (h_qkv + h) / t + flash 4 b heads s / t, unfused
  (c + [dropout] (1 + c)) b heads s^2 / t; 2D/3D with a sequence split across ranks also the gathered keys
  and values (`split_sequence_bytes`). A head width other than h / heads (Qwen3) or latent attention (MLA):
  these tensors at their true widths, plus MLA's latent and its norms' inputs and Qwen3's q / k norms' inputs
  (`attention_widths`; MLA measured on the executor, tests/test_attention_widths_memory.py).
- hidden dropout masks: 2 T h / k (serial/1D), 2 T h / t (2D/3D).
- GELU input (fc output + bias): c T f / t.
  Family llama: SwiGLU's input (fused gate+up output) c T 2f / t and the rotary tables cos, sin:
  2 c s head_dim (whole on every rank; none under selective recomputation, which re-makes them in the
  checkpointed core); its RMSNorms save xhat and rstd.
with t_q = q for 2D (tokens split q ways, inputs gathered over the hidden split) and d q for 2.5D. The first
stage adds the token ids (8 T bytes; 2.5D 8 T / d) and the embedding dropout's mask; the last stage adds the final
LayerNorm, the head's input (and weight copy; none for 2D / 2.5D's tied head, which reads the table in
place), the cross-entropy's fp32 softmax over the local vocabulary
block plus its indices, and with a padded vocabulary the padded columns' mask (1 byte per local column).
A vocabulary-split embedding (every mode but none) also keeps its in-block mask of the ids (1 byte per id).
Selective recomputation (checkpointed attention core): keeps the qkv output and drops the core's own
tensors and its output (1D keeps it: it is proj's input; 2D/3D keep proj's gathered input); the core's
dropout mask is re-drawn from its seed (executor/layers/dropout.py).
Selective recomputation by torchtitan's per-op rule (Dims.selective "op"): what recompute.op_saved_bytes counts.
Full recomputation keeps only each block's input: c T h / k (serial/1D), c T h / t (2D/3D).
Against Korthikanti et al. (2022, Table 2; `--activations megatron`): with fa=0 and dropout, 1D keeps their
10 sbh + 24 sbh / t + 5 a s^2 b / t (sp: (34 sbh + 5 a s^2 b) / t) plus 16 T bytes of LayerNorm statistics
(benchmarks/activations_vs_megatron.py).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models import recompute
from paracube.cost_models import recompute_modules_cost as rmc
from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch
from paracube.modes.base import key_window, sequence_pieces

Arr = np.ndarray
E = 4.0  # fp32: LayerNorm statistics and gathered norm weights, log-sum-exp, softmax


def _split(mode: str, b: LayoutBatch) -> dict[str, Arr]:
    """Token split (tok), hidden split of activations (all), gathered-operand divisors, per layout: the
    mode's activation_split."""
    return MODES[mode].activation_split(b.t.astype(float), b.q.astype(float), b.depth.astype(float))


def _sequence_shards(b: LayoutBatch) -> Arr:
    """Sequence parallelism (1D sp): LayerNorms run on t sequence shards."""
    return np.where(b.sp > 0, b.t, 1).astype(float)


def block_terms(d: Dims, mode: str, b: LayoutBatch) -> dict[str, Arr]:
    """Bytes one transformer block keeps for backward, one micro-batch, one rank, by what keeps them."""
    mb = b.mb.astype(float)
    T = mb * d.s
    h, f, c = float(d.h), float(d.f), float(d.c)
    sp = _split(mode, b)
    replicated = MODES[mode].replicates_activations
    zero = np.zeros_like(T)
    if d.recompute == "full":
        block_input = c * T * h / _sequence_shards(b) if replicated else c * T * h / sp["all"]
        return {"block input": block_input}
    if d.recompute == "selective" and d.selective == "op":  # torchtitan's per-op rule (recompute.py)
        return recompute.op_saved_bytes(d, mode, b, attention_core_bytes(d, mb, sp["all"]))
    w = attention_widths(d)
    # The core is recomputed under selective recomputation, except with cp where the runtime keeps it out of the
    # recomputed region (paracube's executor: its exchange runs in it, executor/layers/context_parallel.py) and it
    # saves what it saves at rc=none (rmc.core_recomputed: Dims.cp_core_recompute; Megatron-core re-runs it).
    core_kept = not rmc.core_recomputed(d)  # (by module: rcm= without core_attn keeps it)
    # q, k, v: views of the qkv output (selective keeps the qkv output itself), or (unfused) the contiguous
    # copies its bmms multiply, in the compute dtype; MLA: the core's q, k, v, or (selective) the up projections'
    # outputs; plus MLA's latent and its norms' inputs, and the per-head q / k norms' inputs (attention_widths)
    attention = (c * (w["qkv"] if core_kept else w["kept"]) + w["heads"]) * T / sp["all"] \
        + w["whole"] * T / _sequence_shards(b) + w["latent"] * T
    if core_kept:  # the attention core's own saved tensors
        attention = attention + attention_core_bytes(d, mb, sp["all"])
    # The core's output: flash saves it; none / 1D keep it anyway as proj's input (2D / 3D's proj keeps its
    # gathered input instead, counted with the linear inputs; the unfused core's bmm does not save its output).
    if replicated or (core_kept and d.flash):
        attention = attention + c * T * w["out"] / sp["all"]
    # and the projection its own copy (attention_widths); with cp one storage (context_parallel.heads_inner)
    if d.mla is not None and core_kept and d.flash and d.cp == 1:
        attention = attention + c * T * w["out"] / sp["all"]
    if MODES[mode].token_axes:
        attention = attention + split_sequence_bytes(d, b, sp)
    if replicated:  # none / 1D: the residual stream, LayerNorm inputs and GELU input in the compute dtype
        shards = _sequence_shards(b)
        norms = 2 * (c * T * h + 4 * d.stat_width * T) / shards
        linear_inputs = c * T * 2 * h / shards + c * T * f / sp["all"]  # qkv, fc (sp: shards); fc2 split
        weights = zero  # the weights are the parameters themselves (compute dtype): nothing gathered
    else:
        norms = 2 * (c * T * h / sp["all"] + 4 * d.stat_width * T / sp["tok"]) + 2 * E * h / (sp["all"] / sp["tok"])
        linear_inputs = c * T * d.sum_hin() / sp["gx"]
        weights = c * d.sum_w() / sp["gw"]
    act_fn_input = c * T * f / sp["all"]
    if d.family == "llama":  # SwiGLU keeps its fused gate+up input [T, 2f] (compute dtype), and the rotary
        # cos, sin tables [s, head_dim] (executor/layers/llama.py), made inside the core (selective: recomputed)
        rotary = 2 * c * d.s * w["rotary"] if core_kept else 0.0
        act_fn_input = c * T * 2 * f / sp["all"] + rotary
    # Hidden dropout after the attention projection and after the MLP: one boolean mask each, on the block's
    # activations (whole in none / 1D, sequence shards with sp, split over all t ranks in 2D / 3D).
    masks = 2 * T * h / (_sequence_shards(b) if replicated else sp["all"]) if d.dropout > 0 else zero
    return {"layernorms": norms, "linear inputs": linear_inputs, "attention": attention,
            "activation-function input": act_fn_input, "gathered weights": weights + zero,
            "dropout masks": masks + zero}


def attention_widths(d: Dims) -> dict[str, float]:
    """What one block's attention keeps per token beyond the norms and the QKV / down projections' shared input
    (executor/layers/llama.py, executor/layers/mla.py), for block_terms: "qkv" columns of the core's q, k, v (at
    rc=none), "kept" those selective recomputation keeps (the checkpointed core's inputs), "out" the core's output
    (the projection's input), "rotary" the width of the rotary cos / sin tables, all in the compute dtype and over
    the rank's heads; bytes per token: "heads" over the rank's heads, "whole" on every tensor rank (sequence shards
    with sp), "latent" whole on every tensor rank even with sp.
    - h / heads per head (gpt, llama): q, k, v views of the qkv output h + 2 kv (gpt 3h), output h.
    - a head width other than h / heads (Dims.head_size, Qwen3): the same with queries and output q_width =
      heads x head width, keys and values kv; with qk_norm, per-head RMSNorms that keep their inputs and
      fp32 rstd (executor/layers/rms_norm.py): (c (q_width + kv) + 4 (heads + kv heads)) per token.
    - MLA (Dims.mla; r_q, r_kv latent ranks, d_n, d_r, d_v head widths, H heads): the core's q and k are new tensors
      of H (d_n + d_r) columns each (RoPE'd parts concatenated; the up projections' outputs die), v a contiguous
      copy of H d_v, the output H d_v, which flash keeps as [b, H, s, d_v] and the projection as its [T, H d_v] copy
      (q is a fresh [b, H, s] tensor, so the output's transpose is no view, unlike the dense core's whose q views
      the qkv output: 2 H d_v kept with the flash core); selective keeps the up projections' outputs instead, H (d_n
      + d_r) + H (d_n + d_v); the rotary tables d_r wide. Every tensor rank keeps the latent [c_q, c_kv', k_r]
      whole, w = (r_q or h) + r_kv + d_r columns (the up projections' inputs are views of it; with sp it is the
      gathered one: no re-gather in backward), and the q / kv norms' inputs and rstd (the kv norm's input is a view
      of kv_a's output, whose storage it keeps: c (r_q + r_kv + d_r) + 8; c (r_kv + d_r) + 4 without q_lora_rank),
      on the rank's sequence shard with sp. The down projections' input is the block's normed x (the dense QKV
      input, counted in block_terms)."""
    c, m = float(d.c), d.mla
    if m is not None:
        H = float(d.heads)
        norms = c * ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim) + E * (2 if m.q_lora_rank else 1)
        return {"qkv": H * (2 * m.qk_head_dim + m.v_head_dim), "kept": H * (m.qk_head_dim + m.qk_nope_head_dim
                + m.v_head_dim), "out": H * m.v_head_dim, "rotary": float(m.qk_rope_head_dim), "heads": 0.0,
                "whole": norms, "latent": c * ((m.q_lora_rank or d.h) + m.kv_lora_rank + m.qk_rope_head_dim)}
    qw, kw = float(d.q_width), float(d.kv)
    qkv = float(d.linears[0][2])
    head = float(d.head_width)
    norms = c * (qw + kw) + E * (qw + kw) / head if d.qk_norm else 0.0
    return {"qkv": qkv, "kept": qkv, "out": qw, "rotary": head, "heads": norms, "whole": 0.0, "latent": 0.0}


def split_sequence_bytes(d: Dims, b: LayoutBatch, sp: dict[str, Arr]) -> Arr:
    """What attention where a rank's c = T / n tokens are not whole sequences keeps beyond the whole-sequence
    case (executor/layers/tokens.py), on the rank with the widest key window W (modes.base.key_window: s when c
    divides s, c + s - gcd(c, s) when blocks straddle sequences): the window's keys and values of its heads,
    c W 2 kv / head split (gpt's flash and selective recomputation keep the window itself; unfused and llama's
    flash keep k, v made from it, W - c tokens more than their own); unfused the scores beyond c s per head; llama
    the rotary tables of the window's W positions instead of s. Flash keeps no [c, W] mask: backward builds it
    again (executor/layers/sink_kernels.masked_flash). 0 where whole."""
    n = np.asarray(sp["tok"]).astype(np.int64)
    T = (b.mb * d.s).astype(np.int64)
    tokens = (T // n).astype(float)
    window = key_window(T, d.s, n).astype(float)
    heads_split = sp["all"] / sp["tok"]
    kv = 2.0 * d.kv / heads_split  # key and value columns of the rank's heads
    if rmc.core_recomputed(d) or (d.flash and d.family == "gpt"):  # gpt's flash: q views qkv, k and v the window
        extra = d.c * window * kv
    elif d.flash:  # llama: rotated k and a copy of v over the window, in place of the local tokens' own
        extra = d.c * (window - tokens) * kv
    else:
        per_score = d.c + (1 + d.c if d.attention_dropout > 0 else 0)
        extra = d.c * (window - tokens) * kv + per_score * tokens * (window - d.s) * d.heads / heads_split
    if d.family == "llama" and not rmc.core_recomputed(d):
        extra = extra + 2 * d.c * (window - d.s) * d.head_width
    return np.where(sequence_pieces(T, d.s, n) > 1, extra, 0.0)


def attention_core_bytes(d: Dims, mb: Arr, heads_split: Arr) -> Arr:
    """Bytes the attention core itself keeps (beyond q, k, v and its output), per rank: flash its fp32
    log-sum-exp [b, heads, s]; unfused (fa=0) the softmax output (c per score), and with attention dropout
    its boolean mask and the dropped probabilities (1 + c per score): Korthikanti's 5 a s^2 b at c = 2."""
    if d.flash:
        return 4.0 * mb * d.heads * d.s / heads_split
    per_score = d.c + (1 + d.c if d.attention_dropout > 0 else 0)
    # a cp rank (d.cp > 1): its s queries x the cp s keys of the whole sequence
    return per_score * mb * d.heads * float(d.s) * d.s * d.cp / heads_split


def block_bytes(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    """Bytes one transformer block keeps for backward, one micro-batch, one rank."""
    return sum(block_terms(d, mode, b).values())


def first_stage_bytes(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    """Token ids kept by the embedding's backward (int64; the ids the rank looks up: the micro-batch's T, 2.5D's
    depth layer its T / d, executor/layers/two_half_d.py), with a vocabulary-split table (every mode but none)
    the boolean mask of those ids inside the rank's rows (the lookup's product with it saves it, one byte per id:
    executor/layers/one_d.py, two_d.py, three_d.py), gpt's position indices of the rank's tokens in the flat
    token layout (int64, the position table's index_select: executor/model/gpt.py, embed), and the embedding
    dropout's boolean mask."""
    T = b.mb.astype(float) * d.s
    looked_up = T / b.depth.astype(float)
    ids = 8.0 * looked_up + np.where(np.asarray(MODES[mode].vocab_split(b.t, b.q)) > 1, looked_up, 0.0)
    if d.family == "gpt" and MODES[mode].token_axes:
        ids = ids + 8.0 * T / _split(mode, b)["tok"]
    if d.embedding_dropout <= 0:
        return ids
    split = _sequence_shards(b) if MODES[mode].replicates_activations else _split(mode, b)["all"]
    return ids + T * d.h / split


def last_stage_bytes(d: Dims, mode: str, b: LayoutBatch, vocab: Arr) -> Arr:
    T = b.mb.astype(float) * d.s
    sp = _split(mode, b)
    h, c = float(d.h), float(d.c)
    tokens = T / sp["tok"]
    if MODES[mode].replicates_activations:
        norm = (c * T * h + 4 * d.stat_width * T) / _sequence_shards(b)
        head = c * T * h / _sequence_shards(b)
    else:
        norm = c * T * h / sp["all"] + 4 * d.stat_width * T / sp["tok"] + E * h / (sp["all"] / sp["tok"])
        # The gathered weight it saves; none for a tied head using the table in place (tied_head_roles W "").
        roles = MODES[mode].tied_head_roles
        weight = 0.0 if d.tied and roles and not roles[1] else c * h * vocab / sp["gw"]
        head = c * T * h / sp["gx"] + weight
    # fp32 softmax, then the vocabulary-parallel cross-entropy's target index and in-block mask (9 bytes a token,
    # executor/layers/functional.vocab_parallel_ce), or torch's cross_entropy (none: the vocabulary whole) its
    # target index and nll_loss's total weight (a 4-byte scalar)
    whole = np.asarray(MODES[mode].vocab_split(b.t, b.q)) == 1
    cross_entropy = E * tokens * vocab / sp["vocab"] + np.where(whole, 8 * tokens + E, 9 * tokens)
    # A padded vocabulary (modes.base.padded): the mask of the padded columns of the rank's logits block, one
    # byte per column, saved by masked_fill (executor/model/gpt.py, token_losses).
    padding = np.where(np.asarray(vocab) != d.V, vocab / sp["vocab"], 0.0)
    return norm + head + cross_entropy + padding
