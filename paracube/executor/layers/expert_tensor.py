"""Tensor parallelism inside the routed experts (Layout etp > 1; modes/experts.py declares its traffic): after the ep
dispatch the etp ranks of an expert shard gather each other's token copies, run their column / row shards of every
local expert (executor/model/routed_experts.py) and reduce-scatter the partial outputs back before the ep combine,
as megatron-core 0.16.1's MoEAlltoAllTokenDispatcher does over its expert tensor group (token_dispatcher.py
l.691-701 dispatch_postprocess: the tokens and the routing weights gathered with output_split_sizes; l.774-783
combine_preprocess: the partial outputs reduce-scattered with input_split_sizes, in the weights' dtype).

`local_experts(experts, x, got, probs, mesh)`: x [sum(got), h] the copies this rank received, (source, local
expert)-major, got [ep, E / ep] their counts, probs [sum(got), 1] their routing weights or None. With etp > 1:
- `moe.etp_counts`: an all_gather over etp of `got` (E int64; every etp rank sizes and orders the gathered copies by
  it; Megatron-core gathers the same counts over its tp x ep group, token_dispatcher.py l.538-543);
- `moe.experts.in` / `moe.experts.in_probs`: all_gathers over etp of the copies and their weights (uneven: each
  etp rank received its own ep peers' copies), payload the gathered rows (estimate.py: an all_gather's output);
- the experts on the gathered copies, sorted by expert, then back to their gathered order;
- `moe.experts.out`: the reduce_scatter over etp of the partial outputs [gathered rows, h], in the router's dtype
  (fp32; fp64 for fp64 copies: Megatron-core's `hidden_states.to(self.probs.dtype)`), each etp rank keeping its
  own copies' sums, cast back.
Backward: each exchange's mirror (the reduce_scatter's an all_gather of dY, the gathers' reduce_scatters of the
copies' and the weights' gradients), recorded with backward=True under the same labels.

The uneven all_gather runs as one all_to_all_single (every rank sends its block to each peer: the bytes an
all_gather of those blocks moves; gloo's all_gather takes equal blocks only), recorded as the all_gather it is.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.errors import check
from paracube.executor.mesh import Mesh
from paracube.modes.experts import router_dtype

ETP = ("etp",)


def _check_order(mesh: Mesh) -> None:
    n = mesh.size(ETP)
    check(mesh.order(ETP) == list(range(n)), "the etp group's index order must be its rank order (expert_groups)")


def _gather(x: Tensor, rows: list[int], mesh: Mesh, backward: bool, label: str) -> Tensor:
    """[rows[me], ...] on etp index me -> [sum(rows), ...], index order."""
    n, x = mesh.size(ETP), x.contiguous()
    out = x.new_empty((sum(rows), *x.shape[1:]))
    with mesh.recorder.issue("all_gather", ETP, n, x, out.numel(), backward, label):
        dist.all_to_all_single(out, x.repeat(n, *([1] * (x.dim() - 1))), rows, [x.shape[0]] * n,
                               group=mesh.group(ETP))
    return out


def _scatter(x: Tensor, rows: list[int], mesh: Mesh, backward: bool, label: str) -> Tensor:
    """[sum(rows), ...] partial sums -> [rows[me], ...] summed over etp."""
    n, x = mesh.size(ETP), x.contiguous()
    out = x.new_empty((rows[mesh.index(ETP)], *x.shape[1:]))
    with mesh.recorder.issue("reduce_scatter", ETP, n, x, x.numel(), backward, label):
        dist.reduce_scatter(out, list(x.split(rows)), group=mesh.group(ETP))
    return out


class _Mirrored(torch.autograd.Function):
    """The uneven gather over etp (`gather` True) or reduce-scatter, its backward the other one."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, rows: list[int], mesh: Mesh, label: str, gather: bool) -> Tensor:
        ctx.args = (rows, mesh, label, gather)
        return (_gather if gather else _scatter)(x, rows, mesh, False, label)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        rows, mesh, label, gather = ctx.args
        return (_scatter if gather else _gather)(grad, rows, mesh, True, label), None, None, None, None


def gather_counts(got: Tensor, mesh: Mesh) -> Tensor:
    """got [ep, L] -> [etp, ep, L]: every etp rank's received counts ("moe.etp_counts")."""
    _check_order(mesh)
    n = mesh.size(ETP)
    return _gather(got.reshape(1, -1), [1] * n, mesh, False, "moe.etp_counts").view(n, *got.shape)


def local_experts(experts: Any, x: Tensor, got: Tensor, probs: Tensor | None, mesh: Mesh) -> Tensor:
    """The outputs of this rank's experts (their etp shards summed over etp) for the copies x it received, in x's
    order (module docstring); `experts`: routed_experts.Experts."""
    rows: list[int] = []
    if mesh.size(ETP) > 1:
        every = gather_counts(got, mesh)  # [etp, ep, L]
        rows = every.sum((1, 2)).tolist()
        x = _Mirrored.apply(x, rows, mesh, "moe.experts.in", True)
        probs = None if probs is None else _Mirrored.apply(probs, rows, mesh, "moe.experts.in_probs", True)
        got = every.reshape(-1, got.shape[1])  # sources (etp, ep), etp-major: the gathered order
    # (source, expert)-major -> (expert, source)-major
    flat = got.reshape(-1)
    starts = (torch.cumsum(flat, 0) - flat).view_as(got)
    perm = torch.cat([torch.arange(int(starts[s, j]), int(starts[s, j] + got[s, j]))
                      for j in range(got.shape[1]) for s in range(got.shape[0])] or [torch.zeros(0, dtype=torch.long)])
    perm = perm.to(x.device)
    y = experts(x[perm], got.sum(0).tolist(), None if probs is None else probs[perm])
    y = y[torch.argsort(perm)]
    if not rows:
        return y
    # reduce-scattered in the router's dtype, as Megatron-core (module docstring)
    wide = getattr(torch, router_dtype(str(y.dtype).removeprefix("torch."))[0])
    return _Mirrored.apply(y.to(wide), rows, mesh, "moe.experts.out", False).to(y.dtype)


__all__ = ["ETP", "gather_counts", "local_experts"]
