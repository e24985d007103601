"""The event engine's collectives (a mixin of event_sim.Sim): where each call runs on the network and when.

- every collective is a ring on the representative group (node-major order), decomposed into its steps
  (collective.ring_steps; an uncalibrated all_reduce that a tree does faster: the tree's steps over the same
  links, collective.call_steps, as the analytic model prices it), whose transfers share links max-min fairly with
  the concurrent groups of the same axis in that stage (event_network.py) and with whatever else the simulated
  devices run at the same time; the decomposition and the call's wait (GemmModel.call_wait) are computed once per
  distinct call; an all_to_all's flows go to every peer (moe_a2a.py);
- tpo: a collective its mode declares overlappable runs each ring exchange alongside the GEMM chunk the executor
  runs beside it (Op.gemm_steps; cost_models/tpo.py); a cp ring step runs alongside one block's attention
  (event_context.py);
- asynchronous collectives queue on a stream per communicator (stage, mesh axes): calls of one group run in issue
  order, calls of different groups concurrently (NCCL runs each communicator on its own stream). They still share
  links (event_network.py); the data-parallel stream's leave the compute side a debt (overlap_drag.owed,
  event_drag.py);
- collectives over groups that span pipeline stages (the grad-norm all-reduce) synchronize the stages: the k-th
  such call of every stage is one call, started when the last stage arrives (`_barrier`).
Each call books its seconds and exposed time to its stage (StageStats.flow) and, with a timeline, a Span.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from paracube.cost_models.collective import call_steps, ring_steps
from paracube.cost_models.compute import GemmModel
from paracube.cost_models.event_network import FlowNetwork, LinkTable, Template
from paracube.cost_models.event_ops import Op, StageStats
from paracube.cost_models.event_trace import Span
from paracube.cost_models.moe_a2a import a2a_template
from paracube.cost_models.overlap_drag import owed
from paracube.cost_models.tpo import runs
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.experts import EXPERT_AXES
from paracube.topologies.protocol import RoutedTopology


class Collectives:
    """event_sim.Sim's collective calls: templates, streams, per-call waits, rings and stage barriers."""

    layout: Layout
    topo: RoutedTopology
    env: simpy.Environment
    stages: list[StageStats]
    record: bool
    spans: list[Span]
    overlap: bool
    links: LinkTable
    net: FlowNetwork | None
    grid: np.ndarray
    reps: list[int]
    stage_of: np.ndarray
    dispatch: object
    waits: GemmModel | None
    alpha_beta: dict[tuple[str, ...], tuple[float, float]]
    streams: dict[tuple[int, tuple[str, ...]], simpy.Resource]
    barriers: dict[tuple[bool, int], list]
    barrier_seen: dict[tuple[bool, int], int]
    _templates: dict[tuple, Template]
    _calls: dict[tuple, tuple[int, float, float]]
    drag_of: Callable[[tuple[str, ...]], float]  # event_drag.Drag's

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

    # --- calls ----------------------------------------------------------------------------------
    def call_wait(self, e: CommEvent) -> float:
        """Seconds the call waits beyond its ring steps (GemmModel.call_wait; 0 on accelerators)."""
        if self.waits is None:
            return 0.0
        return float(self.waits.call_wait(e.kind, e.group_size, e.payload_bytes, e.dtype,
                                          self.layout.tensor_mode.alternating))

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


__all__ = ["Collectives"]
