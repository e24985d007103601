"""The flat token layout of the 2D, 2.5D and 3D modes, and attention over sequences split across ranks.

A micro-batch's ids [b, s] are flattened batch-major to T = b s tokens; the mode's declaration
(paracube/modes: `token_axes` for the block layout, `attention_token_axes` for the qkv output and the head)
names the mesh axes (major -> minor) that split them, and a rank holds one contiguous block of c = T / n
tokens: whole sequences, part of one, or the end of one and the start of the next. Any micro-batch whose
token count divides runs (modes.base.tokens_split_ok), b = 1 included.

Attention where a rank's block is not whole sequences: each rank keeps its c queries and all-gathers the keys
and values of its heads over the smallest minor group of the attention axes whose ranks hold whole sequences
(a group of g consecutive blocks with g c % s == 0: modes.base.kv_gather_groups; their gradients are
reduce-scattered back in backward). It attends over the window of keys from the start of its first token's
sequence to its last token (at most c + s - gcd(c, s) keys, s when c divides s: modes.base.key_window), masked
to the query's own sequence and causal. This is the all-gather form of context parallelism (Megatron-core's
`cp_comm_type="all_gather"`, Llama 3's), applied to the tensor group's own token split, so no mesh axis is
added. When c divides s the mask is the lower-right causal one and the rank holding a sequence's end does the
work of a whole-sequence rank; a block straddling two sequences computes the masked scores of its window.
A block with a sliding window (ModelSpec.attention_window) masks by the same global indices (attention_mask.py);
the gathered window of keys is unchanged, so the bytes stay the priced ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from paracube.executor.comm import gather_fn
from paracube.executor.layers.attention_mask import effective_window, visible
from paracube.executor.layers.shards import block
from paracube.executor.mesh import Mesh
from paracube.modes.base import kv_gather_groups, sequence_pieces

Geometry = tuple[int, int, int]  # (global index of the first query, of the first key, tokens per sequence)


def local_positions(mesh: Mesh, axes: tuple[str, ...], T: int, s: int, device: torch.device) -> Tensor:
    """Positions in their sequences of this rank's block of the T flattened tokens split over `axes`."""
    start, size = block(T, mesh, axes)
    return (start + torch.arange(size, device=device)) % s


def window_mask(geometry: Geometry, queries: int, keys: int, device: torch.device,
                sliding: int | None = None) -> Tensor:
    """[queries, keys] booleans: key j visible to query i (same sequence, not after it, within the block's
    sliding window or attention chunk `sliding`: attention_mask.visible on positions in their sequences)."""
    q0, k0, s = geometry
    q = q0 + torch.arange(queries, device=device)
    k = k0 + torch.arange(keys, device=device)
    return visible(q % s, k % s, effective_window(sliding, s)) & (k.unsqueeze(0) // s == q.unsqueeze(-1) // s)


def window_positions(geometry: Geometry, queries: int, keys: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Positions in their sequences of the queries and of the window's keys (rotary embeddings)."""
    q0, k0, s = geometry
    return ((q0 + torch.arange(queries, device=device)) % s, (k0 + torch.arange(keys, device=device)) % s)


@dataclass(frozen=True)
class SequenceSplit:
    """How one rank's c = T / n tokens in the attention layout meet their sequences (s tokens each): `whole`
    (c a multiple of s), or not: it gathers keys and values over `group` and reads rows [lo, hi) of the
    gathered tensor, its first token's sequence start up to its own last token (`geometry`: global indices)."""

    c: int
    s: int
    whole: bool
    group: tuple[str, ...] = ()
    lo: int = 0
    hi: int = 0
    geometry: Geometry = (0, 0, 0)

    @classmethod
    def of(cls, mesh: Mesh, axes: tuple[str, ...], c: int, s: int) -> SequenceSplit:
        n = mesh.size(axes)
        pieces = int(sequence_pieces(c * n, s, n))
        if pieces == 1:
            return cls(c, s, True)
        hits = kv_gather_groups(axes, {a: mesh.size((a,)) for a in axes}, pieces)
        group = next(g for g, hit in hits if hit)
        index, in_group = mesh.index(axes), mesh.index(group)
        first = index * c
        sequence_start, group_start = first // s * s, (index - in_group) * c
        return cls(c, s, False, group, sequence_start - group_start, (in_group + 1) * c,
                   (first, sequence_start, s))

    def queries(self, qkv: Tensor) -> Tensor:
        """[c, w] -> [sequences, s, w] (whole sequences) or [1, c, w]."""
        return qkv.view(-1, self.s, qkv.shape[-1]) if self.whole else qkv.view(1, self.c, qkv.shape[-1])

    def keys_values(self, qkv: Tensor, groups: int, per_group: int, mesh: Mesh) -> Tensor | None:
        """None for whole sequences; else [1, window, groups, 2, d]: the keys and values from this rank's first
        token's sequence start to its last token, gathered over `group` (qkv columns [groups, per_group + 2, d]:
        per group its query heads, then its key and its value)."""
        if self.whole:
            return None
        d = qkv.shape[-1] // (groups * (per_group + 2))
        kv = qkv.view(self.c, groups, per_group + 2, d)[:, :, per_group:, :].reshape(self.c, groups * 2 * d)
        gathered = gather_fn(kv, mesh, self.group, 0, label="attn.kv")
        window = gathered[self.lo:self.hi]
        if window.shape[0] < gathered.shape[0]:  # a copy: backward keeps the window's rows, not the group's
            window = window.clone()
        return window.view(1, self.hi - self.lo, groups, 2, d)

    def output(self, out: Tensor) -> Tensor:
        """[sequences, tokens, w] -> the flat [c, w] layout."""
        return out.reshape(self.c, out.shape[-1])


__all__ = ["Geometry", "SequenceSplit", "local_positions", "window_mask", "window_positions"]
