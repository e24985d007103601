"""Compute seconds of the event engine's stage programs, as the analytic model prices them (compute.py).

`unit_compute`: per linear the three GEMMs (Y = X A, dX = dY A^T, dA = X^T dY) at their local shapes; the rest of a
block (attention core, norms, elementwise) is `stage_compute_time` of one block minus its GEMMs, one third forward,
two thirds backward (a quarter each for forward and recompute under full recomputation); 1D merges a block half's
two linears into one unit; the head carries the cross-entropy. What rc=selective by module re-runs besides the
attention core (recompute_modules_cost.dense_time: layernorm, mla_up_proj, mlp) is the block's recompute op, run
before its backward (as Megatron-core and the executor run it; tpo's re-issued rings run beside its chunk GEMMs
there, event_program._apply_tpo); the core's re-run stays in the rest (the "attention" rule's shares).
`add_op_overhead`: the per-op dispatch overhead
(step_ops.ops_per_step x op_cost; 0 on accelerators) spread over a program's lists.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paracube.cost_models import fp8
from paracube.cost_models import recompute_modules_cost as rmc
from paracube.cost_models.compute import GemmModel, local_shape, stage_compute_time
from paracube.cost_models.dims import Dims, padded_vocab
from paracube.cost_models.event_ops import Op, StageProgram
from paracube.cost_models.step_ops import ops_per_step
from paracube.cost_models.validity import layout_arrays
from paracube.layout import Layout


def unit_compute(d: Dims, layout: Layout, mb: int, g: GemmModel) -> dict[str, tuple[float, float, float]]:
    """(forward, dX part, dA part) seconds per unit of one block, plus 'head' and '_recompute'."""
    # One block, one micro-batch per stage: L = pp blocks without interleaving (with v chunks a stage would
    # hold v blocks of an L = pp model), so the per-block times do not scale with v.
    mode, a = layout.mode, layout_arrays(layout.with_(interleave=1), mb)
    one = replace(d, L=layout.pp, global_batch=layout.dp * mb)
    block = float(stage_compute_time(one, mode, a, np.array([0]), g)[0])
    with_head = float(stage_compute_time(one, mode, a, np.array([1]), g)[0])
    T = np.array([mb * d.s], dtype=float)
    out: dict[str, tuple[float, float, float]] = {}
    gemm_total, fwd_total = 0.0, 0.0
    for n, (name, h_in, h_out, _) in enumerate(d.linears):
        m, nn, k = local_shape(mode, T, h_in, h_out, n in (0, 2), a)
        # FP8 (and its casts) where g.linear
        f, dx, da = (float(x[0]) for x in g.block_linear_gemms(m, nn, k, fp8.weight_cast_per_micro_batch(d),
                                                                        fp8.cast_bytes(d, name)))
        out[name] = (f, dx, da)
        gemm_total += f + dx + da
        fwd_total += f
    full = d.recompute == "full"
    # rcm='s re-run besides the core (compute.block_compute_time holds it in the block's backward)
    rerun = float(rmc.dense_time(d, mode, a, g)[0]) if rmc.by_module(d) else 0.0
    rest = block - gemm_total - (fwd_total if full else 0.0) - rerun
    rest_f = rest / (4 if full else 3)
    rest_b = rest - rest_f * (2 if full else 1)
    half = (rest_f / 2, rest_b / 2, 0.0)
    merged = layout.tensor_mode.merged_units  # 1D: a unit per block half runs two linears
    for unit, (lin_a, lin_b) in merged:
        out[unit] = tuple(x + y + z for x, y, z in zip(out[lin_a], out[lin_b], half, strict=True))  # type: ignore[assignment]
    if not merged:
        out["ln1"] = out["ln2"] = half
    V = padded_vocab(d.V, layout.tensor_mode.vocab_split(layout.tensor_size, layout.q))
    m, nn, k = local_shape(mode, T, d.h, V, True, a)
    hf, hdx, hda = (float(x[0]) for x in g.gemms(m, nn, k))
    ce = (with_head - block) - (hf + hdx + hda)
    out["head"] = (hf + ce / 3, hdx + 2 * ce / 3, hda)
    out["_recompute"] = (fwd_total + rest_f, 0.0, 0.0) if full else (rerun, 0.0, 0.0)
    return out


def add_op_overhead(layout: Layout, d: Dims, mb: int, g: GemmModel, first: bool, last: bool,
                     prog: StageProgram) -> None:
    """The per-op overhead the analytic model adds to compute (step_ops.ops_per_step x op_cost: 0 on
    accelerators): a micro-batch's ops a third in its forward, two thirds in its backward, spread over the
    chunks; the per-step ops (optimizer, gradient bookkeeping) in the tail."""
    cost = g.op_cost(layout.mode)
    if cost <= 0:
        return
    b = layout_arrays(layout, mb)
    F, H = np.array([int(first)]), np.array([int(last)])
    one, two = (float(ops_per_step(replace(d, global_batch=k * layout.dp * mb), layout.mode, b, F, H)[0])
                for k in (1, 2))
    micro, step = two - one, 2 * one - two
    v = len(prog.fwd)
    for c in range(v):
        for ops in (prog.fwd[c], prog.fwd_first[c]):
            ops.append(Op("compute", "ops.fwd", cost * micro / (3 * v)))
        for ops in (prog.bwd[c], prog.bwd_last[c]):
            ops.append(Op("compute", "ops.bwd", 2 * cost * micro / (3 * v)))
    prog.tail.append(Op("compute", "ops.step", cost * step))


__all__ = ["add_op_overhead", "unit_compute"]
