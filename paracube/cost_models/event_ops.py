"""The ops of the event engine's stage programs (event_program.py builds them, event_sim.py runs them).

`Op`: one compute kernel (seconds), one collective (its CommEvent; asynchronous, tagged, carrying a tpo GEMM or a cp
block run alongside), or a wait for outstanding asynchronous collectives. `StageProgram`: what one representative
device of a pipeline stage runs per micro-batch and chunk (forward, backward; the first and last micro-batch's own
lists for kept weights and gradient buckets) and once per step (tail). `StageStats`: what a stage's simulation
books (event_sim.py; event_fuse.replay).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from paracube.estimate import CommEvent


@dataclass(frozen=True)
class Op:
    kind: str  # compute | comm | wait (join outstanding asynchronous collectives)
    name: str
    seconds: float = 0.0
    event: CommEvent | None = None
    asynchronous: bool = False
    gemm: float = 0.0  # tpo: seconds of the GEMM this collective is decomposed against (cost_models/tpo.py)
    gemm_steps: tuple[float, ...] = ()  # tpo: of those, the seconds beside each ring exchange (sum: gemm)
    tag: str = ""  # an asynchronous op a `wait` with the same tag waits for alone (fsdp_overlap.py's prefetch)
    alongside: bool = False  # the transfer and `gemm` seconds of compute together (cp ring step: event_context.py)
    hides: float = 0.0  # a2ao: compute seconds cut from `seconds` for the all_to_alls a partner hides (moe_program)


@dataclass
class StageProgram:
    stage: int
    fwd: list[list[Op]]  # per model chunk (interleaving), one micro-batch
    bwd: list[list[Op]]
    bwd_last: list[list[Op]]  # the last micro-batch's backward (kept reduce-scatters; grad buckets)
    tail: list[Op]  # per-step collectives after the last backward
    fwd_first: list[list[Op]] = field(default_factory=list)  # the first micro-batch's (kept gathers)
    gathers: list[Op] = field(default_factory=list)  # param_overlap: zero=1's, issued at the step's start (event_sim)
    send_bytes: int = 0
    compute_fwd: float = 0.0
    compute_bwd: float = 0.0
    notes: list[str] = field(default_factory=list)


A2AO_AXIS = "ep"  # the axis of the all_to_alls a2ao hides (moe_traffic.py)


@dataclass
class StageStats:
    busy: float = 0.0  # compute seconds so far
    busy_since: float | None = None
    compute: float = 0.0
    comm: float = 0.0
    exposed: float = 0.0
    by_axis: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_kind: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    end: float = 0.0
    idle: float = 0.0  # seconds the compute side waited (waits, arrivals) so far
    idle_since: float | None = None
    debt: float = 0.0  # compute seconds owed to the data-parallel stream's drag (overlap_drag.py), not yet run
    synced: float = 0.0  # seconds stage-spanning collectives waited for the other stages to arrive (in `exposed`)
    calls: dict[object, tuple[str, str]] = field(default_factory=dict)  # its collectives in flight: (axes, kind)
    mark: float = 0.0  # the time `flow` booked up to

    def flow(self, now: float) -> None:
        """Book the seconds since the last call: exposed while any of the stage's collectives is in flight and it
        computes nothing (one wall-clock second once, however many calls share it: compute + exposed never exceeds
        the stage's time), each call's axes and kind an equal share. Called before every change of `busy_since`
        or `calls`."""
        if self.calls and self.busy_since is None and now > self.mark:
            dt = now - self.mark
            self.exposed += dt
            for axis, kind in self.calls.values():
                self.by_axis[axis] += dt / len(self.calls)
                self.by_kind[kind] += dt / len(self.calls)
        self.mark = now

    def hide(self, seconds: float) -> None:
        """a2ao: `seconds` of compute the program cut for the ep all_to_alls they hide (Op.hides) are compute, not
        exposed all_to_all time (the stage ran the all_to_alls whole and the compute shortened: the same step)."""
        self.compute += seconds
        self.exposed -= seconds
        self.by_axis[A2AO_AXIS] -= seconds
        self.by_kind["all_to_all"] -= seconds

    def idle_at(self, now: float) -> float:
        return self.idle + (now - self.idle_since if self.idle_since is not None else 0.0)


__all__ = ["Op", "StageProgram", "StageStats"]
