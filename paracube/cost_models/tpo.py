"""Tensor-parallel communication overlapped with its GEMM (Layout.tpo): the exposed part of a collective matmul.

A tpo-overlappable collective (modes: `Collective.tpo` names the GEMM it feeds or drains) is decomposed into its
ring steps and the GEMM into as many chunks: while chunk i is multiplied, step i + 1 moves the next block (an
all-gather feeding the GEMM) or the previous block's partial result (a reduce-scatter draining it). Wang et al.
2023, "Overlap communication with dependent computation via decomposition in large deep learning models"
(ASPLOS '23); Megatron's --tp-comm-overlap (Transformer Engine userbuffers, ring-exchange) and torchtitan's
async TP do the same. The bytes are unchanged; only the time differs. With C the collective's alpha-beta time
(n - 1 ring steps on n ranks, each C / (n - 1)), W its waits for the group to be scheduled (0 on accelerators)
and G the GEMM's time,
    exposed = W + C / (n - 1) + max(0, C (n - 2) / (n - 1) - G)
one step that nothing hides (the first block has to arrive, or the last partial has to leave), plus whatever of
the rest the GEMM does not cover. The analytic model (analytic.py) and the event engine (event.py: the first step
alone, then the other steps alongside the GEMM on the links they share) use this same decomposition.

Which collectives overlap which GEMM is each mode's declaration (`Collective.tpo`), as paracube's executor runs
them (executor/layers/collective_matmul.py): 1D + sp (one_d.py) its input gather, output reduce-scatter and their
backward mirrors; 2D and 2.5D (two_d.py) each block linear's X gather over col (f) and dX reduce-scatter (dx);
3D (three_d.py) X's gather over I (f), dY's gather over O (da) and dX's reduce-scatter over I (dx). Weight and
bias collectives (kept weights: once per step) and 3D's forward Y reduce-scatter stay exposed here, although the
executor runs the weight's gather, dA's reduce-scatter and 3D's Y reduce-scatter as rings beside GEMM chunks too
(collective_matmul_2d.py / _3d.py; 2D's forward rings hide nothing off the grid's diagonal at q = 2): the model
does not credit them (conservative; the bytes are the same either way). A group of 2 ranks has one ring step:
nothing hidden here. The executor's rings are
one step better than this: an all-gather's first exchange runs alongside the GEMM on the local block and a
reduce-scatter's first chunk needs no exchange, so no step has to be exposed; the model keeps the conservative
one exposed step (unchanged for 1D; changing it would move every tpo price, megatron's included).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.compute import GemmModel, local_shape
from paracube.cost_models.dims import Dims
from paracube.modes import LayoutBatch
from paracube.modes.base import TPO_GEMMS

Arr = np.ndarray


def gemm_seconds(d: Dims, mode: str, b: LayoutBatch, tag: str, g: GemmModel) -> Arr:
    """Seconds of the GEMM `tag` ("LINEAR.GEMM", modes.base.Collective.tpo) of one micro-batch, per configuration."""
    name, gemm = tag.split(".")
    index = [li[0] for li in d.linears].index(name)
    _, h_in, h_out, _ = d.linears[index]
    m, n, k = local_shape(mode, (b.mb * d.s).astype(float), h_in, h_out, index in (0, 2), b)
    shape = {"f": (m, n, k), "dx": (m, k, n), "da": (k, n, m)}[gemm]
    assert gemm in TPO_GEMMS
    return g.gemm_time(*shape)


def hidden(alpha_beta: Arr, n: Arr, gemm: Arr) -> Arr:
    """Seconds of `alpha_beta` (calls on n ranks, their ring time) that their GEMMs (`gemm` seconds) hide:
    all but one ring step, at most the GEMM's time (module docstring)."""
    steps = np.maximum(np.asarray(n) - 1, 1)
    rest = alpha_beta * (steps - 1) / steps
    return np.clip(np.minimum(rest, gemm), 0.0, None)


__all__ = ["gemm_seconds", "hidden"]
