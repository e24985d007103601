"""Hugging Face configs of mixture-of-experts models: mixtral, qwen3_moe, deepseek_v3, gpt_oss (moe_spec.py's fields).

Defaults of each model_type's config class (transformers 4.5x: models/mixtral/configuration_mixtral.py
MixtralConfig, models/qwen3_moe/configuration_qwen3_moe.py Qwen3MoeConfig,
models/deepseek_v3/configuration_deepseek_v3.py DeepseekV3Config) fill what a file omits (None: derived).
Field mapping:
- mixtral: num_local_experts, num_experts_per_tok, intermediate_size (each expert's), softmax routing, every
  block an MoE block, no shared expert, router_aux_loss_coef.
- qwen3_moe: num_experts, num_experts_per_tok, moe_intermediate_size, decoder_sparse_step, mlp_only_layers
  (only [] or none: dense blocks at other places than the first ones are not described), head_dim, q/k norms.
  qwen2_moe is refused as qwen2 is (its q/k/v projections have biases).
- deepseek_v3: n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts (x
  moe_intermediate_size), first_k_dense_replace, moe_layer_freq, sigmoid routing, n_group / topk_group (the
  group-limited routing, MoESpec.groups / group_topk); MLA's q_lora_rank,
  kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim. The multi-token-prediction module
  (num_nextn_predict_layers) is not counted.
- gpt_oss (transformers' GptOssConfig, models/gpt_oss/configuration_gpt_oss.py; openai/gpt-oss-120b and -20b):
  num_local_experts, num_experts_per_tok, intermediate_size (each expert's), head_dim (64, not hidden / heads =
  45; a head_dim equal to hidden / heads is read as None, ModelSpec.head_size's contract, so that a small
  config the executor runs is not refused as another width), softmax routing (over the top-k router logits: the
  same cost as a softmax over all), every block an MoE block, no shared expert, router_aux_loss_coef;
  sliding_window and layer_types (hf_window.py: "WF").
  GPT-OSS's own parts (gpt_oss_spec.py): attention_bias (GptOssConfig default true: q / k / v / o biases), the
  attention sinks (every gpt_oss model has them: GptOssAttention.sinks), the router's and experts' biases (always:
  GptOssTopKRouter.bias, GptOssExperts.gate_up_proj_bias / down_proj_bias), swiglu_limit (default 7.0; alpha 1.702
  is fixed in GptOssExperts). NOT modelled (`GPT_OSS_UNMODELLED` lets its config set it): YaRN rope scaling
  (rope_scaling): other rotary frequencies and a scaled cos / sin, the same ops and FLOPs as plain rotary.
A config that names routed experts but not their sizes is refused naming the missing field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paracube.errors import check
from paracube.moe_spec import MLASpec, MoESpec

MOE_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "mixtral": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 131072, "vocab_size": 32000,
                "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None,
                "attention_dropout": 0.0, "num_local_experts": 8, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.001},
    "qwen3_moe": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24, "num_attention_heads": 32,
                  "num_key_value_heads": 4, "head_dim": None, "max_position_embeddings": 32768, "vocab_size": 151936,
                  "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": None,
                  "attention_dropout": 0.0, "num_experts": 128, "num_experts_per_tok": 8,
                  "moe_intermediate_size": 768, "decoder_sparse_step": 1, "router_aux_loss_coef": 0.001},
    "deepseek_v3": {"hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "max_position_embeddings": 4096,
                    "vocab_size": 129280, "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                    "attention_dropout": 0.0, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
                    "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128, "n_group": 8, "topk_group": 4},
    "gpt_oss": {"hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "vocab_size": 201088,
                "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "sliding_window": 128,
                "attention_dropout": 0.0, "num_local_experts": 128, "num_experts_per_tok": 4,
                "router_aux_loss_coef": 0.9, "attention_bias": True, "swiglu_limit": 7.0,
                # GptOssConfig: "sliding_attention" at even blocks, "full_attention" at odd ones, when omitted
                "layer_types": lambda n: ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]},
}
# Fields of the llama family's must-be list (hf_config._LLAMA_MUST) a gpt_oss config may set otherwise: attention_bias
# (read by moe_fields) and rope_scaling (YaRN: not modelled)
GPT_OSS_UNMODELLED = ("attention_bias", "rope_scaling")
# The field naming the routed experts, and the one sizing them, per model_type (refusal of a partial config).
_ROUTED = {"mixtral": ("num_local_experts", "intermediate_size"), "qwen3_moe": ("num_experts", "moe_intermediate_size"),
           "deepseek_v3": ("n_routed_experts", "moe_intermediate_size"),
           "gpt_oss": ("num_local_experts", "intermediate_size")}


def moe_fields(model_type: str, data: dict[str, Any], get: Callable[..., Any], path: object) -> dict[str, Any]:
    """ModelSpec keyword arguments beyond the llama family's (moe, mla, head_size, qk_norm) for an MoE config."""
    count, size = _ROUTED[model_type]
    check(count not in data or size in data or model_type in ("mixtral", "gpt_oss"),
          f"{path}: {count}={data.get(count)!r} routed experts but no {size!r} (each expert's intermediate size)")
    aux = float(get("router_aux_loss_coef", (int, float))) if "router_aux_loss_coef" in data or \
        "router_aux_loss_coef" in MOE_HF_DEFAULTS[model_type] else 0.0
    if model_type == "mixtral":
        return {"moe": MoESpec(experts=get("num_local_experts"), top_k=get("num_experts_per_tok"),
                               expert_ffn=get("intermediate_size"), aux_loss=aux)}
    if model_type == "gpt_oss":
        head_dim, limit, bias = get("head_dim"), get("swiglu_limit", (int, float)), get("attention_bias", bool)
        check(limit > 0, f"{path}: field 'swiglu_limit'={limit!r} must be a positive number (GPT-OSS: 7.0)")
        return {"moe": MoESpec(experts=get("num_local_experts"), top_k=get("num_experts_per_tok"),
                               expert_ffn=get("intermediate_size"), aux_loss=aux, expert_bias=True,
                               swiglu_limit=float(limit)),
                "head_size": None if head_dim * get("num_attention_heads") == get("hidden_size") else head_dim,
                "attention_sinks": True, "attention_bias": bias}
    if model_type == "qwen3_moe":
        only = data.get("mlp_only_layers") or []
        check(only == [], f"{path}: field 'mlp_only_layers'={only!r} is not supported (valid: [] or null)")
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        head_dim = get("head_dim", nullable=True) or hidden // heads
        return {"moe": MoESpec(experts=get("num_experts"), top_k=get("num_experts_per_tok"),
                               expert_ffn=get("moe_intermediate_size"), sparse_step=get("decoder_sparse_step"),
                               aux_loss=aux),
                "head_size": head_dim, "qk_norm": True}
    expert_ffn = get("moe_intermediate_size")
    q_lora = get("q_lora_rank", nullable=True)
    return {"moe": MoESpec(experts=get("n_routed_experts"), top_k=get("num_experts_per_tok"), expert_ffn=expert_ffn,
                           shared_ffn=(get("n_shared_experts", nullable=True) or 0) * expert_ffn, router="sigmoid",
                           first_dense=get("first_k_dense_replace"), sparse_step=get("moe_layer_freq"),
                           aux_loss=float(data.get("aux_loss_alpha", 0.0)),
                           groups=get("n_group", nullable=True) or 1, group_topk=get("topk_group", nullable=True) or 1),
            "mla": MLASpec(kv_lora_rank=get("kv_lora_rank"), qk_rope_head_dim=get("qk_rope_head_dim"),
                           qk_nope_head_dim=get("qk_nope_head_dim"), v_head_dim=get("v_head_dim"), q_lora_rank=q_lora)}
