"""Recorded collectives: every call appends one CommEvent to the mesh's recorder (recorder.py; payload rules:
paracube/estimate.py) and runs inside the recorder's observers.

Plain functions (`all_gather`, `reduce_scatter`, `all_reduce`) plus the autograd Functions the parallel
layers are built from. Megatron's f/g are our own Functions because torch.distributed.nn's all_reduce
also all-reduces in backward. A group of size 1 issues and records nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.executor.recorder import Axes, CommRecorder

if TYPE_CHECKING:  # mesh.py imports recorder.py, not this module: no cycle
    from paracube.executor.mesh import Mesh


# --- plain collectives -----------------------------------------------------------------------------------
def all_gather(t: Tensor, mesh: Mesh, axes: Axes, dim: int, backward: bool = False, label: str = "") -> Tensor:
    """Concatenate the group's tensors along `dim`, in the group's index order (first axis major)."""
    n = mesh.size(axes)
    if n == 1:
        return t
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(n)]
    with mesh.recorder.issue("all_gather", axes, n, t, t.numel() * n, backward, label):
        dist.all_gather(parts, t, group=mesh.group(axes))
    order = mesh.order(axes)  # index k lives on group rank order[k]
    return torch.cat([parts[order[k]] for k in range(n)], dim=dim)


def reduce_scatter(t: Tensor, mesh: Mesh, axes: Axes, dim: int, backward: bool = False, label: str = "") -> Tensor:
    """Sum over the group, keep chunk `index(axes)` along `dim`."""
    n = mesh.size(axes)
    if n == 1:
        return t
    chunks = [c.contiguous() for c in t.chunk(n, dim=dim)]
    order = mesh.order(axes)
    by_group_rank: list[Tensor] = [chunks[0]] * n
    for k in range(n):
        by_group_rank[order[k]] = chunks[k]
    out = torch.empty_like(chunks[0])
    with mesh.recorder.issue("reduce_scatter", axes, n, t, t.numel(), backward, label):
        dist.reduce_scatter(out, by_group_rank, group=mesh.group(axes))
    return out


def all_reduce(t: Tensor, mesh: Mesh, axes: Axes, op: str = "sum", backward: bool = False,
               label: str = "") -> Tensor:
    """Out-of-place all-reduce (sum or max)."""
    n = mesh.size(axes)
    if n == 1:
        return t
    out = t.detach().clone().contiguous()
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
    with mesh.recorder.issue("all_reduce", axes, n, t, t.numel(), backward, label):
        dist.all_reduce(out, op=reduce_op, group=mesh.group(axes))
    return out


# --- autograd Functions ----------------------------------------------------------------------------------
class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: Tensor, mesh: Mesh, axes: Axes, dim: int, label: str) -> Tensor:
        ctx.args = (mesh, axes, dim, label)
        return all_gather(t, mesh, axes, dim, label=label)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        mesh, axes, dim, label = ctx.args
        return reduce_scatter(grad, mesh, axes, dim, backward=True, label=label), None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: Tensor, mesh: Mesh, axes: Axes, dim: int, label: str) -> Tensor:
        ctx.args = (mesh, axes, dim, label)
        return reduce_scatter(t, mesh, axes, dim, label=label)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        mesh, axes, dim, label = ctx.args
        return all_gather(grad, mesh, axes, dim, backward=True, label=label), None, None, None, None


class _CopyToGroup(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce (sum) backward."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, mesh: Mesh, axes: Axes, label: str) -> Tensor:
        ctx.args = (mesh, axes, label)
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        mesh, axes, label = ctx.args
        return all_reduce(grad, mesh, axes, backward=True, label=label), None, None, None


class _ReduceFromGroup(torch.autograd.Function):
    """Megatron's g: all-reduce (sum) forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, t: Tensor, mesh: Mesh, axes: Axes, label: str) -> Tensor:
        return all_reduce(t, mesh, axes, label=label)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad, None, None, None


def gather_fn(t: Tensor, mesh: Mesh, axes: Axes, dim: int, label: str = "") -> Tensor:
    """All-gather forward, reduce-scatter backward (differentiable)."""
    return t if mesh.size(axes) == 1 else _AllGather.apply(t, mesh, axes, dim, label)


def scatter_fn(t: Tensor, mesh: Mesh, axes: Axes, dim: int, label: str = "") -> Tensor:
    """Reduce-scatter forward, all-gather backward (differentiable)."""
    return t if mesh.size(axes) == 1 else _ReduceScatter.apply(t, mesh, axes, dim, label)


def copy_to_group(t: Tensor, mesh: Mesh, axes: Axes, label: str = "") -> Tensor:
    return t if mesh.size(axes) == 1 else _CopyToGroup.apply(t, mesh, axes, label)


def reduce_from_group(t: Tensor, mesh: Mesh, axes: Axes, label: str = "") -> Tensor:
    return t if mesh.size(axes) == 1 else _ReduceFromGroup.apply(t, mesh, axes, label)


__all__ = ["CommRecorder", "all_gather", "all_reduce", "copy_to_group", "gather_fn", "reduce_from_group",
           "reduce_scatter", "scatter_fn"]
