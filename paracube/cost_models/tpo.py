"""Tensor-parallel communication overlapped with its GEMM (Layout.tpo): the exposed part of a collective matmul.

A tpo-overlappable collective (modes: `Collective.tpo` names the GEMM it feeds or drains) runs as a ring of n - 1
point-to-point exchanges (executor/layers/ring.py), each posted before a chunk of that GEMM and waited for after
it (Wang et al. 2023, "Overlap communication with dependent computation via decomposition in large deep learning
models", ASPLOS '23; Megatron's --tp-comm-overlap with Transformer Engine userbuffers and torchtitan's async TP do
the same). The bytes are unchanged; only the time differs. Which chunk runs alongside which exchange is the
executor's schedule, declared per collective (`Collective.ring(n, paired)`: the fraction f_s of the GEMM
alongside exchange s on the group's slowest rank). With C the collective's alpha-beta time (e = C / (n - 1) per
exchange), W its waits for the group to be scheduled (0 on accelerators) and G the GEMM's time,
    exposed = W + sum_s max(0, e - f_s G)        hidden = sum_s min(e, f_s G)
(the GEMM time not alongside any exchange runs on its own and is counted as compute either way). The schedules
(modes/base.py, two_d.py, three_d.py):
- `chunks`, one chunk (1/n) per exchange: 2D / 2.5D dX's and dA's reduce-scatters, 3D's dY gather and dX
  reduce-scatter; the X ring alone when the weight is kept (kw=1) and was gathered earlier in the step;
- 2D's forward (`summa_ring`): X's ring over col and the weight's over row in lock step; rank (i, j) has a term
  X_k A_k to multiply only from step min(i - j, q - i + j) on, so the slowest rank (i - j = q // 2) runs
  floor(q/2) exchanges exposed (at q = 2 its one exchange: nothing hidden on the off-diagonal ranks);
- 3D's forward (`cube_ring`): X's and A's rings in lock step with 2 s + 1 terms of 1/q^2 at step s, the last
  step's deferred into Y's reduce-scatter (`cube_out_ring`: 1/q^2 per exchange on the slowest ranks, whose
  largest chunk comes first, before any exchange); 3D's dA reduce-scatter (`cube_wgrad_ring`): 1/q^2 per
  exchange (the term of dY's last block, deferred into it);
- 1D + sp (the default, `first_exposed`): the first exchange exposed and the whole GEMM spread over the other
  n - 2, the price 1D (and Megatron, whose published runs are fitted with it) has had since tpo was added; the
  executor's 1D ring is `chunks` (within one exchange of it: n - 1 of max(0, e - G / n) against
  e + max(0, (n - 2) e - G)). Kept as it was so that no 1D / Megatron price moves here.
Two lock-step rings (X's and A's: `Collective.lockstep`, paired when the weight ring ran in that forward, i.e.
not a kept weight reused) share each exchange's chunk in proportion to the bytes of their exchange (both rings
step together, priced one after the other as every collective is): X's ring gets f_s G b_X / (b_X + b_A). That
exposes at least as much as one ring of e_X + e_A would (never less: equal on links of one speed). Under kw=1 the
weight's gather runs once per step (the first micro-batch's forward) and is paired with that forward's X ring;
X's other rings (and 3D's Y) run unpaired; dA's reduce-scatter runs once, on the last micro-batch's chunks.
Both engines price this same decomposition: the analytic model per (GEMM, kind, axes) entry (`TpoPricing`,
analytic.py) and the event engine exchange by exchange, each beside its chunk (`program_gemm_steps`,
event_program.py; event_sim.py), the chunks' seconds taken out of the unit's compute op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from paracube.cost_models import fp8
from paracube.cost_models.compute import GemmModel, local_shape
from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch
from paracube.modes.base import TPO_GEMMS, Collective

Arr = np.ndarray


def gemm_seconds(d: Dims, mode: str, b: LayoutBatch, tag: str, g: GemmModel) -> Arr:
    """Seconds of the GEMM `tag` ("LINEAR.GEMM", modes.base.Collective.tpo) of one micro-batch, per configuration:
    the block linear's as compute.GemmModel.block_linear_gemms prices it (FP8 where the model has an FP8 curve,
    with the casts), as the event engine's unit_compute does (before 2026-12-03 the bf16 GEMM, which hid more of
    an FP8 row's ring than its faster GEMM can)."""
    name, gemm = tag.split(".")
    assert gemm in TPO_GEMMS
    index = [li[0] for li in d.linears].index(name)
    _, h_in, h_out, _ = d.linears[index]
    m, n, k = local_shape(mode, (b.mb * d.s).astype(float), h_in, h_out, index in (0, 2), b)
    f_dx_da = g.block_linear_gemms(m, n, k, fp8.weight_cast_per_micro_batch(d), fp8.cast_bytes(d, name))
    return f_dx_da[TPO_GEMMS.index(gemm)]


def hidden(alpha_beta: Arr, n: Arr, gemm: Arr) -> Arr:
    """Seconds of `alpha_beta` (calls on n ranks, their ring time) that their GEMMs (`gemm` seconds) hide under
    the default schedule (`first_exposed`): all but one ring step, at most the GEMM's time."""
    steps = np.maximum(np.asarray(n) - 1, 1)
    rest = alpha_beta * (steps - 1) / steps
    return np.clip(np.minimum(rest, gemm), 0.0, None)


def ring_hidden(c: Collective, alpha_beta: Arr, n: Arr | int, gemm: Arr, paired: bool, share: Arr | float = 1.0
                ) -> Arr:
    """Seconds of one call's ring (`alpha_beta`: its alpha-beta time on n ranks) hidden by its GEMM (`gemm`
    seconds) under the collective's schedule: sum_s min(e, f_s G share), e = alpha_beta / (n - 1)."""
    alpha_beta, n = np.asarray(alpha_beta, dtype=float), np.asarray(n)
    shape = np.broadcast_shapes(alpha_beta.shape, n.shape, np.shape(gemm), np.shape(share))
    ab, nn = np.broadcast_to(alpha_beta, shape), np.broadcast_to(n, shape)
    gs = np.broadcast_to(np.asarray(gemm, dtype=float) * share, shape)
    out = np.zeros(shape)
    for size in np.unique(nn):
        f = np.asarray(c.ring(int(size), paired), dtype=float)
        if size < 2 or not f.size:
            continue
        at = nn == size
        e = ab[at] / (size - 1)
        out[at] = np.minimum(e[:, None], f[None, :] * gs[at][:, None]).sum(axis=1)
    return out if shape else out[()]


def declared(d: Any, mode: str) -> dict[tuple[str, str, tuple[str, ...]], Collective]:
    """A block's tpo collectives by (GEMM tag, kind, axes): what the analytic model's entries are keyed by."""
    m = MODES[mode]
    return {(c.tpo, c.kind, c.axes): c for c in (*m.layer_fwd(d), *m.layer_bwd(d)) if c.tpo}


class TpoPricing:
    """The tpo entries of one stage (comm.Entry with `tpo` set) priced per call: paired calls (the weight's ring
    ran too) with the lock-step rings' byte shares, the others unpaired (module docstring)."""

    def __init__(self, d: Dims, mode: str, b: LayoutBatch, g: GemmModel, entries: Sequence[Any]) -> None:
        self.d, self.mode, self.b, self.g = d, mode, b, g
        self.decl = declared(d, mode)
        self.lockstep: dict[str, list[Any]] = {}
        for e in entries:
            c = self.decl.get((e.tpo, e.kind, e.axes))
            if e.tpo and c is not None and c.lockstep:
                self.lockstep.setdefault(e.tpo, []).append(e)

    @staticmethod
    def _per_call(e: Any) -> Arr:
        return e.sent() / np.maximum(e.count, 1)

    def hidden(self, e: Any, alpha_beta: Arr, rows: Arr) -> Arr:
        """Seconds of the entry `e`'s calls (alpha_beta: their time per layout) that their GEMMs hide."""
        c = self.decl[(e.tpo, e.kind, e.axes)]
        count = np.asarray(e.count, dtype=float)[rows]
        calls = np.maximum(count, 1.0)
        gemm = np.asarray(gemm_seconds(self.d, self.mode, self.b, e.tpo, self.g))[rows]
        n = e.n[rows] if np.ndim(e.n) else e.n
        weight = [w for w in self.lockstep.get(e.tpo, []) if self.decl[(w.tpo, w.kind, w.axes)].kept]
        paired = np.minimum(np.asarray(weight[0].count, dtype=float)[rows], count) if weight else 0.0
        share: Arr | float = 1.0
        if c.lockstep and weight:
            mine = self._per_call(e)[rows]
            total = sum(self._per_call(w) for w in self.lockstep[e.tpo])[rows]
            share = np.where(total > 0, mine / np.maximum(total, 1e-300), 1.0)
        per_call = alpha_beta / calls
        with_weight = ring_hidden(c, per_call, n, gemm, True, share)
        alone = ring_hidden(c, per_call, n, gemm, False)
        return np.where(count > 0, paired * with_weight + (count - paired) * alone, 0.0)


def program_gemm_steps(items: Sequence[tuple[Collective, int, float, float]]) -> list[tuple[float, ...]]:
    """The event engine's side: for the tpo collectives of one unit call in a stage program (one micro-batch's
    layer and phase, one GEMM), given as (declaration, group size, bytes per exchange, GEMM seconds), the
    GEMM seconds alongside each of every collective's exchanges (as `TpoPricing` prices them)."""
    paired = any(c.kept and c.lockstep for c, _, _, _ in items)
    total = sum(b for c, _, b, _ in items if c.lockstep) if paired else 0.0
    out = []
    for c, n, b, gemm in items:
        share = b / total if paired and c.lockstep and total > 0 else 1.0
        out.append(tuple(f * gemm * share for f in c.ring(n, paired)) if n > 1 else ())
    return out


def runs(steps: Sequence[float]) -> list[tuple[int, float]]:
    """(exchanges, GEMM seconds beside each) of consecutive equal entries of `steps` (the event engine runs each
    run of equal exchanges as one transfer beside its chunks: the same time as one by one)."""
    out: list[tuple[int, float]] = []
    for x in steps:
        if out and out[-1][1] == x:
            out[-1] = (out[-1][0] + 1, x)
        else:
            out.append((1, x))
    return out


__all__ = ["TpoPricing", "runs", "declared", "gemm_seconds", "hidden", "program_gemm_steps", "ring_hidden"]
