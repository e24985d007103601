"""Sliding-window attention read from a Hugging Face config (ModelSpec.sliding_window / window_pattern).

transformers' fields: `sliding_window` (MistralConfig: 4096 by default, Mistral-7B-v0.1's; MixtralConfig and
Qwen3MoeConfig: None; GptOssConfig: 128), `use_sliding_window` (Qwen's switch: false turns the window off) and
`layer_types`, one of "sliding_attention" / "full_attention" per block (GptOssConfig builds "sliding_attention" at
even blocks, "full_attention" at odd ones, when a file omits it; Gemma 2/3 likewise; Qwen's configs, without it and
with use_sliding_window true, window the blocks from `max_window_layers` on, as transformers' Qwen3MoeConfig derives
its layer_types). A window no shorter than
max_position_embeddings never masks a key: read as None (full causal attention). `layer_types` becomes
`window_pattern`, its shortest repeating period from block 0 ("W" windowed, "F" full; GPT-OSS: "WF"); a period
of all "W" is None (every block windowed), all "F" no window at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paracube.errors import check

LAYER_TYPES = {"sliding_attention": "W", "full_attention": "F"}  # HF layer_types value -> window_pattern letter


def shortest_period(pattern: str) -> str:
    """The shortest prefix p of `pattern` with pattern[i] == p[i % len(p)] for every i ("WFWF" -> "WF")."""
    for n in range(1, len(pattern) + 1):
        if all(pattern[i] == pattern[i % n] for i in range(len(pattern))):
            return pattern[:n]
    return pattern


def pattern_of(layer_types: object, layers: int, path: object) -> str:
    """`layer_types` as a string of W / F, one per block; one line naming the field and the valid values if bad."""
    valid = " / ".join(repr(k) for k in LAYER_TYPES)
    check(isinstance(layer_types, list) and all(t in LAYER_TYPES for t in layer_types),
          f"{path}: field 'layer_types'={layer_types!r} must be a list of {valid}, one per block")
    assert isinstance(layer_types, list)
    check(len(layer_types) == layers,
          f"{path}: field 'layer_types' has {len(layer_types)} entries; valid: one per block "
          f"(num_hidden_layers={layers})")
    return "".join(LAYER_TYPES[t] for t in layer_types)


def window_fields(data: dict[str, Any], defaults: dict[str, Any], get: Callable[..., Any], path: object,
                  seq_len: int, layers: int) -> dict[str, Any]:
    """ModelSpec keyword arguments sliding_window / window_pattern of a config (module docstring); {} without."""
    if "sliding_window" not in defaults and "sliding_window" not in data:
        return {}
    if data.get("use_sliding_window") is False:
        return {}
    window = get("sliding_window", nullable=True)
    check(window is None or window > 0,
          f"{path}: field 'sliding_window'={window!r} must be a positive integer (keys a query sees) or null")
    types = data["layer_types"] if "layer_types" in data else defaults.get("layer_types")
    if callable(types):  # the config class derives it from the block count (GptOssConfig)
        types = types(layers)
    if types is None and data.get("use_sliding_window") is True:  # Qwen's switch: windows from max_window_layers on
        first = data.get("max_window_layers")
        check(isinstance(first, int) and not isinstance(first, bool) and 0 <= first <= layers,
              f"{path}: field 'max_window_layers'={first!r} must be a block index 0..{layers} with "
              "use_sliding_window=true (the blocks from it on are windowed)")
        types = ["full_attention"] * first + ["sliding_attention"] * (layers - first)
    pattern = shortest_period(pattern_of(types, layers, path)) if types is not None else "W"
    if window is None or window >= seq_len or "W" not in pattern:
        return {}
    return {"sliding_window": window, "window_pattern": None if set(pattern) == {"W"} else pattern}


__all__ = ["LAYER_TYPES", "pattern_of", "shortest_period", "window_fields"]
