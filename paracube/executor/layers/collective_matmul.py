"""Collective matmul (Layout.tpo): a linear's tensor-parallel collectives as rings overlapped with its GEMM.

Autograd Functions that replace the unoverlapped linears' gather-GEMM and GEMM-scatter pairs with the ring
decomposition of ring.py: every exchange of a ring is posted before the GEMM chunk on the block already there
(Wang et al. 2023; Megatron-LM --tp-comm-overlap's ring-exchange, torch's async TP). Same blocks, same
collectives (one CommEvent each, the unoverlapped key: zero traffic difference), the same math up to the order
of the sums (chunked GEMMs accumulate over the blocks; the ring adds partials in ring order): the fp64
equivalence bound of tests/dist_helpers.py holds. 16-bit chunk sums accumulate in fp32 (`Sum`, as one GEMM does
internally). This module: 1D + sp (one_d.py), per linear (the `tpo` tags of paracube/modes/one_d.py):
- column (qkv, fc): forward the sequence all-gather over tp with the chunks X_k A (`.in` <-> f);
  backward the input's re-gather with the chunks dA += X_k^T dY_k (`.in.regather` <-> da), then dX's
  reduce-scatter with the chunks dY_k A^T (`.in` <-> dx).
- row (proj, fc2): forward the reduce-scatter with the chunks X_k A (`.out` <-> f); backward dY's
  all-gather with dX_k = dY_k A^T and dA += X_k^T dY_k (`.out` <-> dx).
2D / 2.5D: collective_matmul_2d.py; 3D: collective_matmul_3d.py (there the weight's all-gather, dA's and 3D's
Y reduce-scatter are rings too: weight_ring.py). Only the blocks' linears (`TPO_LINEARS`); the head runs
unoverlapped (the cost models tag block collectives only).
1D's chunk GEMMs are the linear's `gemm` (gemm.py): with `--dtype fp8` its FP8 GEMMs (fp8.py) on the blocks as
they arrive; the rings move the compute dtype's blocks (bf16, the bytes the cost model prices) and each block
is cast with the linear's per-tensor scale on arrival, so the products are the unoverlapped FP8 linear's row
blocks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from paracube.executor.layers.gemm import PLAIN, PlainGemm
from paracube.executor.layers.ring import ring_all_gather, ring_reduce_scatter
from paracube.executor.mesh import Mesh

TPO_LINEARS = ("qkv", "proj", "fc", "fc2")  # a block's linears (Dims.linears): the ones tpo overlaps
TP, SEQ = ("tp",), 1  # 1D: [b, s, h] activations, sequence dimension 1


class Sum:
    """A sum of GEMM chunks, accumulated in fp32 for 16-bit dtypes (a single GEMM accumulates in fp32)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.dtype = dtype
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        self.total = torch.zeros(shape, dtype=acc)

    def add(self, t: Tensor) -> None:
        self.total.add_(t)

    def result(self) -> Tensor:
        return self.total.to(self.dtype)


def rows_of(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1])


# --- 1D with sequence parallelism ------------------------------------------------------------------------
class RingGatherLinear(torch.autograd.Function):
    """Column linear, sp: Y = all_gather_seq(X) @ A as a ring; X's shard kept, re-gathered in backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, a: Tensor, mesh: Mesh, label: str, mm: PlainGemm = PLAIN) -> Tensor:
        sl = x.shape[SEQ]
        out = x.new_empty((x.shape[0], sl * mesh.size(TP), a.shape[1]), dtype=a.dtype)

        def gemm(k: int, xk: Tensor) -> None:
            out.narrow(SEQ, k * sl, sl).copy_(mm.forward(xk, a))

        ring_all_gather(x, mesh, TP, gemm, label=f"{label}.in")
        ctx.save_for_backward(x, a)
        ctx.args = (mesh, label, mm)
        return out

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, a = ctx.saved_tensors
        mesh, label, mm = ctx.args
        dy, sl = dy.to(a.dtype), x.shape[SEQ]
        da = Sum(tuple(a.shape), a.dtype)

        def wgrad(k: int, xk: Tensor) -> None:
            da.add(mm.wgrad(xk, dy.narrow(SEQ, k * sl, sl)))

        ring_all_gather(x, mesh, TP, wgrad, backward=True, label=f"{label}.in.regather")
        dx = ring_reduce_scatter(lambda k: mm.dgrad(dy.narrow(SEQ, k * sl, sl), a), mesh, TP, x.numel(), a.dtype,
                                 backward=True, label=f"{label}.in")
        return dx.to(x.dtype), da.result(), None, None, None


class RingLinearScatter(torch.autograd.Function):
    """Row linear, sp: Y = reduce_scatter_seq(X @ A) as a ring; backward dY's all-gather as a ring."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, a: Tensor, mesh: Mesh, label: str, mm: PlainGemm = PLAIN) -> Tensor:
        n = mesh.size(TP)
        sl = x.shape[SEQ] // n
        ctx.save_for_backward(x, a)
        ctx.args = (mesh, label, mm)
        return ring_reduce_scatter(lambda k: mm.forward(x.narrow(SEQ, k * sl, sl), a), mesh, TP,
                                   x.shape[0] * sl * a.shape[1], a.dtype, label=f"{label}.out")

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, a = ctx.saved_tensors
        mesh, label, mm = ctx.args
        dy, sl = dy.to(a.dtype), dy.shape[SEQ]
        dx = torch.empty_like(x)
        da = Sum(tuple(a.shape), a.dtype)

        def grads(k: int, dyk: Tensor) -> None:
            dxk, dak = mm.backward(x.narrow(SEQ, k * sl, sl), a, dyk)
            dx.narrow(SEQ, k * sl, sl).copy_(dxk)
            da.add(dak)

        ring_all_gather(dy, mesh, TP, grads, backward=True, label=f"{label}.out")
        return dx, da.result(), None, None, None


__all__ = ["TPO_LINEARS", "RingGatherLinear", "RingLinearScatter", "Sum", "rows_of"]
