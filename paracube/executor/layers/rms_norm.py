"""RMSNorm (Zhang and Sennrich 2019; transformers' LlamaRMSNorm): y = x / sqrt(mean(x^2) + eps) * gamma,
statistics in fp32, over a hidden dimension that may be split across mesh `axes` (one [N, 1] fp32 all-reduce
of the sum of squares forward, one of sum(dy gamma xhat) backward; none when the axes have size 1).
The output is in the input's (compute) dtype. Saves the input in its own dtype and rstd (fp32) for backward,
recomputing xhat there: c h_local + 4 bytes per token.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from paracube.executor.comm import Axes, all_reduce
from paracube.executor.layers.functional import upcast
from paracube.executor.mesh import Mesh


class _RMSNorm(torch.autograd.Function):
    """RMSNorm over a hidden dimension split across `axes`: one [N, 1] all-reduce each way."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, gamma: Tensor, mesh: Mesh, axes: Axes, hidden: int, eps: float) -> Tensor:
        xf = upcast(x)
        stats = all_reduce((xf * xf).sum(-1, keepdim=True), mesh, axes, label="ln.stats")
        rstd = torch.rsqrt(stats / hidden + eps)
        ctx.save_for_backward(x, rstd, gamma)
        ctx.args = (mesh, axes, hidden)
        return (xf * rstd * gamma).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, rstd, gamma = ctx.saved_tensors
        mesh, axes, hidden = ctx.args
        xhat = upcast(x) * rstd
        dy = upcast(dy)
        dgamma = (dy * xhat).sum(tuple(range(dy.dim() - 1)))
        dxhat = dy * gamma
        dot = all_reduce((dxhat * xhat).sum(-1, keepdim=True), mesh, axes, backward=True, label="ln.stats")
        dx = rstd * (dxhat - xhat * dot / hidden)
        return dx.to(x.dtype), dgamma.to(gamma.dtype), None, None, None, None


def rms_norm(x: Tensor, gamma: Tensor, mesh: Mesh, axes: Axes, hidden: int, eps: float) -> Tensor:
    return _RMSNorm.apply(x, gamma, mesh, axes, hidden, eps)


__all__ = ["rms_norm"]
