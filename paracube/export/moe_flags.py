"""The MoE and attention flags of each export target (docs/exports.md, "Added 2026-12"), for models with MoE
blocks, MLA or a head width other than hidden / heads; nothing for a dense model.

- megatron (Megatron-core TransformerConfig / MLATransformerConfig): --num-experts, --moe-router-topk,
  --expert-model-parallel-size, --expert-tensor-parallel-size, --moe-ffn-hidden-size,
  --moe-shared-expert-intermediate-size, --moe-layer-freq (a 0/1 list where the first blocks are dense),
  --moe-router-score-function, --moe-apply-probs-on-input (MoESpec.probs_on_input; Megatron runs it with top-1
  routing only: export/llama4_flags.py refuses top_k > 1),
  --moe-router-load-balancing-type aux_loss with --moe-aux-loss-coeff,
  --moe-token-dispatcher-type alltoall, or flex with --moe-flex-dispatcher-backend deepep (DeepEP installed) where
  the plan's runtime dispatches so and the model is dropless (Runtime.moe_dispatch, moe_dispatch.dispatch_of: the
  dispatch the plan was priced with; a plan made for paracube exports alltoall), --moe-router-num-groups /
  --moe-router-group-topk (group-limited routing, MoESpec.groups), --moe-grouped-gemm,
  --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity (dropless when unset),
  --overlap-moe-expert-parallel-comm for the layout's `a2ao`
  (its combined 1F1B schedule; --delay-wgrad-compute is not written: not priced apart); MLA:
  --multi-latent-attention, --q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim;
  --kv-channels and --qk-layernorm (Qwen3).
  The same names serve Megatron-DeepSpeed's export where DeepSpeed-MoE has them: --num-experts, --topk,
  --moe-expert-parallel-size (it has no expert tensor parallelism: the runtime refuses etp > 1), and its own
  --moe-train-capacity-factor for a capacity factor, else --disable-moe-token-dropping (Megatron-DeepSpeed's
  arguments.py; its default drops at a capacity factor of 1.0, which a dropless plan was not priced with).
- torchtitan: --parallelism.expert_parallel_degree (the model's experts come from its --module config); it runs
  MoE dropless only, so a plan with a capacity factor is refused (Runtime.moe_capacity "none").
"""

from __future__ import annotations

from paracube.cost_models.moe_dispatch import dispatch_of
from paracube.plan import Plan
from paracube.runtimes import get_runtime


def megatron_moe_args(plan: Plan) -> list[str]:
    m, lay = plan.model, plan.layout
    args: list[str] = []
    if m.moe is not None:
        e = m.moe
        deepep = dispatch_of(e, get_runtime(plan.runtime).moe_dispatch).dedup
        args += [f"--num-experts {e.experts}", f"--moe-router-topk {e.top_k}",
                 f"--expert-model-parallel-size {lay.ep}", f"--expert-tensor-parallel-size {lay.etp}",
                 f"--moe-ffn-hidden-size {e.expert_ffn}", f"--moe-router-score-function {e.router}",
                 "--moe-router-load-balancing-type aux_loss", f"--moe-aux-loss-coeff {e.aux_loss:g}",
                 *(["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]
                   if deepep else ["--moe-token-dispatcher-type alltoall"]),
                 "--moe-grouped-gemm"]
        if e.groups > 1:
            args += [f"--moe-router-num-groups {e.groups}", f"--moe-router-group-topk {e.group_topk}"]
        if e.shared_ffn:
            args.append(f"--moe-shared-expert-intermediate-size {e.shared_ffn}")
        if e.first_dense or e.sparse_step > 1:
            pattern = ",".join("1" if e.is_moe_layer(i) else "0" for i in range(m.layers))
            args.append(f"--moe-layer-freq [{pattern}]")
        if e.probs_on_input:
            args.append("--moe-apply-probs-on-input")
        if e.capacity_factor is not None:  # drop and pad, as the megatron runtime prices it (Runtime.moe_capacity)
            args += [f"--moe-expert-capacity-factor {e.capacity_factor:g}", "--moe-pad-expert-input-to-capacity"]
        if lay.a2ao:
            args.append("--overlap-moe-expert-parallel-comm")
    if m.mla is not None:
        a = m.mla
        args += ["--multi-latent-attention", f"--kv-lora-rank {a.kv_lora_rank}", f"--qk-head-dim {a.qk_nope_head_dim}",
                 f"--qk-pos-emb-head-dim {a.qk_rope_head_dim}", f"--v-head-dim {a.v_head_dim}"]
        if a.q_lora_rank:
            args.append(f"--q-lora-rank {a.q_lora_rank}")
    elif m.head_size is not None:
        args.append(f"--kv-channels {m.head_size}")
    if m.qk_norm:
        args.append("--qk-layernorm")
    return args


def deepspeed_moe_args(plan: Plan) -> list[str]:
    m, lay = plan.model, plan.layout
    if m.moe is None:
        return []
    # Megatron-DeepSpeed drops tokens at --moe-train-capacity-factor (default 1.0) unless told not to: the priced
    # capacity factor, or dropless (its gate then sizes the capacity from the largest expert count)
    cap = m.moe.capacity_factor
    drop = [f"--moe-train-capacity-factor {cap:g}"] if cap is not None else ["--disable-moe-token-dropping"]
    return [f"--num-experts {m.moe.experts}", f"--topk {m.moe.top_k}", f"--moe-expert-parallel-size {lay.ep}", *drop]


def torchtitan_moe_flags(plan: Plan) -> list[str]:
    return [f"--parallelism.expert_parallel_degree {plan.layout.ep}"] if plan.model.moe is not None else []


__all__ = ["deepspeed_moe_args", "megatron_moe_args", "torchtitan_moe_flags"]
