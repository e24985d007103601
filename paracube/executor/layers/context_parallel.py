"""Context parallelism (Layout `cp`, tensor modes none and 1D): each sequence split over the cp ranks, attention by
exchanging keys and values over the mesh axis "cp" (the contract of paracube/modes/context.py).

Chunks (Megatron-core / Llama 3 causal load balance): a sequence of s tokens splits into 2 cp chunks of
c = s / (2 cp); cp rank i holds chunks i and 2 cp - 1 - i, concatenated in that order (`chunk_positions`).
`load_balanced` takes a rank's tokens (ids, labels) from a micro-batch [b, s]; position ids follow the chunks
(the GPT position table's rows, llama's rotary angles), and the causal mask between a query and a key follows
their global positions: query at p reads key at p' iff p' <= p (and p - p' < w in a block with a sliding window w:
attention_mask.py). Every block is still exchanged; a block no query of the rank sees (outside every window) is
not computed, so the recorded bytes are the full-attention ones the cost model prices.

Attention of a rank's n = s / cp queries (its heads: 1D splits them over tp) against every rank's keys, in
blocks, each block merged by online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022):
per block j, scores S_j = Q K_j^T / sqrt(d) (masked to -inf), its log-sum-exp L_j = log sum_k exp S_j and
output O_j = softmax(S_j) V_j; two merge as L = logaddexp(L_a, L_b), O = O_a e^(L_a - L) + O_b e^(L_b - L).
A rank's own block comes first (each query reads itself, so L stays finite); a block every key of which is in
a query's future has L_j = -inf and weight 0. Backward with the saved final L and D = rowsum(dO * O):
P_j = exp(S_j - L), dV_j = P_j^T dO, dS_j = P_j * (dO V_j^T - D), dQ += dS_j K_j / sqrt(d), dK_j = dS_j^T Q / sqrt(d).
Statistics in fp32 (fp64 for an fp64 model: functional.upcast), outputs in the compute dtype. Grouped-query
attention repeats a kv head over its query heads inside the block and sums their dK, dV back.

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

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.executor.comm import all_gather, reduce_scatter
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


# --- block math ---------------------------------------------------------------------------------------------
def _scores(q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s.masked_fill(~allowed, float("-inf"))


# Scores elements of one query tile: a block's S, P and dS are [b, H, rows, m] per tile, not [b, H, n, m] (1 GiB
# each in fp32 for 4 heads of 8,192 queries against 8,192 keys, seq 16,384 at cp=2: the executor was killed for
# memory on a 2.9 GiB rank where the plan priced 137 MiB), so a block stays near the flash kernel's footprint. Rows
# are independent (softmax, L, O, dQ); dK, dV sum over the tiles. A block within one tile runs as one (every test
# size), unchanged.
TILE_ELEMENTS = 1 << 24


def _row_tiles(q: Tensor, m: int, tile: int) -> list[slice]:
    """Query-row slices of q [b, H, n, d] against m keys, each of at most `tile` scores (one row at least)."""
    n = q.shape[-2]
    rows = max(1, tile // max(1, q.shape[0] * q.shape[1] * m))
    return [slice(i, min(n, i + rows)) for i in range(0, n, rows)]


def block_forward(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, tile: int = TILE_ELEMENTS
                  ) -> tuple[Tensor, Tensor]:
    """Upcast q [b, H, n, d], k, v [b, H, m, d], allowed [n, m] -> (softmax(S) V, L [b, H, n, 1]); a row with
    no allowed key has output 0 and L = -inf. By query tiles of at most `tile` scores (TILE_ELEMENTS)."""
    tiles = _row_tiles(q, k.shape[-2], tile)
    if len(tiles) == 1:
        return _block_forward(q, k, v, allowed)
    parts = [_block_forward(q[..., r, :], k, v, allowed[r]) for r in tiles]
    return torch.cat([o for o, _ in parts], dim=-2), torch.cat([lse for _, lse in parts], dim=-2)


def _block_forward(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
    s = _scores(q, k, allowed)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    out = torch.matmul(e, v) / torch.where(total > 0, total, torch.ones_like(total))
    return out, m + torch.log(total)


def merge(out: Tensor, lse: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Online-softmax merge of two blocks' (output, L); `lse` finite (the rank's own block came first)."""
    new = torch.logaddexp(lse, lse_b)
    return out * torch.exp(lse - new) + out_b * torch.exp(lse_b - new), new


def block_backward(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, do: Tensor, lse: Tensor,
                   delta: Tensor, tile: int = TILE_ELEMENTS) -> tuple[Tensor, Tensor, Tensor]:
    """(dQ, dK, dV) of one block, upcast operands, with the final L and D = rowsum(dO * O) (module docstring); by
    query tiles of at most `tile` scores (TILE_ELEMENTS): dQ's rows are the tiles', dK and dV their sum."""
    tiles = _row_tiles(q, k.shape[-2], tile)
    if len(tiles) == 1:
        return _block_backward(q, k, v, allowed, do, lse, delta)
    dq, dk, dv = [], torch.zeros_like(k), torch.zeros_like(v)
    for r in tiles:
        dq_t, dk_t, dv_t = _block_backward(q[..., r, :], k, v, allowed[r], do[..., r, :], lse[..., r, :],
                                           delta[..., r, :])
        dq.append(dq_t)
        dk += dk_t
        dv += dv_t
    return torch.cat(dq, dim=-2), dk, dv


def _block_backward(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, do: Tensor, lse: Tensor,
                    delta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = torch.exp(_scores(q, k, allowed) - lse)
    dv = torch.matmul(p.transpose(-1, -2), do)
    ds = p * (torch.matmul(do, v.transpose(-1, -2)) - delta)
    return torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-1, -2), q) * scale, dv


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

    def allowed_all(self) -> Tensor:
        """Mask [n, s] of this rank's queries against every rank's keys, in cp index order (the gathered KV)."""
        return visible(self.pos[self.i], torch.cat(self.pos), self.window)

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
            j = (ring.i - step) % ring.cp
            if ring.live[j]:  # the own block (step 0) always is: each query sees itself
                o, l_j = block_forward(qf, *unpack(held, dk_w, group), ring.allowed(j))
                out, lse = (o, l_j) if out is None else merge(out, lse, o, l_j)  # type: ignore[arg-type]
            _wait(reqs)
            held = buf
        out, lse = sink_merge(out, lse, sinks)  # type: ignore[arg-type]  # once per query row (sinks.py)
        result = heads_inner(out.to(q.dtype))
        ctx.save_for_backward(q, k, v, result, lse, sinks)
        ctx.args = (mesh, s, window)
        return result

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, sinks = ctx.saved_tensors
        mesh, s, window = ctx.args
        ring = _Ring(mesh, s, q.device, window)
        group = q.shape[1] // k.shape[1]
        qf, do = upcast(q), upcast(grad)
        delta = (do * upcast(out)).sum(-1, keepdim=True)
        dq = torch.zeros_like(qf)
        held, dk_w = pack(k, v), k.shape[-1]
        arriving: Tensor | None = None  # the partial dK, dV of the block held, from the previous rank
        arriving_reqs: list[Any] = []
        for step in range(ring.cp):
            reqs, buf = ring.exchange(held, KV_TAG, ring.kv_label, True) if step < ring.cp - 1 else ([], held)
            j = (ring.i - step) % ring.cp
            if ring.live[j]:
                dq_j, dk, dv = block_backward(qf, *unpack(held, dk_w, group), ring.allowed(j), do, lse, delta)
                dq += dq_j
                mine = pack(fold_kv(dk, group), fold_kv(dv, group))
            else:  # no query here sees the block: it adds nothing to dK, dV, which still travel on with it
                mine = torch.zeros(held.shape, dtype=qf.dtype, device=qf.device)
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
    """Attention of q over the all-gathered k, v of every cp rank (cpc=ag, module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, mesh: Mesh, s: int, window: int | None,
                sinks: Tensor | None = None) -> Tensor:
        ring = _Ring(mesh, s, q.device, window)
        group = q.shape[1] // k.shape[1]
        kv = all_gather(pack(k, v), mesh, CP, SEQ, label=ring.kv_label)  # [b, kv, s, d_k + d_v], cp index order
        out, lse = block_forward(upcast(q), *unpack(kv, k.shape[-1], group), ring.allowed_all())
        out, lse = sink_merge(out, lse, sinks)
        result = heads_inner(out.to(q.dtype))
        ctx.save_for_backward(q, k, v, result, lse, sinks)
        ctx.args = (mesh, s, window)
        return result

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, sinks = ctx.saved_tensors
        mesh, s, window = ctx.args
        ring = _Ring(mesh, s, q.device, window)
        group = q.shape[1] // k.shape[1]
        kv = all_gather(pack(k, v), mesh, CP, SEQ, backward=True, label=ring.kv_label)
        do = upcast(grad)
        delta = (do * upcast(out)).sum(-1, keepdim=True)
        dq, dk, dv = block_backward(upcast(q), *unpack(kv, k.shape[-1], group), ring.allowed_all(), do, lse, delta)
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


__all__ = ["block_backward", "block_forward", "chunk_positions", "chunk_ranges", "context_attention",
           "context_parallel_attention", "load_balanced", "merge"]
