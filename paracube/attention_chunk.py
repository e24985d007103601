"""Llama 4's attention as a ModelSpec describes it: chunked attention, NoPE blocks, the L2 q / k norm.

transformers 4.57 models/llama4/modeling_llama4.py (Llama4TextAttention, Llama4TextModel):
- `attention_chunk`: a rope block's query at position i sees the keys j <= i of its own chunk of
  `attention_chunk` tokens (floor(j / c) == floor(i / c); create_chunked_causal_mask); NoPE blocks attend causally
  over the whole sequence. For seq <= attention_chunk every block is plain causal attention, priced and run as such,
  exactly; longer sequences are refused (`check_chunk`): the block-diagonal mask (c(c+1)/2 score pairs per chunk)
  is not priced yet.
- `rope_pattern`: "R" (rotary positions) / "N" (no positions, NoPE) per block, repeated from block 0 (HF
  `no_rope_layers`: 1 = rope, 0 = NoPE; Llama4TextConfig's default puts NoPE at every 4th block: "RRRN"; Megatron
  `--no-rope-freq 4`). None: rope in every block. A NoPE block skips the rotary multiply (less elementwise work),
  which the cost model does not subtract.
- `qk_l2_norm`: q and k divided by their RMS over each head (Llama4TextL2Norm: no weights) in the rope blocks, when
  HF use_qk_norm (Scout: true, Maverick: false); no parameters, a few memory-bound passes over q and k not priced.
"""

from __future__ import annotations

from typing import Any

from paracube.errors import check


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


def uses_rope(spec: Any, i: int) -> bool:
    """Block `i` applies rotary positions (rope_pattern repeated from block 0; None: every block)."""
    pattern = spec.rope_pattern or "R"
    return pattern[i % len(pattern)] == "R"


def check_chunk(spec: Any, seq: int) -> None:
    """Refuse a sequence longer than the model's attention chunk: chunked attention is not priced yet."""
    chunk = spec.attention_chunk
    check(chunk is None or seq <= chunk,
          f"{spec.name}: --seq {seq} > attention_chunk_size {chunk}: chunked attention is not priced yet; "
          f"valid: --seq <= {chunk}")


__all__ = ["check_chunk", "uses_rope", "validate_attention"]
