"""Attention sinks (ModelSpec.attention_sinks, GPT-OSS; the formula: paracube/gpt_oss_spec.py) in every attention path.

The parameter: s [heads], one logit per query head, held whole and replicated over the tensor group (AttentionSinks).
A rank uses its own query heads' (`local`: the heads its qkv output columns hold, first = the qkv weight's column
offset / ((r + 2) d) x r, llama.py's fused layout). Its gradient covers those heads and the rank's tokens only:
`local` passes s through copy_to_group (identity forward, all-reduce of the gradient backward) over
modes/base.replica_grad_groups (the tensor axes less the mode's grad_axes, which the step's all-reduce already
sums), one all_reduce of `heads` fp32 values per block and micro-batch, labelled "attn.sinks" (the cost model's list:
cost_models/oss_traffic.py); context parallelism's ranks are summed by the gradient all-reduce over dp x cp.

How each kernel adds the sink column, exactly once per query row:
- unfused (functional.core_attention): the masked, scaled scores get one more column holding s_h before the softmax
  (functional._ScaledCausalSoftmax, `row_sinks` gives each row its head's logit), dropped after it; its gradient
  ds_h = -sum_rows p_sink (sum_j g_j p_j) from the saved probabilities and the sink's own;
- flash (`sink_flash`): the sink merged into the flash kernel's own log-sum-exp (sink_kernels.py: one autograd
  Function; which aten op runs on which device and mask): L' = logaddexp(L, s_h), O' = O e^(L - L'), the kernel's
  own backward run with (O', L'), ds_h = -sum_rows e^(s_h - L') D'. It saves q, k, v, O' (the projection's input
  storage), L' and s, what the activation count prices (FlashAttention with sinks, FA3 / cuDNN: q, k, v, O, L); a
  mask (a sliding window, a split sequence) is built again in backward from the recipe llama.py passes, not kept:
  tests/test_gpt_oss_run's OSS model (d 8, fp32, mb 2, one rank, rc none) saves exactly the count (+0.38% when the
  windowed block kept its 32 x 32 boolean mask; the padded path below: +11.7%; unfused: +0.6%, the sink
  probabilities [b heads s] fp32; `python -m pytest -q -s tests/test_sink_kernels.py -k oss_model`). With attention
  dropout, or operands no kernel takes, `padded_sink_flash`: scaled_dot_product_attention over one more key whose
  score is s_h and whose value is 0: q gets an extra column s_h sqrt(d), every key a 0 there and the sink key a 1
  (scale stays 1 / sqrt(d)), v a zero column (one head width for the flash kernels; sliced off the output), the mask
  one more allowed column; autograd carries ds_h through q's extra column. Exact, but it keeps d + 1 wide q, k, v,
  its own output (not shared with proj's input) and the mask.
- context parallelism (context_parallel.py, ring and all-gather): after the blocks' online-softmax merge, each rank
  merges the sink into its own queries' rows once, as the fused flash path does (`sink_merge`, `sink_grad`).
torchtitan 0.3.0 applies the same function as out x sigmoid(lse - s_h) (models/gpt_oss/model.py
apply_attention_sink_rescale); tests/test_gpt_oss.py compares.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from paracube.executor.comm import copy_to_group
from paracube.executor.layers.dropout import seeded
from paracube.executor.layers.functional import upcast
from paracube.executor.layers.serial import ShardedModule
from paracube.executor.layers.shards import make_spec
from paracube.executor.layers.sink_kernels import fused_sink_flash, kernel_for, sink_grad, sink_merge
from paracube.executor.mesh import Mesh
from paracube.modes import MODES
from paracube.modes.base import replica_grad_groups


class AttentionSinks(ShardedModule):
    """s [heads], replicated over the tensor group (its gradient summed by `local`)."""

    def __init__(self, mesh: Mesh, heads: int):
        super().__init__()
        self.mesh = mesh
        self.add_param("weight", make_spec(mesh, (heads,), {}, replicated_axes=mesh.layout.tensor_axes))

    def local(self, first: int, count: int) -> Tensor:
        """The logits of query heads first .. first + count - 1, in the statistics' dtype (fp32; fp64 copies: fp64)."""
        s = upcast(self.weight)
        for axes in replica_grad_groups(MODES[self.mesh.layout.mode]):
            s = copy_to_group(s, self.mesh, axes, label="attn.sinks")
        return s[first:first + count]


def row_sinks(sinks: Tensor, b: int, kv_heads: int, group: int, c: int) -> Tensor:
    """[b kv_heads, group c]: each row of the unfused core's stacked scores (per kv head its group query heads of c
    queries) with its query head's logit."""
    per = sinks.view(kv_heads, group, 1).expand(kv_heads, group, c).reshape(1, kv_heads, group * c)
    return per.expand(b, -1, -1).reshape(b * kv_heads, group * c)


def sink_flash(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, p: float, seed: int | None, gqa: bool,
               allowed: Tensor | None, remake: Callable[[], Tensor] | None = None) -> Tensor:
    """Attention with sinks on the flash path (q [b, H, c, d], k, v [b, kv, keys, d]): causal over whole sequences
    (allowed None: c = keys) or masked by `allowed` [c, keys] (`remake`: the call that built it, so the fused
    kernel's backward builds it again instead of keeping it). The fused kernel (sink_kernels.py) where one takes
    the operands and there is no dropout, else `padded_sink_flash`."""
    dropout = p > 0.0 and seed is not None
    kernel = None if dropout else kernel_for(q, k, v, allowed)
    if kernel is None:
        return padded_sink_flash(q, k, v, sinks, p, seed, gqa, allowed)
    return fused_sink_flash(q, k, v, sinks, allowed, kernel, 1.0 / math.sqrt(q.shape[-1]), remake)


def padded_sink_flash(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, p: float, seed: int | None, gqa: bool,
                      allowed: Tensor | None) -> Tensor:
    """scaled_dot_product_attention over one more key, the sink (module docstring): sink_flash's fallback."""
    b, heads, c, d = q.shape
    keys = k.shape[2]
    scale = 1.0 / math.sqrt(d)
    extra = (sinks / scale).to(q.dtype).view(1, heads, 1, 1).expand(b, heads, c, 1)
    q1 = torch.cat([q, extra], dim=-1)
    sink_key = torch.zeros((*k.shape[:2], 1, d + 1), dtype=k.dtype, device=k.device)
    sink_key[..., d] = 1.0
    k1 = torch.cat([F.pad(k, (0, 1)), sink_key], dim=2)
    # v as wide as q and k (a zero column, sliced off the output): the flash kernels take one head width
    v1 = F.pad(v, (0, 1, 0, 1))
    if allowed is None:
        allowed = torch.ones(c, keys, dtype=torch.bool, device=q.device).tril()
    mask = torch.cat([allowed, torch.ones(c, 1, dtype=torch.bool, device=q.device)], dim=1)
    if p <= 0.0 or seed is None:
        return F.scaled_dot_product_attention(q1, k1, v1, attn_mask=mask, scale=scale, enable_gqa=gqa)[..., :d]
    with seeded(seed, q.device):
        out = F.scaled_dot_product_attention(q1, k1, v1, attn_mask=mask, dropout_p=p, scale=scale, enable_gqa=gqa)
    return out[..., :d]


def oss_init_tensors(spec: Any, prefix: str, qkv_width: int, normal: Callable[..., Tensor]
                     ) -> Iterator[tuple[str, Tensor]]:
    """A block's GPT-OSS attention tensors (llama_init_tensors' generator `normal`, 0.02): q / k / v / o biases and
    the sinks, drawn after the block's other attention tensors (models without them keep their draws)."""
    if spec.attention_bias:
        yield prefix + "qkv.bias", normal(qkv_width)
        yield prefix + "proj.bias", normal(spec.hidden)
    if spec.attention_sinks:
        yield prefix + "sinks.weight", normal(spec.heads)


__all__ = ["AttentionSinks", "oss_init_tensors", "padded_sink_flash", "row_sinks", "sink_flash", "sink_grad",
           "sink_merge"]
