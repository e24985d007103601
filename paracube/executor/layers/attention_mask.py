"""Which keys a query attends to: causal, within the block's sliding window or attention chunk, by GLOBAL position.

The one mask of every attention path of the executor (whole sequences, a sequence split over a tensor group's
token blocks: tokens.py, context parallelism's load-balanced chunks: context_parallel.py). Contract
(ModelSpec.sliding_window / attention_window; transformers' sliding-window mask, Megatron's
`--window-size (w - 1, 0)`): the query at position i sees the key at position j iff

    j <= i  and  i - j < w        (w = the block's window, itself included; None: j <= i, full causal)

with i and j positions in the same sequence; in a chunked block (Llama 4: the mask is attention_chunk.Chunk(c),
ModelSpec.attention_window; transformers' create_chunked_causal_mask)

    j <= i  and  floor(j / c) == floor(i / c)

A window (chunk) at least as long as the sequence hides nothing, so
`effective_window` turns it into None and the caller runs its full causal path unchanged: a model whose window
covers its sequences is bit-identical to the unwindowed one (the same ops in the same order, not merely the
same mask).
"""

from __future__ import annotations

import torch
from torch import Tensor

from paracube.attention_chunk import Chunk


def effective_window(window: int | None, s: int) -> int | None:
    """The window that masks anything in sequences of s tokens: `window` if shorter than s, else None."""
    return window if window is not None and window < s else None


def visible(q_pos: Tensor, k_pos: Tensor, window: int | None) -> Tensor:
    """[queries, keys] booleans: key at k_pos[j] visible to the query at q_pos[i] (positions in one sequence; the
    caller of several sequences adds the same-sequence condition). `window`: a sliding window, a Chunk, or None."""
    q, k = q_pos.unsqueeze(-1), k_pos.unsqueeze(0)
    allowed = k <= q
    if window is None:
        return allowed
    return allowed & (q // window == k // window) if isinstance(window, Chunk) else allowed & (q - k < window)


def ranges_meet(queries: tuple[int, int], keys: tuple[int, int], window: int | None) -> bool:
    """Whether any key of positions [k0, k1) is visible to any query of [q0, q1) (`visible(...).any()` without
    forming the mask): the earliest key must not follow the last query, and the closest pair at or before it
    (gap max(0, q0 - (k1 - 1))) must lie within the window; chunked: some chunk n (between the chunks of max(q0, k0)
    and of min(q1, k1) - 1) holds a key of the range no later than a query of the range."""
    (q0, q1), (k0, k1) = queries, keys
    if q0 >= q1 or k0 >= k1 or k0 > q1 - 1:
        return False
    if isinstance(window, Chunk):  # some chunk holding a key of the range at or before a query of the range
        c = int(window)
        return any(max(k0, n * c) <= min(q1 - 1, (n + 1) * c - 1)
                   for n in range(max(q0, k0) // c, min(q1 - 1, k1 - 1) // c + 1))
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
