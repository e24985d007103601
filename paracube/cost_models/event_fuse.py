"""Fused runs of the event engine: consecutive synchronous ops of one stage replayed as one simpy timeout.

Why: a step of GPT-3 175B at dp=8, pp=16, tp=1d:8 is ~118k collectives (192 micro-batches x 16 stages x
~38 tensor-parallel all-reduces); simulated one by one each costs a simpy process step, a network job (start,
timeout, done event) and the stage's bookkeeping: ~475k simpy events, most of them for collectives whose time
cannot depend on anything else the step does.

Contract (exact, not an approximation):
- a template (event_network.Template: the representative group of one stage's communicator) is *private* when no
  other template of the run uses any of its links and no asynchronous or tagged op runs on it. Collectives over
  every pipeline stage (the grad-norm all-reduce: event_collectives.Collectives._barrier) do not count: their one
  job runs while every stage's device waits at the barrier, so it meets no synchronous op of any stage. A job on it
  never shares a link, so event_network.FlowNetwork always runs it on its fast path: duration = steps x
  step_time(chunk), known before it starts; the call's wait (GemmModel.call_wait) comes before it, as in
  event_collectives.Collectives.comm;
- a *fusible* op is a compute op, or a plain synchronous collective (no tpo GEMM, no cp block alongside, no tag,
  not stage-spanning) on a private template;
- a maximal run of fusible ops of one op list is precomputed once per list (`compile_ops`): the same list serves
  every micro-batch of the stage (event_program.StageProgram: fwd / bwd per chunk), so 1F1B's steady state
  replays it, and the run costs one timeout of the summed seconds;
- the replay (event_fuse.replay) books compute, communication, exposed time per axis and kind, the network's
  job and ring-step counts and (timeline) every op's span at its offset, as the ops one by one would have;
- it is taken only when no asynchronous op of the stage is in flight: those read the stage's compute progress as
  they end (event_collectives.Collectives._comm_done: hidden = busy at end - busy at start), which a fused run
  does not expose op by op; then the run's ops execute one by one.
The only difference from running the ops one by one is the order of floating-point additions of the same
durations (relative 1e-15 per op); tests/test_event_fuse.py compares both paths.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from paracube.cost_models.event_trace import Span

Op = Any  # event_program.Op (this module is below it: event_program does not need it)
Sim = Any  # event_sim.Sim (which imports this module)


@dataclass(frozen=True)
class Piece:
    """One op of a fused run: offsets (s) from the run's start; ring steps of a collective (0: compute)."""

    op: Op
    start: float
    end: float
    steps: int = 0
    wait: float = 0.0  # the call's wait before its ring steps (part of start..end)


@dataclass(frozen=True)
class Fused:
    pieces: tuple[Piece, ...]
    seconds: float  # the run's length
    compute: float  # compute seconds in it
    ops: tuple[Op, ...]  # the ops, run one by one when the fused path is not taken
    comm: float = 0.0  # collective seconds in it (all exposed: nothing computes alongside a synchronous call)
    by_axis: dict[str, float] = field(default_factory=dict)
    by_kind: dict[str, float] = field(default_factory=dict)
    jobs: int = 0
    ring_steps: int = 0
    hides: float = 0.0  # its compute ops' Op.hides


def private_keys(links: Mapping[Hashable, frozenset[int]], shared: set[Hashable]) -> set[Hashable]:
    """Template keys whose links no other template uses, except those in `shared` (used asynchronously, by
    several processes, or spanning stages)."""
    users: dict[int, int] = {}
    for ls in links.values():
        for link in ls:
            users[link] = users.get(link, 0) + 1
    return {key for key, ls in links.items() if key not in shared and all(users[link] == 1 for link in ls)}


def compile_ops(ops: list[Op], cost: Callable[[Op], tuple[float, float, int] | None]) -> list[Op | Fused]:
    """`ops` with each maximal run of fusible ops (at least one collective in it) replaced by a Fused.
    `cost(op)`: None where the op is not fusible, else (wait seconds, total seconds, ring steps)."""
    out: list[Op | Fused] = []
    run: list[tuple[Op, tuple[float, float, int]]] = []

    def close() -> None:
        if not any(op.kind == "comm" for op, _ in run):
            out.extend(op for op, _ in run)
        else:
            pieces, t, busy, comm = [], 0.0, 0.0, 0.0
            by_axis: dict[str, float] = defaultdict(float)
            by_kind: dict[str, float] = defaultdict(float)
            jobs = ring = 0
            for op, (wait, seconds, steps) in run:
                pieces.append(Piece(op, t, t + seconds, steps, wait))
                t += seconds
                if op.kind == "compute":
                    busy += seconds
                else:
                    comm += seconds
                    by_axis[".".join(op.event.axes)] += seconds
                    by_kind[op.event.kind] += seconds
                    jobs, ring = jobs + 1, ring + steps
            out.append(Fused(tuple(pieces), t, busy, tuple(op for op, _ in run), comm, dict(by_axis),
                             dict(by_kind), jobs, ring, sum(op.hides for op, _ in run)))
        run.clear()

    for op in ops:
        c = cost(op)
        if c is None:
            close()
            out.append(op)
        else:
            run.append((op, c))
    close()
    return out


def compute_phase(name: str) -> str:
    """The phase a compute op's span is coloured by (event_program.py's op names)."""
    return "bwd" if name.endswith(("dX", "dA", "bwd")) else name.rsplit(".", 1)[-1]


def fusible(op: Op) -> bool:
    """A compute op, or a collective with nothing run alongside it and nothing waiting on it alone."""
    if op.kind == "compute":
        return True
    return (op.kind == "comm" and op.event is not None and not op.asynchronous and not op.tag and op.gemm <= 0
            and not op.alongside and "pp" not in op.event.axes)


def prepare(sim: Sim) -> None:
    """Build every template the stages' programs use (collectives, barriers, pipeline sends) and mark the private
    ones (module docstring) in `sim.private`."""
    links: dict[Hashable, frozenset[int]] = {}
    shared: set[Hashable] = set()
    for s, prog in enumerate(sim.programs):
        for ops in (*prog.fwd, *prog.fwd_first, *prog.bwd, *prog.bwd_last, prog.tail):
            for op in ops:
                if op.kind != "comm" or op.event is None:
                    continue
                axes = op.event.axes
                if "pp" in axes and op.event.group_size >= sim.layout.pp:
                    continue  # a barrier of every stage (Collectives._barrier): it runs while all stages wait
                key = sim.template_key(s, axes, op.event.kind)
                links[key] = sim.template(0 if "pp" in axes else s, axes, op.event.kind).links
                if op.asynchronous or op.tag or "pp" in axes:  # may run alongside a job on the same template
                    shared.add(key)
    pp, v = sim.layout.pp, sim.layout.interleave
    for s in range(pp):
        for dst in {(s + 1) % pp, (s - 1) % pp} - {s}:
            if v > 1 or abs(dst - s) == 1:  # without interleaving no send wraps around the pipeline
                links["send", s, dst] = sim.send_template(s, dst).links
                shared.add(("send", s, dst))
    sim.private = private_keys(links, shared)


def cost(sim: Sim, stage: int, op: Op) -> tuple[float, float, int] | None:
    """(wait, seconds, ring steps) of a fusible op on a private template; None otherwise."""
    if op.kind == "compute":
        return 0.0, op.seconds, 0
    if not fusible(op) or sim.template_key(stage, op.event.axes, op.event.kind) not in sim.private:
        return None
    steps, chunk, wait = sim.call_of(op.event)
    tpl = sim.template(stage, op.event.axes, op.event.kind)
    ring = steps * sim.net.step_time(tpl, chunk) if steps > 0 else 0.0
    return wait, wait + ring, steps


def replay(sim: Sim, stage: int, f: Fused) -> Iterator[Any]:
    """One fused run: one timeout, then its bookkeeping (and spans) as its ops one by one would have left."""
    t0 = sim.env.now
    st = sim.stages[stage]
    st.flow(t0)
    yield sim.env.timeout(f.seconds)
    st.mark = sim.env.now  # booked below (nothing else of the stage is in flight: Sim.run_ops)
    st.busy += f.compute
    st.compute += f.compute
    st.comm += f.comm
    st.exposed += f.comm
    for axis, sec in f.by_axis.items():
        st.by_axis[axis] += sec
    for kind, sec in f.by_kind.items():
        st.by_kind[kind] += sec
    if f.hides:
        st.hide(f.hides)
    sim.net.stats["jobs"] += f.jobs
    sim.net.stats["ring_steps"] += f.ring_steps
    sim.net.stats["fused_runs"] += 1
    if sim.record:
        for p in f.pieces:
            if p.op.kind == "compute":
                sim.spans.append(Span(stage, "compute", p.op.name, t0 + p.start, t0 + p.end, compute_phase(p.op.name)))
            else:
                e = p.op.event
                sim.spans.append(Span(stage, "comm", p.op.name, t0 + p.start, t0 + p.end, f"{e.phase}:{e.kind}"))


__all__ = ["Fused", "Piece", "compile_ops", "compute_phase", "cost", "fusible", "prepare", "private_keys", "replay"]
