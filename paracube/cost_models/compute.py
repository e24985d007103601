"""FLOPs and compute time per device, vectorized over layouts.

FLOPs: a matmul [m, k] x [k, n] is 2mnk; per block the four linears, plus attention scores (QK^T) and
values (PV), 2 b s^2 h each; the head 2 T h V. Backward = 2 x forward. Full recompute adds one forward of
every block; selective recompute re-does what the runtime's rule re-runs (recompute.py: Megatron's the attention
core, scores, softmax, values; torchtitan's per-op rule every second bf16 matmul and the elementwise ops). The attention
core depends on the kernel (Layout `fa`, `attention_core_time`): unfused (Megatron's core attention, its
s x s softmax and dropout memory-bound at HBM bandwidth) or flash (causal half of the score blocks,
backward recomputing the scores, no s x s memory traffic).

Time: roofline per GEMM with an efficiency that falls for small local matrices,
    eff(m, n, k) = eff_max * m/(m + m0) * n/(n + n0) * k/(k + k0)
(defaults eff_max = 0.85, m0 = n0 = k0 = 64: a 4096^3 GEMM runs at ~81% of peak, 1024^3 at ~71%, 256^3 at
~54%, 64^3 at ~11%; the topology's calibration.gemm may override any of the four: device_model.gemm_model).
Each linear runs three GEMMs on local shapes: Y = X A (m, n, k), dX = dY A^T (m, k, n), dA = X^T dY (k, n, m).
Memory-bound elementwise work (norms, residual adds, bias, GELU, hidden dropout, cross-entropy) is priced at
memory bandwidth x mem_eff (default 0.8): forward bytes per block c * (12 T h_loc + 4 T f_loc), backward
twice that (a coarse count of reads + writes); the attention core's s x s work as above. Cross-entropy over the
local logits [T, V/t]: CE_BYTES = 28 a logit, Megatron-core's fp32 vocabulary-parallel cross-entropy as NeMo 2
runs it (cross_entropy_loss_fusion, fusions/fused_cross_entropy.py's jit-fused passes): .float() with the max
(2 + 4), subtract-exp-sum (4 + 4), divide (4 + 4); backward softmax x dloss cast to 16 bits (4 + 2). Unfused
(tensor_parallel/cross_entropy.py, each op a pass) it is 52. It was 12 until 2026-12-03 (topologies/efficiency.py
fit6).
Local GEMM shapes (T tokens of a micro-batch, t tensor ranks):
  none [T, h_in] x [h_in, h_out]; 1d column [T, h_in] x [h_in, h_out/t], row [T, h_in/t] x [h_in/t, h_out];
  2d [T/q, h_in] x [h_in, h_out/q]; 2.5d [T/(dq), h_in] x [h_in, h_out/q];
  3d [T/q, h_in/q] x [h_in/q, h_out/q].
Optimizer step (once per step, after the last backward): a fused Adam (Megatron's, apex FusedAdam) is
memory bound: per local parameter it reads and writes the fp32 master weight, both moments and reads the
fp32 gradient (28 bytes), and writes the 16-bit copy the next forward reads (c bytes at c < 4):
    optimizer_time = n_local (28 + c [c < 4]) / (mem_bw mem_eff) / shard     (shard = dp with zero >= 1).
Per-op overhead: with a calibration, every dispatched op (step_ops.ops_per_step, counted from the executor) costs
`calibration.elementwise.op_overhead_by_mode[dtype][mode]` (else `op_overhead_s`) on top: Python dispatch,
autograd and launch, which dominate small models on CPUs. calibrate.py measures it per tensor mode with
step probes, so it also carries what a mode's step costs beyond its fitted GEMMs and collectives (the
executor's glue code, waits for peers, idle cores on a shared host). Without a calibration it is the
device's `op_overhead_s` (0 for accelerators; the local-cpu preset prices its oversubscribed ranks with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paracube.cost_models import fp8, offload, recompute
from paracube.cost_models.attention_window import window_share
from paracube.cost_models.collective import wait_steps
from paracube.cost_models.dims import DTYPE_NAMES, Dims
from paracube.modes import MODES, LayoutBatch
from paracube.modes.base import padded
from paracube.modes.stages import stage_layers
from paracube.workload import DTYPE_BYTES

CE_BYTES = 28.0  # HBM bytes per local logit of the fp32 vocabulary-parallel cross-entropy (module docstring)
ITEM_BYTES = {**DTYPE_BYTES, **{DTYPE_NAMES[k]: v for k, v in DTYPE_BYTES.items()}}  # training and torch names

Arr = np.ndarray


@dataclass(frozen=True)
class GemmModel:
    peak: float  # FLOP/s of the compute dtype
    mem_bw: float  # bytes/s
    eff_max: float = 0.85
    m0: float = 64.0
    n0: float = 64.0
    k0: float = 64.0
    mem_eff: float = 0.8
    # Calibrated extras (zero / empty without a calibration). They ride on the device model so that every
    # caller that builds it with `device_model.gemm_model(topo)` (estimate, the planner's vectorized path) reads
    # the same.
    op_overhead: float = 0.0  # seconds per launched op (Python dispatch + kernel launch), ops.py counts them
    # per tensor mode, where calibrate's step probes measured it (mode, seconds per op); else op_overhead
    op_overhead_by_mode: tuple[tuple[str, float], ...] = ()
    # (kind, group size, alternating, latency s, bandwidth B/s): collective.calibrated_link reads it
    comm: tuple[tuple[str, int, bool, float, float], ...] = ()
    call_overhead: float = 0.0  # seconds per collective call beyond its ring steps (DeviceSpec.call_overhead_s)
    ring_wait: float = 0.0  # seconds per message that waits for its rank to be scheduled (DeviceSpec.ring_wait_s)
    send_wait: float = 0.0  # seconds a point-to-point message waits beside computing ranks (DeviceSpec.send_wait_s)
    ranks_per_core: float = 1.0  # CPU ranks sharing a core (DeviceSpec.ranks_per_core; shared_cores.py's bubble)
    # FP8 (dtype "fp8", cost_models/fp8.py): the block linears' GEMMs at the fp8 peak on their own curve, their
    # operands cast (memory-bound at this model's bandwidth); everything else at this (bf16) model. None: no FP8.
    linear: GemmModel | None = None
    # Fused (flash) attention: the fraction of `peak` its kernel reaches (a fitted figure per generation,
    # topologies/efficiency.py); 0: its score and value GEMMs on this model's curve, like any GEMM.
    flash_eff: float = 0.0
    # Compute seconds lost per second a data-parallel collective's NVLink ring runs beside it (a fitted figure per
    # generation, topologies/efficiency.OVERLAP_DRAG; cost_models/overlap_drag.py); 0: overlap is free.
    overlap_drag: float = 0.0
    # Per-rank jitter s (sqrt(s)) the step's barrier over the data-parallel replicas meets (a fitted figure per
    # generation, topologies/efficiency.STRAGGLER; cost_models/stragglers.py); 0: no wait.
    straggler: float = 0.0
    sync: float = 0.0  # seconds the device idles per host wait (DeviceSpec.sync_s; cost_models/host_sync.py)
    host_bw: float = 0.0  # bytes/s per direction to the host (DeviceSpec.host_bandwidth; cost_models/offload.py)
    # How much slower the host issues a MoE block's ops than devices.HOST_OP_S measured (a fitted figure per device
    # generation, topologies/efficiency.HOST_ISSUE; cost_models/host_issue.py); 1: as measured.
    host_scale: float = 1.0
    # The share of what moe_a2a_overlap.py's two streams hide that a run of Layout `a2ao` hides (a fitted figure per
    # device generation, topologies/efficiency.A2AO_OVERLAP); 1: all of it.
    a2ao_eff: float = 1.0

    @property
    def waits(self) -> bool:
        return bool(self.call_overhead or self.ring_wait or self.send_wait)

    def call_wait(self, kind: str, n: Arr, call_bytes: Arr, dtype: str, alternating: bool = False) -> Arr:
        """Seconds one call on n ranks waits beyond its alpha-beta time: the call overhead plus its messages'
        scheduling waits (collective.wait_steps; `alternating`: the mode's calls switch groups, so each waits
        for its group to meet); a send (a pipeline's hand-off, whose receiver is woken beside ranks that
        compute, not beside ranks in the same collective) at least send_wait per message; 0 without them
        (accelerators). The payload does not matter: a step's calls are latency-bound on a shared core
        (measured, collective.py)."""
        del call_bytes, dtype
        wait = self.call_overhead + self.ring_wait * wait_steps(kind, n, alternating)
        if kind == "send" and self.send_wait:
            return np.maximum(wait, self.send_wait * wait_steps(kind, n))
        return wait

    def op_cost(self, mode: str) -> float:
        """Seconds per dispatched op in a step of `mode`, else of the mode it dispatches like (its
        `dispatches_like`: 2.5D borrows 2D's), else the device's op_overhead."""
        by_mode = dict(self.op_overhead_by_mode)
        like = MODES[mode].dispatches_like if mode in MODES else ""
        return by_mode.get(mode, by_mode.get(like or mode, self.op_overhead))

    def eff(self, m: Arr, n: Arr, k: Arr) -> Arr:
        return self.eff_max * m / (m + self.m0) * n / (n + self.n0) * k / (k + self.k0)

    def gemm_time(self, m: Arr, n: Arr, k: Arr) -> Arr:
        m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
        return 2.0 * m * n * k / (self.peak * self.eff(m, n, k))

    def gemms(self, m: Arr, n: Arr, k: Arr) -> tuple[Arr, Arr, Arr]:
        """(Y = X A, dX = dY A^T, dA = X^T dY) seconds of a linear with local shapes X [m, k], A [k, n]."""
        return self.gemm_time(m, n, k), self.gemm_time(m, k, n), self.gemm_time(k, n, m)

    def block_linear_gemms(self, m: Arr, n: Arr, k: Arr, weight_cast: bool = False,
                           cast_bytes: tuple[float, float] = fp8.DYNAMIC_CASTS) -> tuple[Arr, Arr, Arr]:
        """`gemms` of a block's linear: with FP8 at the FP8 model, plus the casts of X (forward) and dY
        (backward, with dX) as fp8.py prices them, `cast_bytes` = (X's, dY's) bytes per element (fp8.cast_bytes:
        the linear's under the run's scaling); `weight_cast` (fp8.weight_cast_per_micro_batch: dynamic scaling)
        also the weight A's at fp8.CAST_BYTES, with the forward."""
        if self.linear is None:
            return self.gemms(m, n, k)
        f, dx, da = self.linear.gemms(m, n, k)
        bw = self.mem_bw * self.mem_eff
        m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
        cast_f = (cast_bytes[0] * m * k + (fp8.CAST_BYTES * k * n if weight_cast else 0.0)) / bw
        return f + cast_f, dx + cast_bytes[1] * m * n / bw, da

    def linear_time(self, m: Arr, n: Arr, k: Arr, weight_cast: bool = False,
                    cast_bytes: tuple[float, float] = fp8.DYNAMIC_CASTS) -> tuple[Arr, Arr]:
        """(forward, backward) time of one block linear with local shapes X [m, k], A [k, n] (`weight_cast`,
        `cast_bytes`: block_linear_gemms)."""
        f, dx, da = self.block_linear_gemms(m, n, k, weight_cast, cast_bytes)
        return f, dx + da


def local_shape(
    mode: str, T: Arr, h_in: int, h_out: Arr, column: bool, b: LayoutBatch
) -> tuple[Arr, Arr, Arr]:
    """(m, n, k) of the forward GEMM of one linear on one rank (the mode's gemm_shape)."""
    return MODES[mode].gemm_shape(T, h_in, h_out, column, b.t, b.q, b.depth)


def block_compute_time(d: Dims, mode: str, b: LayoutBatch, g: GemmModel) -> tuple[Arr, Arr]:
    """(forward, backward) seconds of one block, one micro-batch, one rank: linears, attention core, elementwise; the
    backward with what selective recomputation re-runs in it (full recomputation's forward is the caller's)."""
    T = (b.mb * d.s).astype(float)
    fwd_blk = np.zeros_like(T)
    bwd_blk = np.zeros_like(T)
    for n, (name, h_in, h_out, _) in enumerate(d.linears):
        fwd, bwd = g.linear_time(*local_shape(mode, T, h_in, h_out, n in (0, 2), b),  # FP8 where g.linear
                                 fp8.weight_cast_per_micro_batch(d), fp8.cast_bytes(d, name))
        fwd_blk, bwd_blk = fwd_blk + fwd, bwd_blk + bwd
    attn_f, attn_b = attention_core_time(d, b.mb, b.t, g)
    elem_f = elementwise_forward(d, mode, b, g)
    bwd = bwd_blk + attn_b + 2 * elem_f
    if d.recompute == "selective":  # the runtime's rule (Dims.selective, recompute.py)
        bwd = bwd + recompute.selective_time(d, mode, b, g, attn_f, elem_f)
    return offload.with_transfers(d, mode, b, g.host_bw, fwd_blk + attn_f + elem_f, bwd)  # off=N (offload.py)


def stage_compute_time(d: Dims, mode: str, b: LayoutBatch, last: Arr, g: GemmModel, first: Arr | int = 0,
                       blocks: tuple[Arr, Arr] | None = None) -> Arr:
    """Compute time of one step on one rank of a stage (all micro-batches, recompute included); `blocks`: the
    batch's block_compute_time where the caller has it (every stage's: the same floats as computing it here)."""
    m = MODES[mode]
    dp, pp, t, mb = b.dp, b.pp, b.t, b.mb
    N = d.global_batch // (dp * mb)
    T = (mb * d.s).astype(float)
    Ls = stage_layers(d.L, pp, b.v, np.where(pp == 1, 1, first), last)
    fwd, bwd = block_compute_time(d, mode, b, g) if blocks is None else blocks
    per_block = fwd + bwd + (fwd if d.recompute == "full" else 0.0)
    # Head (vocab-parallel linear h -> V) and cross-entropy on the last stage.
    V = padded(d.V, m.vocab_split(t, b.q))
    hf, hdx, hda = g.gemms(*local_shape(mode, T, d.h, V, True, b))  # the head stays bf16 under FP8
    hb = hdx + hda
    ce = CE_BYTES * T * V / t / (g.mem_bw * g.mem_eff)
    per_micro = Ls * per_block + last * (hf + hb + ce)
    return N * per_micro


def elementwise_forward(d: Dims, mode: str, b: LayoutBatch, g: GemmModel) -> Arr:
    """Seconds of one block's memory-bound forward work, one micro-batch, one rank (module docstring)."""
    T = (b.mb * d.s).astype(float)
    h_loc, f_loc = T * d.h / MODES[mode].act_split(b.t, b.sp), T * d.f / b.t
    return d.c * (12 * h_loc + 4 * f_loc) / (g.mem_bw * g.mem_eff)


FLASH_CAUSAL = 0.5  # share of the s x s score blocks a causal flash kernel computes (it skips the masked half)
FLASH_BWD = 2.5  # flash backward GEMMs per forward GEMM: recomputes Q K^T, then dV, dP, dQ, dK (5 vs 2)


def attention_core_time(d: Dims, mb: Arr, t: Arr, g: GemmModel) -> tuple[Arr, Arr]:
    """(forward, backward) seconds of the attention core of one block, one micro-batch, one rank (heads / t).

    GEMMs: per (sequence, head) pair Q K^T [s, hd] x [hd, s] and P V [s, s] x [s, hd].
    - unfused (fa=0, Megatron): both GEMMs whole; backward 2 x forward (dV, dP, dQ, dK). Memory-bound s x s
      work at HBM bandwidth, per score of c bytes: the fused masked softmax reads the scores and writes the
      probabilities (2c), its backward reads probabilities and gradient and writes one (3c); attention dropout
      reads and writes c each way plus its 1-byte mask (2c + 1 forward and backward).
    - flash (fa=1): causal, only the unmasked half of the score blocks (FLASH_CAUSAL); backward recomputes the
      scores (FLASH_BWD = 5 GEMMs per 2 forward); no s x s traffic: it reads q, k, v and writes its output
      (4 c T h / t forward; backward about twice that). Its GEMM FLOPs run at peak x `flash_eff` where the
      device generation has that figure fitted (the kernel tiles over the sequence, so its [s, hd] x [hd, s]
      products do not see the GEMM curve's small-k penalty at hd = 64..128), else on the GEMM curve.
    With context parallelism (d.cp > 1, dims.context_local: s is a rank's s / cp tokens) the rank's queries meet
    cp blocks of s keys (its own and cp - 1 received, modes/context.py); the causal load balance gives every rank
    1 / cp of the whole causal work, i.e. cp blocks of the s x s work above (cost_models/context_parallel.py),
    and flash reads the cp blocks' keys and values.
    Sliding-window attention (Dims.window): flash's score GEMMs scaled by attention_window.window_share (the band's
    tiles, the busiest cp rank's; 1.0 for w >= s); the unfused core still materialises and masks the s x s scores.
    """
    hd = d.h // d.heads
    pairs = mb * d.heads / t
    gemms = d.cp * pairs * (g.gemm_time(d.s, d.s, hd) + g.gemm_time(d.s, hd, d.s))
    bw = g.mem_bw * g.mem_eff
    if d.flash and g.flash_eff > 0:  # a fitted fused-kernel efficiency: its GEMM FLOPs at peak x flash_eff
        gemms = d.cp * pairs * 2 * (2.0 * d.s * d.s * hd) / (g.peak * g.flash_eff)  # cp blocks, as above
    if d.flash:
        io = d.c * 2.0 * (1 + d.cp) * mb * d.s * d.h / t / bw  # q, out; k, v of cp blocks (4 c T h at cp = 1)
        gemms = gemms * window_share(d)  # sliding windows: the band's tiles (attention_window.py); else 1.0
        return FLASH_CAUSAL * gemms + io, FLASH_CAUSAL * FLASH_BWD * gemms + 2 * io
    scores = d.cp * mb * d.heads * float(d.s) * d.s / t
    drop = 2.0 * d.c + 1 if d.attention_dropout > 0 else 0.0
    return gemms + scores * (2.0 * d.c + drop) / bw, 2 * gemms + scores * (3.0 * d.c + drop) / bw


def core_scale(d: Dims) -> float:
    """The attention core at its true head widths over attention_core_time's (h / heads per head): (qk + v) /
    (2 h / heads), its GEMMs' widths (Q K^T at qk, P V at v); MLA's qk_nope + qk_rope and v (DeepSeek-V2/V3: 192,
    128), a head width other than h / heads both (Qwen3); exactly 1.0 for every other model. Read by
    attention_correction.py (the core's correction) and context_parallel.ring_blocks (the block a ring step hides
    behind), so the engines time the same core."""
    qk, v = (d.mla.qk_head_dim, d.mla.v_head_dim) if d.mla is not None else (d.head_width, d.head_width)
    return (qk + v) / (2.0 * (d.h // d.heads))


def optimizer_time(n_local: Arr, c: int, g: GemmModel, shard: Arr | float = 1.0) -> Arr:
    """Seconds of one fused Adam step over `n_local` parameters (module docstring), 1/shard of them updated."""
    per_param = 28.0 + (c if c < 4 else 0)
    return np.asarray(n_local, dtype=float) * per_param / (g.mem_bw * g.mem_eff) / shard


def fp8_step_time(d: Dims, mode: str, b: LayoutBatch, first: Arr | int, last: Arr, g: GemmModel) -> Arr:
    """Seconds per step casting the stage's block weights to FP8 (fp8.step_time; 0 without FP8), priced with
    the optimizer step by both engines."""
    if g.linear is None:
        return np.zeros(len(b.dp))
    return fp8.step_time(d, mode, b, first, last, g.mem_bw * g.mem_eff)
