"""The event engine's simulation (simpy): the representative devices' processes, their streams and barriers.

`Sim` replays one training step; event.simulate builds its programs (event_program.py) and reads the result.
- one representative device per pipeline stage runs its program on a compute stream and a communication stream,
  following the stage's 1F1B or interleaved-1F1B schedule (modes/stages.schedule); stages exchange activations /
  their gradients with sends that travel the network;
- every collective is a ring on the representative group (node-major order), decomposed into its steps
  (collective.ring_steps; an uncalibrated all_reduce that a tree does faster: the tree's steps over the same
  links, collective.call_steps, as the analytic model prices it), whose transfers share links max-min fairly with
  the concurrent groups of the same axis in that stage (event_network.py) and with whatever else the simulated
  devices run at the same time; the decomposition and the call's wait are computed once per distinct call;
- runs of synchronous ops whose collectives cannot meet another transfer are replayed as one timeout
  (event_fuse.py: exact; the same op list serves every micro-batch);
- tpo: a collective its mode declares overlappable runs each ring exchange alongside the GEMM chunk the executor
  runs beside it (Op.gemm_steps; cost_models/tpo.py); a cp ring step runs alongside one block's attention
  (event_context.py);
- asynchronous collectives queue on a stream per communicator (stage, mesh axes): calls of one group run in issue
  order, calls of different groups concurrently (NCCL runs each communicator on its own stream). They still share
  links (event_network.py);
- collectives over groups that span pipeline stages (the grad-norm all-reduce) synchronize the stages;
- the data-parallel stream's asynchronous collectives leave the compute side a debt (overlap_drag.py), paid before
  its next compute op or at the end of the pass, absorbed by its idle time (event_drag.py).
"""

from __future__ import annotations

import numpy as np
import simpy

from paracube.cost_models import event_fuse
from paracube.cost_models.collective import call_steps, ring_steps
from paracube.cost_models.compute import GemmModel
from paracube.cost_models.event_drag import Drag
from paracube.cost_models.event_fuse import Fused, compile_ops, compute_phase
from paracube.cost_models.event_network import FlowNetwork, LinkTable, Template
from paracube.cost_models.event_ops import Op, StageProgram, StageStats
from paracube.cost_models.event_program import schedule
from paracube.cost_models.event_trace import Span
from paracube.cost_models.moe_a2a import PLAIN, a2a_template
from paracube.cost_models.overlap_drag import owed
from paracube.cost_models.tpo import runs
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.experts import EXPERT_AXES
from paracube.topologies.protocol import RoutedTopology


class Sim(Drag):
    def __init__(self, layout: Layout, topo: RoutedTopology, programs: list[StageProgram], n_micro: int,
                 overlap: bool, timeline: bool, param_overlap: bool = False, fsdp_prefetch: bool = False,
                 fuse: bool = True) -> None:
        self.layout, self.topo, self.programs, self.n_micro = layout, topo, programs, n_micro
        self.fuse = fuse  # event_fuse.py; False: every op one by one (the reference the tests compare against)
        # Streams are needed once anything runs asynchronously (tp overlap, gradient buckets, FSDP prefetch).
        self.overlap = overlap or layout.overlap or param_overlap or (fsdp_prefetch and layout.zero >= 2)
        self.record = timeline
        self.tagged: dict[tuple[int, str], simpy.Process] = {}  # (stage, tag) -> an asynchronous op in flight
        self.waits: GemmModel | None = None  # the device model's per-call waits (GemmModel.call_wait; simulate)
        self.drag = 0.0  # the device generation's overlap drag (GemmModel.overlap_drag; simulate sets it)
        self._drags: dict[tuple[str, ...], float] = {}  # per axes: drag x the ring's NVLink share (Drag)
        self.dispatch = PLAIN  # the MoE dispatcher's all_to_all bytes (moe_dispatch.py; simulate sets it)
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
        self.stages = [StageStats() for _ in range(layout.pp)]
        self.spans: list[Span] = []
        self.arrivals: dict[tuple[str, int, int], simpy.Event] = {}
        self.barriers: dict[tuple[bool, int], list] = {}
        self.barrier_seen = {(sub, s): 0 for sub in (False, True) for s in range(layout.pp)}
        self.streams: dict[tuple[int, tuple[str, ...]], simpy.Resource] = {}
        self._calls: dict[tuple, tuple[int, float, float]] = {}  # (kind, n, bytes, dtype, axes) -> steps, chunk, wait
        self.private: set = set()  # template keys no other job can meet (event_fuse.prepare)
        self._compiled: dict[tuple[int, int], tuple[list[Op], list]] = {}  # (stage, id(op list)) -> its runs

    def stream(self, stage: int, axes: tuple[str, ...]) -> simpy.Resource:
        """The stream of one communicator (a stage's group over `axes`): its calls run one at a time."""
        key = (stage, axes)
        if key not in self.streams:
            self.streams[key] = simpy.Resource(self.env, 1)
        return self.streams[key]

    # --- templates --------------------------------------------------------------------------------
    @staticmethod
    def template_key(stage: int, axes: tuple[str, ...], kind: str = "") -> tuple:
        return (stage if "pp" not in axes else -1, axes, kind == "all_to_all")

    def template(self, stage: int, axes: tuple[str, ...], kind: str = "") -> Template:
        """The ring of a stage's groups over `axes`; an all_to_all's flows to every peer (moe_a2a.py)."""
        key = self.template_key(stage, axes, kind)
        tpl = self._templates.get(key)
        if tpl is None:
            groups = (self.layout.expert_groups(".".join(axes)) if axes[0] in EXPERT_AXES  # MoE folding
                      else self.layout.groups(axes))
            if "pp" not in axes:
                groups = groups[self.stage_of[groups[:, 0]] == stage]
            rep = self.reps[0 if "pp" in axes else stage]
            prefer = int(np.nonzero((groups == rep).any(axis=1))[0][0])
            name = f"stage{stage}:{'.'.join(axes)}"
            dpn = getattr(self.topo, "devices_per_node", 0)
            if kind == "all_to_all" and groups.shape[1] > 1 and hasattr(self.topo, "route") and dpn:
                tpl = a2a_template(self.links, name + ":a2a", np.asarray(groups), rep, int(dpn), self.dispatch)
            else:
                tpl = self.links.ring_template(name, np.asarray(groups), prefer)
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
    def _comm_start(self, stage: int, e: CommEvent) -> object:
        """A collective of the stage in flight from now (StageStats.flow books its exposed seconds); its key."""
        st, key = self.stages[stage], object()
        st.flow(self.env.now)
        st.calls[key] = (".".join(e.axes), e.kind)
        return key

    def _comm_done(self, stage: int, name: str, e: CommEvent, t0: float, key: object) -> None:
        st, now = self.stages[stage], self.env.now
        st.comm += now - t0
        st.flow(now)  # exposed: its seconds beside no compute (and not already booked to a concurrent call)
        del st.calls[key]
        if self.record:
            self.spans.append(Span(stage, "comm", name, t0, now, f"{e.phase}:{e.kind}"))

    # --- processes --------------------------------------------------------------------------------
    def call_wait(self, e: CommEvent) -> float:
        """Seconds the call waits beyond its ring steps (GemmModel.call_wait; 0 on accelerators)."""
        if self.waits is None:
            return 0.0
        return float(self.waits.call_wait(e.kind, e.group_size, e.payload_bytes, e.dtype))

    def call_of(self, e: CommEvent) -> tuple[int, float, float]:
        """(ring steps, bytes per step, wait seconds) of one call, computed once per distinct call."""
        key = (e.kind, e.group_size, e.payload_bytes, e.dtype, e.axes)
        hit = self._calls.get(key)
        if hit is None:
            link = self.alpha_beta.get(e.axes)
            steps, chunk = (call_steps(e.kind, e.group_size, e.payload_bytes, *link) if link is not None
                            else ring_steps(e.kind, e.group_size, e.payload_bytes))
            hit = self._calls[key] = (steps, chunk, self.call_wait(e))
        return hit

    def comm(self, stage: int, op: Op):
        e = op.event
        assert e is not None and self.net is not None
        steps, chunk, wait = self.call_of(e)
        if "pp" in e.axes:  # spans stages: every stage's representative waits for the others
            yield from self._barrier(stage, e, steps, chunk)
            return
        stream = self.stream(stage, e.axes) if self.overlap else None
        req = stream.request() if stream is not None else None
        if req is not None:
            yield req
        t0, key = self.env.now, self._comm_start(stage, e)
        idle0 = self.stages[stage].idle_at(t0)
        if wait:  # for the group's ranks to be scheduled (DeviceSpec call and ring waits)
            yield self.env.timeout(wait)
        if op.alongside:  # a cp ring step: the transfer alongside one block's attention (event_context.py)
            yield simpy.AllOf(self.env, [self.net.run(self.template(stage, e.axes, e.kind), steps, chunk),
                                         self.env.process(self.gemm(stage, op))])
        elif op.gemm_steps and steps == len(op.gemm_steps):  # tpo: each exchange beside its GEMM chunk (tpo.py)
            for k, seconds in runs(op.gemm_steps):
                ring = self.net.run(self.template(stage, e.axes, e.kind), k, chunk)
                yield simpy.AllOf(self.env, [ring, self.env.process(self.gemm(stage, op, k * seconds))]) \
                    if seconds > 0 else ring
        else:
            if op.gemm > 0:
                yield from self.gemm(stage, op)
            yield self.net.run(self.template(stage, e.axes, e.kind), steps, chunk)
        if stream is not None and req is not None:
            stream.release(req)
        drag = self.drag_of(e.axes) if op.asynchronous else 0.0
        if drag:  # the compute side beside it owes the drag (overlap_drag.owed)
            st = self.stages[stage]
            st.debt += owed(drag, self.env.now - t0, st.idle_at(self.env.now) - idle0)
        self._comm_done(stage, op.name, e, t0, key)

    def gemm(self, stage: int, op: Op, seconds: float | None = None):
        """The GEMM (or `seconds` of its chunks) a tpo collective overlaps: compute time of the stage (it counts as
        hiding the collective)."""
        st = self.stages[stage]
        seconds = op.gemm if seconds is None else seconds
        st.flow(self.env.now)
        st.busy_since = self.env.now
        yield self.env.timeout(seconds)
        st.flow(self.env.now)
        st.busy += seconds
        st.busy_since = None
        st.compute += seconds

    def _barrier(self, stage: int, e: CommEvent, steps: int, chunk: float):
        assert self.net is not None
        # The k-th stage-spanning collective of every stage is the same call; one over a part of the stages
        # (tied embeddings: first + last stage, group size < pp) is matched among those calls only.
        sub = e.group_size < self.layout.pp
        k = (sub, self.barrier_seen[sub, stage])
        self.barrier_seen[sub, stage] += 1
        slot = self.barriers.setdefault(k, [0, self.env.event(), 0.0])
        t0, key = self.env.now, self._comm_start(stage, e)
        slot[0] += 1
        if slot[0] == (e.group_size if sub else self.layout.pp):
            del self.barriers[k]
            slot[2] = self.env.now  # the last stage arrived: the call starts
            wait = self.call_of(e)[2]
            if wait:
                yield self.env.timeout(wait)
            yield self.net.run(self.template(0, e.axes, e.kind), steps, chunk)
            slot[1].succeed()
        else:
            yield slot[1]
            self.stages[stage].synced += slot[2] - t0
        self._comm_done(stage, e.label, e, t0, key)

    def compiled(self, stage: int, ops: list[Op]) -> list:
        """`ops` with its fusible runs precomputed (event_fuse.compile_ops), once per op list."""
        hit = self._compiled.get((stage, id(ops)))
        if hit is None or hit[0] is not ops:  # the list is kept alive with its entry: its id is not reused
            hit = self._compiled[stage, id(ops)] = (ops, compile_ops(ops, lambda op: event_fuse.cost(self, stage, op)))
        return hit[1]

    def run_ops(self, stage: int, ops: list[Op], pending: list):
        for item in self.compiled(stage, ops):
            if not isinstance(item, Fused):
                yield from self.run_op(stage, item, pending)
            elif all(p.triggered for p in pending):  # nothing in flight reads this stage's progress meanwhile
                yield from self.pay(stage)
                yield from event_fuse.replay(self, stage, item)
            else:
                for op in item.ops:
                    yield from self.run_op(stage, op, pending)
        yield from self.pay(stage)  # before what follows the pass (a send, the step's end)

    def run_op(self, stage: int, op: Op, pending: list):
        st = self.stages[stage]
        if op.kind == "compute":
            t0 = self.env.now
            st.flow(t0)
            st.busy_since = t0
            seconds, st.debt = op.seconds + st.debt, 0.0  # with what the drag left owed (overlap_drag.py)
            yield self.env.timeout(seconds)
            st.flow(self.env.now)
            st.busy += seconds
            st.busy_since = None
            st.compute += op.seconds
            if op.hides:
                st.hide(op.hides)
            if self.record:
                self.spans.append(Span(stage, "compute", op.name, t0, self.env.now, compute_phase(op.name)))
        elif op.kind == "wait" and op.tag:  # one tagged op only (fsdp_overlap.py: a unit's prefetched gather)
            proc = self.tagged.pop((stage, op.tag), None)
            if proc is not None:
                yield from self.idle(stage, proc)
        elif op.kind == "wait":
            if pending:
                yield from self.idle(stage, simpy.AllOf(self.env, pending))
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
            ev = CommEvent("send", ("pp",), 2, nbytes, "", "pipeline", kind)
            t0, key = self.env.now, self._comm_start(stage, ev)
            wait = self.call_of(ev)[2]
            if wait:
                yield self.env.timeout(wait)
            yield self.net.run(self.send_template(stage, dst), 1, float(nbytes))
            self._comm_done(stage, f"send {kind} mb{micro} -> stage {dst}", ev, t0, key)
        self._arrival(kind, to_vstage, micro).succeed()

    def device(self, stage: int):
        prog, pp, v = self.programs[stage], self.layout.pp, self.layout.interleave
        last_v = pp * v - 1
        pending: list = []
        for op in prog.gathers:  # param_overlap: after the optimizer step, before any input arrives (event_program.py)
            yield from self.run_op(stage, op, pending)
        for kind, c, m in schedule(pp, v, self.n_micro, stage):
            vs = c * pp + stage
            if kind == "F":
                if vs > 0:
                    yield from self.idle(stage, self._arrival("act", vs, m))
                yield from self.run_ops(stage, prog.fwd_first[c] if m == 0 else prog.fwd[c], pending)
                if vs < last_v:
                    yield from self.send(stage, "act", vs + 1, m, prog.send_bytes)
            else:
                if vs < last_v:
                    yield from self.idle(stage, self._arrival("grad", vs, m))
                yield from self.run_ops(stage, prog.bwd_last[c] if m == self.n_micro - 1 else prog.bwd[c], pending)
                if vs > 0:
                    yield from self.send(stage, "grad", vs - 1, m, prog.send_bytes)
        yield from self.run_ops(stage, [*prog.tail, Op("wait", "end")], pending)
        self.stages[stage].end = self.env.now

    def run(self) -> None:
        self.net = FlowNetwork(self.env, self.links.cap)
        if self.fuse:
            event_fuse.prepare(self)
        for s in range(self.layout.pp):
            self.env.process(self.device(s))
        self.net.cap = self.links.cap  # the table grows as templates are built: share the same list
        self.env.run()



__all__ = ["Sim"]
