"""The event engine's simulation (simpy): the representative devices' processes, their schedules and sends.

`Sim` replays one training step; event.simulate builds its programs (event_program.py) and reads the result.
- one representative device per pipeline stage runs its program on a compute stream and a communication stream,
  following the stage's 1F1B or interleaved-1F1B schedule (modes/stages.schedule); stages exchange activations /
  their gradients with sends that travel the network;
- its collectives (rings on representative groups, per-communicator streams, stage-spanning barriers, tpo's
  exchanges beside their GEMM chunks): event_collectives.py, a mixin of Sim;
- runs of synchronous ops whose collectives cannot meet another transfer are replayed as one timeout
  (event_fuse.py: exact; the same op list serves every micro-batch);
- the data-parallel stream's asynchronous collectives leave the compute side a debt (overlap_drag.py), paid before
  its next compute op or at the end of the pass, absorbed by its idle time (event_drag.py).
"""

from __future__ import annotations

import numpy as np
import simpy

from paracube.cost_models import event_fuse
from paracube.cost_models.compute import GemmModel
from paracube.cost_models.event_collectives import Collectives
from paracube.cost_models.event_drag import Drag
from paracube.cost_models.event_fuse import Fused, compile_ops, compute_phase
from paracube.cost_models.event_network import FlowNetwork, LinkTable, Template
from paracube.cost_models.event_ops import Op, StageProgram, StageStats
from paracube.cost_models.event_program import schedule
from paracube.cost_models.event_trace import Span
from paracube.cost_models.moe_a2a import PLAIN
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.topologies.protocol import RoutedTopology


class Sim(Collectives, Drag):
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

    # --- processes --------------------------------------------------------------------------------
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
