"""zero=2 / zero=3 for a model with MoE blocks: the FSDP units' collectives of one step on one rank, as paracube's
executor issues them (executor/data_parallel/sharded.py, fsdp.py); cost_models/moe_traffic.py puts them in place of
traffic.stage_events' dense units. Both engines price the expert units' (moe_fsdp.py; tests/test_moe_cost.py holds their
collectives equal to these).

Units (forward order): the embedding, each block (an MoE block's dense parameters: attention, router, shared expert,
gate), an MoE block's routed experts right after it (a unit of their own, sharded over the experts' group:
moe_traffic.expert_axes, edp where ep etp > 1), the final norm + head. Each unit is padded to a multiple of its own
group's size n (modes/buckets.padded_numel) and, per micro-batch (pp > 1: once per step, in the last micro-batch):
- its fp32 gradient reduce-scattered over its group, 4 x padded bytes (the reduce-scatter's input);
- zero=3: all-gathered in the compute dtype before its forward and again before its backward, c x padded bytes,
  except the final unit's backward gather (kept from its forward, pp = 1) and, with tied embeddings on the stage,
  the embedding's (held for the head); pp > 1 gathers every unit before each forward and backward (fsdp.py);
per step: zero=2 all-gathers every unit's updated fp32 shard into the parameters, 4 x padded bytes each.
torchtitan 0.3.0 (distributed/fsdp.py l.209-275) shards an MoE block with one fully_shard and per-parameter meshes,
experts over edp and the rest over dp: FSDP2 issues one all-gather and one reduce-scatter per mesh for it, the
collectives listed here.
"""

from __future__ import annotations

from collections.abc import Callable

from paracube.cost_models.dims import Dims
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.buckets import padded_numel

Unit = tuple[tuple[str, ...], int]  # (the group it shards over, its parameters' numel)


def fsdp_unit_events(layout: Layout, d: Dims, units: list[Unit], n_micro: int, first: bool, last: bool,
                     group: Callable[[tuple[str, ...]], int]) -> list[CommEvent]:
    """The units' collectives of one step (module docstring); `units` in forward order, `group(axes)` the size of a
    group (folded expert axes included)."""
    out: list[CommEvent] = []

    def add(kind: str, axes: tuple[str, ...], payload: int, dtype: str, phase: str, label: str) -> None:
        n = group(axes)
        if n > 1:
            out.append(CommEvent(kind, axes, n, payload, dtype, phase, label))

    padded = [(axes, padded_numel(numel, group(axes))) for axes, numel in units]
    pipelined = layout.pp > 1
    held = 1 if d.tied and first and last and not pipelined else 0  # the head reads the gathered embedding table
    kept = len(padded) if pipelined or not last else len(padded) - 1  # pp = 1: the final unit kept gathered
    for m in range(n_micro):
        if layout.zero == 3:
            for axes, p in padded:
                add("all_gather", axes, d.c * p, d.dtype, "fwd", "units.gather")
            for axes, p in padded[held:kept]:
                add("all_gather", axes, d.c * p, d.dtype, "bwd", "units.gather")
        if pipelined and m != n_micro - 1:
            continue  # accumulated unsharded until the step's last micro-batch (sharded.py)
        for axes, p in padded:
            add("reduce_scatter", axes, 4 * p, "float32", "bwd", "units.rs")
    if layout.zero == 2:
        for axes, p in padded:
            add("all_gather", axes, 4 * p, "float32", "optimizer", "params")
    return out


__all__ = ["fsdp_unit_events"]
