"""The small exchanges of a MoE step besides dispatch and combine, declared once for the traffic list
(moe_traffic.py, held equal to what the executor records) and for both engines' pricing (moe.py's block_cost and
stage_cost; the event engine inserts the same events, moe_program.py).

Per MoE block, micro-batch and forward (again in a full recomputation), on a rank of E routed experts
(executor/model/moe.py, executor/layers/experts.py):
- `moe.counts`: with ep > 1, one all_to_all over ep of the E int64 copy counts (ep x E / ep: what this rank sends
  to each local expert of each peer), before the dispatch; the receivers size their buffers with it
  (Megatron-core's MoEAlltoAllTokenDispatcher exchanges the same counts);
- `moe.etp_counts`: with etp > 1, one all_gather over etp of the E int64 counts each rank received (its etp peers
  size and order the copies they gather by them; Megatron-core gathers its counts over the tp x ep group instead,
  token_dispatcher.py l.538-543);
- `moe.aux_counts`: with an aux loss where a sequence is split (cp > 1, and / or sp over a tensor group of t > 1),
  one all_reduce of the [b, E] per-sequence copy counts over the ranks holding its parts (modes/experts.
  aux_count_axes: cp then the tensor axes, Megatron-core's tp_cp group), in the statistics dtype (fp32; fp64 for an
  fp64 model).
Per step, zero=0 with ep > 1: `grad_norm.experts`, one fp32 all_reduce over ep of the experts' squared gradient
norm (with etp > 1 another over etp) before the step's grad-norm all_reduce (zero=1 sums the experts' shards in the
distributed optimizer's norm).
All are latency-bound (8 E, 4 b E and 4 bytes); each is priced in line (nothing overlaps it: the dispatch waits
on the counts, the norm on the gradients).
"""

from __future__ import annotations

import math
from typing import Any

from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.experts import aux_count_axes
from paracube.moe_spec import MoESpec


def block_count_events(layout: Layout, moe: MoESpec, mb: int, dtype: str, phase: str,
                       label: str) -> list[CommEvent]:
    """The forward's exchanges of one MoE block before its dispatch (module docstring); `label`: its prefix,
    `layers.<i>.`; `dtype`: the model's compute dtype (the statistics are fp64 for fp64, else fp32)."""
    out = []
    if layout.ep > 1:
        out.append(CommEvent("all_to_all", ("ep",), layout.ep, 8 * moe.experts, "int64", phase, label + "moe.counts"))
    if layout.etp > 1:  # what each etp peer received, gathered (executor/layers/expert_tensor.py)
        out.append(CommEvent("all_gather", ("etp",), layout.etp, 8 * moe.experts * layout.etp, "int64", phase,
                             label + "moe.etp_counts"))
    axes = aux_count_axes(layout)
    if axes and moe.aux_loss:
        stat, size = ("float64", 8) if dtype == "float64" else ("float32", 4)
        n = math.prod(layout.axis_size(a) for a in axes)
        out.append(CommEvent("all_reduce", axes, n, size * mb * moe.experts, stat, phase, label + "moe.aux_counts"))
    return out


def norm_events(layout: Layout, experts_on_stage: Any) -> list[CommEvent]:
    """The experts' squared-norm all_reduces of one step (zero=0, the stage holding experts): over ep, then over etp
    (its shards are distinct elements)."""
    if layout.zero != 0 or not experts_on_stage:
        return []
    return [CommEvent("all_reduce", (a,), n, 4, "float32", "optimizer", "grad_norm.experts")
            for a, n in (("ep", layout.ep), ("etp", layout.etp)) if n > 1]


__all__ = ["block_count_events", "norm_events"]
