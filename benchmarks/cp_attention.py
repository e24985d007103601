"""The executor's context-parallel attention core on this machine: one cp rank's blocks, forward and backward.

One process, one thread, no exchange (the ring's bytes do not change: tests/test_context_parallel.py), so the
figures are the attention compute a cp rank runs per layer and micro-batch. For each cp rank i of a sequence of s
tokens (rank i holds chunks i and 2 cp - 1 - i), its n = s / cp queries against every rank's keys:
- "whole masked": every block computed whole with its causal mask by explicit scores (query tiles of at most
  attention_blocks.TILE_ELEMENTS scores): what the executor ran before causal spans (and still runs for blocks
  under a sliding window, and off CPU);
- "spans": each block's causal span only (attention_blocks.causal_span) through the kernel the executor runs on
  this device (CPU: torch's fused flash kernel);
- "SDPA whole sequence / cp": torch's causal SDPA of the whole sequence (no cp), forward and backward, divided
  by cp: the per-rank share of the same work without context parallelism, the bound a cp core can approach.
Prints seconds per rank (mean over ranks and --repeats) and ratios, side by side.
`--window W`: instead, a sliding window's live blocks, explicit masked scores (before) against the fused kernel on
each query tile's band of keys (attention_blocks.masked_forward, the executor now).
Usage: python benchmarks/cp_attention.py [--seq 8192] [--cp 2] [--heads 4] [--head-dim 64] [--repeats 2]
       [--window W]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from paracube.executor.layers import attention_blocks as blocks
from paracube.executor.layers.attention_mask import visible
from paracube.executor.layers.context_parallel import chunk_positions


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: list[torch.Tensor], i: int,
            window: int | None = None, fused: bool = False) -> None:
    """Rank i's blocks whole with their masks (causal, or within `window`), forward then backward (the ring's order;
    no exchange; a block no query sees skipped, as the ring skips it): explicit scores, or (`fused`) the band boxes
    of attention_blocks.masked_forward."""
    out = lse = None
    masks = [visible(pos[i], pos[j], window) for j in range(len(pos))]
    live = [j for j in ((i - step) % len(pos) for step in range(len(pos))) if bool(masks[j].any())]
    for j in live:
        fwd = blocks.masked_forward if fused else blocks.block_forward
        o, lj = fwd(q, k[j], v[j], masks[j])
        out, lse = (o, lj) if out is None else blocks.merge(out, lse, o, lj)  # type: ignore[arg-type]
    do = torch.randn_like(out)  # type: ignore[arg-type]
    delta = (do * out).sum(-1, keepdim=True)  # type: ignore[operator]
    for j in live:
        if fused:
            blocks.masked_backward(q, k[j], v[j], masks[j], do, out, lse, delta)  # type: ignore[arg-type]
        else:
            blocks.block_backward(q, k[j], v[j], masks[j], do, lse, delta)  # type: ignore[arg-type]


def _spans(q: torch.Tensor, k: list[torch.Tensor], v: list[torch.Tensor], cp: int, i: int) -> None:
    """Rank i's causal spans, forward then backward."""
    n = q.shape[-2]
    out = lse = None
    for step in range(cp):
        j = (i - step) % cp
        rows, cols, causal = blocks.causal_span(cp, i, j, n)
        o, lj = blocks.span_forward(q[..., rows, :], k[j][..., cols, :], v[j][..., cols, :], causal)
        if out is None or lse is None:
            out, lse = o, lj
        else:
            out[..., rows, :], lse[..., rows, :] = blocks.merge(out[..., rows, :], lse[..., rows, :], o, lj)
    do = torch.randn_like(out)  # type: ignore[arg-type]
    delta = (do * out).sum(-1, keepdim=True)  # type: ignore[operator]
    for j in range(cp):
        rows, cols, causal = blocks.causal_span(cp, i, j, n)
        blocks.span_backward(q[..., rows, :], k[j][..., cols, :], v[j][..., cols, :], causal, do[..., rows, :],
                      out[..., rows, :], lse[..., rows, :], delta[..., rows, :])  # type: ignore[index]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--window", type=int, default=None, help="sliding window: its blocks, explicit vs band boxes")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    s, cp, d = a.seq, a.cp, a.head_dim
    qs, ks, vs = (torch.randn(1, a.heads, s, d) for _ in range(3))
    pos = [chunk_positions(s, cp, i) for i in range(cp)]
    k = [ks[:, :, p].contiguous() for p in pos]
    v = [vs[:, :, p].contiguous() for p in pos]
    q = [qs[:, :, p].contiguous() for p in pos]

    def timed(fn: object) -> float:
        t0 = time.perf_counter()
        for _ in range(a.repeats):
            fn()  # type: ignore[operator]
        return (time.perf_counter() - t0) / a.repeats

    def sdpa() -> None:
        x = qs.clone().requires_grad_()
        F.scaled_dot_product_attention(x, ks, vs, is_causal=True).backward(torch.randn_like(qs))

    if a.window is not None:
        before = sum(timed(lambda i=i: _masked(q[i], k, v, pos, i, a.window)) for i in range(cp)) / cp
        now = sum(timed(lambda i=i: _masked(q[i], k, v, pos, i, a.window, True)) for i in range(cp)) / cp
        print(f"seq {s}, cp {cp}, window {a.window}, {a.heads} heads of {d}, fp32, 1 thread: seconds per cp rank, "
              "forward + backward of its live blocks")
        print(f"  explicit masked scores (before)  {before:8.3f} s   {before / now:5.2f} x now")
        print(f"  fused band boxes (executor now)  {now:8.3f} s   1.00 x now")
        return
    masked = sum(timed(lambda i=i: _masked(q[i], k, v, pos, i)) for i in range(cp)) / cp
    spans = sum(timed(lambda i=i: _spans(q[i], k, v, cp, i)) for i in range(cp)) / cp
    whole = timed(sdpa) / cp
    print(f"seq {s}, cp {cp}, {a.heads} heads of {d}, fp32, 1 thread: seconds per cp rank, forward + backward")
    print(f"  whole masked (before)        {masked:8.3f} s   {masked / spans:5.2f} x spans")
    print(f"  spans (executor now)         {spans:8.3f} s   1.00 x spans")
    print(f"  SDPA whole sequence / cp     {whole:8.3f} s   {whole / spans:5.2f} x spans")


if __name__ == "__main__":
    main()
