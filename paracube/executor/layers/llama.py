"""The llama family's layers (Touvron et al. 2023; as transformers' LlamaModel computes them): RMSNorm,
rotary position embeddings, grouped-query attention over a fused qkv, SwiGLU over a fused gate+up, and
their serial initialization. gpt.py assembles them through any Mode, whose `linear` splits them.

Fused layouts of the full tensors (the same in every mode, so a contiguous block of columns is a whole
unit and a seed gives the same model in every layout):
- qkv [h, q + 2 kv] (q = heads x d, kv = kv_heads x d; d = ModelSpec.head_dim: hidden / heads, or head_size,
  Qwen3's 128 with hidden 2048 and 32 heads), proj [q, h]. qkv's columns [kv_heads, r + 2, d] (r = heads /
  kv_heads): per kv group its r query heads, then its key head and its value head. A rank holding 1/n of the
  columns holds kv_heads / n whole groups (kv_heads % n == 0): its heads / n query heads and the kv heads they read.
  Query head g * r + i reads kv head g (transformers' repeat_kv order).
- gate+up [h, 2f]: columns [f, 2] = (gate_j, up_j) interleaved; an even block of columns holds whole
  pairs, so SwiGLU(x)_j = silu(gate_j) * up_j needs no communication and yields down's input block.
qk_norm (Qwen3): per-head RMSNorms of the queries and keys in qkv, before rotary (head_norm.py). Llama 4: NoPE
blocks skip rotary, its L2 norm follows it (qk_positions.py; `positioned`).
RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma, in fp32 (the residual stream's dtype); split over the
hidden dimension it all-reduces one statistic per token (sum of x^2) each way. Rotary: transformers'
rotate_half form, inv_freq_j = theta^(-2j/d), positions 0..s-1 of each whole local sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paracube.executor.comm import Axes, gather_fn
from paracube.executor.layers.attention_mask import sequence_mask
from paracube.executor.layers.context_parallel import chunk_positions, context_attention
from paracube.executor.layers.discard import region
from paracube.executor.layers.functional import compute_dtype, core_attention, flash_attention, fp32
from paracube.executor.layers.head_norm import HeadRMSNorm, qk_normed
from paracube.executor.layers.qk_positions import QKPositions, l2_norm
from paracube.executor.layers.rms_norm import rms_norm
from paracube.executor.layers.serial import Mode, ShardedModule
from paracube.executor.layers.shards import block, make_spec
from paracube.executor.layers.sinks import AttentionSinks, oss_init_tensors, row_sinks, sink_flash
from paracube.executor.layers.tokens import Geometry, window_mask, window_positions
from paracube.executor.mesh import Mesh
from paracube.workload import ModelSpec


def rotary_tables(s: int, d: int, theta: float, like: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin [s, d] of positions 0..s-1 (inv_freq_j = theta^(-2j/d), halves repeated), in like's dtype."""
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=like.device) / d)
    angles = torch.outer(torch.arange(s, dtype=torch.float32, device=like.device), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(like.dtype), emb.sin().to(like.dtype)


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [b, heads, s, d] rotated by position (transformers' apply_rotary_pos_emb, rotate_half form)."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def positioned(q: Tensor, k: Tensor, q_tables: tuple[Tensor, Tensor], k_tables: tuple[Tensor, Tensor],
               how: QKPositions) -> tuple[Tensor, Tensor]:
    """q, k rotated by their (cos, sin) tables unless a NoPE block, then L2-normed where `how` says
    (qk_positions.py: the order)."""
    if how.rope:
        q, k = rotary(q, *q_tables), rotary(k, *k_tables)
    if how.l2_eps is not None:
        q, k = l2_norm(q, how.l2_eps), l2_norm(k, how.l2_eps)
    return q, k


def gqa_attention(qkv: Tensor, kv_heads: int, group: int, theta: float | QKPositions, flash: bool = True,
                  p: float = 0.0,
                  seed: int | None = None, kv: Tensor | None = None, geometry: Geometry | None = None,
                  window: int | None = None, sinks: Tensor | None = None) -> Tensor:
    """Causal attention: qkv [b, c, kv_heads * (group + 2) * d] -> [b, c, kv_heads*group*d]. kv None: whole
    sequences (c = s); else [1, keys, kv_heads, 2, d], the window of keys and values a split sequence's queries
    read, `geometry` placing both (executor/layers/tokens.py: rotary positions and the mask follow from it).
    `window`: the block's sliding window or attention chunk (attention_mask.py; None: full causal); `theta`: the
    rotary base, or the block's QKPositions (NoPE, L2 norm). `sinks` [kv_heads group]: the local query heads' sink
    logits (sinks.py; None: no sinks).
    flash: scaled_dot_product_attention; else Megatron's unfused core attention (functional.core_attention),
    the group's query heads stacked along the rows of one bmm per kv head."""
    how = theta if isinstance(theta, QKPositions) else QKPositions(theta)
    b, c, width = qkv.shape
    d = width // (kv_heads * (group + 2))
    g = qkv.view(b, c, kv_heads, group + 2, d)
    q = g[..., :group, :].reshape(b, c, kv_heads * group, d).transpose(1, 2)
    if kv is None or geometry is None:
        # v copied out of qkv: backward then keeps v alone, not the whole qkv output it is a view of
        k, v = g[..., group, :].transpose(1, 2), g[..., group + 1, :].transpose(1, 2).contiguous()
        cos, sin = rotary_tables(c, d, how.theta, qkv)
        q, k = positioned(q, k, (cos, sin), (cos, sin), how)
        remake = partial(sequence_mask, c, window, qkv.device)  # None: the plain causal path (a window >= s too)
        allowed = remake()
    else:
        # v copied out of the window, as above (k is rotated into a new tensor anyway)
        k, v = kv[..., 0, :].transpose(1, 2), kv[..., 1, :].transpose(1, 2).contiguous()
        keys = k.shape[2]
        cos, sin = rotary_tables(geometry[2], d, how.theta, qkv)
        _, k_pos = window_positions(geometry, c, keys, qkv.device)
        cos, sin = cos[k_pos], sin[k_pos]  # the queries are the window's last c tokens: views of these
        q, k = positioned(q, k, (cos[keys - c:], sin[keys - c:]), (cos, sin), how)
        remake = partial(window_mask, geometry, c, keys, qkv.device, window)
        allowed = remake()
    keys = k.shape[2]
    if not flash:
        n = b * kv_heads
        cd = compute_dtype(qkv)
        rows = None if sinks is None else row_sinks(sinks, b, kv_heads, group, c)
        out = core_attention(q.to(cd).reshape(n, group * c, d), k.to(cd).reshape(n, keys, d),
                             v.to(cd).reshape(n, keys, d), p, seed, allowed, rows)
        return out.view(b, kv_heads * group, c, d).transpose(1, 2).reshape(b, c, kv_heads * group * d)
    # enable_gqa: query head j reads kv head j // group, without materializing repeated k, v
    out = flash_attention(q, k, v, p, seed, gqa=group > 1, allowed=allowed, remake=remake) if sinks is None else \
        sink_flash(q, k, v, sinks, p, seed, group > 1, allowed, remake)
    return out.transpose(1, 2).reshape(b, c, kv_heads * group * d)


def context_parallel_gqa(qkv: Tensor, kv_heads: int, group: int, theta: float | QKPositions, s: int, mesh: Mesh,
                         window: int | None = None, sinks: Tensor | None = None) -> Tensor:
    """gqa_attention of a cp rank's chunks (qkv [b, s / cp, ...], executor/layers/context_parallel.py): q and k
    rotated at their global positions, then attention over every cp rank's k, v (within `window` of each query)."""
    b, c, width = qkv.shape
    d = width // (kv_heads * (group + 2))
    g = qkv.view(b, c, kv_heads, group + 2, d)
    q = g[..., :group, :].reshape(b, c, kv_heads * group, d).transpose(1, 2)
    k, v = g[..., group, :].transpose(1, 2), g[..., group + 1, :].transpose(1, 2).contiguous()
    how = theta if isinstance(theta, QKPositions) else QKPositions(theta)
    cos, sin = rotary_tables(s, d, how.theta, qkv)
    pos = chunk_positions(s, mesh.layout.cp, mesh.coord("cp"), qkv.device)
    # Indexed once: q's and k's rotations then save the same two tables (indexing per use made a copy each).
    cos, sin = cos[pos], sin[pos]
    q, k = positioned(q, k, (cos, sin), (cos, sin), how)
    out = context_attention(q, k, v, mesh, s, window, sinks)
    return out.transpose(1, 2).reshape(b, c, kv_heads * group * d)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up saving only the fused input (its output is recomputed from it in backward)."""

    @staticmethod
    def forward(ctx: Any, y: Tensor) -> Tensor:
        ctx.save_for_backward(y)
        pairs = y.unflatten(-1, (-1, 2))
        return F.silu(pairs[..., 0]) * pairs[..., 1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        pairs = y.unflatten(-1, (-1, 2))
        gate, up = pairs[..., 0], pairs[..., 1]
        sig = torch.sigmoid(gate)
        d_gate = grad * up * sig * (1 + gate * (1 - sig))  # d silu(g) / dg = s (1 + g (1 - s))
        return torch.stack([d_gate, grad * gate * sig], dim=-1).flatten(-2)


def swiglu(y: Tensor, limit: float | None = None, alpha: float = 1.0) -> Tensor:
    """[..., 2 f_local] with (gate, up) interleaved -> silu(gate) * up [..., f_local]; with `limit` GPT-OSS's clamped
    SwiGLU (gpt_oss_spec.py): (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit), by autograd
    (it keeps its few elementwise intermediates)."""
    if limit is None:
        return _SwiGLU.apply(y)
    pairs = y.unflatten(-1, (-1, 2))
    gate, up = pairs[..., 0].clamp(max=limit), pairs[..., 1].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


class LlamaAttention(nn.Module):
    def __init__(self, mode: Mode, modules: frozenset[str] = frozenset(), flash: bool = True,
                 window: int | None = None, positions: QKPositions | None = None):
        super().__init__()
        self.flash, self.p, self.mode = flash, mode.spec.attention_dropout, mode
        self.selective = "core_attn" in modules  # recompute_modules.py; blocks.py threads the set
        self.window = window  # the block's sliding window or chunk (ModelSpec.attention_window), None: full causal
        spec = mode.spec
        h, q, kv = spec.hidden, spec.heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.group = spec.heads // spec.num_kv_heads
        self.kv_local = mode.heads_local // self.group  # kv_heads / n (sizes.py checks it divides)
        # the rotary base, or the block's NoPE / L2 norm (qk_positions.block_positions)
        self.theta: float | QKPositions = positions or spec.rope_theta
        self.eps = spec.rms_eps
        self.qkv = mode.linear("qkv", h, q + 2 * kv, spec.attention_bias)
        if spec.qk_norm:  # Qwen3's per-head q / k RMSNorms (head_norm.py), before rotary
            self.q_norm, self.k_norm = HeadRMSNorm(mode.mesh, spec.head_dim), HeadRMSNorm(mode.mesh, spec.head_dim)
        self.qk_norm = spec.qk_norm
        self.proj = mode.linear("proj", q, h, spec.attention_bias)
        if spec.attention_sinks:  # GPT-OSS: its local query heads start at its qkv columns' (sinks.py)
            self.sinks = AttentionSinks(mode.mesh, spec.heads)
            self.head0 = self.qkv.shard_specs["weight"].offsets[1] // ((self.group + 2) * spec.head_dim) * self.group

    def forward(self, x: Tensor, seed: int | None = None, s: int = 0) -> Tensor:
        """x: block-layout activations of sequences of s tokens."""
        qkv = self.qkv(x)
        if self.qk_norm:
            qkv = qk_normed(qkv, self.kv_local, self.group, self.q_norm, self.k_norm, self.eps)
        sinks = self.sinks.local(self.head0, self.mode.heads_local) if hasattr(self, "sinks") else None
        if self.mode.mesh.layout.cp > 1:  # context parallelism: keys and values exchanged over cp
            return self.proj(context_parallel_gqa(qkv, self.kv_local, self.group, self.theta, s, self.mode.mesh,
                                                  self.window, sinks))
        split = self.mode.sequence_split(qkv, s)
        # A sequence split over ranks gathers its keys and values here, outside the recomputed core.
        kv = split.keys_values(qkv, self.kv_local, self.group, self.mode.mesh) if split is not None else None
        args = (split.queries(qkv) if split is not None else qkv, self.kv_local, self.group, self.theta,
                self.flash, self.p, seed, kv, split.geometry if split is not None else None, self.window, sinks)
        # core_attn (Korthikanti et al.): keep only qkv, redo the attention core in backward (the same dropout
        # mask: it is drawn from `seed`).
        out = region(gqa_attention, *args) if self.selective else gqa_attention(*args)
        return self.proj(split.output(out) if split is not None else out)


class SwiGLU(nn.Module):
    def __init__(self, mode: Mode):
        super().__init__()
        h, f = mode.spec.hidden, mode.spec.ffn_hidden
        self.fc = mode.linear("fc", h, 2 * f, False)
        self.fc2 = mode.linear("fc2", f, h, False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(swiglu(self.fc(x)))


class SplitRMSNorm(ShardedModule):
    """gamma split over `split_axes` (gathered over `gather_axes`), statistics all-reduced over `stat_axes`."""

    def __init__(self, mesh: Mesh, hidden: int, eps: float, split_axes: Axes, gather_axes: Axes, stat_axes: Axes):
        super().__init__()
        self.mesh, self.hidden, self.eps = mesh, hidden, eps
        self.gather_axes, self.stat_axes = gather_axes, stat_axes
        self.add_param("weight", make_spec(mesh, (hidden,), {0: block(hidden, mesh, split_axes)}))

    def forward(self, x: Tensor) -> Tensor:
        gamma = gather_fn(fp32(self.weight), self.mesh, self.gather_axes, 0, label="ln.gamma")  # fp32, as priced
        return rms_norm(x, gamma, self.mesh, self.stat_axes, self.hidden, self.eps)


AttentionInit = Callable[[str, Callable[..., Tensor], float], Iterator[tuple[str, Tensor]]]
"""(prefix `blocks.I.attn.`, the generator's `normal`, the residual projections' std) -> a block's attention tensors."""


def decoder_init_tensors(spec: ModelSpec, seed: int, attention: AttentionInit) -> Iterator[tuple[str, Tensor]]:
    """The serial initialization of the llama family, one full tensor at a time, in a fixed order, from one
    generator of `seed`: normal 0.02 (residual projections 0.02 / sqrt(2 L), as gpt), norms 1; each block's
    attention tensors from `attention` (GQA: llama_init_tensors; MLA: mla.mla_init_tensors), between its norms."""
    gen = torch.Generator().manual_seed(seed)
    h, f, V, L = spec.hidden, spec.ffn_hidden, spec.vocab, spec.layers

    def normal(*shape: int, std: float = 0.02) -> Tensor:
        return torch.empty(shape).normal_(0.0, std, generator=gen)

    yield "tok_emb.weight", normal(V, h)
    resid_std = 0.02 / math.sqrt(2 * L)
    for i in range(L):
        p = f"blocks.{i}."
        yield p + "ln1.weight", torch.ones(h)
        yield from attention(p + "attn.", normal, resid_std)
        yield p + "ln2.weight", torch.ones(h)
        yield p + "mlp.fc.weight", normal(h, 2 * f)
        yield p + "mlp.fc2.weight", normal(f, h, std=resid_std)
    yield "ln_f.weight", torch.ones(h)
    if not spec.tied_embeddings:
        yield "head.weight", normal(h, V)


def llama_init_tensors(spec: ModelSpec, seed: int) -> Iterator[tuple[str, Tensor]]:
    """decoder_init_tensors with grouped-query attention: qkv, the q / k norms (qk_norm), proj, then GPT-OSS's
    biases and sinks."""
    h, q, kv = spec.hidden, spec.heads * spec.head_dim, spec.num_kv_heads * spec.head_dim

    def attention(p: str, normal: Callable[..., Tensor], resid_std: float) -> Iterator[tuple[str, Tensor]]:
        yield p + "qkv.weight", normal(h, q + 2 * kv)
        if spec.qk_norm:
            yield p + "q_norm.weight", torch.ones(spec.head_dim)
            yield p + "k_norm.weight", torch.ones(spec.head_dim)
        yield p + "proj.weight", normal(q, h, std=resid_std)
        yield from oss_init_tensors(spec, p, q + 2 * kv, normal)

    return decoder_init_tensors(spec, seed, attention)


__all__ = ["AttentionInit", "LlamaAttention", "SplitRMSNorm", "SwiGLU", "context_parallel_gqa", "decoder_init_tensors",
           "gqa_attention", "llama_init_tensors", "positioned", "rotary", "rotary_tables", "swiglu"]
