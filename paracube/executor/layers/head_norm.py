"""Per-head query / key RMSNorms (Qwen3: transformers' Qwen3Attention q_norm / k_norm; ModelSpec.qk_norm) on the
llama attention's fused qkv output (columns [kv_heads, r + 2, d]: per kv group its r query heads, its key head and
its value head; executor/layers/llama.py).

Order, as Qwen3Attention.forward: q = q_norm(q_proj(x).view(..., heads, d)), k = k_norm(k_proj(x).view(...)), v
untouched, THEN rotary on q and k. Qwen3RMSNorm over each head's d values:
    y = gamma * (x / sqrt(mean_d(x^2) + eps))      (statistics in fp32, the result cast back to x's dtype, then
                                                    times gamma: `weight * hidden_states.to(input_dtype)`)
gamma_q, gamma_k [d] each, shared by every head (eps = ModelSpec.rms_eps). Here the statistics run in
functional.upcast's dtype (fp32; fp64 for the fp64 equivalence copies) and gamma is cast to the compute dtype, so
the output stays in the compute dtype as the linear's did.

Applied to qkv before any split of the sequence (token splits' key gathers, context parallelism's exchanges): the
keys every rank reads are normed once, where they were computed.

Gradients: gamma is replicated over the tensor group; each rank's gradient covers its heads and its tokens only.
`reduced` passes it through copy_to_group (Megatron's f: identity forward, all-reduce of the gradient backward)
over the tensor axes the step's gradient all-reduce does not already sum (the mode's axes less its grad_axes:
2.5D's dep is summed there with dp, as its other parameters' depth shares are), once per block and micro-batch
(2 d values: the bytes of a 2D RMSNorm gamma's gather and reduce-scatter, which sum its partial gradients alike).
"""

from __future__ import annotations

import torch
from torch import Tensor

from paracube.executor.comm import copy_to_group
from paracube.executor.layers.functional import upcast
from paracube.executor.layers.serial import ShardedModule
from paracube.executor.layers.shards import make_spec
from paracube.executor.mesh import Mesh
from paracube.modes import MODES


def head_rms_norm(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    """Qwen3RMSNorm over the last dimension (module docstring): gamma * (x / sqrt(mean(x^2) + eps))."""
    xf = upcast(x)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return gamma.to(x.dtype) * normed.to(x.dtype)


class HeadRMSNorm(ShardedModule):
    """gamma [d] replicated over the tensor group; `reduced()` is gamma with its gradient summed over the axes
    that split the heads or tokens within a replica (module docstring)."""

    def __init__(self, mesh: Mesh, head_dim: int):
        super().__init__()
        self.mesh = mesh
        tensor = mesh.layout.tensor_axes
        self.add_param("weight", make_spec(mesh, (head_dim,), {}, replicated_axes=tensor))
        summed = MODES[mesh.layout.mode].grad_axes
        axes = tuple(a for a in tensor if a not in summed)
        # One group where the mesh builds it (the whole tensor group); else one per axis (2.5D's row, col)
        self.groups = [axes] if axes == tensor else [(a,) for a in axes]

    def reduced(self) -> Tensor:
        w = self.weight
        for axes in self.groups:
            w = copy_to_group(w, self.mesh, axes, label="attn.qk_norm")
        return w


def qk_normed(qkv: Tensor, groups: int, per_group: int, q_norm: HeadRMSNorm, k_norm: HeadRMSNorm,
              eps: float) -> Tensor:
    """qkv [..., groups * (per_group + 2) * d] with every query head normed by q_norm and every key head by
    k_norm (the values as they were)."""
    d = qkv.shape[-1] // (groups * (per_group + 2))
    g = qkv.unflatten(-1, (groups, per_group + 2, d))
    q_w, k_w = q_norm.reduced(), k_norm.reduced()
    gamma = torch.cat([q_w.expand(per_group, d), k_w.unsqueeze(0)])  # [per_group + 1, d]: the queries, the key
    normed = head_rms_norm(g[..., :per_group + 1, :], gamma, eps)
    return torch.cat([normed, g[..., per_group + 1:, :]], dim=-2).flatten(-3)


__all__ = ["HeadRMSNorm", "head_rms_norm", "qk_normed"]
