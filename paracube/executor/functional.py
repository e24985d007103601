"""Autograd pieces shared by the tensor modes: compute dtype, split LayerNorm, vocab-parallel
cross-entropy, local causal attention."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from paracube.executor.comm import Axes, all_reduce
from paracube.executor.mesh import Mesh

LN_EPS = 1e-5


def compute_dtype(t: Tensor) -> torch.dtype:
    """The autocast dtype when autocast is on for t's device (bf16 stays bf16), else t's dtype."""
    device = t.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return t.dtype


class _SplitLayerNorm(torch.autograd.Function):
    """LayerNorm over a hidden dimension split across `axes`: one [N, 2] statistics all-reduce each way."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gamma: Tensor, beta: Tensor, mesh: Mesh, axes: Axes, hidden: int) -> Tensor:
        xf = x.float()
        stats = torch.stack([xf.sum(-1), (xf * xf).sum(-1)], dim=-1)
        stats = all_reduce(stats, mesh, axes, label="ln.stats")
        mean = stats[..., 0:1] / hidden
        var = (stats[..., 1:2] / hidden - mean * mean).clamp_min(0.0)
        rstd = torch.rsqrt(var + LN_EPS)
        xhat = (xf - mean) * rstd
        ctx.save_for_backward(xhat, rstd, gamma)
        ctx.args = (mesh, axes, hidden, x.dtype)
        return xhat * gamma + beta

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        xhat, rstd, gamma = ctx.saved_tensors
        mesh, axes, hidden, dtype = ctx.args
        dy = dy.float()
        lead = tuple(range(dy.dim() - 1))
        dgamma = (dy * xhat).sum(lead)
        dbeta = dy.sum(lead)
        dxhat = dy * gamma
        sums = torch.stack([dxhat.sum(-1), (dxhat * xhat).sum(-1)], dim=-1)
        sums = all_reduce(sums, mesh, axes, backward=True, label="ln.stats")
        dx = rstd * (dxhat - sums[..., 0:1] / hidden - xhat * sums[..., 1:2] / hidden)
        return dx.to(dtype), dgamma, dbeta, None, None, None


def split_layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, mesh: Mesh, axes: Axes, hidden: int) -> Tensor:
    return _SplitLayerNorm.apply(x, gamma, beta, mesh, axes, hidden)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy of logits whose vocabulary is split across `axes` (offset `v0`)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, labels: Tensor, v0: int, mesh: Mesh, axes: Axes) -> Tensor:
        lf = logits.float()
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


def local_attention(qkv: Tensor, heads: int) -> Tensor:
    """Causal attention of whole sequences: qkv [b, s, heads*3*d] with columns [heads, 3, d] -> [b, s, heads*d]."""
    b, s, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = qkv.view(b, s, heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, s, heads * d)
