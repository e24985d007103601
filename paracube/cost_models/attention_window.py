"""Sliding-window and chunked attention priced: the share of causal attention's score work a flash kernel does.

Contract (workload.ModelSpec): in a windowed block the query at position i sees the keys i - w < j <= i (w =
`sliding_window`, itself included; Megatron `--window-size (w - 1, 0)`); `window_pattern` says which blocks are
windowed (Dims.window; Dims.window_frac, the share of the blocks windowed).

Chunked attention (Llama 4, ModelSpec.attention_chunk; Dims.chunked): the query at i sees the keys
floor(i / c) c <= j <= i (attention_chunk.py), the same machinery with the row's first key at the start of its chunk
instead of i - w + 1 (`first_key`): a whole chunk of c tokens has c (c + 1) / 2 pairs,
    chunk_pairs(s, c) = n c (c + 1) / 2 + r (r + 1) / 2      (s = n c + r; causal for c >= s)   (`band_pairs`)
its blocks "windowed" in Dims' terms (window = c, window_frac the share of rope blocks, window_pattern W at rope
blocks and F at NoPE blocks), so the per-stage pricing (window_stages.py) and everything below hold unchanged. With c
a multiple of the tile (Llama 4: 8192) no query tile straddles two chunks: the tiles are the exact chunks' diagonal
tiles (FlexAttention's block mask for a fixed-block AND causal mask, torchtitan models/common/attention.py
get_fixed_block_mask_mod, visits the same). Under context parallelism the chunks put different loads on the cp ranks
(a rank's load-balanced chunks may straddle attention-chunk boundaries): the busiest rank's tiles, as for windows.

Exact band: a windowed block's scores are sum over queries of min(i + 1, w) key-query pairs,
    band(s, w) = w s - w (w - 1) / 2        (w <= s; s (s + 1) / 2, causal, for w >= s)      (`band_pairs`)
against s (s + 1) / 2 for causal attention.

Tiles: a flash kernel computes whole tiles of Bq queries x Bk keys, masking inside them; for a local (windowed)
mask it visits, per query tile, the key tiles the band of any of its rows meets (FlashAttention-2's
n_block_min / n_block_max for Is_local; the causal kernel likewise computes its diagonal tiles whole). TILE = 128 x
128 is FlashAttention-2's forward tile for head widths 64 without dropout (flash_fwd_launch_template.h,
run_mha_fwd_hdim64: Flash_fwd_kernel_traits<64, 128, 128, ...>), as we recall it: flash-attn is not installed
here to check, and cuDNN's fused attention (Transformer Engine's default on Hopper) does not publish its tiles.
At w = 128, s = 4096 the band's tiles are 63 of the causal kernel's 528 (0.119), where the exact band is 0.062 of
the causal pairs: a windowed query tile meets its own key tile and the one before.

Price: the causal kernel's score GEMMs (compute.attention_core_time: FLASH_CAUSAL of the s x s work, at the fitted
flash_eff, fitted on causal runs whose kernels compute their diagonal tiles too) scaled by
    share = 1 - f + f x tiles(w) / tiles(causal)          (f = Dims.window_frac: the model's windowed blocks)
so each computed tile costs what a causal tile costs, and w >= s (or no window) is exactly the causal price
(share 1.0). f is the model's mean share; a pipeline stage holds its own blocks, each priced at its own share (f = 1
windowed, 0 full: cost_models/window_stages.py). The unfused core (fa=0, Megatron's unfused path,
transformer/dot_product_attention.py with utils.get_sliding_window_causal_mask) materialises the s x s scores and
masks them: its price is unchanged by the window.

Context parallelism (Dims.cp > 1, load-balanced chunks i and 2 cp - 1 - i of c = s / (2 cp) tokens,
modes/context.py): a rank's work is the band tiles of its two chunks' queries (key tiles on the sequence's grid);
unlike causal attention the ranks differ (rank 0 holds the first w queries, which see fewer keys), so the share is
the busiest rank's tiles over its causal tiles (cp equal ranks under causal attention). The key / value exchange
is unchanged: the executor (and Transformer Engine) exchange every block, masked.

Unchanged by windows: memory (flash keeps no s x s tensor; the unfused core's scores and mask, memory.py, are still
s x s) and the model FLOPs of MFU (model_flops.model_flops_per_step keeps its 4 b s^2 h per block convention, windowed
blocks included, as torchtitan's and Megatron-LM's FLOP counts do, so MFU stays comparable across models; it is not
the work done).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from paracube.cost_models.dims import Dims

TILE = 128  # a flash kernel's query and key tile (module docstring: FlashAttention-2, head width 64)


def band_pairs(s: int, w: int, chunked: bool = False) -> int:
    """Key-query pairs of causal attention over s positions with window w, or attention chunks of w tokens
    (`chunked`) (module docstring, closed forms)."""
    if w >= s:
        return s * (s + 1) // 2
    if chunked:
        n, r = divmod(s, w)
        return n * w * (w + 1) // 2 + r * (r + 1) // 2
    return w * s - w * (w - 1) // 2


def first_key(q: np.ndarray, w: int, chunked: bool = False) -> np.ndarray:
    """The first key the query at position q sees: the start of its chunk (`chunked`) or of its window."""
    return (q // w) * w if chunked else np.maximum(0, q - w + 1)


def chunk_work(q0: int, q1: int, w: int, tile: int = TILE, chunked: bool = False) -> int:
    """Score entries a flash kernel computes for the queries q0 <= i < q1 under window (or attention chunk) w: query
    tiles from q0, per query tile the key tiles (of the sequence's grid) its rows' bands meet, each whole; tile 1: the
    exact band. (A query tile's rows see the keys from its first row's first key to its last row: first_key grows
    with the row in both masks.)"""
    starts = np.arange(q0, q1, tile, dtype=np.int64)
    ends = np.minimum(starts + tile, q1) - 1  # each query tile's last row
    first = first_key(starts, w, chunked)  # the first key its first row sees
    keys = (ends - first + 1) if tile == 1 else (ends // tile - first // tile + 1) * tile
    return int(((ends - starts + 1) * keys).sum())


def rank_work(s: int, cp: int, rank: int, w: int, tile: int = TILE, chunked: bool = False) -> int:
    """chunk_work of one cp rank's queries: chunks rank and 2 cp - 1 - rank of s / (2 cp) (the whole s at cp = 1)."""
    if cp == 1:
        return chunk_work(0, s, w, tile, chunked)
    c = s // (2 * cp)
    return sum(chunk_work(k * c, (k + 1) * c, w, tile, chunked) for k in (rank, 2 * cp - 1 - rank))


@lru_cache(maxsize=256)
def band_fraction(s: int, cp: int, w: int, tile: int = TILE, chunked: bool = False) -> float:
    """The busiest cp rank's windowed (chunked) tiles over its causal tiles (1.0 for w >= s): one masked block's
    share."""
    if w >= s:
        return 1.0
    return (max(rank_work(s, cp, r, w, tile, chunked) for r in range(cp))
            / max(rank_work(s, cp, r, s, tile) for r in range(cp)))


def window_share(d: Dims) -> float:
    """The share of the causal flash kernel's score work one block of `d` does on average (module docstring); exactly
    1.0 without windows (chunks) or with windows (chunks) no shorter than the sequence."""
    s = d.s * d.cp  # the whole sequence (d is a cp rank's view)
    if not d.window or not d.window_frac or d.window >= s:
        return 1.0
    return 1.0 - d.window_frac + d.window_frac * band_fraction(s, d.cp, d.window, TILE, d.chunked)


__all__ = ["TILE", "band_fraction", "band_pairs", "chunk_work", "first_key", "rank_work", "window_share"]
