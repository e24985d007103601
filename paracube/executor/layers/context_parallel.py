"""Context parallelism (Layout `cp`, tensor modes none and 1D): each sequence split over the cp ranks, attention by
exchanging keys and values over the mesh axis "cp" (the contract of paracube/modes/context.py).

Chunks (Megatron-core / Llama 3 causal load balance): a sequence of s tokens splits into 2 cp chunks of
c = s / (2 cp); cp rank i holds chunks i and 2 cp - 1 - i, concatenated in that order (`chunk_positions`).
`load_balanced` takes a rank's tokens (ids, labels) from a micro-batch [b, s]; position ids follow the chunks
(the GPT position table's rows, llama's rotary angles), and the causal mask between a query and a key follows
their global positions: query at p reads key at p' iff p' <= p (and p - p' < w in a block with a sliding window w:
attention_mask.py). Every block is still exchanged; a block no query of the rank sees (outside every window) is
not computed, so the recorded bytes are the full-attention ones the cost model prices.

Attention of a rank's n = s / cp queries (its heads: 1D splits them over tp) against every rank's keys, one block
per rank, merged by online softmax in fp32 (fp64 for an fp64 model: functional.upcast), outputs in the compute
dtype (attention_blocks.py: the math, the kernels). A rank's own block comes first (each query reads itself, so L
stays finite). Full causal attention computes each block's causal span only (attention_blocks.causal_span: the
own block causal, an earlier rank's early chunk and a later rank's keys for the late chunk's queries, whole); a
block under a sliding window is computed with its mask (masked_forward: each query tile on the band of keys it
sees) where any query sees it. Grouped-query attention repeats a kv head over its query heads inside the block and
sums their dK, dV back.

The exchanges (`cpc`), KV = [b, kv heads, n, d_k + d_v] of the rank's k and v side by side (`pack`) in the
compute dtype (d_k = d_v but for MLA: keys of qk_nope + qk_rope, values of v_head_dim per head, executor/layers/mla.py;
the scale 1 / sqrt(d_k): megatron-core 0.16.1 multi_latent_attention.py l.126, l.155-165 hands Transformer
Engine's cp attention k_channels = q_head_dim, v_channels = v_head_dim):
- p2p (ring, Megatron's cp_comm_type=p2p): forward cp - 1 steps; in each the rank posts (batch_isend_irecv) the
  send of the KV block it holds to cp rank i + 1 and the receive of the next from i - 1 BEFORE the attention on
  the block it holds (the exchange overlaps it). Backward: the blocks circulate again (cp - 1 sends of KV) and
  each block's partial dK, dV travel with it, each rank adding its queries' share, back to the block's owner
  (cp sends of KV size): 2 cp - 1 KV sends per rank per layer. Every send is recorded as kind "send" over
  ("cp",) (labels <unit>.cp_kv, <unit>.cp_dkv as declared; receives are their peers' sends, as the pipeline
  records them).
- ag (Megatron's all_gather): forward all_gather of KV over cp; backward all_gather of KV again (nothing
  gathered is saved) and reduce_scatter of the gathered dK, dV over cp (same labels).
The autograd Functions save only the rank's own q, k, v, its output and L (no s x s tensor); selective
recomputation therefore leaves this core alone, full recomputation reruns the block and so its forward exchange.
Why our own Functions, not torch's context_parallel (torch.distributed.tensor.experimental): that one patches
F.scaled_dot_product_attention at run time and issues its collectives unseen by the CommRecorder, so the
recorded bytes could not be held to the cost model's; it also shards sequences round-robin, not by this contract.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.executor.comm import all_gather, reduce_scatter
from paracube.executor.layers.attention_blocks import (
    causal_span,
    masked_backward,
    masked_forward,
    merge,
    span_backward,
    span_forward,
)
from paracube.executor.layers.attention_mask import effective_window, ranges_meet, visible
from paracube.executor.layers.functional import upcast
from paracube.executor.layers.kv_heads import expand as expand_kv
from paracube.executor.layers.kv_heads import fold as fold_kv
from paracube.executor.layers.sinks import sink_grad, sink_merge
from paracube.executor.mesh import Mesh
from paracube.modes import MODES, context

CP = ("cp",)
KV_TAG, DKV_TAG = 0x6B76, 0x646B  # gloo matches p2p messages by tag: keys / values and their gradients apart
SEQ = 2  # the token dimension of a packed KV [b, kv, n, d_k + d_v]


def pack(k: Tensor, v: Tensor) -> Tensor:
    """k [b, kv, n, d_k] and v [b, kv, n, d_v] side by side: one KV block to exchange (widths may differ)."""
    return torch.cat([k, v], dim=-1)


def unpack(kv: Tensor, d_k: int, group: int) -> tuple[Tensor, Tensor]:
    """pack's k, v upcast, each kv head repeated over its `group` query heads."""
    k, v = kv.split([d_k, kv.shape[-1] - d_k], dim=-1)
    return expand_kv(upcast(k), group), expand_kv(upcast(v), group)


# --- chunks ------------------------------------------------------------------------------------------------
def chunk_ranges(s: int, cp: int, i: int) -> list[tuple[int, int]]:
    """The global position ranges [start, end) of cp rank i's two chunks of s / (2 cp): i and 2 cp - 1 - i."""
    c = s // (2 * cp)
    return [(i * c, (i + 1) * c), ((2 * cp - 1 - i) * c, (2 * cp - i) * c)]


def chunk_positions(s: int, cp: int, i: int, device: torch.device | None = None) -> Tensor:
    """Global positions [s / cp] of the tokens cp rank i holds: chunks i and 2 cp - 1 - i of s / (2 cp)."""
    return torch.cat([torch.arange(a, b, device=device) for a, b in chunk_ranges(s, cp, i)])


def load_balanced(t: Tensor, cp: int, i: int) -> Tensor:
    """cp rank i's tokens of a micro-batch t [b, s] (ids, labels): [b, s / cp] (module docstring)."""
    return t[:, chunk_positions(t.shape[1], cp, i, t.device)].contiguous()


# --- the ring -------------------------------------------------------------------------------------------------
class _Ring:
    """This rank's cp ring: peers, positions of every rank's tokens, recorded sends."""

    def __init__(self, mesh: Mesh, s: int, device: torch.device, window: int | None) -> None:
        self.mesh, self.cp, self.i = mesh, mesh.layout.cp, mesh.coord("cp")
        self.window = effective_window(window, s)
        mine = chunk_ranges(s, self.cp, self.i)
        # Whether any query of this rank sees any key of rank j: a block wholly outside the window is skipped
        # (its exchange is not: the bytes stay the priced ones)
        self.live = [any(ranges_meet(q, k, self.window) for q in mine for k in chunk_ranges(s, self.cp, j))
                     for j in range(self.cp)]
        self.nxt, self.prev = mesh.axis_peer("cp", 1), mesh.axis_peer("cp", -1)
        self.group = mesh.group(CP)
        self.pos = [chunk_positions(s, self.cp, j, device) for j in range(self.cp)]
        unit = context.attention_unit(MODES[mesh.layout.mode])  # the declaration's labels (modes/context.py)
        self.kv_label, self.dkv_label = f"{unit}.cp_kv", f"{unit}.cp_dkv"

    def allowed(self, j: int) -> Tensor:
        """Mask [n, n] of this rank's queries against cp rank j's keys (global positions; attention_mask.py)."""
        return visible(self.pos[self.i], self.pos[j], self.window)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, j: int, out: Tensor | None, lse: Tensor | None
               ) -> tuple[Tensor | None, Tensor | None]:
        """(out, L) with cp rank j's block merged in: q [b, H, n, d_k] upcast, k, v rank j's upcast and expanded;
        out, L None before the own block (module docstring: spans, or the windowed block's mask)."""
        if self.window is None:
            rows, cols, causal = causal_span(self.cp, self.i, j, q.shape[-2])
            o, l_j = span_forward(q[..., rows, :], k[..., cols, :], v[..., cols, :], causal)
        elif self.live[j]:  # the own block (j = i) always is: each query sees itself
            rows = slice(None)
            o, l_j = masked_forward(q, k, v, self.allowed(j))
        else:
            return out, lse
        if out is None or lse is None:
            return o, l_j
        out[..., rows, :], lse[..., rows, :] = merge(out[..., rows, :], lse[..., rows, :], o, l_j)
        return out, lse

    def grads(self, q: Tensor, k: Tensor, v: Tensor, j: int, do: Tensor, out: Tensor, lse: Tensor, delta: Tensor
              ) -> tuple[Tensor, Tensor, Tensor]:
        """(dQ, dK, dV) of cp rank j's block against the final upcast out, L and D (attend's operands; dK, dV in
        the expanded heads), zeros where the block computes nothing."""
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        if self.window is None:
            rows, cols, causal = causal_span(self.cp, self.i, j, q.shape[-2])
            dq[..., rows, :], dk[..., cols, :], dv[..., cols, :] = span_backward(
                q[..., rows, :], k[..., cols, :], v[..., cols, :], causal, do[..., rows, :], out[..., rows, :],
                lse[..., rows, :], delta[..., rows, :])
        elif self.live[j]:
            dq, dk, dv = masked_backward(q, k, v, self.allowed(j), do, out, lse, delta)
        return dq, dk, dv

    def exchange(self, t: Tensor, tag: int, label: str, backward: bool) -> tuple[list[Any], Tensor]:
        """Post the send of t to the next rank and the receive of as much from the previous one; the requests
        and the receive buffer (wait on the requests before reading it)."""
        t = t.contiguous()
        buf = torch.empty_like(t)
        with self.mesh.recorder.issue("send", CP, self.cp, t, t.numel(), backward, label):
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, self.nxt, self.group, tag),
                                           dist.P2POp(dist.irecv, buf, self.prev, self.group, tag)])
        return reqs, buf


def _wait(reqs: list[Any]) -> None:
    for r in reqs:
        r.wait()


def heads_inner(out: Tensor) -> Tensor:
    """out [b, H, n, d] stored as [b, n, H, d]: the caller's transpose(1, 2).reshape is then a view, so the output
    the Function saves and the one the projection saves are one storage (as without cp: the model counts one)."""
    return out.transpose(1, 2).contiguous().transpose(1, 2)


def _finish(ctx: Any, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, sinks: Tensor | None,
            args: tuple[Mesh, int, int | None]) -> Tensor:
    """Both exchanges' forward end: the sinks merged once per query row (sinks.py), the output in q's dtype with its
    heads inner, what the backward reads saved."""
    out, lse = sink_merge(out, lse, sinks)
    result = heads_inner(out.to(q.dtype))
    ctx.save_for_backward(q, k, v, result, lse, sinks)
    ctx.args = args
    return result


class _RingAttention(torch.autograd.Function):
    """Attention of q [b, H, n, d] over every cp rank's k, v [b, kv, n, d] by the p2p ring (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, mesh: Mesh, s: int, window: int | None,
                sinks: Tensor | None = None) -> Tensor:
        ring = _Ring(mesh, s, q.device, window)
        group = q.shape[1] // k.shape[1]
        qf = upcast(q)
        held, dk_w = pack(k, v), k.shape[-1]
        out = lse = None
        for step in range(ring.cp):
            # The next block's exchange is posted before this block's attention: it runs while we compute.
            reqs, buf = ring.exchange(held, KV_TAG, ring.kv_label, False) if step < ring.cp - 1 else ([], held)
            out, lse = ring.attend(qf, *unpack(held, dk_w, group), (ring.i - step) % ring.cp, out, lse)
            _wait(reqs)
            held = buf
        return _finish(ctx, q, k, v, out, lse, sinks, (mesh, s, window))  # type: ignore[arg-type]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (q, k, v, out, lse, sinks), (mesh, s, window) = ctx.saved_tensors, ctx.args
        ring, group = _Ring(mesh, s, q.device, window), q.shape[1] // k.shape[1]
        qf, do, outf = upcast(q), upcast(grad), upcast(out)
        delta = (do * outf).sum(-1, keepdim=True)
        dq = torch.zeros_like(qf)
        held, dk_w = pack(k, v), k.shape[-1]
        arriving: Tensor | None = None  # the partial dK, dV of the block held, from the previous rank
        arriving_reqs: list[Any] = []
        for step in range(ring.cp):
            reqs, buf = ring.exchange(held, KV_TAG, ring.kv_label, True) if step < ring.cp - 1 else ([], held)
            dq_j, dk, dv = ring.grads(qf, *unpack(held, dk_w, group), (ring.i - step) % ring.cp, do, outf, lse,
                                      delta)
            dq += dq_j
            mine = pack(fold_kv(dk, group), fold_kv(dv, group))
            if arriving is not None:
                _wait(arriving_reqs)  # posted in the previous step
                mine = mine + upcast(arriving)
            # The block's dK, dV go on with it (in the compute dtype, as its k, v travel); after the last step
            # what arrives is this rank's own block's, summed over every rank's queries.
            arriving_reqs, arriving = ring.exchange(mine.to(k.dtype), DKV_TAG, ring.dkv_label, True)
            _wait(reqs)
            held = buf
        _wait(arriving_reqs)
        dkv = arriving
        dk_, dv_ = dkv.split([dk_w, v.shape[-1]], dim=-1)  # type: ignore[union-attr]
        return dq.to(q.dtype), dk_, dv_, None, None, None, sink_grad(sinks, lse, delta)


class _GatherAttention(torch.autograd.Function):
    """Attention of q over the all-gathered k, v of every cp rank (cpc=ag, module docstring), block by block in the
    ring's order (own first)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, mesh: Mesh, s: int, window: int | None,
                sinks: Tensor | None = None) -> Tensor:
        ring = _Ring(mesh, s, q.device, window)
        group = q.shape[1] // k.shape[1]
        kv = all_gather(pack(k, v), mesh, CP, SEQ, label=ring.kv_label)  # [b, kv, s, d_k + d_v], cp index order
        keys, values = unpack(kv, k.shape[-1], group)
        qf, n = upcast(q), q.shape[-2]
        out = lse = None
        for step in range(ring.cp):
            j = (ring.i - step) % ring.cp
            out, lse = ring.attend(qf, keys[..., j * n:(j + 1) * n, :], values[..., j * n:(j + 1) * n, :], j, out,
                                   lse)
        return _finish(ctx, q, k, v, out, lse, sinks, (mesh, s, window))  # type: ignore[arg-type]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (q, k, v, out, lse, sinks), (mesh, s, window) = ctx.saved_tensors, ctx.args
        ring, group = _Ring(mesh, s, q.device, window), q.shape[1] // k.shape[1]
        kv = all_gather(pack(k, v), mesh, CP, SEQ, backward=True, label=ring.kv_label)
        keys, values = unpack(kv, k.shape[-1], group)
        qf, do, outf, n = upcast(q), upcast(grad), upcast(out), q.shape[-2]
        delta = (do * outf).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(keys), torch.zeros_like(values)
        for j in range(ring.cp):
            cols = slice(j * n, (j + 1) * n)
            dq_j, dk[..., cols, :], dv[..., cols, :] = ring.grads(qf, keys[..., cols, :], values[..., cols, :], j, do,
                                                                  outf, lse, delta)
            dq += dq_j
        dkv = reduce_scatter(pack(fold_kv(dk, group), fold_kv(dv, group)).to(k.dtype), mesh, CP, SEQ,
                             backward=True, label=ring.dkv_label)
        dk_, dv_ = dkv.split([k.shape[-1], v.shape[-1]], dim=-1)
        return dq.to(q.dtype), dk_, dv_, None, None, None, sink_grad(sinks, lse, delta)


def context_attention(q: Tensor, k: Tensor, v: Tensor, mesh: Mesh, s: int, window: int | None = None,
                      sinks: Tensor | None = None) -> Tensor:
    """Causal attention of this cp rank's queries q [b, H, n, d_k] (n = s / cp, chunk_positions) over the keys
    k [b, kv, n, d_k] and values v [b, kv, n, d_v] of every cp rank (-> [b, H, n, d_v]), exchanged as the layout's
    cpc says (None: p2p); `window`: the block's sliding window (None: full causal); `sinks` [H]: the heads' sink
    logits (sinks.py)."""
    fn = _GatherAttention if mesh.layout.cp_comm == "ag" else _RingAttention
    return fn.apply(q, k, v, mesh, s, window, sinks)


def context_parallel_attention(qkv: Tensor, heads: int, s: int, mesh: Mesh, window: int | None = None) -> Tensor:
    """functional.local_attention of a cp rank's chunks: qkv [b, s / cp, heads * 3 * d] (columns [heads, 3, d])
    -> [b, s / cp, heads * d]."""
    b, n, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = qkv.view(b, n, heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
    return context_attention(q, k, v, mesh, s, window).transpose(1, 2).reshape(b, n, heads * d)


__all__ = ["chunk_positions", "chunk_ranges", "context_attention", "context_parallel_attention", "load_balanced"]
