"""The per-head q / k norms' gradient sum (Qwen3's q_norm / k_norm; ModelSpec.qk_norm), declared once for every mode.

The two gammas (the head width each) are replicated over the tensor group; each tensor rank's gradient covers its
own heads and tokens only. The executor (executor/layers/head_norm.py: `qk_normed`, copy_to_group) sums them per
block and micro-batch, in backward, with one all_reduce of the two stacked gammas (2 x head width fp32 values) over
each group of base.replica_grad_groups: the mode's tensor axes less its grad_axes (those the step's data-parallel
gradient all-reduce already sums: 2.5D's dep), as one group where that is the whole tensor group (the mesh builds it),
else one per axis (2.5D: row, col). None without tensor axes. Labelled with the mode's attention unit
(context.attention_unit), where the event engine places it.
"""

from __future__ import annotations

from typing import Any

from paracube.modes.base import F32, Collective, TensorMode, coll, replica_grad_groups
from paracube.modes.context import attention_unit


def gamma_grads(d: Any, mode: TensorMode) -> list[Collective]:
    """One block's backward all_reduces of the q / k norms' gamma gradients (none without qk_norm)."""
    if not getattr(d, "qk_norm", False):
        return []
    unit = attention_unit(mode)
    return [coll("all_reduce", axes, F32, lambda z: 4 * 2 * d.head_width, f"{unit}.qk_norm", "bwd")
            for axes in replica_grad_groups(mode)]


__all__ = ["gamma_grads"]
