"""Per-head query / key RMSNorms (Qwen3: transformers' Qwen3Attention q_norm / k_norm; ModelSpec.qk_norm) on the
llama attention's fused qkv output (columns [kv_heads, r + 2, d]: per kv group its r query heads, its key head and
its value head; executor/layers/llama.py).

Order, as Qwen3Attention.forward: q = q_norm(q_proj(x).view(..., heads, d)), k = k_norm(k_proj(x).view(...)), v
untouched, THEN rotary on q and k. Qwen3RMSNorm over each head's d values:
    y = gamma * (x / sqrt(mean_d(x^2) + eps))      (statistics in fp32, the result cast back to x's dtype, then
                                                    times gamma: `weight * hidden_states.to(input_dtype)`)
gamma_q, gamma_k [d] each, shared by every head (eps = ModelSpec.rms_eps). Computed by executor/layers/rms_norm.py
over each head's d values (no collective): statistics in fp32 (fp64 for the fp64 equivalence copies), the product
with gamma too, then cast to the compute dtype (Qwen3RMSNorm casts before multiplying by gamma: the same in fp32,
one rounding apart in bf16, as this executor's other RMSNorms); it saves its input (the queries and keys, copied out of
the qkv output so that its values are not kept with them) and an fp32 rstd per head: c (q + kv) + 4 (heads +
kv_heads) bytes per token, cost_models/activations.py's count. The normed heads and the values are copied into a new
qkv tensor, what the attention then reads.

Applied to qkv before any split of the sequence (token splits' key gathers, context parallelism's exchanges): the
keys every rank reads are normed once, where they were computed.

Gradients: gamma is replicated over the tensor group; each rank's gradient covers its heads and its tokens only.
`qk_normed` passes the two gammas, stacked, through copy_to_group (Megatron's f: identity forward, all-reduce of
the gradient backward) over the tensor axes the step's gradient all-reduce does not already sum (the mode's axes
less its grad_axes: 2.5D's dep is summed there with dp, as its other parameters' depth shares are): one
all-reduce of 2 d values per block and micro-batch, as this executor's 2D / 3D RMSNorm gammas sum their partial
gradients per micro-batch (gather forward, reduce-scatter backward), in every mode alike. (1D + sp sums its
replicated weights once per step instead, one_d.sequence_parallel_params: fewer, larger collectives.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from paracube.executor.comm import copy_to_group
from paracube.executor.layers.functional import upcast
from paracube.executor.layers.rms_norm import rms_norm
from paracube.executor.layers.serial import ShardedModule
from paracube.executor.layers.shards import make_spec
from paracube.executor.mesh import Mesh
from paracube.layout import Layout
from paracube.modes import MODES
from paracube.modes.base import replica_grad_groups


class HeadRMSNorm(ShardedModule):
    """gamma [d], replicated over the tensor group (its gradient summed by `qk_normed`)."""

    def __init__(self, mesh: Mesh, head_dim: int):
        super().__init__()
        self.mesh = mesh
        self.add_param("weight", make_spec(mesh, (head_dim,), {}, replicated_axes=mesh.layout.tensor_axes))


def gamma_groups(layout: Layout) -> list[tuple[str, ...]]:
    """The groups the gammas' gradients are summed over (module docstring): the mode's declaration
    (modes/base.replica_grad_groups, which the cost models price through modes/head_norm.py)."""
    return replica_grad_groups(MODES[layout.mode])


def qk_normed(qkv: Tensor, groups: int, per_group: int, q_norm: HeadRMSNorm, k_norm: HeadRMSNorm,
              eps: float) -> Tensor:
    """qkv [..., groups * (per_group + 2) * d] with every query head normed by q_norm and every key head by
    k_norm (the values as they were): a new tensor of qkv's shape."""
    d = qkv.shape[-1] // (groups * (per_group + 2))
    g = qkv.unflatten(-1, (groups, per_group + 2, d))
    mesh = q_norm.mesh
    both = upcast(torch.stack([q_norm.weight, k_norm.weight]))  # the gradient sum in fp32 (fp64 copies: fp64)
    for axes in gamma_groups(mesh.layout):
        both = copy_to_group(both, mesh, axes, label="attn.qk_norm")
    # The norms' inputs copied out of qkv: what they keep for backward is then the queries and keys alone, not the
    # whole qkv output (its values) that views of it would keep alive
    qk = g[..., :per_group + 1, :].contiguous()
    q = rms_norm(qk[..., :per_group, :], both[0], mesh, (), d, eps)
    k = rms_norm(qk[..., per_group:, :], both[1], mesh, (), d, eps)
    return torch.cat([q, k, g[..., per_group + 1:, :]], dim=-2).flatten(-3)


__all__ = ["HeadRMSNorm", "gamma_groups", "qk_normed"]
