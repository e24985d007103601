"""Gathered weights kept across the micro-batches of one step (Layout kw=1; FSDP's reshard_after_forward=False).

A 2D / 2.5D / 3D linear all-gathers its weight block (and bias) before its GEMM and reduce-scatters the weight
gradient after it. `kept_gather` is that gather as an autograd Function: with kw=0 (or outside a train step)
it all-gathers forward and reduce-scatters backward on every call, as comm.gather_fn does. With kw=1, inside
a step (`KeptWeights.begin_step(n)` .. `end_step()`):
- forward: the first call gathers and keeps the gathered tensor; every later forward of the step (other
  micro-batches, full recomputation) reuses it: one all_gather per weight per step;
- backward: the gathered-form gradient is accumulated in fp32 and nothing is returned to the parameter, until
  the step's n-th backward of that weight, which reduce-scatters the sum (in the gradient's dtype) into the
  parameter's .grad: one reduce_scatter per weight per step, in the last micro-batch's backward (so the
  data-parallel buckets still see every gradient arrive there, grad_sync.py). The gathered tensors are
  released at end_step.
  With zero >= 2 (`every_backward`, set by data_parallel/sharded.py) the earlier backwards return a zero
  gradient instead of none: the FSDP unit of the weight is reduce-scattered over the zero group in every
  micro-batch's backward, once each of its parameters has a gradient (the unit's sum over the step is the
  same: zeros, then the reduce-scattered total in the last one; the bytes are the unit's, priced per micro-batch).
Model: the `kept` collectives of paracube/modes (cost_models/traffic.py, comm.py; memory: memory.kept_bytes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from paracube.errors import check
from paracube.executor.comm import Axes, all_gather, reduce_scatter
from paracube.executor.mesh import Mesh


class _Kept:
    """One kept weight: its gathered tensor, the fp32 sum of its gathered gradients, backwards seen."""

    def __init__(self, gathered: Tensor) -> None:
        self.gathered = gathered
        self.grad: Tensor | None = None
        self.backwards = 0


class KeptWeights:
    """The kept gathered weights of one model on one rank (enabled: the layout's kw=1)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.micro_batches = 0  # > 0 inside a train step
        self.entries: dict[tuple[int, str], _Kept] = {}
        self.every_backward = False  # zero >= 2: a (zero) gradient in every backward (module docstring)

    @property
    def active(self) -> bool:
        return self.enabled and self.micro_batches > 0

    def begin_step(self, micro_batches: int) -> None:
        self.entries.clear()
        self.micro_batches = micro_batches if self.enabled else 0

    def end_step(self) -> None:
        """After the step's last backward: every kept weight has given its gradient back."""
        left = [k[1] for k, e in self.entries.items() if e.backwards != self.micro_batches]
        self.entries.clear()
        self.micro_batches = 0
        check(not left, f"kept weights {left[:3]} did not see one backward per micro-batch in this step")


class _KeptGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: Tensor, mesh: Mesh, axes: Axes, dim: int, label: str, kept: KeptWeights | None,
                key: tuple[int, str]) -> Tensor:
        ctx.args = (mesh, axes, dim, label, kept if kept is not None and kept.active else None, key)
        ctx.shard = (t.shape, t.dtype, t.device)
        if ctx.args[4] is None:
            return all_gather(t, mesh, axes, dim, label=label)
        entry = kept.entries.get(key)  # type: ignore[union-attr]
        if entry is None:
            entry = kept.entries[key] = _Kept(all_gather(t, mesh, axes, dim, label=label))  # type: ignore[union-attr]
        return entry.gathered.detach()  # a fresh alias: each micro-batch's graph gets its own output node

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        mesh, axes, dim, label, kept, key = ctx.args
        none = (None,) * 6
        if kept is None:
            return (reduce_scatter(grad, mesh, axes, dim, backward=True, label=label), *none)
        entry = kept.entries[key]
        entry.grad = grad.to(torch.float32, copy=True) if entry.grad is None else entry.grad.add_(grad)
        entry.backwards += 1
        if entry.backwards < kept.micro_batches:
            if kept.every_backward:
                shape, dtype, device = ctx.shard
                return (torch.zeros(shape, dtype=dtype, device=device), *none)
            return (None, *none)
        # Kept until end_step: full recomputation may re-run this forward after this backward (a bias's
        # gradient needs no saved tensor, so it can come before the block is recomputed).
        total, entry.grad = entry.grad, None
        return (reduce_scatter(total.to(grad.dtype), mesh, axes, dim, backward=True, label=label), *none)


def kept_gather(t: Tensor, mesh: Mesh, axes: Axes, dim: int, label: str, kept: KeptWeights | None,
                owner: object) -> Tensor:
    """All-gather of a weight (block) `t` along `dim` over `axes`, kept for the step under kw=1; `owner` and
    `label` name it (one kept tensor per owner module and label)."""
    if mesh.size(axes) == 1:
        return t
    return _KeptGather.apply(t, mesh, axes, dim, label, kept, (id(owner), label))


__all__ = ["KeptWeights", "kept_gather"]
