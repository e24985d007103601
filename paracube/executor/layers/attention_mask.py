"""Which keys a query attends to: causal, within the block's sliding window, by GLOBAL token position.

The one mask of every attention path of the executor (whole sequences, a sequence split over a tensor group's
token blocks: tokens.py, context parallelism's load-balanced chunks: context_parallel.py). Contract
(ModelSpec.sliding_window / attention_window; transformers' sliding-window mask, Megatron's
`--window-size (w - 1, 0)`): the query at position i sees the key at position j iff

    j <= i  and  i - j < w        (w = the block's window, itself included; None: j <= i, full causal)

with i and j positions in the same sequence. A window at least as long as the sequence hides nothing, so
`effective_window` turns it into None and the caller runs its full causal path unchanged: a model whose window
covers its sequences is bit-identical to the unwindowed one (the same ops in the same order, not merely the
same mask).
"""

from __future__ import annotations

import torch
from torch import Tensor


def effective_window(window: int | None, s: int) -> int | None:
    """The window that masks anything in sequences of s tokens: `window` if shorter than s, else None."""
    return window if window is not None and window < s else None


def visible(q_pos: Tensor, k_pos: Tensor, window: int | None) -> Tensor:
    """[queries, keys] booleans: key at k_pos[j] visible to the query at q_pos[i] (positions in one sequence,
    or global indices of flattened sequences: the caller adds the same-sequence condition)."""
    q, k = q_pos.unsqueeze(-1), k_pos.unsqueeze(0)
    allowed = k <= q
    return allowed if window is None else allowed & (q - k < window)


def ranges_meet(queries: tuple[int, int], keys: tuple[int, int], window: int | None) -> bool:
    """Whether any key of positions [k0, k1) is visible to any query of [q0, q1) (`visible(...).any()` without
    forming the mask): the earliest key must not follow the last query, and the closest pair at or before it
    (gap max(0, q0 - (k1 - 1))) must lie within the window."""
    (q0, q1), (k0, k1) = queries, keys
    if q0 >= q1 or k0 >= k1 or k0 > q1 - 1:
        return False
    return window is None or max(0, q0 - (k1 - 1)) < window


def sequence_mask(s: int, window: int | None, device: torch.device) -> Tensor | None:
    """The [s, s] mask of whole sequences of s tokens, or None where it is plain causal (the callers' own
    is_causal / triangular path; `effective_window`)."""
    w = effective_window(window, s)
    if w is None:
        return None
    pos = torch.arange(s, device=device)
    return visible(pos, pos, w)


__all__ = ["effective_window", "ranges_meet", "sequence_mask", "visible"]
