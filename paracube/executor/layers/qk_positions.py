"""What a llama block does to its queries and keys before attention: rotary positions or none (NoPE), and Llama 4's
weightless L2 norm (ModelSpec.rope_pattern, qk_l2_norm; attention_chunk.py).

transformers 4.57 models/llama4/modeling_llama4.py (not installed here: as we read it), Llama4TextAttention.forward:
    if self.use_rope: q, k = apply_rotary_emb(q, k, freqs)       (NoPE blocks: no positions at all)
    if hasattr(self, "qk_norm"): q, k = self.qk_norm(q), self.qk_norm(k)
with qk_norm = Llama4TextL2Norm(config.rms_norm_eps) built only where use_qk_norm and use_rope (NoPE blocks have
none), and Llama4TextL2Norm over each head's d values, no weight:
    y = x / sqrt(mean_d(x^2) + eps)          (in fp32: self._norm(x.float()).type_as(x))
So the norm comes AFTER rotary. megatron-core 0.16.1's L2Norm (transformer/torch_norm.py, installed: the same
x_float * rsqrt(x_float.pow(2).mean(-1, keepdim=True) + eps), cast back) is the formula tests check against; its
gpt_layer_specs puts it on q and k of every block (export/llama4_flags.py notes the difference). eps =
ModelSpec.rms_eps (Llama 4: 1e-5). Statistics in fp32, fp64 for the fp64 equivalence copies (functional.upcast).

Applied wherever the queries and keys are rotated (executor/layers/llama.py: whole sequences, a split sequence's
gathered window of keys, a cp rank's chunks before the exchange): per token and head, so each path computes the
same values the serial model does. No parameters, no collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from paracube.attention_chunk import uses_rope
from paracube.executor.layers.functional import upcast
from paracube.workload import ModelSpec


@dataclass(frozen=True)
class QKPositions:
    """A block's treatment of q and k: rotary base `theta`, `rope` False for a NoPE block, `l2_eps` the L2 norm's
    epsilon (None: no norm)."""

    theta: float
    rope: bool = True
    l2_eps: float | None = None


def block_positions(spec: ModelSpec, index: int | None) -> QKPositions:
    """Block `index`'s QKPositions (None: block 0's rule, rotary): NoPE where rope_pattern says N; the L2 norm in the
    rope blocks of a qk_l2_norm model (module docstring)."""
    rope = index is None or uses_rope(spec, index)
    return QKPositions(spec.rope_theta, rope, spec.rms_eps if spec.qk_l2_norm and rope else None)


def l2_norm(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, statistics upcast, cast back to x's dtype."""
    xf = upcast(x)
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt()).to(x.dtype)


__all__ = ["QKPositions", "block_positions", "l2_norm"]
