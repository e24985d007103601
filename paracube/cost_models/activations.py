"""Activation bytes that paracube's executor keeps for backward, per rank, vectorized over layouts.

Counted from what autograd really saves in paracube/executor (tests/test_fidelity.py measures it with
saved_tensors_hooks and holds this model to 10%). The executor keeps the residual stream, LayerNorm and the
bias-added linear outputs in fp32 (e = 4 bytes) and runs matmuls and attention in the compute dtype
(c bytes; autocast). Attention is fused (scaled_dot_product_attention): it saves q, k, v, its output and a
[b, heads, s] fp32 log-sum-exp, never the s x s scores; there is no dropout. Per block, T = b*s tokens of
the micro-batch:

Per block (1D replicates what is marked "whole"; t = tensor ranks):
- 2 LayerNorm inputs (+ mean, rstd): serial/1D 2 e T h + 16 T (whole); 2D/3D 2 e T h / t + 8 T / tokens split.
- linear inputs: serial/1D c T (2h + f / t) (qkv and fc inputs whole, fc2's split; proj's input is the
  attention output); 2D/2.5D the gathered X of all four linears, c T sum(h_in) / t_q; 3D c T sum(h_in) / q^2.
- gathered weights: serial/1D autocast's cast copies only, c sum(h_in h_out) / t; 2D c sum(h_in h_out) / q;
  3D c sum(h_in h_out) / q^2.
- q, k, v, attention output and log-sum-exp: c T (h_qkv + h) / t + 4 b heads s / t.
- GELU input (fc output + bias): e T f / t. Family llama: SwiGLU's input (fused gate+up output) c T 2f / t
  and the rotary tables cos, sin: 2 c s head_dim (whole on every rank); its RMSNorms save xhat and rstd.
with t_q = q for 2D (tokens split q ways, inputs gathered over the hidden split) and d q for 2.5D. The first
stage adds the token ids (8 T bytes); the last stage adds the final LayerNorm, the head's input (and weight
copy), and the cross-entropy's fp32 softmax over the local vocabulary block plus its indices.
Full recomputation keeps only each block's fp32 input: e T h per block (/ t outside 1D).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch

Arr = np.ndarray
E = 4.0  # fp32: residual stream, LayerNorm, bias-added outputs, softmax


def _split(mode: str, b: LayoutBatch) -> dict[str, Arr]:
    """Token split (tok), hidden split of activations (all), gathered-operand divisors, per layout: the
    mode's activation_split."""
    return MODES[mode].activation_split(b.t.astype(float), b.q.astype(float), b.depth.astype(float))


def block_bytes(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    """Bytes one transformer block keeps for backward, one micro-batch, one rank."""
    mb = b.mb.astype(float)
    T = mb * d.s
    h, f, c = float(d.h), float(d.f), float(d.c)
    sp = _split(mode, b)
    replicated = MODES[mode].replicates_activations
    if d.recompute == "full":
        return E * T * h / (np.ones_like(T) if replicated else sp["all"])
    h_qkv = float(d.linears[0][2])  # qkv output width (3h; h + 2 kv with GQA)
    attention = c * T * (h_qkv + h) / sp["all"] + 4.0 * mb * d.heads * d.s / sp["all"]
    act_fn_input = E * T * f / sp["all"]
    if d.family == "llama":  # SwiGLU keeps its fused gate+up input [T, 2f] (compute dtype), and the rotary
        # cos, sin tables [s, head_dim] (executor/llama.py)
        act_fn_input = c * T * 2 * f / sp["all"] + 2 * c * d.s * (h / d.heads)
    if replicated:
        norms = 2 * (E * T * h + 8 * T)
        linear_inputs = c * T * 2 * h + c * T * f / sp["all"]  # qkv and fc inputs whole; fc2's split
        weights = c * d.sum_w() / sp["gw"] if d.c < 4 else 0.0  # autocast keeps a cast copy of each weight
    else:
        norms = 2 * (E * T * h / sp["all"] + 4 * T / sp["tok"]) + 2 * 2 * E * h / (sp["all"] / sp["tok"])
        linear_inputs = c * T * d.sum_hin() / sp["gx"]
        weights = c * d.sum_w() / sp["gw"]
    return norms + linear_inputs + weights + attention + act_fn_input


def first_stage_bytes(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    return 8.0 * b.mb.astype(float) * d.s  # token ids kept by the embedding's backward


def last_stage_bytes(d: Dims, mode: str, b: LayoutBatch, vocab: Arr) -> Arr:
    T = b.mb.astype(float) * d.s
    sp = _split(mode, b)
    h, c = float(d.h), float(d.c)
    tokens = T / sp["tok"]
    if MODES[mode].replicates_activations:
        norm = E * T * h + 8 * T
        head = c * T * h + (c * h * vocab / sp["vocab"] if d.c < 4 else 0.0)
    else:
        norm = E * T * h / sp["all"] + 4 * T / sp["tok"]
        head = c * T * h / sp["gx"] + c * h * vocab / sp["gw"]
    cross_entropy = E * tokens * vocab / sp["vocab"] + 9 * tokens  # softmax, target index, in-block mask
    return norm + head + cross_entropy
