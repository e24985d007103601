"""Collective matmul (Layout.tpo) of a 3D linear: all six collectives of Y = X A as rings overlapped with GEMMs.

Roles (I, W, O), q ranks each (three_d.py): X [T/q^2, h_in/q] (tokens block over I, hidden block o), the weight
sub-block A_w [h_in/q^2, h_out/q] (row sub-block w of h_in block o), the partial output's row block k
Y_k = X_k A (X_k: I index k's tokens) summed over O. The decomposition (Wang et al. 2023, ASPLOS '23):
- forward: X's ring over I and A's ring over W run in lock step (ring.ring_all_gathers); X's blocks are row
  blocks of Y and A's are sub-blocks of the contraction, so every pair (X_k, A_a) is a term X_k[:, a] A_a and
  every step has terms: step 0 the local pair, step s the new X block against the A blocks here and the new A
  block against the X blocks here (one GEMM X_k A when a row's terms are all due). The last step has no exchange
  in flight: its terms are deferred to Y's reduce-scatter over O, a ring (ring.ring_reduce_scatter) whose chunk
  b is Y_b finished by them, so Y's ring steps run alongside GEMM chunks too. kw=1: a weight gathered earlier in
  the step is reused (weight_ring.py) and X's ring runs alone;
- backward: dY's ring over O with dA += X_k^T dY_k (the last block's term deferred again), dA's reduce-scatter
  over W as a ring whose chunk a is dA's row sub-block a finished by that term (weight_ring.weight_grad_ring;
  kw=1: summed over the step's micro-batches first), then dX's reduce-scatter over I as a ring with the row
  blocks dY_k A^T.
Same collectives, payloads and keys as _Linear3D + kept_gather (`.X`, `.A`, `.Y`, `.dY`, `.dX`: zero traffic
difference); sums in another order (the fp64 equivalence bound of tests/dist_helpers.py). The bias gather over
(W, O) (4 h_out / q bytes of fp32, added after the GEMM) stays a plain collective.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from paracube.executor.layers.collective_matmul import Sum
from paracube.executor.layers.kept import KeptWeights
from paracube.executor.layers.ring import GatherRing, ring_all_gathers, ring_reduce_scatter
from paracube.executor.layers.weight_ring import active, keep_weight, kept_weight, weight_grad_ring
from paracube.executor.mesh import Mesh


class _Terms:
    """Row blocks Y_k = sum_a X_k[:, a] A_a of the partial output as X's (rows) and A's (sub-blocks) blocks arrive;
    `defer` leaves a step's new terms for `row(k)` (Y's ring chunks)."""

    def __init__(self, n: int, sb: int, width: int, dtype: torch.dtype) -> None:
        self.n, self.sb, self.width, self.dtype = n, sb, width, dtype
        self.x: dict[int, Tensor] = {}
        self.a: dict[int, Tensor] = {}
        self.seen: set[tuple[int, int]] = set()
        self.pending: dict[int, list[int]] = {}
        self.y: dict[int, Sum] = {}
        self._whole: Tensor | None = None

    def whole(self) -> Tensor:
        """The gathered weight (every sub-block here)."""
        if self._whole is None:
            self._whole = torch.cat([self.a[k] for k in range(self.n)], dim=0)
        return self._whole

    def arrive(self, blocks: list[tuple[int, Tensor]], defer: bool) -> bool:
        self.x[blocks[0][0]] = blocks[0][1]
        if len(blocks) > 1:
            self.a[blocks[1][0]] = blocks[1][1]
        ran = False
        for kx in self.x:
            new = [ka for ka in self.a if (kx, ka) not in self.seen]
            self.seen.update((kx, ka) for ka in new)
            if defer:
                self.pending.setdefault(kx, []).extend(new)
            elif new:
                self._compute(kx, new)
                ran = True
        return ran

    def _compute(self, kx: int, kas: list[int]) -> None:
        xk = self.x[kx]
        y = self.y.setdefault(kx, Sum((xk.shape[0], self.width), self.dtype))
        if len(kas) == self.n:
            y.add(xk @ self.whole())
            return
        for ka in kas:
            y.add(xk[:, ka * self.sb:(ka + 1) * self.sb] @ self.a[ka])

    def row(self, k: int) -> Tensor:
        kas = self.pending.pop(k, [])
        if kas:
            self._compute(k, kas)
        return self.y[k].result()


class RingLinear3D(torch.autograd.Function):
    """_Linear3D with its X, A, Y (forward), dY, dA, dX (backward) collectives as rings (module docstring).
    w: the weight sub-block in the compute dtype; kept / key: the kw=1 store (weight_ring.py)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, mesh: Mesh, roles: tuple[str, str, str], label: str,
                kept: KeptWeights | None, key: tuple[int, str]) -> Tensor:
        i_ax, w_ax, o_ax = ((r,) for r in roles)
        c, n = w.dtype, mesh.size(i_ax)
        assert mesh.size(w_ax) == n == mesh.size(o_ax), "a 3D cube: q ranks on each role"
        kept = active(kept)
        xc = x.to(c).contiguous()
        tl = xc.shape[0]
        gathered = kept_weight(kept, key)
        sb = w.shape[0] if gathered is None else gathered.shape[0] // n
        terms = _Terms(n, sb, w.shape[1], c)
        if gathered is not None:
            terms.a.update({k: gathered[k * sb:(k + 1) * sb] for k in range(n)})
        rings = [GatherRing(xc, mesh, i_ax, f"{label}.X")]
        if gathered is None:
            rings.append(GatherRing(w, mesh, w_ax, f"{label}.A"))
        ring_all_gathers(rings, lambda step, blocks: terms.arrive(blocks, defer=step == n - 1 and n > 1))
        if gathered is None:
            gathered = terms.whole()
            keep_weight(kept, key, gathered)
        ctx.save_for_backward(torch.cat([terms.x[k] for k in range(n)], dim=0), gathered)
        ctx.args = (mesh, roles, label, x.dtype, kept, key)
        return ring_reduce_scatter(terms.row, mesh, o_ax, tl * w.shape[1], c, label=f"{label}.Y")

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        xg, ag = ctx.saved_tensors
        mesh, roles, label, x_dtype, kept, key = ctx.args
        i_ax, w_ax, o_ax = ((r,) for r in roles)
        c, n = ag.dtype, mesh.size(o_ax)
        dy = dy.to(c).contiguous()
        tl = dy.shape[0]
        dyg = dy.new_empty((tl * n, dy.shape[1]))
        da = Sum(tuple(ag.shape), c)
        last: list[int] = []

        def wgrad(step: int, blocks: list[tuple[int, Tensor]]) -> bool:
            k, dyk = blocks[0]
            dyg[k * tl:(k + 1) * tl].copy_(dyk)
            if step == n - 1:  # no exchange in flight: its term goes into dA's ring chunks
                last.append(k)
                return False
            da.add(xg[k * tl:(k + 1) * tl].t() @ dyk)
            return True

        ring_all_gathers([GatherRing(dy, mesh, o_ax, f"{label}.dY", backward=True)], wgrad)
        kl, sb = last[0], ag.shape[0] // mesh.size(w_ax)
        x_last, dy_last = xg[kl * tl:(kl + 1) * tl], dyg[kl * tl:(kl + 1) * tl]

        def chunk(a: int) -> Tensor:  # row sub-block a of the gathered-form dA
            rows = slice(a * sb, (a + 1) * sb)
            return (da.total[rows] + x_last[:, rows].t() @ dy_last).to(c)

        dw = weight_grad_ring(chunk, mesh.size(w_ax), sb * ag.shape[1], mesh, w_ax, f"{label}.A", kept, key, c)
        tx = xg.shape[0] // mesh.size(i_ax)
        dx = ring_reduce_scatter(lambda k: dyg[k * tx:(k + 1) * tx] @ ag.t(), mesh, i_ax, tx * xg.shape[1], c,
                                 backward=True, label=f"{label}.dX")
        return dx.to(x_dtype), dw, None, None, None, None, None


__all__ = ["RingLinear3D"]
