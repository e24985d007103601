"""A ModelSpec from a Hugging Face `config.json` of model_type gpt2, llama, mistral, a MoE type (hf_moe.py) or Llama 4's
(llama4 / llama4_text: hf_llama4.py, the language model of its text_config),
read as transformers reads it: a field the file omits takes the default of that model_type's config class
(`HF_DEFAULTS`); configs of look-alike models that are not the gpt or llama family are refused with the reason.
Sliding-window attention (sliding_window, use_sliding_window, layer_types) is read by hf_window.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paracube.errors import ParacubeError, check
from paracube.hf_llama4 import LLAMA4_TEXT_DEFAULTS, LLAMA4_TYPES, llama4_fields, text_config
from paracube.hf_moe import GPT_OSS_UNMODELLED, MOE_HF_DEFAULTS, moe_fields
from paracube.hf_window import window_fields
from paracube.workload import ModelSpec


def config_name(path: Path, name_or_path: object = None) -> str:
    """The name a config.json model shows in headers: its `_name_or_path` (last part), else the file's
    name (`llama-7b.json` -> llama-7b; `.../llama-7b/config.json` -> llama-7b)."""
    if isinstance(name_or_path, str) and name_or_path.strip().strip("/"):
        return name_or_path.strip().rstrip("/").split("/")[-1]
    if path.name == "config.json":
        parent = path.resolve().parent.name
        return parent or "config"
    return path.stem


# What transformers fills in for a field a config.json omits: the defaults of each model_type's config
# class (transformers 4.x: models/gpt2/configuration_gpt2.py GPT2Config, models/llama/configuration_llama.py
# LlamaConfig, models/mistral/configuration_mistral.py MistralConfig). None: derived (n_inner -> 4 n_embd,
# num_key_value_heads -> num_attention_heads).
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "n_positions": 1024,
             "vocab_size": 50257, "tie_word_embeddings": True, "resid_pdrop": 0.1, "attn_pdrop": 0.1,
             "embd_pdrop": 0.1},
    "llama": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": None, "max_position_embeddings": 2048, "vocab_size": 32000,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "attention_dropout": 0.0},
    "mistral": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 131072, "vocab_size": 32000,
                "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 4096,
                "attention_dropout": 0.0},
    **MOE_HF_DEFAULTS,  # mixtral, qwen3_moe, deepseek_v3, gpt_oss (hf_moe.py)
    **{t: LLAMA4_TEXT_DEFAULTS for t in LLAMA4_TYPES},  # llama4's text_config, llama4_text (hf_llama4.py)
}
# model_type of each `architectures` name, for configs that omit model_type.
_ARCHITECTURES = {"GPT2LMHeadModel": "gpt2", "GPT2Model": "gpt2", "LlamaForCausalLM": "llama",
                  "LlamaModel": "llama", "MistralForCausalLM": "mistral", "MistralModel": "mistral",
                  "MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3_moe",
                  "DeepseekV3ForCausalLM": "deepseek_v3", "GptOssForCausalLM": "gpt_oss",
                  "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4_text"}
# Decoder configs that look alike but are other models (why they are not the gpt or llama family).
_OTHER_MODELS = {"qwen2": "its q/k/v projections have biases",
                 "qwen2_moe": "its q/k/v projections have biases", "gpt_neox": "parallel attention, partial rotary",
                 "opt": "ReLU MLP, offset learned positions"}
# Keys of llama/mistral configs that would make a different model than the llama family (value allowed).
_LLAMA_MUST = {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "rope_scaling": None}


def _hf_model_type(data: dict[str, Any], path: Path) -> str:
    model_type = data.get("model_type")
    if model_type is None:
        archs = data.get("architectures") or []
        check(isinstance(archs, list) and all(isinstance(a, str) for a in archs),
              f"{path}: field 'architectures' must be a list of names, got {archs!r}")
        model_type = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
        check(model_type is not None, f"{path}: no model_type and no known architectures ({archs}); "
              f"supported model_type: {', '.join(HF_DEFAULTS)}")
    why = f" ({_OTHER_MODELS[model_type]})" if model_type in _OTHER_MODELS else ""
    check(model_type in HF_DEFAULTS, f"{path}: model_type {model_type!r} is not supported{why}; "
          f"supported: {', '.join(HF_DEFAULTS)}")
    return str(model_type)


def from_hf_config(path: Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json`, omitted fields taking HF_DEFAULTS of its model_type."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ParacubeError(f"cannot read model config {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ParacubeError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    check(isinstance(data, dict), f"{path}: expected a JSON object with model hyper-parameters")
    model_type = _hf_model_type(data, path)
    defaults = HF_DEFAULTS[model_type]
    name = config_name(path, data.get("_name_or_path"))
    if model_type in LLAMA4_TYPES:  # the language model: a llama4 config's text_config (hf_llama4.py)
        data = text_config(data, path)

    def get(key: str, kind: type | tuple[type, ...] = int, nullable: bool = False) -> Any:
        """The file's value, else the class default; null only where transformers derives the value."""
        value = data[key] if key in data else defaults.get(key)
        ok = isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool)
        check(ok or (value is None and (nullable or defaults.get(key, 0) is None)),
              f"{path}: field {key!r} must be {_KIND_NAMES[kind]}, got {value!r}")
        return value

    if model_type == "gpt2":
        hidden = get("n_embd")
        return ModelSpec(name=str(name), layers=get("n_layer"), hidden=hidden, heads=get("n_head"),
                         ffn_hidden=get("n_inner") or 4 * hidden, vocab=get("vocab_size"),
                         seq_len=get("n_positions"), family="gpt", tied_embeddings=get("tie_word_embeddings", bool),
                         dropout=float(get("resid_pdrop", (int, float))),
                         attention_dropout=float(get("attn_pdrop", (int, float))),
                         embedding_dropout=float(get("embd_pdrop", (int, float))))
    for key, allowed in _LLAMA_MUST.items():
        unmodelled = (model_type == "gpt_oss" and key in GPT_OSS_UNMODELLED  # hf_moe.py: read there, or left out
                      or model_type in LLAMA4_TYPES and key == "rope_scaling")  # hf_llama4.py: the same FLOPs
        check(unmodelled or data.get(key, allowed) == allowed,
              f"{path}: field {key!r}={data.get(key)!r} is not supported by the llama family (valid: {allowed!r})")
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    extra = moe_fields(model_type, data, get, path) if model_type in MOE_HF_DEFAULTS else \
        llama4_fields(data, get, path) if model_type in LLAMA4_TYPES else {}
    check(data.get("head_dim") in (None, hidden // max(heads or 1, 1)) or "head_size" in extra,
          f"{path}: field 'head_dim'={data.get('head_dim')!r} must be hidden_size / num_attention_heads")
    seq_len, layers = extra.pop("seq_len", None) or get("max_position_embeddings"), get("num_hidden_layers")
    extra.update(window_fields(data, defaults, get, path, seq_len, layers))  # sliding windows (hf_window.py)
    return ModelSpec(name=str(name), layers=layers, hidden=hidden, heads=heads,
                     ffn_hidden=extra.pop("ffn_hidden", None) or get("intermediate_size"), vocab=get("vocab_size"),
                     seq_len=seq_len,
                     family="llama", kv_heads=get("num_key_value_heads") or heads,
                     tied_embeddings=get("tie_word_embeddings", bool), rms_eps=float(get("rms_norm_eps", (int, float))),
                     rope_theta=float(get("rope_theta", (int, float))),
                     attention_dropout=float(get("attention_dropout", (int, float))), **extra)


_KIND_NAMES: dict[Any, str] = {int: "an integer", bool: "true or false", (int, float): "a number"}


__all__ = ["HF_DEFAULTS", "config_name", "from_hf_config"]
