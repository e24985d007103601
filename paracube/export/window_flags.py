"""Sliding-window attention in the exports (ModelSpec.sliding_window, window_pattern: query i sees i - w < j <= i).

- Megatron-LM core_r0.16.1 / megatron-core 0.16.1: `--window-size {w - 1},0` (TransformerConfig.window_size, keys
  (left, right) of the query; transformer/utils.get_sliding_window_causal_mask keeps i - left <= j <= i + right: w - 1
  keys before the query plus itself, the contract's w), and `--window-attn-skip-freq k`: blocks are numbered from 1
  and block n is windowed unless n % k == 0 (utils.is_layer_window_attention), i.e. window_pattern "W" x (k - 1) + "F"
  from block 0 (GPT-OSS "WF": k = 2); unset, every block is windowed. TransformerConfig also takes a list of 0 / 1 per
  block, but Megatron-LM's argument syntax for it is not installed here to check: other patterns are refused. With
  cp > 1 only the exchanges the megatron runtime declares for windows (Runtime.window_cp_comms: Transformer Engine
  has no sliding window on its p2p ring).
- torchtitan 0.3.0: its gpt_oss module builds sliding windows of 128 keys at even blocks ("WF";
  models/gpt_oss/__init__.py), its llama3 / qwen3 modules none: other windows are refused; the export says to use
  MODEL_MODULE=gpt_oss, and with cp > 1 its FlexAttention backend (the varlen one has no context parallelism).
- DeepSpeed (Megatron-DeepSpeed): no sliding-window attention: refused.
"""

from __future__ import annotations

from paracube.plan import Plan
from paracube.runtimes import get_runtime
from paracube.workload import ModelSpec

TORCHTITAN_WINDOW = (128, "WF")  # (sliding_window, window_pattern) of torchtitan 0.3.0's gpt_oss module


def windowed(model: ModelSpec) -> bool:
    """Some block of the model is windowed (a pattern of F only, or no sliding_window: full attention)."""
    return model.sliding_window is not None and "W" in (model.window_pattern or "W")


def skip_freq(model: ModelSpec) -> int | None:
    """k of --window-attn-skip-freq for the model's pattern (None: every block windowed); 0 if Megatron's integer
    form cannot express it."""
    pattern = model.window_pattern or "W"
    if set(pattern) == {"W"}:
        return None
    k = len(pattern)
    return k if k >= 2 and pattern == "W" * (k - 1) + "F" else 0


def megatron_window_refusal(plan: Plan) -> str | None:
    m, lay = plan.model, plan.layout
    if not windowed(m):
        return None
    if skip_freq(m) == 0:
        return (f"its --window-attn-skip-freq k writes window_pattern W x (k - 1) + F (WF, WWF, ...) or every block "
                f"windowed, not window_pattern={m.window_pattern!r}")
    comms = get_runtime("megatron").cp_comms_for(True)
    if lay.cp > 1 and (lay.cp_comm or "p2p") not in comms:
        return (f"Transformer Engine runs sliding-window attention with context parallelism with "
                f"cpc={'/'.join(comms)} only, not cpc={lay.cp_comm or 'p2p (unpinned)'}")
    return None


def megatron_window_args(model: ModelSpec) -> list[str]:
    """--window-size and --window-attn-skip-freq of a windowed model (module docstring); [] without windows."""
    if not windowed(model):
        return []
    k = skip_freq(model)
    return [f"--window-size {model.sliding_window - 1},0", *([f"--window-attn-skip-freq {k}"] if k else [])]


def torchtitan_window_refusal(model: ModelSpec) -> str | None:
    if not windowed(model) or (model.sliding_window, model.window_pattern) == TORCHTITAN_WINDOW:
        return None
    w, pattern = TORCHTITAN_WINDOW
    return (f"its only sliding windows are its gpt_oss module's (sliding_window={w}, window_pattern={pattern}), not "
            f"sliding_window={model.sliding_window}, window_pattern={model.window_pattern}")


def torchtitan_window_notes(plan: Plan) -> list[str]:
    if not windowed(plan.model):
        return []
    cp = " and its FlexAttention backend (the varlen backend has no context parallelism)" if plan.layout.cp > 1 else ""
    return [f"sliding-window attention: MODEL_MODULE=gpt_oss (torchtitan 0.3.0's only module with windows){cp}"]


def deepspeed_window_refusal(model: ModelSpec) -> str | None:
    if not windowed(model):
        return None
    return f"Megatron-DeepSpeed has no sliding-window attention (sliding_window={model.sliding_window})"


__all__ = ["TORCHTITAN_WINDOW", "deepspeed_window_refusal", "megatron_window_args", "megatron_window_refusal",
           "skip_freq", "torchtitan_window_notes", "torchtitan_window_refusal", "windowed"]
