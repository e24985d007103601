"""Flow-level network for the event engine: ring steps whose transfers share links max-min fairly.

Why flow level: a packet-level model (ns-3 style) costs orders of magnitude more events per byte, and what
decides a collective's time here is how a link's bandwidth is split between the transfers crossing it,
which flow-level max-min fair sharing reproduces (TCP/IB congestion control converges to it).

Symmetry (scale): one *representative* group per (pipeline stage, mesh axes) is simulated: of the groups
that run the collective at the same time, the one whose worst hop sees the most loaded link (ties: the
group of the stage's first rank), since the others wait for it at the next collective that couples them.
This catches groups that straddle a node boundary where the group of rank 0 does not. Its ring hops
are flow *classes*: on a link e a representative hop stands for `weight = k(e) / r(e)` flows, where k(e)
counts the hops of every concurrent group of that axis in the stage crossing e and r(e) the
representative's own hops crossing e. Weighted max-min (sum of weight x rate <= capacity on every link) then
gives each hop the rate it would get with all concurrent groups simulated, when they are symmetric.
A ring hop that crosses nodes runs as parallel channels (topology.ring_channels, NCCL's channels over the node's
NICs): one flow whose rate R puts share x R on each channel's links, so k(e) and r(e) sum shares and a link's
weight is share x k(e) / r(e) -- the analytic engine's fractional link load (event_links.ring_template).

A job is one collective: `steps` synchronized ring steps; in each, a latency `alpha` then every hop moves
`chunk` bytes (cost_models/collective.ring_steps: steps x chunk = the bytes a rank sends); the step ends when
its slowest hop ends. Rates are recomputed whenever a transfer starts or ends. Fast path: a job whose links no
other active job uses runs its remaining steps in one jump (the step time is cached per template); when
another job arrives on its links it is materialized back into step-by-step mode (its position inside the
current step is interpolated linearly). Link ids, capacities and paths: event_paths.py; the templates themselves:
event_links.py.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import simpy

from paracube.cost_models.event_links import LinkTable, Template, ring_hops  # re-exported: the engine's one import

EPS = 1e-12


def weighted_maxmin(hops: Sequence[tuple[tuple[int, float], ...]], cap: Sequence[float]) -> list[float]:
    """Progressive filling: all unfrozen hops rise together to a common level; a link saturates at
    level (capacity - frozen load) / (unfrozen weight), the first to saturate freezes its hops there.
    Links saturating at the same level (to 1e-9) are frozen in one round: symmetric rings take few rounds."""
    n = len(hops)
    rates = [math.inf] * n
    frozen = [False] * n
    used: dict[int, float] = {}
    wsum: dict[int, float] = {}
    users: dict[int, list[tuple[int, float]]] = {}
    for i, hop in enumerate(hops):
        for link, w in hop:
            users.setdefault(link, []).append((i, w))
            wsum[link] = wsum.get(link, 0.0) + w
            used.setdefault(link, 0.0)
    live = set(wsum)
    while live:
        levels = {link: (cap[link] - used[link]) / wsum[link] for link in live}
        best = min(levels.values())
        for link in [link for link, lv in levels.items() if lv <= best * (1 + 1e-9)]:
            for i, _ in users[link]:
                if frozen[i]:
                    continue
                rates[i], frozen[i] = best, True
                for other, w in hops[i]:
                    used[other] += w * best
                    wsum[other] -= w
        live = {link for link in live if wsum[link] > 1e-12}
    return rates


@dataclass
class _Job:
    tpl: Template
    steps: int
    chunk: float
    done: simpy.Event
    step: int = 0
    mode: str = "lat"  # lat | xfer | iso
    until: float = 0.0  # end of the latency phase (lat) or of the whole job (iso)
    iso_start: float = 0.0
    remaining: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)


class FlowNetwork:
    """Links with capacities (B/s); jobs (collectives) over templates; simpy drives the clock."""

    def __init__(self, env: simpy.Environment, capacities: Sequence[float]) -> None:
        self.env = env
        self.cap = list(capacities)
        self.active: list[_Job] = []
        self._last = 0.0
        self._gen = 0
        self._rate_cache: dict[tuple, list[float]] = {}
        self._step_cache: dict[tuple[int, float], float] = {}
        self._meet: dict[tuple[int, int], bool] = {}  # (tid, tid) -> the two templates share a link
        self.stats = Counter()

    def _shares(self, a: Template, b: Template) -> bool:
        """Whether templates a and b use a common link (memoized: a run asks it for every active pair; a ring
        crossing nodes through its channels has many links)."""
        key = (a.tid, b.tid) if a.tid <= b.tid else (b.tid, a.tid)
        hit = self._meet.get(key)
        if hit is None:
            hit = self._meet[key] = not a.links.isdisjoint(b.links)
        return hit

    # --- public -----------------------------------------------------------------------------------
    def run(self, tpl: Template, steps: int, chunk: float) -> simpy.Event:
        """Start a collective; the returned event fires when its last step ends."""
        done = self.env.event()
        self.stats["jobs"] += 1
        self.stats["ring_steps"] += steps
        if steps <= 0:
            done.succeed()
            return done
        self._advance()
        job = _Job(tpl, steps, float(chunk), done)
        sharing = [j for j in self.active if self._shares(j.tpl, tpl)]
        for other in sharing:
            if other.mode == "iso":
                self._materialize(other)
        self.active.append(job)
        if sharing:
            job.mode, job.until = "lat", self.env.now + tpl.alpha
        else:
            self._go_iso(job)
        self._reschedule()
        return done

    def step_time(self, tpl: Template, chunk: float) -> float:
        """One ring step alone on the network: latency + fluid transfer with rates recomputed as hops end."""
        key = (tpl.tid, chunk)
        hit = self._step_cache.get(key)
        if hit is None:
            remaining = [chunk] * len(tpl.hops)
            live = list(range(len(tpl.hops)))
            t = 0.0
            while live:
                rates = weighted_maxmin([tpl.hops[i] for i in live], self.cap)
                dt = min(remaining[i] / r for i, r in zip(live, rates, strict=True))
                t += dt
                for i, r in zip(live, rates, strict=True):
                    remaining[i] -= r * dt
                live = [i for i in live if remaining[i] > chunk * 1e-9]
            hit = self._step_cache[key] = tpl.alpha + t
        return hit

    # --- internals --------------------------------------------------------------------------------
    def _go_iso(self, job: _Job) -> None:
        job.mode, job.iso_start = "iso", self.env.now
        job.until = self.env.now + (job.steps - job.step) * self.step_time(job.tpl, job.chunk)

    def _materialize(self, job: _Job) -> None:
        """Back to step-by-step mode at the current time (position inside the step interpolated)."""
        per = self.step_time(job.tpl, job.chunk)
        elapsed = self.env.now - job.iso_start
        done_steps = min(int(elapsed / per + EPS), job.steps - job.step - 1) if per > 0 else 0
        job.step += done_steps
        into = elapsed - done_steps * per
        alpha = job.tpl.alpha
        if into < alpha:
            job.mode, job.until = "lat", self.env.now + (alpha - into)
        else:
            frac = min(1.0, (into - alpha) / max(per - alpha, EPS))
            job.mode, job.remaining = "xfer", [job.chunk * (1 - frac)] * len(job.tpl.hops)
        self.stats["materialized"] += 1

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            for job in self.active:
                if job.mode == "xfer":
                    job.remaining = [max(0.0, r - rate * dt)
                                     for r, rate in zip(job.remaining, job.rates, strict=True)]
        self._last = now

    def _transitions(self) -> None:
        now = self.env.now
        tol = EPS * (1.0 + now)  # below the clock's resolution at `now`: would never advance time
        finished: list[_Job] = []
        for job in self.active:
            if job.mode == "iso" and job.until <= now + tol:
                job.step = job.steps
                finished.append(job)
            elif job.mode == "lat" and job.until <= now + tol:
                job.mode, job.remaining = "xfer", [job.chunk] * len(job.tpl.hops)
            elif job.mode == "xfer" and len(job.rates) == len(job.remaining):
                job.remaining = [0.0 if rate > 0 and r / rate <= tol else r
                                 for r, rate in zip(job.remaining, job.rates, strict=True)]
            if job.mode == "xfer" and all(r <= job.chunk * 1e-9 for r in job.remaining):
                job.step += 1
                if job.step >= job.steps:
                    finished.append(job)
                elif any(j is not job and self._shares(j.tpl, job.tpl) for j in self.active):
                    job.mode, job.until = "lat", now + job.tpl.alpha
                else:
                    self._go_iso(job)  # alone again: jump over the remaining steps
        for job in finished:
            self.active.remove(job)
            job.done.succeed()

    def _rates(self) -> None:
        # Deterministic order (template, hop) so the max-min solution can be cached by the active set.
        xfer = sorted(((j, i) for j in self.active if j.mode == "xfer" for i, r in enumerate(j.remaining)
                       if r > j.chunk * 1e-9), key=lambda ji: (ji[0].tpl.tid, ji[1]))
        key = tuple((j.tpl.tid, i) for j, i in xfer)
        rates = self._rate_cache.get(key)
        if rates is None:
            self.stats["maxmin_solves"] += 1
            rates = self._rate_cache[key] = weighted_maxmin([j.tpl.hops[i] for j, i in xfer], self.cap)
        for job in self.active:
            if job.mode == "xfer":
                job.rates = [0.0] * len(job.remaining)
        for (job, i), rate in zip(xfer, rates, strict=True):
            job.rates[i] = rate

    def _reschedule(self) -> None:
        self._transitions()
        self._rates()
        now, nxt = self.env.now, math.inf
        for job in self.active:
            if job.mode in ("iso", "lat"):
                nxt = min(nxt, job.until)
            else:
                for r, rate in zip(job.remaining, job.rates, strict=True):
                    if r > job.chunk * 1e-9:
                        nxt = min(nxt, now + r / rate if rate > 0 else math.inf)
        if math.isinf(nxt):
            return
        self._gen += 1
        gen = self._gen
        ev = self.env.timeout(max(0.0, nxt - now))
        ev.callbacks.append(lambda _e, g=gen: self._wake(g))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later reschedule
        self.stats["wakeups"] += 1
        self._advance()
        self._reschedule()


__all__ = ["FlowNetwork", "LinkTable", "Template", "ring_hops", "weighted_maxmin"]
