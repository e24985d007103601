"""The discrete-event engine (simpy): one training step replayed on the topology, with link contention.

Same inputs and output (StepEstimate, engine="event") as the analytic `estimate`; `estimate_with(engine,
...)` dispatches between the two. Memory, FLOPs and the CommEvent list are the analytic model's (they do not
depend on timing); the times come from the simulation:
- one representative device per pipeline stage runs its program (event_program.py) on a compute stream and
  a communication stream, following the stage's 1F1B or interleaved-1F1B schedule; stages exchange
  activations / their gradients with sends that travel the network;
- every collective is a ring on the representative group (node-major order), decomposed into its steps
  (collective.ring_steps; an uncalibrated all_reduce that a tree does faster: the tree's steps over the same
  links, collective.call_steps, as the analytic model prices it),
  whose transfers share links max-min fairly with the concurrent groups of the same axis in that stage
  (event_network.py explains the weighting that stands in for them) and with whatever else the simulated
  devices run at the same time;
- kept weights (kw=1): a stage's kept gathers run in each chunk's first micro-batch's forward, their
  gradients' reduce-scatters in its last micro-batch's backward (traffic.py; event_program.py);
- tensor-parallel collectives are synchronous (the executor's run in line) unless the layout has `tpo`: then a
  collective its mode declares overlappable runs its first ring step, then the rest alongside its GEMM
  (event_program.py, cost_models/tpo.py); the option `overlap=True`
  hides dA / bias-gradient reduce-scatters under the dX GEMM (Bian et al. 2021);
- a layout with `overlap` (Layout.overlap; also implied by the option) issues each data-parallel gradient
  bucket (traffic.py; zero=1: its reduce_scatter) asynchronously in the last backward, once the layers that
  produce its gradients are done, as the executor does (executor/data_parallel/grad_sync.py) and the
  analytic model prices;
- asynchronous collectives queue on a stream per communicator (stage, mesh axes): calls of one group run
  in issue order, calls of different groups concurrently (NCCL runs each communicator on its own stream; a
  tp all-reduce does not wait behind a dp gradient bucket). They still share links (event_network.py);
- collectives over groups that span pipeline stages (the grad-norm all-reduce) synchronize the stages.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from paracube.cost_models.analytic import estimate as analytic_estimate
from paracube.cost_models.analytic import layout_links
from paracube.cost_models.collective import call_steps, ring_steps
from paracube.cost_models.compute import GemmModel, gemm_model
from paracube.cost_models.dims import context_local, dims_of, with_pins
from paracube.cost_models.event_network import FlowNetwork, LinkTable, Template
from paracube.cost_models.event_program import Op, StageProgram, build_stage, schedule
from paracube.cost_models.event_trace import Span, Timeline
from paracube.cost_models.links import LinkCache
from paracube.cost_models.moe import dense_part, expert_links, priced
from paracube.cost_models.moe_program import with_blocks
from paracube.cost_models.validity import resolve_micro_batch
from paracube.errors import ParacubeError, check, unknown
from paracube.estimate import CommEvent, StepEstimate
from paracube.layout import Layout
from paracube.modes.experts import EXPERT_AXES
from paracube.topologies.protocol import RoutedTopology
from paracube.workload import ModelSpec, TrainingSpec

ENGINES = ("analytic", "event")


@dataclass
class EventResult:
    estimate: StepEstimate
    timeline: Timeline
    stats: dict[str, float] = field(default_factory=dict)  # events, wall seconds, ring steps, ...


@dataclass
class _Stage:
    busy: float = 0.0  # compute seconds so far
    busy_since: float | None = None
    compute: float = 0.0
    comm: float = 0.0
    exposed: float = 0.0
    by_axis: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_kind: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    end: float = 0.0

    def busy_at(self, now: float) -> float:
        return self.busy + (now - self.busy_since if self.busy_since is not None else 0.0)


class _Sim:
    def __init__(self, layout: Layout, topo: RoutedTopology, programs: list[StageProgram], n_micro: int,
                 overlap: bool, timeline: bool, param_overlap: bool = False, fsdp_prefetch: bool = False) -> None:
        self.layout, self.topo, self.programs, self.n_micro = layout, topo, programs, n_micro
        # Streams are needed once anything runs asynchronously (tp overlap, gradient buckets, FSDP prefetch).
        self.overlap = overlap or layout.overlap or param_overlap or (fsdp_prefetch and layout.zero >= 2)
        self.record = timeline
        self.tagged: dict[tuple[int, str], simpy.Process] = {}  # (stage, tag) -> an asynchronous op in flight
        self.waits: GemmModel | None = None  # the device model's per-call waits (GemmModel.call_wait; simulate)
        # (bandwidth, latency) per axes where the algorithm may be a tree (uncalibrated; simulate sets it)
        self.alpha_beta: dict[tuple[str, ...], tuple[float, float]] = {}
        self.env = simpy.Environment()
        self.links = LinkTable(topo)
        self.grid = layout.rank_grid()
        self.reps = [int(self.grid[s].flat[0]) for s in range(layout.pp)]
        self.stage_of = np.empty(layout.world_size, dtype=np.int64)
        for s in range(layout.pp):
            self.stage_of[self.grid[s].ravel()] = s
        self._templates: dict[tuple, Template] = {}
        self.net: FlowNetwork | None = None
        self.stages = [_Stage() for _ in range(layout.pp)]
        self.spans: list[Span] = []
        self.arrivals: dict[tuple[str, int, int], simpy.Event] = {}
        self.barriers: dict[tuple[bool, int], list] = {}
        self.barrier_seen = {(sub, s): 0 for sub in (False, True) for s in range(layout.pp)}
        self.streams: dict[tuple[int, tuple[str, ...]], simpy.Resource] = {}

    def stream(self, stage: int, axes: tuple[str, ...]) -> simpy.Resource:
        """The stream of one communicator (a stage's group over `axes`): its calls run one at a time."""
        key = (stage, axes)
        if key not in self.streams:
            self.streams[key] = simpy.Resource(self.env, 1)
        return self.streams[key]

    # --- templates --------------------------------------------------------------------------------
    def template(self, stage: int, axes: tuple[str, ...]) -> Template:
        key = (stage if "pp" not in axes else -1, axes)
        tpl = self._templates.get(key)
        if tpl is None:
            groups = (self.layout.expert_groups(".".join(axes)) if axes[0] in EXPERT_AXES  # MoE folding
                      else self.layout.groups(axes))
            if "pp" not in axes:
                groups = groups[self.stage_of[groups[:, 0]] == stage]
            rep = self.reps[0 if "pp" in axes else stage]
            prefer = int(np.nonzero((groups == rep).any(axis=1))[0][0])
            tpl = self.links.ring_template(f"stage{stage}:{'.'.join(axes)}", groups.tolist(), prefer)
            self._templates[key] = tpl
        return tpl

    def send_template(self, src: int, dst: int) -> Template:
        key = ("send", src, dst)
        tpl = self._templates.get(key)
        if tpl is None:
            pairs = [[(a, b)] for a, b in zip(self.grid[src].ravel().tolist(), self.grid[dst].ravel().tolist(),
                                              strict=True)]
            tpl = self.links.template(f"send{src}->{dst}", pairs)
            self._templates[key] = tpl
        return tpl

    # --- recording --------------------------------------------------------------------------------
    def _comm_done(self, stage: int, name: str, e: CommEvent, t0: float, busy0: float) -> None:
        st, now = self.stages[stage], self.env.now
        dur = now - t0
        hidden = st.busy_at(now) - busy0  # compute that ran meanwhile (only for asynchronous ones)
        exposed = max(0.0, dur - hidden)
        axis = ".".join(e.axes)
        st.comm += dur
        st.exposed += exposed
        st.by_axis[axis] += exposed
        st.by_kind[e.kind] += exposed
        if self.record:
            self.spans.append(Span(stage, "comm", name, t0, now, f"{e.phase}:{e.kind}"))

    # --- processes --------------------------------------------------------------------------------
    def call_wait(self, e: CommEvent) -> float:
        """Seconds the call waits beyond its ring steps (GemmModel.call_wait; 0 on accelerators)."""
        if self.waits is None:
            return 0.0
        return float(self.waits.call_wait(e.kind, e.group_size, e.payload_bytes, e.dtype))

    def comm(self, stage: int, op: Op):
        e = op.event
        assert e is not None and self.net is not None
        link = self.alpha_beta.get(e.axes)
        steps, chunk = (call_steps(e.kind, e.group_size, e.payload_bytes, *link) if link is not None
                        else ring_steps(e.kind, e.group_size, e.payload_bytes))
        if "pp" in e.axes:  # spans stages: every stage's representative waits for the others
            yield from self._barrier(stage, e, steps, chunk)
            return
        stream = self.stream(stage, e.axes) if self.overlap else None
        req = stream.request() if stream is not None else None
        if req is not None:
            yield req
        t0, busy0 = self.env.now, self.stages[stage].busy_at(self.env.now)
        wait = self.call_wait(e)  # for the group's ranks to be scheduled (DeviceSpec call and ring waits)
        if wait:
            yield self.env.timeout(wait)
        if op.alongside:  # a cp ring step: the transfer alongside one block's attention (event_context.py)
            yield simpy.AllOf(self.env, [self.net.run(self.template(stage, e.axes), steps, chunk),
                                         self.env.process(self.gemm(stage, op))])
        elif op.gemm > 0 and steps > 1:  # tpo: the first ring step alone, the rest alongside the GEMM (tpo.py)
            yield self.net.run(self.template(stage, e.axes), 1, chunk)
            rest = self.net.run(self.template(stage, e.axes), steps - 1, chunk)
            yield simpy.AllOf(self.env, [rest, self.env.process(self.gemm(stage, op))])
        else:
            if op.gemm > 0:
                yield from self.gemm(stage, op)
            yield self.net.run(self.template(stage, e.axes), steps, chunk)
        if stream is not None and req is not None:
            stream.release(req)
        self._comm_done(stage, op.name, e, t0, busy0)

    def gemm(self, stage: int, op: Op):
        """The GEMM a tpo collective overlaps: compute time of the stage (it counts as hiding the collective)."""
        st = self.stages[stage]
        st.busy_since = self.env.now
        yield self.env.timeout(op.gemm)
        st.busy += op.gemm
        st.busy_since = None
        st.compute += op.gemm

    def _barrier(self, stage: int, e: CommEvent, steps: int, chunk: float):
        assert self.net is not None
        # The k-th stage-spanning collective of every stage is the same call; one over a part of the stages
        # (tied embeddings: first + last stage, group size < pp) is matched among those calls only.
        sub = e.group_size < self.layout.pp
        k = (sub, self.barrier_seen[sub, stage])
        self.barrier_seen[sub, stage] += 1
        slot = self.barriers.setdefault(k, [0, self.env.event()])
        t0, busy0 = self.env.now, self.stages[stage].busy_at(self.env.now)
        slot[0] += 1
        if slot[0] == (e.group_size if sub else self.layout.pp):
            del self.barriers[k]
            wait = self.call_wait(e)
            if wait:
                yield self.env.timeout(wait)
            yield self.net.run(self.template(0, e.axes), steps, chunk)
            slot[1].succeed()
        else:
            yield slot[1]
        self._comm_done(stage, e.label, e, t0, busy0)

    def run_ops(self, stage: int, ops: list[Op], pending: list):
        st = self.stages[stage]
        for op in ops:
            if op.kind == "compute":
                t0 = self.env.now
                st.busy_since = t0
                yield self.env.timeout(op.seconds)
                st.busy += op.seconds
                st.busy_since = None
                st.compute += op.seconds
                if self.record:
                    phase = "bwd" if op.name.endswith(("dX", "dA", "bwd")) else op.name.rsplit(".", 1)[-1]
                    self.spans.append(Span(stage, "compute", op.name, t0, self.env.now, phase))
            elif op.kind == "wait" and op.tag:  # one tagged op only (fsdp_overlap.py: a unit's prefetched gather)
                proc = self.tagged.pop((stage, op.tag), None)
                if proc is not None:
                    yield proc
            elif op.kind == "wait":
                if pending:
                    yield simpy.AllOf(self.env, pending)
                    pending.clear()
            elif op.asynchronous:  # build_stage marks ops asynchronous only when they overlap
                pending.append(self.env.process(self.comm(stage, op)))
                if op.tag:
                    self.tagged[stage, op.tag] = pending[-1]
            else:
                yield from self.comm(stage, op)

    def _arrival(self, kind: str, vstage: int, micro: int) -> simpy.Event:
        key = (kind, vstage, micro)
        if key not in self.arrivals:
            self.arrivals[key] = self.env.event()
        return self.arrivals[key]

    def send(self, stage: int, kind: str, to_vstage: int, micro: int, nbytes: int):
        assert self.net is not None
        dst = to_vstage % self.layout.pp
        if dst != stage:
            t0, busy0 = self.env.now, self.stages[stage].busy_at(self.env.now)
            ev = CommEvent("send", ("pp",), 2, nbytes, "", "pipeline", kind)
            wait = self.call_wait(ev)
            if wait:
                yield self.env.timeout(wait)
            yield self.net.run(self.send_template(stage, dst), 1, float(nbytes))
            self._comm_done(stage, f"send {kind} mb{micro} -> stage {dst}", ev, t0, busy0)
        self._arrival(kind, to_vstage, micro).succeed()

    def device(self, stage: int):
        prog, pp, v = self.programs[stage], self.layout.pp, self.layout.interleave
        last_v = pp * v - 1
        pending: list = []
        for kind, c, m in schedule(pp, v, self.n_micro, stage):
            vs = c * pp + stage
            if kind == "F":
                if vs > 0:
                    yield self._arrival("act", vs, m)
                yield from self.run_ops(stage, prog.fwd_first[c] if m == 0 else prog.fwd[c], pending)
                if vs < last_v:
                    yield from self.send(stage, "act", vs + 1, m, prog.send_bytes)
            else:
                if vs < last_v:
                    yield self._arrival("grad", vs, m)
                yield from self.run_ops(stage, prog.bwd_last[c] if m == self.n_micro - 1 else prog.bwd[c], pending)
                if vs > 0:
                    yield from self.send(stage, "grad", vs - 1, m, prog.send_bytes)
        yield from self.run_ops(stage, [*prog.tail, Op("wait", "end")], pending)
        self.stages[stage].end = self.env.now

    def run(self) -> None:
        self.net = FlowNetwork(self.env, self.links.cap)
        for s in range(self.layout.pp):
            self.env.process(self.device(s))
        self.net.cap = self.links.cap  # the table grows as templates are built: share the same list
        self.env.run()


def simulate(model: ModelSpec, training: TrainingSpec, layout: Layout, topo: RoutedTopology,
             overlap: bool = False, timeline: bool = True, with_events: bool = True,
             param_overlap: bool = False, fsdp_prefetch: bool = False, grad_bytes: int = 4,
             gather_16bit: bool = False) -> EventResult:
    """Replay one training step of `layout` on `topo`; returns the estimate, the timeline and run stats.
    `param_overlap`: zero=1's parameter all_gathers overlapped with the first forward (event_program.py);
    `fsdp_prefetch`: zero=2/3's gathers prefetched and reduce-scatters asynchronous (fsdp_overlap.py)."""
    check(isinstance(layout, Layout), f"layout {layout!r} is not a Layout; parse it with parse_layout")
    n_dev = getattr(topo, "num_devices", None)
    check(isinstance(n_dev, int), f"topology {topo!r} has no num_devices; load one with load_topology")
    check(layout.world_size <= n_dev, f"layout {layout} needs {layout.world_size} devices; topology "
          f"{getattr(topo, 'name', topo)!r} has {n_dev} (ranks 0..{n_dev - 1})")
    base = analytic_estimate(model, training, layout, topo, with_events=with_events, param_overlap=param_overlap,
                             fsdp_prefetch=fsdp_prefetch, grad_bytes=grad_bytes, gather_16bit=gather_16bit)
    # a cp rank's view; MoE blocks: moe_program.with_blocks
    d = context_local(replace(with_pins(dims_of(dense_part(model), training), layout), grad_bytes=grad_bytes,
                              gather_16bit=gather_16bit), layout.cp, layout.cp_comm)  # traffic.py's elements
    mb, _ = resolve_micro_batch(layout, d)
    n_micro = d.global_batch // (layout.dp * mb)
    if layout.interleave > 1 and n_micro % layout.pp:
        raise ParacubeError(f"layout {layout}: interleaved 1F1B needs the micro-batch count ({n_micro}) to be "
                            f"a multiple of pp={layout.pp}; change the global batch or mb")
    g = gemm_model(topo, training.dtype)
    programs = [build_stage(layout.with_(micro_batch=mb), d, mb, s, g, overlap, overlap or layout.overlap,
                            param_overlap, fsdp_prefetch) for s in range(layout.pp)]
    if priced(model):
        mlay = layout.with_(micro_batch=mb)
        links = expert_links(mlay, LinkCache(topo))
        programs = [with_blocks(p, model, d, mlay, mb, g, links, n_micro) for p in programs]
    sim = _Sim(layout, topo, programs, n_micro, overlap, timeline, param_overlap, fsdp_prefetch)
    sim.waits = g if g.waits else None
    if not g.comm:  # uncalibrated all_reduces take the faster of ring and tree, as the analytic model does
        sim.alpha_beta = {axes: (float(bw[0]), float(lat[0]))
                          for axes, (bw, lat) in layout_links(layout, LinkCache(topo)).items()}
    wall = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - wall
    step = max(st.end for st in sim.stages)
    crit = max(range(layout.pp), key=lambda s: sim.stages[s].compute + sim.stages[s].exposed)
    st = sim.stages[crit]
    peak = g.peak
    flops = base.flops_per_gpu * layout.world_size
    notes = [n for n in base.notes if not n.startswith("pipeline:")]
    notes.append(f"event engine: {layout.pp} representative device(s), one per pipeline stage; breakdown of "
                 f"stage {crit}; comm_time_by_axis/kind are exposed seconds"
                 + ("; tp weight-gradient overlap on" if overlap else "")
                 + ("; gradient buckets overlap backward" if overlap or layout.overlap
                    else "; gradient reduction after backward (layout without overlap)"))
    est = replace(base, engine="event", step_time_s=step, compute_time_s=st.compute, comm_time_s=st.comm,
                  exposed_comm_time_s=st.exposed, bubble_time_s=max(0.0, step - st.compute - st.exposed),
                  mfu=flops / (step * peak * layout.world_size), comm_time_by_axis=dict(st.by_axis),
                  comm_time_by_kind=dict(st.by_kind), notes=tuple(notes))
    # simpy numbers every scheduled event (a private counter): the next id is the number scheduled.
    scheduled = float(next(sim.env._eid)) if hasattr(sim.env, "_eid") else float("nan")  # type: ignore[attr-defined]
    stats = {"wall_s": wall, "simpy_events": scheduled}
    stats.update({k: float(v) for k, v in sim.net.stats.items()})  # type: ignore[union-attr]
    devices = [f"stage {s} (rank {r})" for s, r in enumerate(sim.reps)]
    return EventResult(est, Timeline(devices, sim.spans), stats)


def estimate_event(model: ModelSpec, training: TrainingSpec, layout: Layout, topo: RoutedTopology,
                   with_events: bool = True, overlap: bool = False, param_overlap: bool = False,
                   fsdp_prefetch: bool = False, grad_bytes: int = 4, gather_16bit: bool = False) -> StepEstimate:
    """Like the analytic `estimate`, timed by the discrete-event simulation (engine="event")."""
    return simulate(model, training, layout, topo, overlap=overlap, timeline=False, with_events=with_events,
                    param_overlap=param_overlap, fsdp_prefetch=fsdp_prefetch, grad_bytes=grad_bytes,
                    gather_16bit=gather_16bit).estimate


def estimate_with(engine: str, model: ModelSpec, training: TrainingSpec, layout: Layout, topo: RoutedTopology,
                  with_events: bool = True, **options: object) -> StepEstimate:
    """`--engine analytic|event`: one entry point for the CLI. Options: overlap=True (event only);
    param_overlap=True and fsdp_prefetch=True (both engines: how the runtime runs zero's parameter gathers,
    planner/dimensions.engine_options)."""
    param_overlap = bool(options.pop("param_overlap", False))
    fsdp_prefetch = bool(options.pop("fsdp_prefetch", False))
    grad_bytes = int(options.pop("grad_bytes", 4))  # type: ignore[call-overload]
    gather_16bit = bool(options.pop("gather_16bit", False))
    if engine == "analytic":
        check(not options, f"engine analytic takes no options {sorted(options)}; valid only with engine event")
        return analytic_estimate(model, training, layout, topo, with_events=with_events, param_overlap=param_overlap,
                                 fsdp_prefetch=fsdp_prefetch, grad_bytes=grad_bytes, gather_16bit=gather_16bit)
    if engine == "event":
        extra = sorted(set(options) - {"overlap"})
        check(not extra, f"unknown event-engine options {extra}; valid: overlap")
        return estimate_event(model, training, layout, topo, with_events, bool(options.get("overlap", False)),
                              param_overlap, fsdp_prefetch, grad_bytes, gather_16bit)
    raise unknown("engine", engine, ENGINES)


__all__ = ["ENGINES", "EventResult", "estimate_event", "estimate_with", "simulate"]
