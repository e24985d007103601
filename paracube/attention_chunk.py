"""Llama 4's attention as a ModelSpec describes it: chunked attention, NoPE blocks, the L2 q / k norm.

transformers 4.57 models/llama4/modeling_llama4.py (Llama4TextAttention, Llama4TextModel):
- `attention_chunk`: a rope block's query at position i sees the keys j <= i of its own chunk of
  `attention_chunk` tokens (floor(j / c) == floor(i / c); create_chunked_causal_mask); NoPE blocks attend causally
  over the whole sequence. ModelSpec.attention_window(i) gives a chunked block's mask as `Chunk(c)`: an int (the
  chunk's tokens) whose type says "chunks, not a sliding window", so the one mask helper of the executor
  (executor/layers/attention_mask.py) and the one tile-share of the cost model (cost_models/attention_window.py,
  Dims.chunked) serve both. For seq <= attention_chunk every block is plain causal attention, priced and run as
  such, bit for bit; longer sequences are priced (c (c + 1) / 2 score pairs per whole chunk) and run by the runtimes
  that declare `chunked_attention` (runtimes/base.py; `chunk_refusal` names the others in one line).
  A model has a sliding window or an attention chunk, not both (one mask per block).
- `rope_pattern`: "R" (rotary positions) / "N" (no positions, NoPE) per block, repeated from block 0 (HF
  `no_rope_layers`: 1 = rope, 0 = NoPE; Llama4TextConfig's default puts NoPE at every 4th block: "RRRN"; Megatron
  `--no-rope-freq 4`). None: rope in every block. A NoPE block skips the rotary multiply (less elementwise work),
  which the cost model does not subtract.
- `qk_l2_norm`: q and k divided by their RMS over each head (Llama4TextL2Norm: no weights) in the rope blocks, when
  HF use_qk_norm (Scout: true, Maverick: false); no parameters, a few memory-bound passes over q and k not priced.
The executor runs all three (NoPE and the norm, after rotary: executor/layers/qk_positions.py) and the router's
score on the experts' input (MoESpec.probs_on_input: executor/model/moe.py).
"""

from __future__ import annotations

from typing import Any

from paracube.errors import check


class Chunk(int):
    """A chunked block's mask: the tokens per chunk (module docstring). An int, so code that only passes a block's
    mask along (typed int | None) carries it unchanged; the mask helpers read its type."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Chunk({int(self)})"


def validate_attention(spec: Any) -> None:
    """One line per bad Llama 4 attention field of ModelSpec `spec` (called from its __post_init__)."""
    where = f"model {spec.name!r}"
    chunk = spec.attention_chunk
    check(chunk is None or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0),
          f"{where}: attention_chunk={chunk!r} must be a positive integer (tokens per chunk) or null")
    pattern = spec.rope_pattern
    check(pattern is None or (isinstance(pattern, str) and pattern != "" and set(pattern) <= {"R", "N"}),
          f"{where}: rope_pattern={pattern!r} must be a non-empty string of R (rotary block) and N (NoPE block), "
          "or null (rotary in every block)")
    check(isinstance(spec.qk_l2_norm, bool), f"{where}: qk_l2_norm={spec.qk_l2_norm!r} must be true or false")
    check((pattern is None and not spec.qk_l2_norm) or (spec.family == "llama" and spec.mla is None),
          f"{where}: rope_pattern={pattern!r}, qk_l2_norm={spec.qk_l2_norm} need family llama without mla (rotary "
          f"grouped-query attention), got family {spec.family!r}{' with mla' if spec.mla is not None else ''}")
    check(chunk is None or spec.sliding_window is None,
          f"{where}: attention_chunk={chunk} with sliding_window={spec.sliding_window}: one mask per block; valid: "
          "one of them null")


def uses_rope(spec: Any, i: int) -> bool:
    """Block `i` applies rotary positions (rope_pattern repeated from block 0; None: every block)."""
    pattern = spec.rope_pattern or "R"
    return pattern[i % len(pattern)] == "R"


def chunked_beyond(spec: Any, seq: int) -> bool:
    """Sequences of `seq` tokens span more than one of the model's attention chunks (the mask hides keys)."""
    return spec.attention_chunk is not None and seq > spec.attention_chunk


def chunk_refusal(spec: Any, seq: int, runtime: Any) -> str | None:
    """Why `runtime` (runtimes/base.Runtime) cannot train `spec` on sequences of `seq` tokens for its chunked
    attention (one line), else None: a runtime without `chunked_attention` trains sequences up to one chunk only."""
    if not chunked_beyond(spec, seq) or runtime.chunked_attention:
        return None
    return (f"runtime {runtime.name} ({runtime.title}) does not train chunked attention (attention_chunk="
            f"{spec.attention_chunk}) over --seq {seq}{runtime.chunk_note}; valid: --seq <= {spec.attention_chunk}, "
            "or --runtime paracube")


__all__ = ["Chunk", "chunk_refusal", "chunked_beyond", "uses_rope", "validate_attention"]
