"""Hugging Face `llama4` configs (Llama 4 Scout, Maverick): the language model of a Llama4Config's `text_config`
(model_type llama4_text), or a bare `llama4_text` config.

Read as transformers 4.57 reads them (models/llama4/configuration_llama4.py Llama4TextConfig, Llama4VisionConfig;
modeling_llama4.py): a field the file omits takes `LLAMA4_TEXT_DEFAULTS` (Llama4TextConfig's, which are Scout's).
Field mapping (ModelSpec / MoESpec):
- hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim (None where hidden / heads),
  vocab_size, rms_norm_eps, rope_theta, tie_word_embeddings, attention_dropout, router_aux_loss_coef;
- intermediate_size_mlp: the dense blocks' SwiGLU width (ModelSpec.ffn_hidden); intermediate_size: each routed
  expert's and the one shared expert's width (Llama4TextMoe: experts + shared_expert, no gate on the shared one);
- num_local_experts, num_experts_per_tok; the router: sigmoid of the top-k logits, unnormalized (Llama4Router: router
  "sigmoid"), scaling each expert's input (Llama4TextMoe's routed_in: MoESpec.probs_on_input);
- moe_layers (default: range(interleave_moe_layer_step - 1, layers, step): blocks step-1, 2 step-1, ...): MoE at
  block i when (i + 1) % step == 0, which is MoESpec.sparse_step = step with first_dense 0; a moe_layers list of
  another shape is refused in one line;
- attention_chunk_size -> attention_chunk; no_rope_layers (default: NoPE every no_rope_layer_interval-th block,
  1-based) -> rope_pattern; use_qk_norm -> qk_l2_norm (attention_chunk.py);
- seq_len: min(max_position_embeddings, attention_chunk_size): Scout's max_position_embeddings is 10,485,760; one
  chunk is Llama 4's short-context training length; --seq chooses another (longer: chunked attention priced,
  attention_chunk.py).
rope_scaling (Scout: "llama3") is read and not modelled: other rotary frequencies, the same ops and FLOPs.
NOT modelled, with its size:
- the vision tower and projector (`vision_parameters`; Scout's and Maverick's vision_config: 34 ViT blocks of 1408,
  the pixel-shuffle MLP and the 4096 x 5120 projector: 871,932,416 parameters, 0.80% of Scout's 108.64B and 0.22% of
  Maverick's 401.58B with them): paracube plans the language model on text tokens;
- the L2 q / k norm (no parameters; a few memory-bound passes over q and k per rope block);
- NoPE blocks skip the rotary multiply (less elementwise work, not subtracted);
- attention temperature tuning (attn_temperature_tuning: q scaled by a per-position factor in NoPE blocks, one
  elementwise multiply);
- the router has no bias: MoESpec counts DeepSeek's score-correction bias (experts) for sigmoid routing, 16 x 48 =
  768 (Scout) and 128 x 24 = 3,072 (Maverick) parameters too many (< 1e-8 of either).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paracube.errors import check
from paracube.moe_spec import MoESpec

LLAMA4_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 500000,
    "attention_dropout": 0.0, "num_experts_per_tok": 1, "num_local_experts": 16, "moe_layers": None,
    "interleave_moe_layer_step": 1, "use_qk_norm": True, "router_aux_loss_coef": 0.001, "rope_scaling": None,
    "no_rope_layers": None, "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
}
# Llama4VisionConfig's defaults (the vision tower is counted, not planned: vision_parameters).
LLAMA4_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "num_hidden_layers": 34, "num_channels": 3, "intermediate_size": 5632,
    "vision_output_dim": 7680, "image_size": 448, "patch_size": 14, "projector_input_dim": 4096,
    "projector_output_dim": 4096, "multi_modal_projector_bias": False,
}
LLAMA4_TYPES = ("llama4", "llama4_text")


def text_config(data: dict[str, Any], path: object) -> dict[str, Any]:
    """The language model's fields: a llama4 config's text_config ({} when omitted: all defaults), else `data`."""
    if data.get("model_type") != "llama4":
        return data
    text = data.get("text_config") or {}
    check(isinstance(text, dict), f"{path}: field 'text_config' must be a JSON object (a llama4_text config)")
    check(text.get("model_type", "llama4_text") == "llama4_text",
          f"{path}: text_config has model_type {text.get('model_type')!r}; valid: 'llama4_text'")
    return text


def vision_parameters(data: dict[str, Any], text_hidden: int) -> int:
    """Parameters of a llama4 config's vision tower, pixel-shuffle MLP and projector (modeling_llama4.py:
    Llama4VisionModel, Llama4MultiModalProjector), its vision_config's fields over LLAMA4_VISION_DEFAULTS."""
    v = {**LLAMA4_VISION_DEFAULTS, **(data.get("vision_config") or {})}
    h, f, n = v["hidden_size"], v["intermediate_size"], (v["image_size"] // v["patch_size"]) ** 2 + 1
    block = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h  # q, k, v, o and fc1, fc2 with biases; 2 LN
    embed = v["num_channels"] * v["patch_size"] ** 2 * h + h + n * h + 2 * 2 * h  # unfold linear, cls, positions
    adapter = f * v["projector_input_dim"] + v["projector_output_dim"] ** 2  # Llama4VisionMLP2 fc1, fc2
    projector = v["vision_output_dim"] * text_hidden + (text_hidden if v["multi_modal_projector_bias"] else 0)
    return v["num_hidden_layers"] * block + embed + adapter + projector


def _pattern(bits: list[int]) -> str:
    """The shortest period of a per-block pattern, repeated from block 0."""
    for n in range(1, len(bits) + 1):
        if all(bits[i] == bits[i % n] for i in range(len(bits))):
            return "".join("R" if b else "N" for b in bits[:n])
    return ""


def llama4_fields(data: dict[str, Any], get: Callable[..., Any], path: object) -> dict[str, Any]:
    """ModelSpec keyword arguments beyond the llama family's for a llama4_text config (module docstring)."""
    layers, step = get("num_hidden_layers"), get("interleave_moe_layer_step")
    check(step > 0, f"{path}: field 'interleave_moe_layer_step'={step!r} must be a positive integer")
    moe = MoESpec(experts=get("num_local_experts"), top_k=get("num_experts_per_tok"),
                  expert_ffn=get("intermediate_size"), shared_ffn=get("intermediate_size"), router="sigmoid",
                  sparse_step=step, aux_loss=float(get("router_aux_loss_coef", (int, float))), probs_on_input=True)
    listed = data.get("moe_layers")
    check(listed is None or listed == [i for i in range(layers) if moe.is_moe_layer(i)],
          f"{path}: field 'moe_layers'={listed!r} is not supported; valid: null or every k-th block "
          f"[k-1, 2k-1, ...] (k = interleave_moe_layer_step = {step})")
    interval = get("no_rope_layer_interval")
    check(interval > 0, f"{path}: field 'no_rope_layer_interval'={interval!r} must be a positive integer (NoPE every "
          "that many blocks)")
    bits = data.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    check(isinstance(bits, list) and len(bits) == layers and all(b in (0, 1) for b in bits),
          f"{path}: field 'no_rope_layers'={bits!r} must be a list of 1 (rope) / 0 (NoPE), one per block "
          f"(num_hidden_layers={layers})")
    rope = _pattern(bits)
    types = data.get("layer_types")
    derived = ["chunked_attention" if b else "full_attention" for b in bits]
    check(types is None or types == derived, f"{path}: field 'layer_types' other than no_rope_layers' "
          f"(chunked_attention at rope blocks, full_attention at NoPE blocks) is not supported; valid: null")
    chunk = get("attention_chunk_size", nullable=True)
    check(chunk is None or chunk > 0, f"{path}: field 'attention_chunk_size'={chunk!r} must be a positive integer "
          "(tokens per chunk) or null")
    hidden, heads, head_dim = get("hidden_size"), get("num_attention_heads"), get("head_dim", nullable=True)
    check(heads > 0, f"{path}: field 'num_attention_heads'={heads!r} must be a positive integer")
    return {"moe": moe, "ffn_hidden": get("intermediate_size_mlp"),
            "head_size": None if head_dim in (None, hidden // heads) and hidden % heads == 0 else head_dim,
            "attention_chunk": chunk, "rope_pattern": None if rope == "R" else rope,
            "qk_l2_norm": get("use_qk_norm", bool) and "R" in rope,
            "seq_len": min(get("max_position_embeddings"), chunk or get("max_position_embeddings"))}


__all__ = ["LLAMA4_TEXT_DEFAULTS", "LLAMA4_TYPES", "LLAMA4_VISION_DEFAULTS", "llama4_fields", "text_config",
           "vision_parameters"]
