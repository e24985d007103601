"""Expert parallelism's exchanges (modes/experts.py declares them): the token dispatch and combine, gloo / NCCL
`all_to_all_single` with uneven splits over the folded `ep` group (Mesh's expert groups: layout.expert_groups),
as explicit autograd Functions, recorded with their real split sizes (recorder.SplitSizes).

Forward dispatch sends each rank's routed token copies [n, h], sorted by expert, to the ranks holding their experts
(rank r holds experts r E/ep .. (r+1) E/ep - 1, modes/experts.splits); its backward is the same all-to-all with the
splits swapped (the gradients of the received copies travel home). Combine is the mirror: the expert outputs back
to their tokens' ranks, its backward the dispatch of dY. Payload convention (modes/experts.py): an all_to_all's
recorded payload is the rank's whole send buffer, its own share included.

Before the dispatch the ranks exchange how many copies each sends to each local expert of each peer (`exchange
counts`: one all_to_all_single of ep x E/ep int64 counts, recorded as "moe.counts"): the receivers size their
buffers and order the copies by expert with it (Megatron-core's MoEAlltoAllTokenDispatcher does the same).

Why our own Functions: torch.distributed.nn.functional.all_to_all_single is differentiable but records nothing,
and the recorder must see every byte (tests/test_moe_run.py checks it against the model's splits).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.errors import check
from paracube.executor.mesh import Mesh

EP = ("ep",)


def _all_to_all(x: Tensor, send: list[int], recv: list[int], mesh: Mesh, backward: bool, label: str) -> Tensor:
    """x [sum(send), ...] (rows for peer k after those for peer k - 1) -> [sum(recv), ...]; send / recv in rows."""
    x = x.contiguous()
    row = math.prod(x.shape[1:])
    out = x.new_empty((sum(recv), *x.shape[1:]))
    rec = mesh.recorder
    with rec.issue("all_to_all", EP, mesh.size(EP), x, x.numel(), backward, label) as event:
        dist.all_to_all_single(out, x, recv, send, group=mesh.group(EP))
    size = row * x.element_size()
    rec.split_sizes(event, [n * size for n in send], [n * size for n in recv])
    return out


def exchange_counts(counts: Tensor, mesh: Mesh) -> Tensor:
    """counts [ep, E / ep] (copies this rank sends to each peer's local experts) -> [ep, E / ep] copies it receives
    from each peer for each of its local experts."""
    n = mesh.size(EP)
    check(mesh.order(EP) == list(range(n)), "the ep group's index order must be its rank order (layout.expert_groups)")
    return _all_to_all(counts.reshape(n, -1), [1] * n, [1] * n, mesh, False, "moe.counts")


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, send: list[int], recv: list[int], mesh: Mesh, label: str) -> Tensor:
        ctx.args = (send, recv, mesh, label)
        return _all_to_all(x, send, recv, mesh, False, label)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        send, recv, mesh, label = ctx.args
        return _all_to_all(grad, recv, send, mesh, True, label), None, None, None, None


def all_to_all(x: Tensor, send: list[int], recv: list[int], mesh: Mesh, label: str) -> Tensor:
    """Differentiable all-to-all over ep (its backward sends the gradients back along the swapped splits); the
    identity on a single ep rank."""
    return x if mesh.size(EP) == 1 else _AllToAll.apply(x, send, recv, mesh, label)


__all__ = ["all_to_all", "exchange_counts"]
