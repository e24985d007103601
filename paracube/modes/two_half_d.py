"""2.5D tensor parallelism (Tesseract; Wang et al. 2021). Mesh axes dep, row, col: q x q grids stacked
d deep.

Each depth layer runs the 2D algorithm (two_d.py) on its T/d tokens (axes row/col unchanged, payloads
with T/d); weights are replicated over `dep`, so the per-step gradient all_reduce runs over ("dp", "dep")
as one fused, data-parallel style group; zero=1 shards the optimizer state over that same group
(reduce-scatter and all_gather over ("dp", "dep"), 12 / (dp d) bytes per parameter). The executor runs it
(executor/layers/two_half_d.py): the micro-batch's sequences split over (dep major, row), every parameter stored
once per q x q grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from paracube.modes.base import IntOrArr, divisors
from paracube.modes.executor_support import ExecutorSupport
from paracube.modes.two_d import TwoD


class TwoHalfD(TwoD):
    name = "2.5d"
    axes = ("dep", "row", "col")
    shape_rule = "tp=2.5d:qxqxd, q x q grids stacked d deep (e.g. 2x2x2, 4x4x2)"
    no_shape = ("2.5d needs q x q x d tensor ranks (q, d >= 2: 8, 16, 18, ...) dividing the GPU count: "
                "{n} has none")
    grad_axes = ("dp", "dep")
    executor = ExecutorSupport("paracube.executor.layers.two_half_d:Mode25D", pipeline=True, zero_stages=(0, 1, 2, 3),
                               tpo=True)
    ops_layer, ops_edge = TwoD.ops_layer, TwoD.ops_edge + 1  # 2D's layers, plus the depth slice of the ids
    dispatches_like = TwoD.name  # calibration's step probes do not run 2.5D: it borrows 2D's per-op cost
    paper = "Tesseract (Wang et al. 2021)"
    token_axes = attention_token_axes = ("dep", "row")  # depth layer k holds tokens block k, split over row
    tied_token_axes = ("dep", "col")  # the tied head's logits: depth layer k's tokens, split over col (two_d.py)
    collective_axes = (("row",), ("col",), ("dep", "row"))  # (dep, row): keys / values of a split sequence
    mesh_groups = (("dep", "row"),)

    def shape_ok(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == 3 and shape[0] == shape[1] >= 1 and shape[2] >= 1

    def shapes(self, gpus: int) -> list[tuple[int, ...]]:
        return [(q, q, d) for q in range(2, math.isqrt(gpus) + 1) for d in divisors(gpus // (q * q))
                if gpus % (q * q) == 0 and d >= 2]

    def depth(self, shape: tuple[int, ...]) -> int:
        return shape[2]

    def axis_sizes(self, q: IntOrArr, t: IntOrArr, depth: IntOrArr) -> dict[str, IntOrArr]:
        return {"dep": depth, "row": q, "col": q}

    def paper_layer_bytes(self, T: float, linears: Sequence[tuple[str, int, int]], shape: tuple[int, ...],
                          e: float) -> float:
        """p = q^2 d: SUMMA (TwoD's closed form) on each of d layers over T/d tokens, weights replicated over
        depth and their gradients all-reduced over it (ring, 2(d-1)/d):
            3 * (q-1)/q * sum(T h_in / d + h_in h_out) / q * e + 2(d-1)/d * sum(h_in h_out) / q^2 * e"""
        q, d = shape[0], self.depth(shape)
        depth_sync = 2 * (d - 1) / d * sum(i * o for _, i, o in linears) / q**2 * e
        return super().paper_layer_bytes(T / d, linears, shape, e) + depth_sync


MODE = TwoHalfD()
