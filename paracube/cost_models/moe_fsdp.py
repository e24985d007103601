"""zero=2 / zero=3 for the routed experts: each MoE block's experts are an FSDP unit of their own, sharded over the
expert-data-parallel group (edp), and their collectives are priced in the step time by both engines.

The units and bytes are the executor's (moe_fsdp_traffic.py; torchtitan 0.3.0 shards the experts so too): the
block's local experts (moe_traffic._expert_sizes: E / ep experts of width f_e / etp, GPT-OSS's biases with them),
padded to a multiple of edp (modes/buckets.padded_numel), p elements. Per MoE block:
- zero=3: all-gathered in the compute dtype before its forward and again before its backward (c p bytes each: the
  expert unit is never the stage's last, which pp = 1 keeps gathered; a recomputed forward runs inside the backward,
  its parameters already gathered);
- its gradient reduce-scattered after its backward, in the runtime's gradient element (Dims.grad_bytes: the expert
  gradients' all_reduce it replaces is priced so), per micro-batch with pp = 1, once a step (the last micro-batch)
  with pipelines, which accumulate unsharded (executor/data_parallel/sharded.py);
- zero=2: once a step, after the optimizer step, the updated fp32 shards all-gathered into the parameters (4 p).
The per-micro-batch ones run in line with the block's compute in both engines: neither prefetches the expert units
yet (the dense units are prefetched one unit ahead with pp = 1, fsdp_overlap.py), so this is an upper bound by their
collective seconds; without it (before 2026-12-04) they were not in the step time at all, and a search ranked
dp = 64 x zero=3 with every expert gathered each micro-batch (qwen3-30b-a3b, torchtitan, 64 H100s) first at 2.46 s.
A pipelined step's reduce-scatter is the step's expert gradient reduction (moe_step.py hides it under the last
backward with `overlap`, as the all_reduce it replaces); zero=2's gather is exposed after the optimizer step.
Memory: one gathered unit's parameters (zero=3, c p) and one unit's unsharded gradient before its reduce-scatter
(grad_bytes p), temporaries alive inside the block.
"""

from __future__ import annotations

from dataclasses import dataclass

from paracube.cost_models.dims import Dims
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.buckets import padded_numel
from paracube.moe_spec import MoESpec

AXES = ("edp",)


@dataclass(frozen=True)
class ExpertUnit:
    """One MoE block's expert-unit collectives (label prefix "layers.0.": the caller relabels per block)."""

    fwd: tuple[CommEvent, ...] = ()  # per micro-batch, before the experts' forward
    bwd_gather: tuple[CommEvent, ...] = ()  # per micro-batch, before the experts' backward
    bwd_scatter: tuple[CommEvent, ...] = ()  # per micro-batch, after the experts' backward
    step: tuple[CommEvent, ...] = ()  # once a step: the pipelined reduce-scatter (the gradient reduction)
    after: tuple[CommEvent, ...] = ()  # once a step, after the optimizer step (zero=2's parameter gather)
    temporaries: float = 0.0  # bytes alive inside the block (module docstring)


def unit_numel(moe: MoESpec, h: int, layout: Layout) -> int:
    """p: one block's local expert elements, padded to a multiple of edp."""
    f = moe.expert_ffn // layout.etp
    per_expert = 3 * h * f + (2 * f + h if moe.expert_bias else 0)
    return padded_numel((moe.experts // layout.ep) * per_expert, layout.expert_data)


def expert_unit(moe: MoESpec, d: Dims, layout: Layout) -> ExpertUnit:
    """The expert unit's collectives of a layout with zero >= 2 and edp > 1 (module docstring); empty otherwise."""
    n = layout.expert_data
    if layout.zero < 2 or n == 1:
        return ExpertUnit()
    p = unit_numel(moe, d.h, layout)

    def ev(kind: str, size: int, dtype: str, phase: str, what: str) -> tuple[CommEvent, ...]:
        # "unit_gather", not ".gather": fsdp_program's prefetch keys the dense units' by that ending
        return (CommEvent(kind, AXES, n, size * p, dtype, phase, f"layers.0.experts.unit_{what}"),)

    gather = ev("all_gather", d.c, d.dtype, "fwd", "gather") if layout.zero == 3 else ()
    scatter = ev("reduce_scatter", d.grad_bytes, d.grad_dtype, "bwd", "rs")
    pipelined = layout.pp > 1
    return ExpertUnit(
        fwd=gather,
        bwd_gather=tuple(CommEvent(e.kind, e.axes, e.group_size, e.payload_bytes, e.dtype, "bwd", e.label)
                         for e in gather),
        bwd_scatter=() if pipelined else scatter,
        step=tuple(CommEvent(e.kind, e.axes, e.group_size, e.payload_bytes, e.dtype, "grad_sync", e.label)
                   for e in scatter) if pipelined else (),
        after=ev("all_gather", 4, "float32", "optimizer", "params") if layout.zero == 2 else (),
        temporaries=float((d.c if layout.zero == 3 else 0) * p + d.grad_bytes * p))


__all__ = ["AXES", "ExpertUnit", "expert_unit", "unit_numel"]
