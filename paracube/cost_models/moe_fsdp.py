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
Prefetched (pp = 1 and the runtime's fsdp_prefetch, as every stack here runs FSDP; torchtitan prefetches a block's
experts with the block, `set_modules_to_forward_prefetch([next_block, next_block.moe.experts])`), `Chain`: the expert
units on a stream of their own (their own process group), the first MoE block's gather issued as the micro-batch
starts, each next one as a block's experts start and waited for as its own experts start; backward (last block
first) the same, each unit's reduce-scatter issued as its experts' backward ends (asynchronous with the layout's
`overlap`, else in line), all waited for at the backward's end: the one-stream recursion of fsdp_overlap.py over the
expert units, the work between two issue points a whole block's (dense and MoE). The dense units run their own
prefetch beside it and share its links (the event engine's max-min; moe_step._unit_stalls counts each expert
gather as moving its block's dense gather too, and with `overlap` queues each block's dense reduce-scatter on the same
stream as the block's backward ends). The backward's all_to_alls share the links of the reduce-scatters queued beside
them (moe_contention.beside): the dispatch's right after the expert unit's, the next block's combine after the dense
unit's. On one node (A100, gpt-oss-20b, dp=8 x ep=4, zero=3) that was the engines' 3.0% (now 0.0%); a ring over nodes
is taken to share the NICs only, its NVLink hops not counted (the event engine's hops take port bandwidth there: the
same layouts over two nodes stay 3-5% apart).
Otherwise (pipelines, or no prefetch) they run in line with the block's compute, as the dense units do there.
Before 2026-12-04 they were not in the step time at all: a search ranked dp = 64 x zero=3 with every expert gathered
each micro-batch (qwen3-30b-a3b, torchtitan, 64 H100s) first at 2.46 s; priced, it is 3.17 s (event engine 3.15 s)
and over the memory cap with its gathered unit, and dp = 64 x ep = 8 x zero=3 ranks first at 3.04 s (3.03 s).
A pipelined step's reduce-scatter is exposed once a step, as the dense units' are there; zero=2's gather is exposed
after the optimizer step.
Memory: one gathered unit's parameters (zero=3, c p) and one unit's unsharded gradient before its reduce-scatter
(grad_bytes p), temporaries alive inside the block; prefetched (zero=3, two MoE blocks or more on the stage) the next
block's gathered unit is alive beside them, c p more, as the dense units count two gathered units (memory.with_zero).
"""

from __future__ import annotations

from dataclasses import dataclass

from paracube.cost_models.dims import Dims
from paracube.cost_models.moe_contention import beside
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
    gathered: float = 0.0  # one gathered unit's parameter bytes (zero=3: c p; the prefetched next unit's too)


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
    gathered = float(d.c * p if layout.zero == 3 else 0)
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
        temporaries=gathered + float(d.grad_bytes * p), gathered=gathered)


@dataclass(frozen=True)
class Chain:
    """One micro-batch of a stage (pp = 1) as the expert units' prefetch sees it: k MoE blocks, the work (compute and
    in-line communication, seconds) between their issue and wait points (module docstring), a unit's gather `a`
    (zero=3, else 0) and reduce-scatter `r` seconds, the layout's `overlap` (reduce-scatters asynchronous). With
    `overlap`, a block's dense unit's reduce-scatter `r_dense` is queued on the same stream as its backward ends, and
    the backward's routed all_to_alls beside the queue share its links (moe_contention.beside): `a2a_head` right after
    the experts' backward (the dispatch's) with the rates of the expert unit's ring, `a2a_tail` right before them (the
    combine's) with the dense unit's."""

    k: int
    pre_fwd: float  # from the forward's start to the first MoE block's experts
    block_fwd: float  # from one MoE block's experts to the next's (a whole block's forward)
    pre_bwd: float  # from the backward's start to the last MoE block's experts' backward
    block_bwd: float  # from one experts' backward to the next's (a whole block's backward)
    experts_bwd: float  # the experts' backward itself (its reduce-scatter issued at its end)
    end_bwd: float  # from the first MoE block's experts' backward end to the backward's end
    a: float
    r: float
    overlap: bool
    r_dense: float = 0.0
    a2a_head: float = 0.0
    a2a_tail: float = 0.0
    unit_rates: tuple[float, float] = (1.0, 1.0)  # moe_contention.rates: (all_to_all, ring) slowdowns
    dense_rates: tuple[float, float] = (1.0, 1.0)

    def stalls(self) -> float:
        """Seconds the compute side waits on the units' stream beyond its work (without `overlap` the reduce-scatters
        in line, after the gather in flight on their links), and its all_to_alls' time beside the stream's queue: the
        one-stream recursion of fsdp_overlap.py over the expert units and the blocks' dense reduce-scatters."""
        k, a, r = self.k, self.a, self.r
        idle = 0.0
        if a > 0:  # forward: block j + 1's gather issued as block j's experts start, waited as its own start
            t, ready = self.pre_fwd, a
            for j in range(k):
                idle, t = idle + max(0.0, ready - t), max(t, ready)
                if j < k - 1:
                    ready = max(ready, t) + a
                    t += self.block_fwd
        stream = ready = a  # backward, last block first: its gather issued as the backward starts
        t = self.pre_bwd
        for j in range(k):
            if a > 0:
                idle, t = idle + max(0.0, ready - t), max(t, ready)
                if j < k - 1:  # the next block's, queued on the stream before this one's reduce-scatter
                    ready = stream = max(stream, t) + a
            t += self.experts_bwd
            stream = max(stream, t) + r
            if not self.overlap:  # in line: after what the stream has in flight (the same links, one at a time)
                idle, t = idle + stream - t, stream
            extra, later = beside(self.a2a_head, stream - t, *self.unit_rates)
            idle, t, stream = idle + extra, t + extra, stream + later
            if j < k - 1:
                t += self.block_bwd - self.experts_bwd - self.a2a_tail  # this block's backward ends
                if self.r_dense > 0:
                    stream = max(stream, t) + self.r_dense
                    extra, later = beside(self.a2a_tail, stream - t, *self.dense_rates)
                    idle, t, stream = idle + extra, t + extra, stream + later
                t += self.a2a_tail
            else:
                stream = max(stream, t) + self.r_dense
                t += self.end_bwd
        return idle + max(0.0, stream - t)


__all__ = ["AXES", "Chain", "ExpertUnit", "expert_unit", "unit_numel"]
