"""The MoE all_to_alls of one micro-batch overlapped with another micro-batch's compute (Layout `a2ao`), priced alike by
both engines (moe_step.py, moe_program.py).

What runs (Megatron-core 0.16 --overlap-moe-expert-parallel-comm: pipeline_parallel/combined_1f1b.py,
models/common/model_chunk_schedule_plan.TransformerLayerSchedulePlan.run): in every 1F1B step the forward of one
micro-batch's chunk and the backward of another's run together, layer by layer, on two streams:
    comm stream:  combine_bwd(B) | dispatch_fwd(A) -> dispatch_bwd(B) | combine_fwd(A)
    comp stream:  attn_fwd(A)    | mlp_bwd(B) -> mlp_bwd_dw(B) -> mlp_fwd(A) | attn_bwd(B)
so the backward's all_to_alls (A_b) run beside the forward's compute (C_f) and the forward's (A_f) beside the
backward's (C_b). Priced per micro-batch of the stage, its layers taken together (a lower bound on the per-layer
pairing's time: one layer's all_to_all can hide only under its own partner's compute):
    combined = max(A_b, C_f + s A_b) + max(A_f, C_b + s A_f)
             = C + s A + x_f + x_b,   x_f = max(0, (1 - s) A_f - C_b),  x_b = max(0, (1 - s) A_b - C_f),
against C + A without it; C_f = C / 3, C_b = 2 C / 3 (the backward's share, as analytic.py splits a micro-batch;
full recomputation is refused). `s`: the compute slowed while an all_to_all runs, the share of the SMs its kernels
hold: DeepEP's 20 SMs (megatron-core 0.16 TransformerConfig.moe_deepep_num_sms = 20) of an H100 SXM's 132 (NVIDIA
H100 datasheet); NCCL's all_to_all (the alltoall dispatcher) is taken at the same share (an assumption: NCCL documents
no default channel count for it). The saving A (1 - s) - x_f - x_b >= 0: the overlap never lengthens a step's time.
Which steps: pp = 1, every micro-batch but the first's forward and the last's backward (combined_1f1b_schedule_for_
no_pipelining): a fraction (N - 1) / N; interleaved (pp > 1, v > 1), the N v - w chunk steps after the warm-up of
w = 2 (pp - rank - 1) + (v - 1) pp + 1 chunk forwards (schedules.get_pp_rank_microbatches: one more than without
it). The analytic engine takes the saving x that fraction of its N micro-batches; the event engine's `fwd` / `bwd`
lists (every micro-batch's but the first's forward and the last's backward) carry it scaled by
psi = fraction N / (N - 1).
A run hides a share eta of what these two streams hide (GemmModel.a2ao_eff, StageCost.a2ao_eff: a figure per device
generation, topologies/efficiency.A2AO_OVERLAP, fitted on the one published run with the overlap): both engines scale
the saving by it (moe_step._a2a_saved; moe_program._overlap's hidden compute). Not priced: the one extra warm-up
micro-batch's activations (memory).
"""

from __future__ import annotations

from dataclasses import dataclass

SM_SHARE = 20.0 / 132.0  # DeepEP's SMs (megatron-core moe_deepep_num_sms) of an H100 SXM's 132
BWD_SHARE = 2.0 / 3.0  # the backward's part of a micro-batch's compute (analytic.py's)


@dataclass(frozen=True)
class Combined:
    """One micro-batch's all_to_alls beside its partner's compute (module docstring): seconds."""

    a_fwd: float
    a_bwd: float
    x_fwd: float  # the forward's all_to_alls left exposed
    x_bwd: float
    slowed: float  # s (A_f + A_b): compute lost to the all_to_alls' SMs

    @property
    def saved(self) -> float:
        return self.a_fwd + self.a_bwd - self.x_fwd - self.x_bwd - self.slowed


def combined(compute: float, a_fwd: float, a_bwd: float, s: float = SM_SHARE) -> Combined:
    """The combined step's terms for a micro-batch of `compute` seconds and its routed all_to_alls (module doc)."""
    c_b = BWD_SHARE * compute
    c_f = compute - c_b
    return Combined(a_fwd, a_bwd, max(0.0, (1.0 - s) * a_fwd - c_b), max(0.0, (1.0 - s) * a_bwd - c_f),
                    s * (a_fwd + a_bwd))


def overlapped_fraction(pp: int, v: int, n_micro: int, stage: int) -> float:
    """The fraction of a stage's chunk steps run combined (module docstring)."""
    if n_micro <= 1:
        return 0.0
    if pp == 1:
        return (n_micro - 1) / n_micro
    total = n_micro * v
    warm = min(total, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
    return (total - warm) / total


def list_share(pp: int, v: int, n_micro: int, stage: int) -> float:
    """psi: the share of the saving the event engine's `fwd` / `bwd` lists carry (N - 1 micro-batches each)."""
    if n_micro <= 1:
        return 0.0
    return min(1.0, overlapped_fraction(pp, v, n_micro, stage) * n_micro / (n_micro - 1))


__all__ = ["BWD_SHARE", "SM_SHARE", "Combined", "combined", "list_share", "overlapped_fraction"]
