"""rc=selective by module (Layout `rcm=`, paracube/recompute_modules.py): per module, per block it applies to, the
forward seconds re-run in backward and the activation bytes no longer kept, one micro-batch, one rank. Both engines read
them: the dense part's modules through compute.block_compute_time (its backward; the event engine takes a block's time
from there, event_compute.unit_compute) and block_acts.saved_block_bytes (memory.py, offload.py); the MoE side's through
moe.block_cost / stage_cost and mlp_delta.block_deltas (moe_program.py inserts the same terms).

Which modules (`modules`): the layout's rcm= (Dims.recompute_modules), else the runtime's rule: Megatron's "attention"
rule is recompute_modules.DEFAULT ("core_attn",), priced exactly as before rcm= existed (recompute.py); torchtitan's
"op" rule is no module. The dense engines price `moe.dense_part(model)`: on a model with MoE blocks they take only the
modules of every block (`DENSE`; analytic.prepare strips the rest, `dense_modules`) and moe.py the blocks' own.

T tokens of the micro-batch at the tensor group (b s / cp), t tensor ranks, k = the activations' split (1D: t with sp,
else 1; 2D / 3D: t: TensorMode.act_split), c the compute dtype's bytes, bw the memory rate (mem_bw x mem_eff), R the
token copies at the most loaded rank's experts (moe.block_cost), f_e / etp the expert width there, F(f) the forward of a
gated MLP of width f (mlp_delta._mlp: fc [h, 2 f], fc2 [f, h] at the mode's local shapes, its SwiGLU 4 c T f / t).
Sources: megatron-core 0.16.1.
- core_attn (region; transformer/attention.py:328-331, 381 _checkpointed_attention_forward): recompute.py's
  "attention" rule: the core's forward again, its own tensors not kept (activations.py, block_acts.py).
- layernorm (discard: CheckpointWithoutOutput, transformer_layer.py:576-616 input norm, 671-680 and 797-803 pre-MLP
  norm): re-run the forward of n norms, n x 2 c T h / k / bw (each reads and writes c T h / k); no longer kept: their
  outputs, n c T h / k. n per block (`block_norms`) by the runtime (Dims.fused_norms, Runtime.fused_norms): both norms,
  n = 2, where each is a module of its own (paracube's executor); where its dense norms run inside the next linear
  (Megatron-core's Transformer Engine spec, models/gpt/gpt_layer_specs.py: standard attention's input norm inside
  linear_qkv, TELayerNormColumnParallelLinear, :279; a dense MLP's pre-MLP norm inside linear_fc1, :265 / :291 /
  :492-497; both left IdentityOp, which transformer_layer.py:379-444 does not recompute: 384, 432), n counts only latent
  attention's input norm (a TENorm, :248) and a MoE block's pre-MLP norm (a TENorm, the router reads it): a dense
  standard-attention block 0, a MoE or latent-attention block 1, a MoE block with latent attention 2. The dense
  engines price every block's share (`dense_norms`: 2, or latent attention's 1), moe.py each MoE block's pre-MLP norm
  under fused norms (`moe_rerun`, `moe_rcm_saved`). Under mlp with fused norms the pre-MLP norm's output is
  inside fc1 and mlp frees it (`mlp_saved`).
- mla_up_proj (discard, multi_latent_attention.py:119, 838-845, discarded at 344-347): re-run the q / kv up
  projections' forward GEMMs (q_up [r_q, H d_qk] or, without q_lora_rank, q_proj [h, H d_qk]; kv_up [r_kv,
  H (d_n + d_v)], column-parallel) and their rotary / concatenation (writing q, k, v: c T H (2 d_qk + d_v) / t, read
  and written once, 2x that / bw); no longer kept: q, k, v, c T H (2 d_qk + d_v) / t (paracube's executor's count
  with the core recomputed keeps the up projections' outputs instead, activations.attention_widths "kept":
  c T H (d_qk + d_n + d_v) / t).
- mlp (region, dense blocks only: transformer_layer.py:447-449, 719-737): re-run F(f) (a dense model: the dense
  engines' fc and fc2 forward GEMMs and SwiGLU / GELU bytes, 4 c T f / t); no longer kept: the activation's input
  c T f_a / t (f_a = 2 f gated, f GELU) and fc2's input c T f / t. fc's input, the pre-MLP norm's output, is the
  region's input in paracube's executor (the norm outside it: executor/model/blocks.py), kept; Megatron's Transformer
  Engine spec fuses that norm into fc (LayerNormLinear inside the region), so under its fused norms
  (Runtime.fused_norms) mlp frees it too, c T h / k (where layernorm then frees no dense norm), and re-runs it
  with fc (`mlp_norm_time`): a norm pass, 2 c T h / k / bw, as layernorm prices one (gpt_layer_specs.py:265 / :291
  pre_mlp_layernorm IdentityOp on a dense block, :492-497 linear_fc1 column_parallel_layer_norm_linear;
  transformer_layer.py:703 the identity's output is the region's input, :719-737 tensor_parallel.checkpoint(
  self.mlp, ...) re-runs linear_fc1 whole, its norm included). A MoE model's dense blocks alike (mlp_delta.py);
  a shared expert's region does not hold the pre-MLP norm (a TENorm of its own, the router reads it).
  Its tensor-parallel forward collectives up to the region's last saved tensor run again in the backward
  (recompute_again.py `again_collectives`, `mlp_again`: 1D + sp's all_gather; 2D / 3D's fc
  gathers and fc2's operand gathers, 3D's fc2 output reduce-scatter, issued inside its GEMM's autograd Function; not
  the last linear's output reduce after its GEMM, 1D's reduce_scatter / all_reduce, nor its bias gather:
  torch.utils.checkpoint's early stop, AFTER_LAST_SAVED; but with `tpo` 1D + sp's output reduce_scatter, a ring
  inside fc2's own autograd Function, executor/layers/collective_matmul.py RingLinearScatter, whose inputs are saved
  when it returns: issued again, beside fc2's chunk GEMMs as in the forward), phase "recompute", in both engines
  (the event engine's ring ops take their chunks' seconds from the block's recompute op, which holds `dense_time`:
  event_compute.unit_compute, event_program._apply_tpo); on a model with MoE
  blocks its dense blocks' (and the shared experts' under shared_experts / moe) through moe_mlp_again.py. Megatron-core
  0.16.1's tensor_parallel.checkpoint (random.py:496-573 CheckpointFunction, reentrant: its backward, l.557, runs the
  whole function again) re-runs the region to its end, those trailing collectives included: not priced (paracube prices
  what its executor runs); on 1D + sp that is one reduce_scatter of c T h per block and micro-batch more.
- layernorm's collectives: 2D / 2.5D / 3D's norms split the hidden dimension, so their re-run forward all-reduces
  its statistics and gathers gamma (beta) again (`again_collectives`, phase "recompute"); none in none / 1D.
- moe_act (discard, moe/experts.py:100-275, TEGroupedMLP's activation_checkpoint): re-run the experts' activation,
  3 c R f_e / etp / bw (moe_passes.pass_bytes' SwiGLU forward); no longer kept: its output, c R f_e / etp.
- shared_experts (region, moe/moe_layer.py:150-160 shared_experts_recompute): re-run F(f_s) of the shared expert,
  its MLP collectives up to its last saved tensor with it (as mlp's: moe_mlp_again.py); no longer kept: its
  activation's input and fc2's input, c T 3 f_s / t (its input, the norm's output, is kept).
- moe (region, moe/moe_layer.py:432-450 moe_layer_recompute): re-run the MoE layer's whole forward (router, the
  copy counts' all_to_all, the aux loss's counts all_reduce, the dispatch and combine all_to_alls (their time and
  bytes again in the backward, as full recomputation's: moe.stage_cost, moe_program.py, moe_traffic.py), the
  permutes, the experts, the shared expert F(f_s) and its MLP collectives up to its last saved tensor,
  moe_mlp_again.py); no longer kept: every tensor of the MoE layer's (moe.stage_cost's activations: R h + 3 R f_e /
  etp in c bytes, the router's T E fp32) and the shared expert's (as shared_experts), its input kept. paracube's
  executor keeps what that count says of the layer's activations (its experts weight inside the activation, Megatron's
  way: executor/layers/weighted_glu.py) and, beyond it, only the routing's indices and weights
  (tests/test_recompute_modules_run.py known_gap), with the module and without.
Measured against paracube's executor (tests/test_recompute_modules_run.py, fp64, serial): mlp, moe_act and
shared_experts free exactly these bytes; layernorm also the norms' statistics (4 stat_width T / k per norm, fp32),
which its term does not subtract; mla_up_proj on CPU's SDPA math path keeps q and k (the kernel's own copies).
The re-made tensors of the one block whose backward runs are not added to the peak (as for core_attn).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paracube.cost_models import fp8
from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch
from paracube.recompute_modules import DEFAULT

Arr = np.ndarray
DENSE: tuple[str, ...] = ("core_attn", "layernorm", "mla_up_proj")  # of every block: the dense engines' on MoE models
MOE_REGION = "moe"


def modules(d: Dims) -> tuple[str, ...]:
    """The modules rc=selective re-runs (module docstring); () without selective recomputation or under "op"."""
    if d.recompute != "selective":
        return ()
    if d.recompute_modules is not None:
        return d.recompute_modules
    return DEFAULT if d.selective == "attention" else ()


def core_recomputed(d: Dims) -> bool:
    """The attention core is recomputed (Megatron's default rule, or rcm= naming core_attn); under cp only by a runtime
    whose re-run runs its exchange too (Dims.cp_core_recompute; context_parallel.ring_again), else kept."""
    return "core_attn" in modules(d) and (d.cp == 1 or d.cp_core_recompute)


def by_module(d: Dims) -> bool:
    """Selective recomputation by module (the "attention" rule or rcm=), not torchtitan's "op" rule."""
    return d.recompute == "selective" and (d.recompute_modules is not None or d.selective == "attention")


def dense_modules(d: Dims, has_moe: bool) -> tuple[str, ...] | None:
    """What the dense engines take of the pinned modules: on a model with MoE blocks those of every block (DENSE)."""
    if d.recompute_modules is None or not has_moe:
        return d.recompute_modules
    return tuple(m for m in d.recompute_modules if m in DENSE)


def block_norms(d: Dims, moe_block: bool) -> int:
    """Norms rcm=layernorm re-runs in one block (module docstring): 2, or with fused norms latent attention's input
    norm and a MoE block's pre-MLP norm."""
    return int(d.mla is not None) + int(moe_block) if d.fused_norms else 2


def dense_norms(d: Dims) -> int:
    """Of `block_norms`, those of every block (the dense engines'); a MoE block's pre-MLP norm under fused norms is
    moe.py's (`moe_norms`)."""
    return block_norms(d, False) if "layernorm" in modules(d) else 0


def moe_norms(d: Dims) -> int:
    """Of `block_norms`, the MoE blocks' own: their pre-MLP norm under fused norms (the dense engines price both
    norms of every block otherwise)."""
    return block_norms(d, True) - block_norms(d, False) if "layernorm" in modules(d) else 0


def _shards(mode: str, b: LayoutBatch) -> Arr:
    return np.asarray(MODES[mode].act_split(b.t, b.sp), dtype=float)


def mla_widths(d: Dims) -> tuple[float, float, float, float]:
    """(q's input width, q's columns H d_qk, kv_up's columns H (d_n + d_v), q, k, v's columns H (2 d_qk + d_v)) of
    latent attention."""
    m = d.mla
    assert m is not None
    H = float(d.heads)
    return (float(m.q_lora_rank or d.h), H * m.qk_head_dim, H * (m.qk_nope_head_dim + m.v_head_dim),
            H * (2 * m.qk_head_dim + m.v_head_dim))


def dense_time(d: Dims, mode: str, b: LayoutBatch, g: object) -> Arr:
    """Forward seconds the dense part's modules other than core_attn re-run per block (module docstring)."""
    mods = modules(d)
    T = (b.mb * d.s).astype(float)
    bw = g.mem_bw * g.mem_eff  # type: ignore[attr-defined]
    c = float(d.c)
    out = np.zeros_like(T)
    if "layernorm" in mods:
        out = out + dense_norms(d) * 2 * c * T * d.h / _shards(mode, b) / bw
    if "mla_up_proj" in mods and d.mla is not None:
        r_q, wq, wkv, qkv = mla_widths(d)
        m = MODES[mode]
        for k_in, width in ((r_q, wq), (float(d.mla.kv_lora_rank), wkv)):
            out = out + g.gemm_time(*m.gemm_shape(T, k_in, width, True, b.t, b.q, b.depth))  # type: ignore[attr-defined]
        out = out + 2 * c * T * qkv / b.t / bw
    if "mlp" in mods:
        m = MODES[mode]
        for n in (2, 3):  # fc, fc2 (Dims.linears), as compute.block_compute_time runs them
            name, h_in, h_out, _ = d.linears[n]
            shape = m.gemm_shape(T, h_in, h_out, n == 2, b.t, b.q, b.depth)
            out = out + g.block_linear_gemms(*shape, fp8.weight_cast_per_micro_batch(d),  # type: ignore[attr-defined]
                                             fp8.cast_bytes(d, name))[0]
        out = out + 4 * c * T * d.f / b.t / bw  # elementwise_forward's f term: the activation
        out = out + mlp_norm_time(d, T, _shards(mode, b), bw)
    return out


def mlp_norm_time(d: Dims, T: Arr | float, shards: Arr | float, bw: float) -> Arr | float:
    """Forward seconds of the pre-MLP norm `mlp` re-runs with a dense MLP (module docstring): under fused norms
    (inside fc, LayerNormLinear) one norm pass, 2 c T h / k / bw, as layernorm's; else 0 (outside the region)."""
    return 2 * d.c * T * d.h / shards / bw if d.fused_norms else 0.0 * T


def mlp_saved(d: Dims, T: Arr, t: Arr, shards: Arr, f: float) -> Arr:
    """Bytes a dense MLP of width f keeps that `mlp` no longer keeps (module docstring), one block; its norm's output
    only under fused norms (the norm inside fc)."""
    gated = 2.0 if d.family == "llama" else 1.0
    inner = d.c * T * (gated + 1.0) * f / t
    # paracube's executor: the pre-MLP norm sits outside the region, its output the region's kept input (layernorm
    # frees it); fused norms (Megatron's Transformer Engine spec): the norm runs inside fc, its output freed with it
    return inner + (d.c * T * d.h / shards if d.fused_norms else 0.0)


def dense_saved(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    """Bytes one dense-part block no longer keeps under the modules other than core_attn (module docstring)."""
    mods = modules(d)
    T = (b.mb * d.s).astype(float)
    t = b.t.astype(float)
    shards = _shards(mode, b)
    c = float(d.c)
    out = np.zeros_like(T)
    if "layernorm" in mods:
        out = out + dense_norms(d) * c * T * d.h / shards
    if "mla_up_proj" in mods and d.mla is not None:  # paracube's count, core recomputed: the up outputs it keeps
        m = d.mla
        up = d.heads * (m.qk_head_dim + m.qk_nope_head_dim + m.v_head_dim)
        out = out + c * T * (up if d.activations == "paracube" and core_recomputed(d) else mla_widths(d)[3]) / t
    if "mlp" in mods:
        out = out + mlp_saved(d, T, t, shards, float(d.f))
    return out


def moe_side(layout: object) -> tuple[str, ...]:
    """The pinned modules moe.py prices (the MoE blocks' and, on a model with MoE blocks, its dense blocks' mlp)."""
    return tuple(m for m in (getattr(layout, "recompute_modules", None) or ()) if m not in DENSE)


def experts_rerun(d: Dims, mods: tuple[str, ...], R: float, fe: float, bw: float) -> float:
    """Forward seconds moe_act re-runs per MoE block (the experts' activation, module docstring); 0 without it or
    under `moe` (its whole forward is re-run, moe.stage_cost)."""
    return 3 * d.c * R * fe / bw if "moe_act" in mods and MOE_REGION not in mods else 0.0


def moe_saved(d: Dims, mods: tuple[str, ...], acts: float, R: float, fe: float, shared: float, T: float,
              t: float) -> float:
    """Bytes one MoE block no longer keeps (module docstring): `acts` its MoE layer's tensors, `shared` its shared
    expert's width, T its tokens at the tensor group, t the tensor ranks."""
    gated = 2.0 if d.family == "llama" else 1.0
    shared_inner = d.c * T * (gated + 1.0) * shared / t
    if MOE_REGION in mods:
        return acts + shared_inner
    return (d.c * R * fe if "moe_act" in mods else 0.0) + (shared_inner if "shared_experts" in mods else 0.0)


def layout_shards(layout: Any) -> float:
    """The activations' split k of a layout (TensorMode.act_split)."""
    return float(np.asarray(MODES[layout.mode].act_split(np.array([layout.tensor_size]),
                                                          np.array([int(layout.sequence_parallel)])))[0])


def moe_rerun(d: Dims, layout: Any, mb: int, R: float, fe: float, bw: float) -> float:
    """Forward seconds rcm= re-runs per MoE block beyond the dense engines' (module docstring): `experts_rerun` and
    layernorm's `moe_norms` (the pre-MLP norm under fused norms), 2 c T h / k / bw each."""
    norms = moe_norms(d) * 2 * d.c * mb * d.s * d.h / layout_shards(layout) / bw
    return experts_rerun(d, moe_side(layout), R, fe, bw) + norms


def moe_rcm_saved(model: Any, d: Dims, layout: Any, mb: int, held: list[int], mods: tuple[str, ...], acts: float,
                  R: float) -> float:
    """Bytes a stage's blocks `held` (global indices) of a model with MoE blocks no longer keep per micro-batch under
    the MoE side's modules (`moe_side`): each MoE block's `moe_saved` (`acts`: its MoE layer's tensors,
    moe.stage_cost) and its `moe_norms`' outputs, each dense block's `mlp_saved` at its width (ModelSpec.ffn_hidden)."""
    moe = model.moe
    T, t = float(mb * d.s), float(layout.tensor_size)
    shards = layout_shards(layout)
    k = sum(1 for i in held if moe.is_moe_layer(i))
    per_moe = moe_saved(d, mods, acts, R, moe.expert_ffn / layout.etp, float(moe.shared_ffn), T, t) \
        + moe_norms(d) * d.c * T * d.h / shards
    dense = float(mlp_saved(d, T, t, shards, float(model.ffn_hidden))) if "mlp" in mods else 0.0  # type: ignore[arg-type]
    return k * per_moe + (len(held) - k) * dense


__all__ = ["DENSE", "block_norms", "by_module", "core_recomputed", "dense_modules", "dense_norms", "dense_saved",
           "dense_time", "experts_rerun", "layout_shards", "mla_widths", "mlp_norm_time", "mlp_saved", "modules",
           "moe_norms", "moe_rcm_saved", "moe_rerun", "moe_saved", "moe_side"]
