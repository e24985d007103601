"""The attention sinks' gradient sum (ModelSpec.attention_sinks, GPT-OSS; executor/layers/sinks.py runs it): declared
once, read by the cost model's explicit list (cost_models/traffic.py) and its per-(kind, axes) sums (comm.py), so
both engines price what the executor records.

Each rank holds the whole s [heads] and its gradient covers its own query heads and tokens: per block and micro-batch
one all_reduce of `heads` fp32 values (4 heads bytes) in backward over each of base.replica_grad_groups: the tensor
axes less the mode's grad_axes (those the step's gradient all-reduce sums: dp; 2.5D's dep), as one group where that is
the whole tensor group (1D: tp; 2D: row x col; 3D: x y z), else one per axis (2.5D: row, col). A few hundred bytes,
latency bound; its parameters (heads per block on every rank) are counted by cost_models/dims.py.
"""

from __future__ import annotations

from typing import Any

from paracube.modes.base import TensorMode, replica_grad_groups
from paracube.modes.collective import F32, Collective, Sizes, coll
from paracube.modes.context import attention_unit


def sink_collectives(d: Any, mode: TensorMode) -> list[Collective]:
    """A block's backward all_reduces of the sinks' gradient (none without sinks)."""
    if not getattr(d, "sinks", False):
        return []

    def payload(z: Sizes) -> int:
        return 4 * d.heads

    label = f"{attention_unit(mode)}.sinks"
    return [coll("all_reduce", axes, F32, payload, label, "bwd") for axes in replica_grad_groups(mode)]


__all__ = ["sink_collectives"]
