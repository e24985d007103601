"""2D's SUMMA variant (`tp=2d:QxQ,summa`): the seed paper's 2D baseline, Optimus's SUMMA (Xu et al. 2021;
van de Geijn & Watts 1997), q broadcast steps per GEMM operand; the grid, splits, parameters, norms and loss are
2D's (two_d.py). Priced by both engines, run by no runtime here (`executor = None`); searched only on request.
"""

from __future__ import annotations

from typing import Any

from paracube.modes.base import COMPUTE, F32, Collective, coll
from paracube.modes.head_norm import gamma_grads
from paracube.modes.two_d import COL, ROW, TwoD, block, norm_collectives, tokens_per_rank


def _summa_linear(d: Any, label: str, h_in: int, h_out: int | None, bias: bool, backward: bool) -> list[Collective]:
    """SUMMA on the q x q grid, per GEMM operand q broadcast steps of one block each (Optimus, Xu et al. 2021,
    section 3): forward Y = X A broadcasts q blocks of X [T/q, h_in/q] along `col` and q blocks of A
    [h_in/q, h_out/q] along `row`; backward dX = dY A^T broadcasts A's blocks again and reduces q blocks of dX
    along `col`; dA = X^T dY broadcasts X's blocks again and reduces q blocks of dA along `row` (nothing
    gathered is kept: each rank holds only its own blocks). Biases as in 2D."""

    def width(z: Any) -> Any:
        return z.V if h_out is None else h_out

    def x_block(z: Any) -> Any:
        return d.c * tokens_per_rank(z) * h_in // z.q

    def a_block(z: Any) -> Any:
        return d.c * h_in * width(z) // (z.q * z.q)

    def b_bytes(z: Any) -> Any:
        return 4 * width(z) // z.q

    def q(z: Any) -> Any:
        return z.q

    if not backward:
        out = [coll("broadcast", COL, COMPUTE, x_block, f"{label}.X", calls=q),
               coll("broadcast", ROW, COMPUTE, a_block, f"{label}.A", calls=q)]
        return out + ([coll("all_gather", ROW, F32, b_bytes, f"{label}.bias")] if bias else [])
    out = [coll("broadcast", ROW, COMPUTE, a_block, f"{label}.bcastA", "bwd", calls=q),
           coll("reduce", COL, COMPUTE, x_block, f"{label}.dX", "bwd", calls=q),
           coll("broadcast", COL, COMPUTE, x_block, f"{label}.bcastX", "bwd", calls=q),
           coll("reduce", ROW, COMPUTE, a_block, f"{label}.dA", "bwd", calls=q)]
    return out + ([coll("reduce_scatter", ROW, F32, b_bytes, f"{label}.dbias", "bwd")] if bias else [])


def _summa_block_linear(d: Any, n: int, label: str, h_in: int, h_out: int, bias: bool,
                        backward: bool) -> list[Collective]:
    return _summa_linear(d, label, h_in, h_out, bias, backward)


class TwoDSumma(TwoD):
    """2D with SUMMA's GEMMs (`tp=2d:QxQ,summa`): the same grid, splits, parameters, norms and loss as 2D; per
    GEMM operand q broadcast (forward) and broadcast + reduce (backward) steps instead of one gather / one
    reduce-scatter. Per rank per linear it sends 3 (q-1)/q (T h_in + h_in h_out)/q e bytes (the closed form
    `paper_layer_bytes` states), 3/2 of 2D's 2 (q-1)/q (...): 2D keeps the gathered X and A for backward.
    And 2q calls per operand pass instead of one, each paying its ring's q - 1 latency steps: q x 2D's latency.
    Memory: no gathered operand is saved (only each rank's own blocks), one block of each operand in flight."""

    name = "2d-summa"
    variant_of, variant_flag = "2d", "summa"
    searched = False
    executor = None
    keeps_weights = False
    paper = "Optimus (Xu et al. 2021), SUMMA (van de Geijn & Watts 1997): q broadcast steps per GEMM operand"
    dispatches_like = "2d"

    def layer_fwd(self, d: Any) -> list[Collective]:
        return block(d, False, norm_collectives, _summa_block_linear, self.kv_gathers(d) + gamma_grads(d, self))

    def layer_bwd(self, d: Any) -> list[Collective]:
        return block(d, True, norm_collectives, _summa_block_linear, self.kv_gathers(d) + gamma_grads(d, self))

    def head(self, d: Any) -> list[Collective]:
        out: list[Collective] = []
        for backward in (False, True):
            out += norm_collectives(d, "ln_f", backward) + _summa_linear(d, "head", d.h, None, False, backward)
        return out + [coll("all_reduce", COL, F32, lambda z: 4 * tokens_per_rank(z), "loss.max"),
                      coll("all_reduce", COL, F32, lambda z: 8 * tokens_per_rank(z), "loss.sum")]

    def activation_split(self, t: Any, q: Any, depth: Any) -> dict[str, Any]:
        # linear inputs: each rank's own X block [T/(dq), h_in/q]; no gathered weight saved
        return {**super().activation_split(t, q, depth), "gx": q * q * depth, "gw": float("inf")}

    def megatron_block(self, d: Any, X: Any, att: Any, sbh: Any, T: Any, t: Any, q: Any, depth: Any,
                       sp: Any, scale: float) -> Any:
        """(X + att)/t: every saved tensor split over all t ranks, nothing gathered."""
        return scale * (X + att) / t

    def linear_temporaries(self, c: int, T: Any, h_in: int, h_out: Any, t: Any, q: Any, depth: Any) -> Any:
        """One broadcast block of X and of A, and the output block: c (T h_in + h_in h_out + T h_out) / q^2."""
        tq = T / (depth * q)
        return c * (tq * h_in / q + h_in * h_out / (q * q) + tq * h_out / q)


SUMMA = TwoDSumma()
