"""Llama 4's attention in the exports (ModelSpec.rope_pattern, qk_l2_norm, attention_chunk: attention_chunk.py).

- megatron (megatron-core 0.16.1 TransformerConfig): `--no-rope-freq k` where rope_pattern is "R" x (k - 1) + "N"
  and k divides the blocks (its rule: [0] x (k - 1) + [1] repeated, 1 = skip rotary, attention.py reads it per block
  numbered from 1), else the 0 / 1 list; `--qk-l2-norm` (gpt_layer_specs' L2Norm on q and k). Megatron puts the L2
  norm in every block, NoPE blocks too, where transformers' Llama 4 skips it (Llama4TextAttention: rope blocks
  only): the weightless norm of a NoPE block's q and k differs, which no parameter or FLOP count sees.
  attention_chunk writes nothing: megatron-core 0.16.1 has no chunked attention mask in training (runtimes/
  megatron.py), so a plan whose sequences span more than one chunk is refused (`chunk_export_refusal`); up to one
  chunk, chunked attention is Megatron's plain causal attention. MoE placement, the shared expert and the sigmoid
  top-1 router are moe_flags.py's (--moe-layer-freq as a 0 / 1 list: Megatron's integer form puts MoE at blocks 0,
  k, 2k, ..., Llama 4 at k - 1, 2k - 1, ...).
  The router's score on the expert's input (MoESpec.probs_on_input, moe_flags.py's --moe-apply-probs-on-input):
  megatron-core's experts assert top-1 routing for it (experts.py): other top_k refused in one line.
- deepspeed: Megatron-DeepSpeed has neither NoPE blocks nor the L2 q / k norm nor scores on the experts' input:
  refused in one line.
- torchtitan: the model's blocks come from its --module config: nothing written; 0.3.0 has no llama4 module and no
  model building its fixed-block (chunk) mask: sequences beyond one chunk refused, as for every runtime without
  Runtime.chunked_attention (`chunk_export_refusal`: the runtime declaration says which).
"""

from __future__ import annotations

from paracube.attention_chunk import chunked_beyond, uses_rope
from paracube.plan import Plan
from paracube.runtimes import for_target
from paracube.runtimes.refusals import llama4_features
from paracube.workload import ModelSpec


def chunk_export_refusal(plan: Plan, target: str) -> str | None:
    """Why `target` cannot train the plan's chunked attention (its runtime declares no chunked_attention and the
    sequences span more than one chunk), else None."""
    model, runtime = plan.model, for_target(target)
    seq = plan.training.sequence_length(model)
    if runtime is None or runtime.chunked_attention or not chunked_beyond(model, seq):
        return None
    return (f"it has no chunked attention (attention_chunk={model.attention_chunk}) over sequences of {seq} "
            f"tokens{runtime.chunk_note}; valid: --seq <= {model.attention_chunk}")


def megatron_llama4_args(model: ModelSpec) -> list[str]:
    args: list[str] = []
    if model.rope_pattern is not None:
        k = len(model.rope_pattern)
        if model.rope_pattern == "R" * (k - 1) + "N" and model.layers % k == 0:
            args.append(f"--no-rope-freq {k}")
        else:
            skips = ",".join("0" if uses_rope(model, i) else "1" for i in range(model.layers))
            args.append(f"--no-rope-freq [{skips}]")
    if model.qk_l2_norm:
        args.append("--qk-l2-norm")
    return args


def megatron_llama4_refusal(model: ModelSpec) -> str | None:
    if model.moe is not None and model.moe.probs_on_input and model.moe.top_k > 1:
        return (f"it applies router scores on the experts' input with top-1 routing only (moe_apply_probs_on_input); "
                f"top_k={model.moe.top_k}")
    return None


def deepspeed_llama4_refusal(model: ModelSpec) -> str | None:
    parts = llama4_features(model)  # what its runtime declares it lacks (Runtime.llama4_blocks)
    return f"Megatron-DeepSpeed has no {' or '.join(parts)} (Llama 4's)" if parts else None


__all__ = ["chunk_export_refusal", "deepspeed_llama4_refusal", "megatron_llama4_args", "megatron_llama4_refusal"]
