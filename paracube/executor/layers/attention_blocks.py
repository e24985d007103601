"""One block of context-parallel attention: a rank's queries against one rank's keys, forward (output and log-sum-exp)
and backward against the final statistics, as the ring and the all-gather of context_parallel.py merge them.

Math (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022): per block j, scores S_j = Q K_j^T / sqrt(d_k)
(masked to -inf), L_j = log sum_k exp S_j, O_j = softmax(S_j) V_j; two blocks merge as L = logaddexp(L_a, L_b),
O = O_a e^(L_a - L) + O_b e^(L_b - L) (`merge`). Backward of a block with the FINAL L and D = rowsum(dO * O):
P_j = exp(S_j - L), dV_j = P_j^T dO, dS_j = P_j * (dO V_j^T - D), dQ += dS_j K_j / sqrt(d_k),
dK_j = dS_j^T Q / sqrt(d_k).

Spans (`causal_span`, full causal attention, no window): rank i holds chunks i and 2 cp - 1 - i of s / (2 cp)
(context_parallel.chunk_ranges), so against rank j's two chunks, in the local order of increasing positions:
- j = i: causal over the rank's n = s / cp tokens (a late-chunk query sees the whole early chunk);
- j < i: every query sees rank j's early chunk whole and its late chunk not at all: keys [0, n / 2), no mask;
- j > i: the late chunk's queries see both of rank j's chunks whole, the early chunk's none: rows [n / 2, n).
That is the load balance's point (each rank computes n^2 / 2 + (cp - 1) n^2 / 2 scores, the causal half of its
rows x s) and what Megatron-core / Transformer Engine's cp attention computes per step; a block with a sliding window
keeps its mask (context_parallel.py: computed whole where any query sees it).

Kernels: on CPU a span runs torch's fused flash-attention kernel, which returns L beside the output and takes it
back in the backward (aten._scaled_dot_product_flash_attention_for_cpu and its _backward; the kernels
torch.distributed.tensor.experimental's ring attention calls; fp32 and fp64 operands, causal or full); widths
d_k != d_v (MLA) are zero-padded to one width with the scale kept at 1 / sqrt(d_k) (zero columns add nothing to
a score and give zero output columns, dropped). Elsewhere (CUDA: the flash kernels there take 16-bit operands only,
this path's statistics are fp32; no GPU run of this module yet), the explicit scores by query tiles of at most
TILE_ELEMENTS (`block_forward`, `block_backward`). A block under a sliding window (`masked_forward`,
`masked_backward`) runs the fused kernel too on CPU, tile by tile on the band of keys each tile sees, its mask as an
additive bias. Operands arrive upcast (functional.upcast):
fp32, or fp64 for the fp64 equivalence tests.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

Span = tuple[slice, slice, bool]  # query rows, key columns, causal (else every pair visible)
# Scores elements of one query tile: a block's S, P and dS are [b, H, rows, m] per tile, not [b, H, n, m] (1 GiB
# each in fp32 for 4 heads of 8,192 queries against 8,192 keys, seq 16,384 at cp=2: the executor was killed for
# memory on a 2.9 GiB rank where the plan priced 137 MiB), so a block stays near the flash kernel's footprint. Rows
# are independent (softmax, L, O, dQ); dK, dV sum over the tiles. masked_forward's boxes are tiled alike.
TILE_ELEMENTS = 1 << 24


def causal_span(cp: int, i: int, j: int, n: int) -> Span:
    """What rank i's n queries compute against rank j's n keys under full causal attention (module docstring)."""
    half = n // 2
    if j == i:
        return slice(0, n), slice(0, n), True
    if j < i:
        return slice(0, n), slice(0, half), False
    return slice(half, n), slice(0, n), False


# A private aten op (torch 2.13 has it): a torch without it runs the explicit scores.
_FUSED_CPU = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def fused(t: Tensor) -> bool:
    """Whether spans of `t`'s device run the fused kernel (module docstring: CPU)."""
    return _FUSED_CPU and t.device.type == "cpu"


def _padded(t: Tensor, width: int) -> Tensor:
    """t's last dimension zero-padded to `width` (the fused kernel takes one head width for q, k and v)."""
    return F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t


def _mask(rows: int, cols: int, causal: bool, device: torch.device) -> Tensor:
    full = torch.ones(rows, cols, dtype=torch.bool, device=device)
    return full.tril() if causal else full


def _flash(q: Tensor, k: Tensor, v: Tensor, causal: bool, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The fused CPU kernel's (output [.., d_v], L [.., 1]), widths padded to one and the scale kept 1 / sqrt(d_k)."""
    width = max(q.shape[-1], v.shape[-1])
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        *(_padded(t, width) for t in (q, k, v)), 0.0, causal, attn_mask=bias, scale=1.0 / math.sqrt(q.shape[-1]))[:2]
    return out[..., :v.shape[-1]], lse.unsqueeze(-1)


def _flash_backward(q: Tensor, k: Tensor, v: Tensor, causal: bool, do: Tensor, out: Tensor, lse: Tensor,
                    bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The fused CPU kernel's (dQ, dK, dV) against the final out and L, as _flash pads and scales."""
    d_k, d_v = q.shape[-1], v.shape[-1]
    width = max(d_k, d_v)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(_padded(t, width) for t in (do, q, k, v, out)), lse.squeeze(-1), 0.0, causal, attn_mask=bias,
        scale=1.0 / math.sqrt(d_k))
    return dq[..., :d_k], dk[..., :d_k], dv[..., :d_v]


def span_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """(softmax(S) V [b, H, rows, d_v], L [b, H, rows, 1]) of a span's q [b, H, rows, d_k], k, v [b, H, cols, d]."""
    if not fused(q):
        return block_forward(q, k, v, _mask(q.shape[-2], k.shape[-2], causal, q.device))
    return _flash(q, k, v, causal)


def span_backward(q: Tensor, k: Tensor, v: Tensor, causal: bool, do: Tensor, out: Tensor, lse: Tensor,
                  delta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dQ, dK, dV) of a span against the final output `out`, L `lse` and D `delta` of its rows."""
    if not fused(q):
        return block_backward(q, k, v, _mask(q.shape[-2], k.shape[-2], causal, q.device), do, lse, delta)
    return _flash_backward(q, k, v, causal, do, out, lse)


def masked_forward(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, tile: int = TILE_ELEMENTS
                   ) -> tuple[Tensor, Tensor]:
    """block_forward of a block under an arbitrary mask (sliding windows): on CPU by query tiles of at most `tile`
    scores, each through the fused kernel on the box of key columns its rows see (a window's band: rows x (rows + w)),
    with the box's mask as an additive -inf bias; a row that sees no key gets output 0 and L = -inf (the kernel gives
    L = 0 there), a tile that sees none is not run."""
    if not fused(q):
        return block_forward(q, k, v, allowed, tile)
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])
    lse = q.new_full((*q.shape[:-1], 1), float("-inf"))
    for rows, cols, box in _boxes(q, allowed, tile):
        o, l_t = _flash(q[..., rows, :], k[..., cols, :], v[..., cols, :], False, _bias(box, q))
        out[..., rows, :] = o
        lse[..., rows, :] = l_t.masked_fill(~box.any(1, keepdim=True), float("-inf"))
    return out, lse


def masked_backward(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, do: Tensor, out: Tensor, lse: Tensor,
                    delta: Tensor, tile: int = TILE_ELEMENTS) -> tuple[Tensor, Tensor, Tensor]:
    """block_backward of a masked block against the final out, L and D of its rows, by masked_forward's boxes (a row
    that sees no key of the box: its scores are -inf, so it adds nothing whatever its final L)."""
    if not fused(q):
        return block_backward(q, k, v, allowed, do, lse, delta, tile)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for rows, cols, box in _boxes(q, allowed, tile):
        g_q, g_k, g_v = _flash_backward(q[..., rows, :], k[..., cols, :], v[..., cols, :], False, do[..., rows, :],
                                        out[..., rows, :], lse[..., rows, :], _bias(box, q))
        dq[..., rows, :] += g_q
        dk[..., cols, :] += g_k
        dv[..., cols, :] += g_v
    return dq, dk, dv


def _bias(box: Tensor, like: Tensor) -> Tensor:
    """A boolean mask as the fused kernel takes it: 0 where visible, -inf elsewhere, in the operands' dtype."""
    return torch.zeros(box.shape, dtype=like.dtype, device=like.device).masked_fill(~box, float("-inf"))


def _boxes(q: Tensor, allowed: Tensor, tile: int) -> list[tuple[slice, slice, Tensor]]:
    """(query rows, key columns, their mask) of each query tile that sees a key: the columns from its first visible
    key to its last."""
    out = []
    for rows in _row_tiles(q, allowed.shape[-1], tile):
        seen = allowed[rows].any(0).nonzero()
        if seen.numel():
            cols = slice(int(seen[0]), int(seen[-1]) + 1)
            out.append((rows, cols, allowed[rows, cols]))
    return out


# --- explicit scores (masked blocks; devices without the fused kernel) -----------------------------------------
def _scores(q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s.masked_fill(~allowed, float("-inf"))


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


__all__ = ["TILE_ELEMENTS", "Span", "block_backward", "block_forward", "causal_span", "fused", "masked_backward",
           "masked_forward", "merge", "span_backward", "span_forward"]
