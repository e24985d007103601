"""The discrete-event engine (simpy): one training step replayed on the topology, with link contention.

Same inputs and output (StepEstimate, engine="event") as the analytic `estimate`; `estimate_with(engine,
...)` dispatches between the two. Memory, FLOPs and the CommEvent list are the analytic model's (they do not
depend on timing); the times come from the simulation (event_sim.py: processes, streams, barriers; event_fuse.py:
runs of uncontended ops replayed as one timeout; event_network.py: links shared max-min fairly):
- one representative device per pipeline stage runs its program (event_program.py) on a compute stream and
  a communication stream, following the stage's 1F1B or interleaved-1F1B schedule;
- kept weights (kw=1): a stage's kept gathers run in each chunk's first micro-batch's forward, their
  gradients' reduce-scatters in its last micro-batch's backward (traffic.py; event_program.py);
- tensor-parallel collectives are synchronous (the executor's run in line) unless the layout has `tpo`: then a
  collective its mode declares overlappable runs its first ring step, then the rest alongside its GEMM
  (event_program.py, cost_models/tpo.py); the option `overlap=True`
  hides dA / bias-gradient reduce-scatters under the dX GEMM (Bian et al. 2021);
- a layout with `overlap` (Layout.overlap; also implied by the option) issues each data-parallel gradient
  bucket (traffic.py; zero=1: its reduce_scatter) asynchronously in the last backward, once the layers that
  produce its gradients are done, as the executor does (executor/data_parallel/grad_sync.py) and the
  analytic model prices; buckets hold at most `bucket_bytes` (modes/buckets.py; a published run: its stack's,
  calibration/from_runs.py), the same limit the analytic engine is given;
- collectives over groups that span pipeline stages (the grad-norm all-reduce) synchronize the stages;
- CPU ranks that share cores (GemmModel.ranks_per_core > 1): the simulation runs every stage at its 1/r share of
  a core; the critical stage's bubble (its idle time: step - compute - exposed, plus the exposed time it waited for
  other stages at stage-spanning collectives) is then taken at shared_cores.bubble_share, the
  analytic engine's factor (the idle stages' ranks give their cores to the busy ones; the timeline keeps the
  unshared schedule);
- the step's barrier over the data-parallel replicas meets the slowest of them: the simulated step plus
  stragglers.straggler_wait (a closed form of its length and dp, as the analytic engine adds it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from paracube.cost_models.analytic import estimate as analytic_estimate
from paracube.cost_models.analytic import layout_links, prepare
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event_program import build_stage
from paracube.cost_models.event_sim import Sim
from paracube.cost_models.event_trace import Timeline
from paracube.cost_models.links import LinkCache
from paracube.cost_models.moe import priced
from paracube.cost_models.moe_dispatch import dispatch_of
from paracube.cost_models.moe_links import expert_links
from paracube.cost_models.moe_program import with_blocks
from paracube.cost_models.shared_cores import bubble_share
from paracube.cost_models.stragglers import straggler_wait
from paracube.engine_options import EngineOptions, options_of
from paracube.errors import ParacubeError, check, unknown
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.topologies.protocol import RoutedTopology
from paracube.workload import ModelSpec, TrainingSpec

ENGINES = ("analytic", "event")


@dataclass
class EventResult:
    estimate: StepEstimate
    timeline: Timeline
    stats: dict[str, float] = field(default_factory=dict)  # events, wall seconds, ring steps, ...


def simulate(model: ModelSpec, training: TrainingSpec, layout: Layout, topo: RoutedTopology,
             overlap: bool = False, timeline: bool = True, with_events: bool = True, fuse: bool = True,
             options: EngineOptions | None = None, **changes: object) -> EventResult:
    """Replay one training step of `layout` on `topo`; returns the estimate, the timeline and run stats.
    `options` / `changes`: how the stack runs it, as analytic.estimate takes them (engine_options.py);
    `overlap`: the event engine's tp weight-gradient overlap; `fuse=False`: every op simulated one by one
    (event_fuse.py's reference; the same answer, more simpy events)."""
    o = options_of(options, changes)
    check(isinstance(layout, Layout), f"layout {layout!r} is not a Layout; parse it with parse_layout")
    n_dev = getattr(topo, "num_devices", None)
    check(isinstance(n_dev, int), f"topology {topo!r} has no num_devices; load one with load_topology")
    check(layout.world_size <= n_dev, f"layout {layout} needs {layout.world_size} devices; topology "
          f"{getattr(topo, 'name', topo)!r} has {n_dev} (ranks 0..{n_dev - 1})")
    base = analytic_estimate(model, training, layout, topo, with_events=with_events, options=o)
    d, mb, _ = prepare(model, training, layout, o)  # a cp rank's view (traffic.py's elements); MoE: with_blocks
    n_micro = d.global_batch // (layout.dp * mb)
    if layout.interleave > 1 and n_micro % layout.pp:
        raise ParacubeError(f"layout {layout}: interleaved 1F1B needs the micro-batch count ({n_micro}) to be "
                            f"a multiple of pp={layout.pp}; change the global batch or mb")
    g = gemm_model(topo, training.dtype)
    programs = [build_stage(layout.with_(micro_batch=mb), d, mb, s, g, overlap, overlap or layout.overlap,
                            o.param_overlap, o.fsdp_prefetch, o.bucket_bytes) for s in range(layout.pp)]
    if priced(model):
        mlay = layout.with_(micro_batch=mb)
        links = expert_links(mlay, LinkCache(topo), dispatch_of(model.moe, o.moe_dispatch))
        programs = [with_blocks(p, model, d, mlay, mb, g, links, n_micro) for p in programs]
    sim = Sim(layout, topo, programs, n_micro, overlap, timeline, o.param_overlap, o.fsdp_prefetch, fuse)
    sim.waits = g if g.waits else None
    sim.drag = g.overlap_drag  # compute beside the data-parallel stream (overlap_drag.py)
    sim.dispatch = dispatch_of(model.moe, o.moe_dispatch)  # the all_to_alls' bytes by dispatcher (moe_dispatch.py)
    if not g.comm:  # uncalibrated all_reduces take the faster of ring and tree, as the analytic model does
        sim.alpha_beta = {axes: (float(bw[0]), float(lat[0]))
                          for axes, (bw, lat) in layout_links(layout, LinkCache(topo)).items()}
    wall = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - wall
    step = max(st.end for st in sim.stages)
    crit = max(range(layout.pp), key=lambda s: sim.stages[s].compute + sim.stages[s].exposed)
    st = sim.stages[crit]
    # ranks sharing cores: the critical stage's simulated bubble (its idle time, the wait for the other stages at
    # stage-spanning collectives included) at its share (shared_cores.py), as the analytic engine prices it
    exposed, bubble = st.exposed, max(0.0, step - st.compute - st.exposed)
    share = float(bubble_share(layout.pp, g.ranks_per_core))
    if share < 1.0:
        exposed, bubble = st.exposed - st.synced, max(0.0, step - st.compute - st.exposed + st.synced)
        step, bubble = step - (1.0 - share) * bubble, share * bubble
    wait = float(straggler_wait(step, layout.dp, g.straggler))  # the step's barrier meets the slowest replica
    step, exposed = step + wait, exposed + wait  # (stragglers.py, as analytic_scores.evaluate adds it)
    peak = g.peak
    flops = base.flops_per_gpu * layout.world_size
    notes = [n for n in base.notes if not n.startswith("pipeline:")]
    notes.append(f"event engine: {layout.pp} representative device(s), one per pipeline stage; breakdown of "
                 f"stage {crit}; comm_time_by_axis/kind are exposed seconds"
                 + ("; tp weight-gradient overlap on" if overlap else "")
                 + ("; gradient buckets overlap backward" if overlap or layout.overlap
                    else "; gradient reduction after backward (layout without overlap)"))
    est = replace(base, engine="event", step_time_s=step, compute_time_s=st.compute, comm_time_s=st.comm,
                  exposed_comm_time_s=exposed, bubble_time_s=bubble,
                  mfu=flops / (step * peak * layout.world_size), comm_time_by_axis=dict(st.by_axis),
                  comm_time_by_kind=dict(st.by_kind), notes=tuple(notes))
    # simpy numbers every scheduled event (a private counter): the next id is the number scheduled.
    scheduled = float(next(sim.env._eid)) if hasattr(sim.env, "_eid") else float("nan")  # type: ignore[attr-defined]
    stats = {"wall_s": wall, "simpy_events": scheduled}
    stats.update({k: float(v) for k, v in sim.net.stats.items()})  # type: ignore[union-attr]
    devices = [f"stage {s} (rank {r})" for s, r in enumerate(sim.reps)]
    return EventResult(est, Timeline(devices, sim.spans), stats)


def estimate_event(model: ModelSpec, training: TrainingSpec, layout: Layout, topo: RoutedTopology,
                   with_events: bool = True, overlap: bool = False, options: EngineOptions | None = None,
                   **changes: object) -> StepEstimate:
    """Like the analytic `estimate`, timed by the discrete-event simulation (engine="event")."""
    return simulate(model, training, layout, topo, overlap=overlap, timeline=False, with_events=with_events,
                    options=options_of(options, changes)).estimate


def estimate_with(engine: str, model: ModelSpec, training: TrainingSpec, layout: Layout, topo: RoutedTopology,
                  with_events: bool = True, overlap: bool = False, options: EngineOptions | None = None,
                  **changes: object) -> StepEstimate:
    """`--engine analytic|event`: one entry point for the CLI, the stack's options as both engines take them
    (engine_options.py); `overlap=True` (the tp weight-gradient overlap) is the event engine's only."""
    o = options_of(options, changes)
    if engine == "analytic":
        check(not overlap, "engine analytic takes no option overlap; valid only with engine event")
        return analytic_estimate(model, training, layout, topo, with_events=with_events, options=o)
    if engine == "event":
        return estimate_event(model, training, layout, topo, with_events, overlap, o)
    raise unknown("engine", engine, ENGINES)


__all__ = ["ENGINES", "EventResult", "estimate_event", "estimate_with", "simulate"]
