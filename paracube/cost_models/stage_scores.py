"""One pipeline stage's parts of the analytic step, vectorized over layouts: `score_stage` -> `StageScores`.

analytic_scores.evaluate combines them (pipeline, overlaps, memory); its module docstring states how. The stages
considered are first (embedding), middle and last (head, loss) (STAGES; `stage_flags`: without pipelining the one
stage is both first and last, pp = 2 has no middle). Per stage:
- each collective of the stage's traffic (comm.StepTraffic) at alpha-beta on its axes' links (collective.py,
  calibrated_link where the calibration fits the kind and size; uncalibrated, an all_reduce at the faster of ring and
  tree), per micro-batch or per step. Tensor-parallel and pipeline communication is not overlapped (see comm.py)
  unless the layout says `tpo`: then each collective a mode declares overlappable exposes what the GEMM chunks
  beside its ring's exchanges do not hide (cost_models/tpo.py). Each collective call also costs the device model's
  call wait (GemmModel.call_wait: on uncalibrated local-cpu ranks sharing cores, every message the call passes waits
  to be scheduled, collective.wait_steps and topologies/local_cpu.py; 0 elsewhere); the event engine adds the same
  per call. What the step's overlaps read is kept apart: the gradient buckets (`grad`), zero=1's parameter gather
  (`gather`), zero=2/3's unit collectives (`fsdp`), the tensor collectives' bandwidth seconds (contention.py);
- context parallelism's p2p ring, overlapped with attention block by block (context_parallel.py; window_stages.py
  with sliding windows);
- compute: the stage's blocks, head and loss (compute.stage_compute_time; window_stages.stage_delta where windows
  make stages differ) plus the per-op overhead, step_ops.ops_per_step x GemmModel.op_cost;
- the optimizer step (compute.optimizer_time, 1 / shard of the parameters with zero >= 1) and FP8's weight casts;
- with `overlap`, when the backward releases which share of the buckets (grad_overlap.release_keys).
Per-configuration quantities are computed once per configuration, link-dependent times per layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paracube.cost_models.collective import calibrated_link, latency_factor
from paracube.cost_models.comm import Entry, StepTraffic, stage_layers_params
from paracube.cost_models.compute import (
    GemmModel,
    block_compute_time,
    fp8_step_time,
    optimizer_time,
    stage_compute_time,
)
from paracube.cost_models.context_parallel import ring_time
from paracube.cost_models.dims import Dims
from paracube.cost_models.grad_overlap import Profile, release_keys
from paracube.cost_models.step_ops import ops_per_step
from paracube.cost_models.tpo import TpoPricing
from paracube.cost_models.window_stages import stage_delta, stage_ring, stages_differ
from paracube.modes import MODES, LayoutBatch
from paracube.modes.stages import stage_layers

Arr = np.ndarray
Links = dict[tuple[str, ...], tuple[Arr, Arr]]
STAGES = ("first", "middle", "last")


@dataclass(frozen=True)
class StageScores:
    """One pipeline stage, per layout: its collectives, communication per micro-batch and per step (s),
    bytes sent, compute (s)."""

    entries: list[Entry]
    micro: Arr
    step: Arr
    sent: Arr
    compute: Arr
    grad: Arr  # the data-parallel gradient reduction's part of `step` (s), what overlap may hide
    # when the backward issues which share of the buckets: (per stage shape, its v, each configuration's shape)
    releases: tuple[Profile, Arr, Arr] | tuple[()]  # (grad_overlap.release_keys; () without overlap)
    optim: Arr  # the optimizer step (s, compute.optimizer_time), once per step, outside the pipeline
    gather: Arr  # zero=1's parameter all_gather after the optimizer step (s): what param_overlap may hide
    fsdp: dict[str, tuple[Arr, Arr]]  # zero=2/3's per-unit gathers / reduce-scatters: (latency s, bandwidth s)
    ring: Arr | None = None  # context parallelism's exposed p2p ring (s, in `micro`; context_parallel.py)
    tensor_bw: Arr | float = 0.0  # the tensor-parallel collectives' bandwidth seconds per step (in `micro`)
    tensor_bwd: Arr | float = 0.0  # the part of tensor_bw sent during backward (Entry.backward)
    stream_bw: tuple[Arr, Arr] | None = None  # bandwidth seconds of `grad` and of `gather` (links busy: contention)


def stage_flags(stage: str, pp: Arr) -> tuple[Arr, Arr]:
    """(first, last) flags per layout: without pipelining the one stage is both; pp = 2 has no middle."""
    single = pp == 1
    first = single | (stage == "first") | ((stage == "middle") & (pp == 2))
    last = single | (stage == "last")
    return first.astype(np.int64), last.astype(np.int64)


def same_stage(pp: Arr) -> list[int]:
    """Per stage of STAGES, the first stage with the same edge flags on every configuration (itself if none):
    every stage is the first at pp = 1, the middle is the first at pp <= 2 (stage_flags). score_stage and
    prefetched_micro read the stage only through its flags, so such stages are computed once."""
    flags = [stage_flags(s, pp) for s in STAGES]
    return [next(j for j in range(k + 1) if all(np.array_equal(a, b) for a, b in zip(flags[j], flags[k],
                                                                                  strict=True)))
            for k in range(len(STAGES))]


def score_stage(d: Dims, mode: str, b: LayoutBatch, traffic: StepTraffic, links: Links, g: GemmModel, stage: str,
           rows: Arr, zero: Arr | None = None, tpo: Arr | None = None, overlap: bool | Arr = False,
           blocks: tuple[Arr, Arr] | None = None) -> StageScores:
    """Per-config quantities (counts, payloads, compute) are computed once per configuration of `b`;
    only the link-dependent times are evaluated per layout (`rows` maps layouts to configurations). `blocks`:
    compute.block_compute_time of `b`, which every stage shares (computed once per evaluate)."""
    F, H = stage_flags(stage, b.pp)
    entries = traffic.entries(F, H)
    n = len(rows)
    micro, step, sent, grad, gather = np.zeros(n), np.zeros(n), np.zeros(len(b)), np.zeros(n), np.zeros(n)
    tensor_bw, tensor_bwd, tensor = np.zeros(n), np.zeros(n), set(MODES[mode].axes)
    grad_bw, gather_bw = np.zeros(n), np.zeros(n)
    alternating = MODES[mode].alternating
    grad_axes = traffic.data_axes  # the mode's grad_axes; with context parallelism dp x cp
    fsdp: dict[str, tuple[Arr, Arr]] = {}
    tpo_pricing = TpoPricing(d, mode, b, g, entries) if tpo is not None else None
    for e in entries:
        if not np.any(e.count):
            continue
        bw, lat = calibrated_link(g.comm, e.kind, e.n[rows] if g.comm else e.n, *links[e.axes], alternating)
        # collective.collective_time, with the per-configuration factors computed before indexing by layout
        e_sent = e.sent()
        per_call = e.payload / np.maximum(e.count, 1)
        calls = (e.count * g.call_wait(e.kind, e.n, per_call, e.dtype, alternating))[rows] if g.waits else 0.0
        # each layout's bandwidth seconds and whether its configuration calls: once per entry (read below)
        sent_t = e_sent[rows] / bw
        live = e.count[rows] > 0
        alpha_beta = (e.count * e.latency_steps())[rows] * lat + sent_t
        tm = alpha_beta + calls
        if e.tpo and tpo_pricing is not None:  # collective matmul: the ring's exchanges beside GEMM chunks (tpo.py)
            tm = tm - np.where(tpo, tpo_pricing.hidden(e, alpha_beta, rows), 0.0)
        if e.kind == "all_reduce" and not g.comm:  # uncalibrated: the faster of ring and tree (collective.py)
            depth2 = latency_factor("all_reduce", e.n, "tree")
            tm = np.minimum(tm, (e.count * depth2)[rows] * lat + (depth2 * e.payload)[rows] / bw + calls)
        if not np.all(e.count > 0):  # no call, no time (a one-rank group's link may be infinitely fast)
            tm = np.where(live, tm, 0.0)
        if traffic.zero >= 2 and (e.axes == traffic.zero_axes or e.axes == ("dp_replicate",)) \
                and e.per_step == (e.axes == ("dp_replicate",)):  # fsdp_overlap.py's inputs (HSDP: "replica")
            fsdp["replica" if e.per_step else e.kind] = (np.where(live, tm - sent_t, 0.0),
                                                         np.where(live, sent_t, 0.0))
        if e.per_step:
            step += tm
            # The gradient buckets (all_reduce over grad_axes; zero=1: reduce_scatter), not the norm
            # or metrics scalars, nor zero=1's parameter all_gather (it follows the optimizer step).
            if e.kind in ("all_reduce", "reduce_scatter") and e.axes == grad_axes \
                    and np.any(e.payload > 64):
                grad += tm
                grad_bw += np.where(live, sent_t, 0.0)
            if e.kind == "all_gather" and traffic.zero == 1 and e.axes == grad_axes:
                gather += tm
                gather_bw += np.where(live, sent_t, 0.0)
        else:
            micro += tm
            if tensor and set(e.axes) <= tensor:
                seconds = np.where(live, sent_t, 0.0)
                if e.tpo and tpo_pricing is not None:  # what its GEMMs hide of a slowed ring step costs nothing
                    seconds = seconds * np.clip(tm / np.maximum(alpha_beta, 1e-30), 0.0, 1.0)
                tensor_bw += seconds
                tensor_bwd += seconds * (np.asarray(e.backward) / np.maximum(e.payload, 1))[rows]
        sent += np.where(e.count > 0, e_sent, 0.0)
    ring = None
    if d.cp > 1:  # context parallelism's p2p ring, overlapped with attention block by block (context_parallel.py)
        exposed, ring_sent = ring_time(d, mode, b, *links[("cp",)], g, stage_layers(d.L, b.pp, b.v, F, H), rows)
        if stages_differ(d) and d.cp_comm == "p2p":  # each block's steps beside its own attention (window_stages.py)
            exposed = stage_ring(d, mode, b, *links[("cp",)], g, F, H, rows)
        N = d.global_batch // (b.dp * b.mb)
        ring = N[rows] * exposed
        micro += ring
        sent += N * ring_sent
    # Per-op overhead (Python dispatch + launch; zero without a calibration) is compute-side time of the rank.
    compute = (stage_compute_time(d, mode, b, H, g, F, blocks) + g.op_cost(mode) * ops_per_step(d, mode, b, F, H))[rows]
    if stages_differ(d):  # sliding windows: the stage's own blocks, not the model's mean share (window_stages.py)
        compute = compute + stage_delta(d, mode, b, g, F, H, blocks or block_compute_time(d, mode, b, g))[rows]
    n_local = stage_layers_params(d, mode, b, F, H)
    shard = np.where(zero >= 1, traffic.group_size(traffic.zero_axes), 1) if zero is not None else 1.0
    optim = (optimizer_time(n_local, d.c, g, shard) + fp8_step_time(d, mode, b, F, H, g))[rows]
    releases = ()
    if np.any(overlap):
        dp = traffic.group_size(traffic.data_axes) if traffic.zero == 1 else np.ones_like(b.dp)
        layers = stage_layers(d.L, b.pp, b.v, F, H) * np.ones_like(b.dp)
        releases = release_keys(mode, d, b.t, b.q, layers, F * np.ones_like(b.dp), H * np.ones_like(b.dp), dp,
                                b.v, traffic.bucket_bytes)  # per stage shape: evaluate reads it by rows
    return StageScores(entries, micro, step, sent[rows], compute, grad, releases, optim,
                       gather, fsdp, ring, tensor_bw, tensor_bwd, (grad_bw, gather_bw))


__all__ = ["STAGES", "Links", "StageScores", "same_stage", "score_stage", "stage_flags"]
