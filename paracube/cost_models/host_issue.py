"""The host's issue time of a dropless MoE block: between two host waits the GPU runs only as fast as its host issues.

What runs. A runtime that waits on the host every dropless MoE forward (host_sync.py, Runtime.moe_host_sync) drains
the GPU's queue at each wait: the host cannot run ahead of the GPU across it. Between two waits (one MoE block's
forward: from block i's dispatch to block i+1's, the same ops by periodicity) the GPU finishes no sooner than the host
has issued that segment's ops, so the segment takes max(G, H) instead of G (G its GPU work, H its host's issue time);
the backward of a micro-batch (no waits in it) is one segment too, max(G_b, H_b) per block. Without waits (dense
blocks, a block padded to a capacity, a runtime that does not wait) the host runs ahead and is hidden, as before.

Price, per dropless MoE block and micro-batch on one rank (both engines: moe.stage_cost adds it to the stage's compute
as a wait, moe_program.py as the block's host-wait op, outside `a2ao`'s overlapped compute):
    H_f = (n_f + e_f L) t_f,    H_b = (n_b + e_b L) t_b,    L = the rank's local experts (E / ep)
(n, e: the runtime's counts, with its experts' bias ops where they carry biases: MoEHostOps.of)
    idle_f = max(0, H_f - G_f),    idle_b = max(0, H_b - G_b)
(full recomputation re-runs the forward, and its wait, before each block's backward: the backward's segment per block
then holds both, idle_b = max(0, H_f + H_b - G_f - G_b), G_b without the recomputed forward)
G_f: the block's forward on the GPU: the dense part's block (compute.block_compute_time) + the attention correction
+ the MoE forward (moe.block_cost, less its wait) + its in-line collectives (counts, dispatch, combine); G_b alike
(with `a2ao` the collectives are counted whole: a lower bound on the idle). Ops (n, e) are the runtime's declaration
(Runtime.moe_host_ops, counted from its own code); the seconds per op are the host's: devices.HOST_OP_S /
HOST_BWD_OP_S, measured without a GPU, times GemmModel.host_scale (the generation's efficiency.HOST_ISSUE,
devices.HOST_ISSUE_SCALE, fitted on one DGX H100 row: what a GPU host adds per op, each kernel's launch, Transformer
Engine's Python, the ops the count leaves out), on a device with a host of its own (DeviceSpec.sync_s > 0: not the
local CPU, whose op overhead is priced per op already, compute.py).

What it leaves out: the host's share of a step without waits (hidden on every published row:
benchmarks/published_runs.py); the count's shape (a constant and a slope per local expert, from Megatron-core's
SequentialMLP on CPU) stands for Transformer Engine's grouped GEMM, whose host cost per expert the one fitted factor
carries at the fit row's 8 local experts only.
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.compute import GemmModel, block_compute_time
from paracube.cost_models.dims import Dims
from paracube.cost_models.host_sync import waits_per_forward
from paracube.cost_models.validity import layout_arrays
from paracube.layout import Layout
from paracube.moe_spec import MoESpec
from paracube.topologies import devices


def issue_seconds(moe: MoESpec, d: Dims, layout: Layout, g: GemmModel) -> tuple[float, float]:
    """(H_f, H_b): the host's seconds to issue one MoE block's forward and backward (module docstring); 0 without a
    declaration, or on a device that is its own host."""
    ops = d.moe_host_ops
    if ops is None or g.sync <= 0:
        return 0.0, 0.0
    local = moe.experts // layout.ep
    fwd, fwd_expert, bwd, bwd_expert = ops.of(moe.expert_bias)
    return ((fwd + fwd_expert * local) * devices.HOST_OP_S * g.host_scale,
            (bwd + bwd_expert * local) * devices.HOST_BWD_OP_S * g.host_scale)


def idle_seconds(moe: MoESpec, d: Dims, layout: Layout, g: GemmModel, gpu_fwd: float,
                 gpu_bwd: float) -> tuple[float, float]:
    """(idle_f, idle_b): seconds one MoE block's forward and backward (its recomputation included) wait for their host
    beyond their GPU work `gpu_fwd` / `gpu_bwd` (module docstring); 0 where the block does not wait."""
    if not waits_per_forward(moe, d):
        return 0.0, 0.0
    hf, hb = issue_seconds(moe, d, layout, g)
    if d.recompute == "full":
        return max(0.0, hf - gpu_fwd), max(0.0, hf + hb - gpu_fwd - gpu_bwd)
    return max(0.0, hf - gpu_fwd), max(0.0, hb - gpu_bwd)


def block_idle(moe: MoESpec, d: Dims, layout: Layout, mb: int, g: GemmModel, moe_fwd: float,
               moe_bwd: float) -> tuple[float, float]:
    """`idle_seconds` of one MoE block whose GPU work is the dense part's block (compute.block_compute_time) plus
    `moe_fwd` / `moe_bwd` (moe.stage_cost: the attention correction, the MoE compute less its wait, the in-line
    collectives)."""
    if d.moe_host_ops is None:
        return 0.0, 0.0
    dense_f, dense_b = block_compute_time(d, layout.mode, layout_arrays(layout, mb), g)
    return idle_seconds(moe, d, layout, g, float(np.asarray(dense_f).ravel()[0]) + moe_fwd,
                        float(np.asarray(dense_b).ravel()[0]) + moe_bwd)


__all__ = ["block_idle", "idle_seconds", "issue_seconds"]
