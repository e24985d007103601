"""Autograd pieces shared by the tensor modes: compute dtype, split LayerNorm, the vocabulary-split embedding
lookup, vocab-parallel cross-entropy, local causal attention.

Precision (the plan's dtype; Megatron's mixed precision, Micikevicius et al. 2018): the model's parameters
ARE the compute copy (fp32, bf16 or fp16; `COMPUTE_DTYPES`), so activations, the residual stream and the
matmul operands are in the compute dtype with no autocast and no per-micro-batch weight copies. Gradients
accumulate into fp32 buckets (grad_sync.py), presented per parameter as `p.main_grad` (fp32; for fp32
parameters the same tensor as p.grad); the optimizer keeps fp32 master weights (optim.py). Norms compute
their statistics in fp32 inside the op and save their input in the compute dtype. Collectives that the
cost model prices in fp32 (norm and bias parameter gathers, embedding reductions: paracube/modes, F32)
upcast their operand explicitly (`fp32`), so recorded traffic is unchanged by the compute dtype.

Attention of a rank's heads over whole sequences, one of two kernels (Layout `fa`):
- flash (fa=1): F.scaled_dot_product_attention (dropout_p from a seeded generator); it saves q, k, v, its
  output and a [b, heads, s] log-sum-exp, never an s x s tensor (on CUDA; on CPU a dropout_p > 0 falls back
  to torch's math path, which does keep s x s tensors).
- unfused (fa=0), Megatron's core attention: scores = Q K^T (bmm), the scaled causal softmax (Megatron's
  fused ScaledUpperTriangMaskedSoftmax: saves only its output), dropout on the probabilities (saves its
  boolean mask), probs x V (bmm, saves the dropped probabilities and V). Per rank and micro-batch it keeps
  the contiguous Q, K, V it multiplies (c T h_qkv / t) and c + 1 + c bytes per score (Korthikanti et al.
  2022: 5 a s^2 b at c = 2); without dropout only the softmax output (c per score).
A block with a sliding window shorter than its sequences (ModelSpec.attention_window) runs either kernel with the
explicit mask of attention_mask.py instead of the causal one; a window covering the sequence runs the causal path.
Grouped-query attention runs unfused as one bmm per kv head: its r query heads stacked along the rows
([r s, d] x [d, s]), so K and V are never repeated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from paracube.executor.comm import Axes, all_reduce
from paracube.executor.layers.attention_mask import sequence_mask
from paracube.executor.layers.dropout import dropout, seeded
from paracube.executor.layers.sink_kernels import kernel_for, masked_flash
from paracube.executor.layers.tokens import Geometry, window_mask
from paracube.executor.mesh import Mesh

LN_EPS = 1e-5


COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(t: Tensor) -> torch.dtype:
    """The compute dtype of an activation: its own (parameters live in the compute dtype; no autocast)."""
    return t.dtype


def upcast(t: Tensor) -> Tensor:
    """`t` in the dtype its statistics (norms, softmax, cross-entropy) are computed in: fp32, or fp64 for an
    fp64 model (the equivalence tests run serial and sharded copies in fp64, where rounding cannot decide a
    comparison: tests/dist_helpers.py)."""
    return t if t.dtype == torch.float64 else t.float()


def fp32(t: Tensor) -> Tensor:
    """`t` in fp32 (a no-op for fp32): the operand of a collective the cost model prices in fp32."""
    return t.float()


def main_grad(p: Tensor) -> Tensor:
    """The fp32 gradient of a parameter after the step's reduction: `p.main_grad` (grad_sync.py), which
    for fp32 parameters is p.grad itself; p.grad where no reduction set one (a backward outside a step)."""
    g = getattr(p, "main_grad", None)
    return g if g is not None else p.grad  # type: ignore[return-value]


class _SplitLayerNorm(torch.autograd.Function):
    """LayerNorm over a hidden dimension split across `axes`: one [N, 2] statistics all-reduce each way.
    Statistics in fp32; saves the input in its own (compute) dtype and the fp32 mean and rstd (as Megatron's
    fused LayerNorm), recomputing xhat in backward. The output is in the input's dtype."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gamma: Tensor, beta: Tensor, mesh: Mesh, axes: Axes, hidden: int) -> Tensor:
        xf = upcast(x)
        stats = torch.stack([xf.sum(-1), (xf * xf).sum(-1)], dim=-1)
        stats = all_reduce(stats, mesh, axes, label="ln.stats")
        mean = stats[..., 0:1] / hidden
        var = (stats[..., 1:2] / hidden - mean * mean).clamp_min(0.0)
        rstd = torch.rsqrt(var + LN_EPS)
        out = ((xf - mean) * rstd * gamma + beta).to(x.dtype)
        ctx.save_for_backward(x, mean.contiguous(), rstd, gamma)
        ctx.args = (mesh, axes, hidden, beta.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, mean, rstd, gamma = ctx.saved_tensors
        mesh, axes, hidden, beta_dtype = ctx.args
        xhat = (upcast(x) - mean) * rstd
        dy = upcast(dy)
        lead = tuple(range(dy.dim() - 1))
        dgamma = (dy * xhat).sum(lead)
        dbeta = dy.sum(lead)
        dxhat = dy * gamma
        sums = torch.stack([dxhat.sum(-1), (dxhat * xhat).sum(-1)], dim=-1)
        sums = all_reduce(sums, mesh, axes, backward=True, label="ln.stats")
        dx = rstd * (dxhat - sums[..., 0:1] / hidden - xhat * sums[..., 1:2] / hidden)
        return dx.to(x.dtype), dgamma.to(gamma.dtype), dbeta.to(beta_dtype), None, None, None


def split_layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, mesh: Mesh, axes: Axes, hidden: int) -> Tensor:
    return _SplitLayerNorm.apply(x, gamma, beta, mesh, axes, hidden)


def vocab_block_lookup(ids: Tensor, weight: Tensor, v0: int, vl: int) -> Tensor:
    """Embeddings of `ids` from this rank's rows [v0, v0 + vl) of a vocabulary-split table (`weight`, those rows):
    ids outside the block give zeros, so the sum of the ranks' lookups over the vocabulary split is the whole
    table's (Megatron's VocabParallelEmbedding; its in-block mask is what autograd saves of it)."""
    local = ids - v0
    inside = (local >= 0) & (local < vl)
    return F.embedding(local.clamp(0, vl - 1), weight) * inside.unsqueeze(-1)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy of logits whose vocabulary is split across `axes` (offset `v0`)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, labels: Tensor, v0: int, mesh: Mesh, axes: Axes) -> Tensor:
        lf = upcast(logits)
        vl = lf.shape[-1]
        m = all_reduce(lf.max(-1).values, mesh, axes, op="max", label="ce.max")
        e = torch.exp(lf - m.unsqueeze(-1))
        local = labels - v0
        inside = (local >= 0) & (local < vl)
        idx = local.clamp(0, vl - 1)
        target = torch.where(inside, lf.gather(-1, idx.unsqueeze(-1)).squeeze(-1), torch.zeros_like(m))
        sums = all_reduce(torch.stack([e.sum(-1), target]), mesh, axes, label="ce.sum")
        loss = torch.log(sums[0]) + m - sums[1]
        ctx.save_for_backward(e / sums[0].unsqueeze(-1), idx, inside)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        softmax, idx, inside = ctx.saved_tensors
        d = softmax.clone()
        d.scatter_add_(-1, idx.unsqueeze(-1), -inside.to(d.dtype).unsqueeze(-1))
        return (d * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None, None


def vocab_parallel_ce(logits: Tensor, labels: Tensor, v0: int, mesh: Mesh, axes: Axes) -> Tensor:
    """Per-token losses [...]: the softmax normalizer and target logit reduced over `axes`."""
    return _VocabParallelCE.apply(logits, labels, v0, mesh, axes)


class _ScaledCausalSoftmax(torch.autograd.Function):
    """softmax(scale * scores) over keys, masked, in fp32 inside; saves only its output (Megatron's fused masked
    softmax). Mask: causal over square scores of whole sequences (rows are queries at positions row % s, stacked
    GQA heads repeating them), or `allowed` [c, keys] (a window of a split sequence, executor/layers/tokens.py; rows
    r c, query row % c). `sinks` [n, rows]: each row's sink logit, one more column dropped after the softmax
    (executor/layers/sinks.py); its gradient -p_sink sum(g p) per row."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, scale: float, allowed: Tensor | None, sinks: Tensor | None = None) -> Tensor:
        rows, keys = scores.shape[-2:]
        if allowed is None:
            q_pos = torch.arange(rows, device=scores.device) % keys
            future = torch.arange(keys, device=scores.device) > q_pos.unsqueeze(-1)
        else:
            future = ~allowed.repeat(rows // allowed.shape[0], 1)
        logits = (upcast(scores) * scale).masked_fill(future, float("-inf"))
        if sinks is not None:  # the sink column, dropped after the softmax; its probability kept for backward
            full = torch.softmax(torch.cat([logits, sinks.to(logits.dtype).unsqueeze(-1)], dim=-1), dim=-1)
            logits, sink_p = full[..., :-1], full[..., -1]
            probs = logits.to(scores.dtype)
        else:
            probs, sink_p = torch.softmax(logits, dim=-1).to(scores.dtype), None
        ctx.save_for_backward(probs, sink_p)
        ctx.scale = scale
        return probs

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        probs, sink_p = ctx.saved_tensors
        y, g = upcast(probs), upcast(grad)
        gy = (g * y).sum(-1, keepdim=True)
        d_sinks = None if sink_p is None else -(sink_p * gy.squeeze(-1))  # the sink column's g is 0
        return (ctx.scale * y * (g - gy)).to(grad.dtype), None, None, d_sinks


def core_attention(q: Tensor, k: Tensor, v: Tensor, p: float = 0.0, seed: int | None = None,
                   allowed: Tensor | None = None, sinks: Tensor | None = None) -> Tensor:
    """Megatron's unfused attention: q [n, r c, d] (r query heads per k/v head stacked along rows), k, v
    [n, keys, d] -> [n, r c, d]; causal over whole sequences (c = keys), or masked by `allowed` [c, keys];
    dropout p on the probabilities (mask from `seed`); `sinks` [n, r c] each row's sink logit (sinks.row_sinks)."""
    scores = torch.bmm(q, k.transpose(1, 2))
    probs = _ScaledCausalSoftmax.apply(scores, 1.0 / math.sqrt(q.shape[-1]), allowed, sinks)
    return torch.bmm(dropout(probs, p, seed), v)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, p: float = 0.0, seed: int | None = None,
                    gqa: bool = False, allowed: Tensor | None = None,
                    remake: Callable[[], Tensor] | None = None) -> Tensor:
    """scaled_dot_product_attention, q [b, heads, c, d], k, v [b, kv heads, keys, d]: causal over whole
    sequences, or masked by `allowed` [c, keys]; dropout_p drawn from `seed`. A mask without dropout runs the
    same kernel through sink_kernels.masked_flash, which keeps no mask when `remake` (the call that built it)
    is given, as FlashAttention / cuDNN make theirs from positions (scaled_dot_product_attention would keep it
    as a [c, keys] tensor in the compute dtype); other operands, or dropout, run scaled_dot_product_attention."""
    mask = {"is_causal": True} if allowed is None else {"attn_mask": allowed}
    if p <= 0.0 or seed is None:
        kernel = None if allowed is None else kernel_for(q, k, v, allowed)
        if kernel is not None:
            return masked_flash(q, k, v, allowed, kernel, 1.0 / math.sqrt(q.shape[-1]), remake)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, **mask)  # type: ignore[arg-type]
    with seeded(seed, q.device):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=gqa, **mask)  # type: ignore[arg-type]


def local_attention(qkv: Tensor, heads: int, flash: bool = True, p: float = 0.0, seed: int | None = None,
                    kv: Tensor | None = None, geometry: Geometry | None = None, window: int | None = None) -> Tensor:
    """Causal attention: qkv [b, c, heads*3*d] with columns [heads, 3, d] -> [b, c, heads*d]. kv None: whole
    sequences (c = s, keys and values from qkv); else [1, keys, heads, 2, d], the window of keys and values a
    split sequence's queries read, `geometry` placing both (executor/layers/tokens.py). `window`: the block's
    sliding window (attention_mask.py; None: full causal).
    flash: scaled_dot_product_attention, else Megatron's unfused core attention (module docstring)."""
    if kv is not None and geometry is not None:
        return _split_sequence_attention(qkv, heads, flash, p, seed, kv, geometry, window)
    b, s, width = qkv.shape
    d = width // (3 * heads)
    remake = partial(sequence_mask, s, window, qkv.device)
    allowed = remake()  # None: the plain causal path (a window >= s included)
    if flash:
        q, k, v = qkv.view(b, s, heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
        out = flash_attention(q, k, v, p, seed, allowed=allowed, remake=remake)
        return out.transpose(1, 2).reshape(b, s, heads * d)
    c = compute_dtype(qkv)
    # Contiguous [b heads, s, d] copies in the compute dtype: what the two bmms keep (Megatron's Q, K, V).
    q, k, v = qkv.to(c).view(b, s, heads, 3, d).permute(3, 0, 2, 1, 4).reshape(3, b * heads, s, d).unbind(0)
    out = core_attention(q, k, v, p, seed, allowed)
    return out.view(b, heads, s, d).transpose(1, 2).reshape(b, s, heads * d)


def _split_sequence_attention(qkv: Tensor, heads: int, flash: bool, p: float, seed: int | None, kv: Tensor,
                              geometry: Geometry, window: int | None) -> Tensor:
    """local_attention's queries against the window of keys and values (kv [1, keys, heads, 2, d]), masked to
    each query's sequence (the mask made here, inside a selective recomputation); unfused: a contiguous copy of
    q, and k, v read from the window (which backward keeps)."""
    b, c, width = qkv.shape
    d = width // (3 * heads)
    keys = kv.shape[1]
    remake = partial(window_mask, geometry, c, keys, qkv.device, window)
    allowed = remake()
    q = qkv.view(b, c, heads, 3, d)[..., 0, :].transpose(1, 2)
    k, v = kv[..., 0, :].transpose(1, 2), kv[..., 1, :].transpose(1, 2)
    if flash:
        out = flash_attention(q, k, v, p, seed, allowed=allowed, remake=remake)
    else:
        c_dtype = compute_dtype(qkv)
        # q copied (a reshape could view it and keep the whole qkv output); k, v view the window, as priced
        out = core_attention(q.to(c_dtype).contiguous().reshape(b * heads, c, d),
                             k.to(c_dtype).reshape(b * heads, keys, d), v.to(c_dtype).reshape(b * heads, keys, d),
                             p, seed, allowed).view(b, heads, c, d)
    return out.transpose(1, 2).reshape(b, c, heads * d)
