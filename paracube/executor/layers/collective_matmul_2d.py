"""Collective matmul (Layout.tpo) of a 2D / 2.5D linear: every collective of Y = X A a ring overlapped with a GEMM.

Rank (i, j) holds X [T/(dq), h_in/q] (hidden block j over col) and the weight block A_ij [h_in/q, h_out/q] (rows
block i over row). Y_ij = sum_k X_k A_kj needs X's hidden block k (from col index k) and A's row block k (from row
index k): SUMMA (van de Geijn & Watts 1997) with both broadcasts replaced by all-gather rings, decomposed as in
Wang et al. 2023 ("Overlap communication with dependent computation via decomposition", ASPLOS '23):
- forward: X's ring over col and A's ring over row run in lock step (ring.ring_all_gathers), and at every step
  the terms X_k A_k whose two blocks are now both here are multiplied while the next blocks travel. At step s
  the rank holds X block j - s and A block i - s (mod q): with d = i - j, term i - s is here from step d on and
  term j - s from step q - d on, so every step from min(d, q - d) has a term (on the diagonal all q), and the
  first min(d, q - d) exchanges run exposed (recorded with gemm None; at q = 2 the one exchange off the
  diagonal; the rings the other way round would expose more: about (q - d) / 2 steps, the diagonal's too).
  Under kw=1 a weight gathered earlier in the step is reused (weight_ring.py) and only X's ring runs, each of
  its steps with its term;
- backward: dX's reduce-scatter over col as a ring with the chunks dY A_k^T (as before), then dA's
  reduce-scatter over row as a ring with the chunks dA_k = X_k^T dY (weight_ring.weight_grad_ring, kw=1: summed
  over the step's micro-batches first).
Same collectives, payloads and keys as the unoverlapped _Linear2D + kept_gather pair (zero traffic difference;
labels `.X`, `.A`, `.dX`); the sums in another order (fp64 equivalence bound of tests/dist_helpers.py).
The bias gather (4 h_out / q bytes of fp32, added after the GEMM: nothing to overlap) stays a plain collective.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from paracube.executor.layers.collective_matmul import Sum, rows_of
from paracube.executor.layers.kept import KeptWeights
from paracube.executor.layers.ring import GatherRing, ring_all_gathers, ring_reduce_scatter
from paracube.executor.layers.weight_ring import active, keep_weight, kept_weight, weight_grad_ring
from paracube.executor.mesh import Mesh

ROW, COL = ("row",), ("col",)


class RingLinear2D(torch.autograd.Function):
    """Y = allgather_col(X) @ allgather_row(A) as two lock-step rings; backward dX's and dA's reduce-scatters as
    rings. w: the weight block in the compute dtype; kept / key: the kw=1 store (weight_ring.py)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, mesh: Mesh, label: str, kept: KeptWeights | None,
                key: tuple[int, str]) -> Tensor:
        c, q = w.dtype, mesh.size(COL)
        kept = active(kept)
        xc = x.to(c)
        hb = xc.shape[-1]
        y = Sum((*xc.shape[:-1], w.shape[1]), c)
        xs: dict[int, Tensor] = {}
        gathered = kept_weight(kept, key)
        ws: dict[int, Tensor] = {} if gathered is None else {k: gathered[k * hb:(k + 1) * hb] for k in range(q)}
        done: set[int] = set()

        def step(_: int, blocks: list[tuple[int, Tensor]]) -> bool:
            xs[blocks[0][0]] = blocks[0][1]
            if len(blocks) > 1:
                ws[blocks[1][0]] = blocks[1][1]
            ready = [k for k in xs if k in ws and k not in done]
            for k in ready:
                y.add(xs[k] @ ws[k])
                done.add(k)
            return bool(ready)

        rings = [GatherRing(xc, mesh, COL, f"{label}.X")]
        if gathered is None:
            rings.append(GatherRing(w, mesh, ROW, f"{label}.A"))
        ring_all_gathers(rings, step)
        if gathered is None:
            gathered = torch.cat([ws[k] for k in range(q)], dim=0)
            keep_weight(kept, key, gathered)
        ctx.save_for_backward(torch.cat([xs[k] for k in range(q)], dim=-1), gathered)
        ctx.args = (mesh, label, x.dtype, hb, kept, key)
        return y.result()

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        xg, ag = ctx.saved_tensors
        mesh, label, x_dtype, hb, kept, key = ctx.args
        dy = dy.to(ag.dtype)
        dx = ring_reduce_scatter(lambda k: dy @ ag[k * hb:(k + 1) * hb].t(), mesh, COL,
                                 dy.numel() // dy.shape[-1] * hb, ag.dtype, backward=True, label=f"{label}.dX")
        dy_rows, q = rows_of(dy), mesh.size(ROW)

        def chunk(k: int) -> Tensor:  # row block k of the gathered-form dA: X_k^T dY
            return rows_of(xg[..., k * hb:(k + 1) * hb]).t() @ dy_rows

        da = weight_grad_ring(chunk, q, hb * ag.shape[1], mesh, ROW, f"{label}.A", kept, key, ag.dtype)
        return dx.to(x_dtype), da, None, None, None, None


__all__ = ["RingLinear2D"]
