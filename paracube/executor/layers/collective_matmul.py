"""Collective matmul (Layout.tpo): a linear's tensor-parallel collectives as rings overlapped with its GEMM.

Autograd Functions that replace the unoverlapped linears' gather-GEMM and GEMM-scatter pairs (one_d.py,
two_d.py, three_d.py) with the ring decomposition of ring.py: every exchange of a ring is posted before the
GEMM chunk on the block already there (Wang et al. 2023; Megatron-LM --tp-comm-overlap's ring-exchange, torch's
async TP). Same blocks, same collectives (one CommEvent each, the unoverlapped key: zero traffic difference),
the same math up to the order of the sums (chunked GEMMs accumulate over the blocks; the ring adds partials
in ring order): the fp64 equivalence bound of tests/dist_helpers.py holds. 16-bit chunk sums accumulate in
fp32 (as one GEMM does internally). What each overlaps, per linear (the `tpo` tags of paracube/modes):
- 1D + sp, column (qkv, fc): forward the sequence all-gather over tp with the chunks X_k A (`.in` <-> f);
  backward the input's re-gather with the chunks dA += X_k^T dY_k (`.in.regather` <-> da), then dX's
  reduce-scatter with the chunks dY_k A^T (`.in` <-> dx).
- 1D + sp, row (proj, fc2): forward the reduce-scatter with the chunks X_k A (`.out` <-> f); backward dY's
  all-gather with dX_k = dY_k A^T and dA += X_k^T dY_k (`.out` <-> dx).
- 2D / 2.5D (X [T/(dq), h_in/q], hidden over col): forward X's all-gather over col with Y += X_k A_k, A_k the
  gathered weight's row block k (`.X` <-> f); backward dX's reduce-scatter over col with dY A_k^T (`.dX` <-> dx).
- 3D (roles I, W, O; tokens along dim 0): forward X's all-gather over I with the row blocks X_k A of the partial
  output (`.X` <-> f), then its reduce-scatter over O unoverlapped (the forward has one GEMM, already used);
  backward dY's all-gather over O with dA += X_k^T dY_k (`.dY` <-> da), dX's reduce-scatter over I with the
  row blocks dY_k A^T (`.dX` <-> dx).
1D's chunk GEMMs are the linear's `gemm` (gemm.py): with `--dtype fp8` its FP8 GEMMs (fp8.py) on the blocks as
they arrive; the rings move the compute dtype's blocks (bf16, the bytes the cost model prices) and each block
is cast with the linear's per-tensor scale on arrival, so the products are the unoverlapped FP8 linear's row
blocks. Weight gathers (kept.py) and bias gathers stay unoverlapped. Only the blocks' linears (`TPO_LINEARS`); the head
runs unoverlapped (the cost models tag block collectives only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from paracube.executor.comm import reduce_scatter
from paracube.executor.layers.gemm import PLAIN, PlainGemm
from paracube.executor.layers.ring import ring_all_gather, ring_reduce_scatter
from paracube.executor.mesh import Mesh

TPO_LINEARS = ("qkv", "proj", "fc", "fc2")  # a block's linears (Dims.linears): the ones tpo overlaps
TP, SEQ = ("tp",), 1  # 1D: [b, s, h] activations, sequence dimension 1


class _Sum:
    """A sum of GEMM chunks, accumulated in fp32 for 16-bit dtypes (a single GEMM accumulates in fp32)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.dtype = dtype
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        self.total = torch.zeros(shape, dtype=acc)

    def add(self, t: Tensor) -> None:
        self.total.add_(t)

    def result(self) -> Tensor:
        return self.total.to(self.dtype)


def _rows(t: Tensor) -> Tensor:
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
        da = _Sum(tuple(a.shape), a.dtype)

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
        da = _Sum(tuple(a.shape), a.dtype)

        def grads(k: int, dyk: Tensor) -> None:
            dxk, dak = mm.backward(x.narrow(SEQ, k * sl, sl), a, dyk)
            dx.narrow(SEQ, k * sl, sl).copy_(dxk)
            da.add(dak)

        ring_all_gather(dy, mesh, TP, grads, backward=True, label=f"{label}.out")
        return dx, da.result(), None, None, None


# --- 2D / 2.5D --------------------------------------------------------------------------------------------
class RingLinear2D(torch.autograd.Function):
    """Y = allgather_col(X) @ ag with X's gather a ring (Y += X_k ag_k); backward dX's reduce-scatter a ring.
    ag: the weight gathered over row (kept.kept_gather); dA returned in gathered form, as _Linear2D does."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ag: Tensor, mesh: Mesh, label: str) -> Tensor:
        c, axes = ag.dtype, ("col",)
        xc = x.to(c)
        hb = xc.shape[-1]
        blocks: list[Tensor | None] = [None] * mesh.size(axes)
        y = _Sum((*xc.shape[:-1], ag.shape[1]), c)

        def gemm(k: int, xk: Tensor) -> None:
            blocks[k] = xk
            y.add(xk @ ag[k * hb:(k + 1) * hb])

        ring_all_gather(xc, mesh, axes, gemm, label=f"{label}.X")
        ctx.save_for_backward(torch.cat(blocks, dim=-1), ag)  # type: ignore[arg-type]
        ctx.args = (mesh, label, x.dtype, hb)
        return y.result()

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        xg, ag = ctx.saved_tensors
        mesh, label, x_dtype, hb = ctx.args
        dy = dy.to(ag.dtype)
        dx = ring_reduce_scatter(lambda k: dy @ ag[k * hb:(k + 1) * hb].t(), mesh, ("col",),
                                 dy.numel() // dy.shape[-1] * hb, ag.dtype, backward=True, label=f"{label}.dX")
        da = _rows(xg).t() @ _rows(dy)
        return dx.to(x_dtype), da, None, None


# --- 3D -----------------------------------------------------------------------------------------------------
class RingLinear3D(torch.autograd.Function):
    """_Linear3D with X's gather over I a ring (row blocks X_k ag of the partial output) and, backward, dY's
    gather over O (dA += X_k^T dY_k) and dX's reduce-scatter over I (dY_k ag^T) as rings."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ag: Tensor, mesh: Mesh, roles: tuple[str, str, str], label: str) -> Tensor:
        i_ax, _, o_ax = ((r,) for r in roles)
        c = ag.dtype
        xc = x.to(c)
        tl = xc.shape[0]
        n = mesh.size(i_ax)
        xg = xc.new_empty((tl * n, *xc.shape[1:]))
        yg = xc.new_empty((tl * n, ag.shape[1]))

        def gemm(k: int, xk: Tensor) -> None:
            xg[k * tl:(k + 1) * tl].copy_(xk)
            yg[k * tl:(k + 1) * tl].copy_(xk @ ag)

        ring_all_gather(xc, mesh, i_ax, gemm, label=f"{label}.X")
        ctx.save_for_backward(xg, ag)
        ctx.args = (mesh, roles, label, x.dtype)
        return reduce_scatter(yg, mesh, o_ax, dim=0, label=f"{label}.Y")

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        xg, ag = ctx.saved_tensors
        mesh, roles, label, x_dtype = ctx.args
        i_ax, _, o_ax = ((r,) for r in roles)
        dy = dy.to(ag.dtype).contiguous()
        tl = dy.shape[0]
        dyg = dy.new_empty((tl * mesh.size(o_ax), dy.shape[1]))
        da = _Sum(tuple(ag.shape), ag.dtype)

        def wgrad(k: int, dyk: Tensor) -> None:
            dyg[k * tl:(k + 1) * tl].copy_(dyk)
            da.add(xg[k * tl:(k + 1) * tl].t() @ dyk)

        ring_all_gather(dy, mesh, o_ax, wgrad, backward=True, label=f"{label}.dY")
        tx = xg.shape[0] // mesh.size(i_ax)
        dx = ring_reduce_scatter(lambda k: dyg[k * tx:(k + 1) * tx] @ ag.t(), mesh, i_ax, tx * xg.shape[1],
                                 ag.dtype, backward=True, label=f"{label}.dX")
        return dx.to(x_dtype), da.result(), None, None, None


__all__ = ["TPO_LINEARS", "RingGatherLinear", "RingLinear2D", "RingLinear3D", "RingLinearScatter"]
