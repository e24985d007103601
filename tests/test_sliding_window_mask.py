"""Sliding-window attention's mask (executor/layers/attention_mask.py) and the serial reference it masks, in one
process: the mask against a naive per-query rule (key j visible to query i iff i - w < j <= i, same sequence) on
whole sequences, on a flat token block straddling two sequences (tokens.window_mask) and on context parallelism's
load-balanced chunk positions (chunks i and 2 cp - 1 - i); the serial attention kernels (flash and unfused, GPT's,
llama's GQA and MLA's) against attention computed query by query over exactly those keys (fp64, rel 1e-12: the
same sums in another order, ~1e-16 apart); and a window covering the sequence BIT-IDENTICAL to no window (the
same ops in the same order: torch.equal on the loss and every gradient, both kernels, every family)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from dist_helpers import F64, rel_err

from paracube.executor import build_model
from paracube.executor.layers.attention_blocks import block_forward, merge
from paracube.executor.layers.attention_mask import effective_window, ranges_meet, sequence_mask, visible
from paracube.executor.layers.context_parallel import chunk_positions, chunk_ranges
from paracube.executor.layers.functional import local_attention
from paracube.executor.layers.llama import gqa_attention, rotary, rotary_tables
from paracube.executor.layers.tokens import window_mask
from paracube.executor.mesh import Mesh
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import ModelSpec

WINDOWS = [1, 3, 8, 31, 32, 40, None]
LLAMA_W = ModelSpec("swa-llama", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, family="llama",
                    kv_heads=2, sliding_window=8, window_pattern="WF")
GPT_W = ModelSpec("swa-gpt", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, sliding_window=8,
                  window_pattern="WF")
MLA_W = replace(PRESETS["tiny-mla"], name="swa-mla", seq_len=32, sliding_window=8, window_pattern="WF")


def naive(q_pos: list[int], k_pos: list[int], w: int | None, s: int | None = None) -> torch.Tensor:
    """The contract, one pair at a time: same sequence (global indices // s), i - w < j <= i."""
    return torch.tensor([[(s is None or i // s == j // s) and j <= i and (w is None or i - w < j) for j in k_pos]
                         for i in q_pos])


@pytest.mark.parametrize("w", WINDOWS)
def test_mask_of_whole_sequences_and_split_blocks_is_the_naive_rule(w: int | None) -> None:
    s = 32
    got = sequence_mask(s, w, torch.device("cpu"))
    want = naive(list(range(s)), list(range(s)), w)
    if w is not None and w < s:
        assert torch.equal(got, want)
    else:  # a window covering the sequence hides nothing: the caller's plain causal path
        assert got is None and effective_window(w, s) is None
        assert torch.equal(want, torch.ones(s, s, dtype=torch.bool).tril())
    # a flat block of 24 queries (tokens 40..63) over keys from its first sequence's start (32): two sequences
    q0, k0 = 40, 32
    got = window_mask((q0, k0, s), 24, 32, torch.device("cpu"), w)
    assert torch.equal(got, naive(list(range(q0, q0 + 24)), list(range(k0, k0 + 32)), w, s))
    # a block straddling two sequences (tokens 24..47 of s = 32, keys from 0)
    got = window_mask((24, 0, s), 24, 48, torch.device("cpu"), w)
    assert torch.equal(got, naive(list(range(24, 48)), list(range(48)), w, s))


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("w", WINDOWS)
def test_mask_on_context_parallel_chunks_is_the_naive_rule(cp: int, w: int | None) -> None:
    """Every cp rank's queries against every rank's keys by global position; `ranges_meet` (which blocks a ring
    rank computes) equals 'some pair visible'."""
    s = 32
    for i in range(cp):
        qp = chunk_positions(s, cp, i)
        assert qp.tolist() == [p for a, b in chunk_ranges(s, cp, i) for p in range(a, b)]
        for j in range(cp):
            kp = chunk_positions(s, cp, j)
            got = visible(qp, kp, effective_window(w, s))
            assert torch.equal(got, naive(qp.tolist(), kp.tolist(), w))
            meets = any(ranges_meet(q, k, effective_window(w, s)) for q in chunk_ranges(s, cp, i)
                        for k in chunk_ranges(s, cp, j))
            assert meets == bool(got.any())
    # the window of 8 over cp = 4 chunks of 4 leaves whole blocks out (the ring skips their compute)
    assert not any(ranges_meet(q, k, 8) for q in chunk_ranges(s, 4, 0) for k in chunk_ranges(s, 4, 3))


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int | None) -> torch.Tensor:
    """q, k, v [b, H, s, d] (k, v per query head): each query's softmax over keys i - w < j <= i, one at a time."""
    out = torch.empty_like(q)
    for i in range(q.shape[2]):
        lo = 0 if w is None else max(0, i - w + 1)
        scores = q[:, :, i:i + 1] @ k[:, :, lo:i + 1].transpose(-1, -2) / math.sqrt(q.shape[-1])
        out[:, :, i] = (torch.softmax(scores, -1) @ v[:, :, lo:i + 1])[:, :, 0]
    return out


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("w", [1, 5, 16, None])
def test_serial_kernels_attend_exactly_the_window(flash: bool, w: int | None) -> None:
    """GPT's local_attention (columns [heads, 3, d]) and llama's GQA (2 query heads per kv head, rotary) against
    naive_attention on the same q, k, v, fp64."""
    gen = torch.Generator().manual_seed(3)
    b, s, heads, d = 2, 16, 4, 8
    qkv = torch.randn(b, s, heads * 3 * d, generator=gen, dtype=F64)
    q, k, v = qkv.view(b, s, heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
    assert rel_err(local_attention(qkv, heads, flash, window=w),
                   naive_attention(q, k, v, w).transpose(1, 2).reshape(b, s, heads * d)) < 1e-12
    kv_heads, group = 2, 2
    qkv = torch.randn(b, s, kv_heads * (group + 2) * d, generator=gen, dtype=F64)
    g = qkv.view(b, s, kv_heads, group + 2, d)
    q = g[..., :group, :].reshape(b, s, kv_heads * group, d).transpose(1, 2)
    k = g[..., group, :].transpose(1, 2).repeat_interleave(group, dim=1)
    v = g[..., group + 1, :].transpose(1, 2).repeat_interleave(group, dim=1)
    cos, sin = rotary_tables(s, d, 10000.0, qkv)
    want = naive_attention(rotary(q, cos, sin), rotary(k, cos, sin), v, w).transpose(1, 2).reshape(b, s, -1)
    assert rel_err(gqa_attention(qkv, kv_heads, group, 10000.0, flash, window=w), want) < 1e-12


def test_online_softmax_over_windowed_chunks_equals_the_naive_attention() -> None:
    """context_parallel's block math (block_forward + merge, rank 0's blocks in ring order) with the windowed
    chunk masks equals naive_attention at rank 0's positions; a block outside every window is left out, as the
    ring leaves it, and changes nothing."""
    gen = torch.Generator().manual_seed(4)
    s, cp, w = 32, 4, 8
    q, k, v = (torch.randn(1, 2, s, 8, generator=gen, dtype=F64) for _ in range(3))
    mine = chunk_positions(s, cp, 0)
    out = lse = None
    for j in range(cp):
        pos = chunk_positions(s, cp, j)
        if not any(ranges_meet(a, c, w) for a in chunk_ranges(s, cp, 0) for c in chunk_ranges(s, cp, j)):
            continue
        o, l_j = block_forward(q[:, :, mine], k[:, :, pos], v[:, :, pos], visible(mine, pos, w))
        out, lse = (o, l_j) if out is None else merge(out, lse, o, l_j)
    assert out is not None and rel_err(out, naive_attention(q, k, v, w)[:, :, mine]) < 1e-12


@pytest.mark.parametrize("w", [1, 3, 8, 31])
@pytest.mark.parametrize(("d_v", "tile"), [(8, None), (6, 64), (12, 40)])
def test_fused_windowed_blocks_equal_the_explicit_scores(w: int, d_v: int, tile: int | None) -> None:
    """attention_blocks.masked_forward / masked_backward (CPU: the fused kernel on each query tile's band of keys,
    the mask as a -inf bias) equal block_forward / block_backward (explicit scores, checked against naive attention
    above) on every windowed block of every cp = 4 rank, rows that see no key included (output 0, L = -inf); the
    backward against the merged final out, L and D of the rank, to 1e-12 of the block's largest gradient (with
    w = 1 a query sees only itself: dQ and dK are 0 in exact arithmetic, noise of 1e-16 in the explicit path).
    Widths d_v != d_k (MLA) and tiles of a few rows (the band boxes) too. fp64: the two sum the same terms in other
    orders."""
    from paracube.executor.layers.attention_blocks import (
        TILE_ELEMENTS,
        block_backward,
        masked_backward,
        masked_forward,
    )

    gen = torch.Generator().manual_seed(11)
    s, cp, heads = 32, 4, 2
    q, k = (torch.randn(1, heads, s, 8, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(1, heads, s, d_v, generator=gen, dtype=F64)
    for i in range(cp):
        mine = chunk_positions(s, cp, i)
        blocks = [j for j in ((i - step) % cp for step in range(cp))  # the ring's order: own block first
                  if any(ranges_meet(a, c, w) for a in chunk_ranges(s, cp, i) for c in chunk_ranges(s, cp, j))]
        out = lse = None
        for j in blocks:
            pos, mask = chunk_positions(s, cp, j), visible(mine, chunk_positions(s, cp, j), w)
            o, l_j = masked_forward(q[:, :, mine], k[:, :, pos], v[:, :, pos], mask, tile or TILE_ELEMENTS)
            o_ref, l_ref = block_forward(q[:, :, mine], k[:, :, pos], v[:, :, pos], mask)
            assert rel_err(o, o_ref) < 1e-12
            assert torch.equal(torch.isinf(l_j), torch.isinf(l_ref))
            finite = torch.isfinite(l_ref)
            assert rel_err(l_j[finite], l_ref[finite]) < 1e-12
            out, lse = (o, l_j) if out is None else merge(out, lse, o, l_j)
        assert out is not None and lse is not None
        do = torch.randn(out.shape, generator=gen, dtype=F64)
        delta = (do * out).sum(-1, keepdim=True)
        for j in blocks:
            pos, mask = chunk_positions(s, cp, j), visible(mine, chunk_positions(s, cp, j), w)
            got = masked_backward(q[:, :, mine], k[:, :, pos], v[:, :, pos], mask, do, out, lse, delta,
                                  tile or TILE_ELEMENTS)
            want = block_backward(q[:, :, mine], k[:, :, pos], v[:, :, pos], mask, do, lse, delta)
            for a, b in zip(got, want, strict=True):  # scaled by the block's largest (w = 1: dQ, dK are 0)
                assert (a - b).abs().max() <= 1e-12 * max(1.0, b.abs().max().item())


def _loss_and_grads(spec: ModelSpec, fa: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = build_model(spec, Mesh.single(parse_layout(f"dp=1,fa={fa}")), seed=5)
    gen = torch.Generator().manual_seed(8)
    ids = torch.randint(0, spec.vocab, (2, spec.seq_len), generator=gen)
    labels = torch.randint(0, spec.vocab, (2, spec.seq_len), generator=gen)
    loss, _ = model(ids, labels)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("fa", [1, 0])
@pytest.mark.parametrize("spec", [LLAMA_W, GPT_W, MLA_W], ids=["llama", "gpt", "mla"])
def test_a_window_covering_the_sequence_is_bit_identical_to_none(spec: ModelSpec, fa: int) -> None:
    """window = seq_len and window > seq_len against no window: equal loss and gradients, bit for bit; the
    model's own window (8) changes the loss (the window is applied at all)."""
    loss, grads = _loss_and_grads(replace(spec, sliding_window=None, window_pattern=None), fa)
    for w in (spec.seq_len, 4 * spec.seq_len):
        loss_w, grads_w = _loss_and_grads(replace(spec, sliding_window=w, window_pattern=None), fa)
        assert torch.equal(loss_w, loss)
        assert all(torch.equal(grads_w[n], g) for n, g in grads.items())
    assert not torch.equal(_loss_and_grads(spec, fa)[0], loss)


@pytest.mark.parametrize("spec", [LLAMA_W, GPT_W, MLA_W], ids=["llama", "gpt", "mla"])
def test_each_block_takes_the_window_of_its_pattern(spec: ModelSpec) -> None:
    """Pattern "WWF" over 4 blocks: blocks 0, 1, 3 windowed, block 2 full (ModelSpec.attention_window)."""
    spec = replace(spec, layers=4, window_pattern="WWF")
    model = build_model(spec, Mesh.single(), seed=5)
    assert [b.attn.window for b in model.blocks] == [8, 8, None, 8]
