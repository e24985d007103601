"""Grouped-query attention's key / value heads for kernels that want one per query head: `expand` repeats kv head g
to query heads g * group .. g * group + group - 1 (HF repeat_kv's order), `fold` sums those heads' gradients back."""

from __future__ import annotations

from torch import Tensor


def expand(t: Tensor, group: int) -> Tensor:
    """kv heads [b, kv, n, d] -> their query heads' [b, kv * group, n, d] (query head g * group + r reads kv g)."""
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def fold(t: Tensor, group: int) -> Tensor:
    """The query heads' gradient [b, kv * group, n, d] summed back onto their kv heads [b, kv, n, d]."""
    if group == 1:
        return t
    b, h, n, d = t.shape
    return t.view(b, h // group, group, n, d).sum(2)
