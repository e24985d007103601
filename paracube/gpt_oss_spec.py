"""GPT-OSS's attention and experts as a ModelSpec / MoESpec describes them (openai/gpt-oss-120b, -20b).

Sources: transformers' models/gpt_oss/modeling_gpt_oss.py (GptOssAttention, GptOssExperts, GptOssTopKRouter) and
torchtitan 0.3.0's models/gpt_oss (model.py apply_attention_sink_rescale, moe.py swiglu), which tests/test_gpt_oss.py
runs against paracube's executor on identical weights.
- `attention_sinks` (ModelSpec): one learned logit per query head per block, s_h. Each softmax row of head h gets one
  more column holding s_h (no key, no value: a sink whose probability is dropped after the softmax):
      p_ij = exp(z_ij - m_i) / (exp(s_h - m_i) + sum_j' exp(z_ij' - m_i)),   out_i = sum_j p_ij v_j
  (z the scaled, masked scores; m_i = max(s_h, max_j z_ij)). Equivalently out = softmax-attention x sigmoid(lse -
  s_h), lse the row's log-sum-exp over its keys (torchtitan's apply_attention_sink_rescale). Gradient: ds_h = -sum
  over the head's rows of p_sink,i x sum_j p_ij g_ij' (g' = dL/dp), which the executor gets from autograd.
  Megatron-core: TransformerConfig.softmax_type = "learnable".
- `attention_bias` (ModelSpec): q / k / v and o projections with biases (HF attention_bias; GPT-OSS true).
- `expert_bias` (MoESpec): the router's logits x W_r + b_r, and every expert's gate+up (b1 [2 f_e]) and down (b2
  [h]) biases: y = (swiglu(x W1 + b1)) W2 + b2 (GptOssExperts; torchtitan GptOssGroupedExperts mlp1_bias / mlp2_bias).
- `swiglu_limit` L, `swiglu_alpha` a (MoESpec): the clamped SwiGLU on (gate, up) interleaved columns (GPT-OSS's
  checkpoint interleaves them too: gate_up_proj[..., ::2] / [..., 1::2], as paracube's fused gate+up does):
      g = min(gate, L), u = clamp(up, -L, L), out = (u + 1) x g x sigmoid(a g)
  (HF swiglu_limit 7.0, alpha 1.702; torchtitan moe.swiglu). None: the plain SwiGLU silu(gate) x up.
Routing (softmax over the top-k router logits) is paracube's softmax routing normalized over the top-k: the same
weights exactly (exp(z_e) / sum over the top-k of exp(z_e')).
Not modelled: YaRN rope scaling (HF rope_scaling; other rotary frequencies and a scaled cos / sin, the same FLOPs).
Priced (both engines): every bias and sink as a parameter (memory, gradient buckets and their reduction, optimizer
state and step; cost_models/dims.py, moe.py, moe_traffic.py) and the sinks' per-block gradient all_reduce
(modes/sinks.py). Not priced apart, as work: the sink column (one more score per softmax row of s keys: 1 / s more
of the core's elementwise work, inside the attention kernel), the bias adds (GEMM epilogues) and the clamp (two
clamps and an add on the tensors the SwiGLU pass already reads and writes: no more bytes, moe_passes.py prices
the pass by its bytes).
"""

from __future__ import annotations

from typing import Any

from paracube.errors import check

SWIGLU_ALPHA = 1.702  # GptOssExperts.alpha; torchtitan moe.swiglu's default
SWIGLU_LIMIT = 7.0  # GptOssConfig.swiglu_limit's default


def validate_experts(moe: Any, where: str) -> None:
    """One line per bad GPT-OSS field of MoESpec `moe` (called from its validate)."""
    check(isinstance(moe.expert_bias, bool), f"{where}: expert_bias={moe.expert_bias!r} must be true or false")
    limit = moe.swiglu_limit
    check(limit is None or (isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0),
          f"{where}: swiglu_limit={limit!r} must be a positive number (GPT-OSS: 7.0) or null (plain SwiGLU)")
    alpha = moe.swiglu_alpha
    check(isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha > 0,
          f"{where}: swiglu_alpha={alpha!r} must be a positive number (GPT-OSS: {SWIGLU_ALPHA})")


def validate_attention(spec: Any) -> None:
    """One line per bad GPT-OSS attention field of ModelSpec `spec` (called from its __post_init__)."""
    where = f"model {spec.name!r}"
    for attr in ("attention_sinks", "attention_bias"):
        value = getattr(spec, attr)
        check(isinstance(value, bool), f"{where}: {attr}={value!r} must be true or false")
        check(not value or spec.family == "llama",
              f"{where}: {attr}=true needs family llama (GPT-OSS's attention); valid for family "
              f"{spec.family!r}: false")
        check(not (value and spec.mla is not None),
              f"{where}: {attr}=true with multi-head latent attention is not supported; valid with mla: false")


def sink_parameters(spec: Any) -> int:
    """Attention sinks and biases of one block: heads (sinks) + q + 2 kv + h (q / k / v / o biases)."""
    q, kv = spec.heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return (spec.heads if spec.attention_sinks else 0) + (q + 2 * kv + spec.hidden if spec.attention_bias else 0)


def plan_defaults(moe: dict[str, Any]) -> dict[str, Any]:
    """An MoE spec's dict without the GPT-OSS fields at their defaults (plans of other models read as before)."""
    defaults = {"expert_bias": False, "swiglu_limit": None, "swiglu_alpha": SWIGLU_ALPHA}
    return {k: v for k, v in moe.items() if k not in defaults or v != defaults[k]}


__all__ = ["SWIGLU_ALPHA", "SWIGLU_LIMIT", "plan_defaults", "sink_parameters", "validate_attention",
           "validate_experts"]
