"""The flat token layout of the 2D, 2.5D and 3D modes, and attention over a sequence split across ranks.

A micro-batch's ids [b, s] are flattened batch-major to T = b s tokens; the mode's declaration
(paracube/modes: `token_axes` for the block layout, `attention_token_axes` for the qkv output and the head)
names the mesh axes (major -> minor) that split them, and a rank holds one contiguous block of T / n tokens:
whole sequences (n | b) or part of one sequence (b | n and n / b | s; modes.base.tokens_split_ok), so any
micro-batch whose tokens divide that way runs, even b < n (b = 1 included).

Attention over a split sequence (n / b ranks per sequence): each rank keeps its c = T / n queries and
all-gathers the keys and values of its heads over the smallest minor group of the attention axes whose ranks
hold whole sequences (modes.base.kv_gather_groups; the gradients are reduce-scattered back in backward),
then attends to its sequence's keys from the sequence's first token to its own last one: span = o + c keys,
queries at positions o .. o + c - 1 of the sequence (causal, aligned lower-right). The rank holding the end
of a sequence attends to all s keys, as a rank holding whole sequences does: per-rank work and the
attention's saved bytes match the whole-sequence case at its largest. This is the all-gather form of context
parallelism (Megatron-core's `cp_comm_type="all_gather"`, Llama 3's), applied to the tensor group's own
token split, so no new mesh axis is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from paracube.executor.comm import gather_fn
from paracube.executor.mesh import Mesh
from paracube.executor.shards import block
from paracube.modes.base import kv_gather_groups, sequence_pieces


def local_positions(mesh: Mesh, axes: tuple[str, ...], T: int, s: int, device: torch.device) -> Tensor:
    """Positions in their sequences of this rank's block of the T flattened tokens split over `axes`."""
    start, size = block(T, mesh, axes)
    return (start + torch.arange(size, device=device)) % s


@dataclass(frozen=True)
class SequenceSplit:
    """How one rank's c = T / n tokens in the attention layout meet their sequences (s tokens each):
    `whole` (c a multiple of s), or part of one sequence whose keys and values it gathers over `group` and
    reads rows [lo, hi) of the gathered tensor: its sequence's first token up to its own last."""

    c: int
    s: int
    whole: bool
    group: tuple[str, ...] = ()
    lo: int = 0
    hi: int = 0

    @classmethod
    def of(cls, mesh: Mesh, axes: tuple[str, ...], c: int, s: int) -> SequenceSplit:
        n = mesh.size(axes)
        pieces = int(sequence_pieces(c * n, s, n))
        if pieces == 1:
            return cls(c, s, True)
        hits = kv_gather_groups(axes, {a: mesh.size((a,)) for a in axes}, pieces)
        group = next(g for g, hit in hits if hit)
        index, in_group = mesh.index(axes), mesh.index(group)
        sequence_start, group_start = index * c // s * s, (index - in_group) * c
        return cls(c, s, False, group, sequence_start - group_start, (in_group + 1) * c)

    def queries(self, qkv: Tensor) -> Tensor:
        """[c, w] -> [sequences, tokens, w]: whole sequences, or the one piece of a sequence this rank holds."""
        return qkv.view(-1, self.s, qkv.shape[-1]) if self.whole else qkv.view(1, self.c, qkv.shape[-1])

    def keys_values(self, qkv: Tensor, groups: int, per_group: int, mesh: Mesh) -> Tensor | None:
        """None for whole sequences; else [1, span, groups, 2, d]: the sequence's keys and values up to this
        rank's last token, gathered over `group` (qkv columns [groups, per_group + 2, d]: per group its
        query heads, then its key and its value)."""
        if self.whole:
            return None
        d = qkv.shape[-1] // (groups * (per_group + 2))
        kv = qkv.view(self.c, groups, per_group + 2, d)[:, :, per_group:, :].reshape(self.c, groups * 2 * d)
        gathered = gather_fn(kv, mesh, self.group, 0, label="attn.kv")
        # A copy of the window: backward keeps span rows, not the whole gathered group's
        return gathered[self.lo:self.hi].contiguous().view(1, self.hi - self.lo, groups, 2, d)

    def output(self, out: Tensor) -> Tensor:
        """[sequences, tokens, w] -> the flat [c, w] layout."""
        return out.reshape(self.c, out.shape[-1])


__all__ = ["SequenceSplit", "local_positions"]
