"""The cost of one collective call: the one home of the alpha-beta formulas every engine and fit uses.

A call of kind K on a group of n ranks, whose (whole, unsharded) payload is P bytes (estimate.CommEvent
says which tensor that is), over a link of bandwidth B (bytes/s) and latency a (s per step), takes

    time = latency_factor(K, n) * a + sent_factor(K, n) * P / B

Ring algorithms (the default; what gloo and NCCL run for the large payloads of training, and what the
executor's calls were measured with). Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH", section 4; bandwidth-optimality of the ring all_reduce: Patarasuk &
Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations":

    kind                                 latency_factor   sent_factor (bytes one rank sends / P)
    all_gather, reduce_scatter           n - 1            (n - 1) / n
    all_reduce (reduce_scatter + gather) 2 (n - 1)        2 (n - 1) / n
    broadcast, reduce (pipelined ring)   n - 1            (n - 1) / n
    all_to_all                           n - 1            (n - 1) / n
    send (point to point)                1                1

A group of one rank sends nothing (sent_factor 0). The ring runs latency_factor synchronized steps, each
moving P / n bytes per rank (a send: one step of P): `ring_steps` gives the event engine that
decomposition, so that steps x bytes per step = sent_factor x P.

Tree all_reduce (`algorithm="tree"`): binomial-tree reduce to a root, then binomial-tree broadcast
(Thakur et al. 2005, section 4.4, short messages): 2 ceil(log2 n) steps, each moving the whole payload,

    time = 2 ceil(log2 n) (a + P / B)      (sent_factor = 2 ceil(log2 n): bytes on a rank's critical path)

It beats the ring when latency dominates, i.e. for small payloads on large groups
((n - 1 - ceil(log2 n)) a > (ceil(log2 n) - (n - 1)/n) P / B); `best_algorithm` picks the faster per call.
Only all_reduce has a tree variant. Both engines price an uncalibrated all_reduce with the faster of the two
(`fastest_time`, `call_steps`), as NCCL picks its algorithm by message size and group; with a calibration
they keep the ring (the fits were made with the ring factors). The bytes a rank sends stay the ring's.

Tiers: (B, a) is the link of the group (topology.group_link: the slowest hop of the group's ring, NVLink /
NVSwitch inside a node, the NIC's InfiniBand rate between nodes, each times the fabric's bandwidth
efficiency of presets.FABRIC_EFF; latency summed along the hop's path), so a call inside a node and one
across nodes are priced by their own tier, for ring and tree alike.

Calibrated links. `paracube calibrate` fits (a, B) per collective kind and group size, with every rank busy,
once with fixed groups and once with calls cycling through the groups of every stride (`alternating`,
what modes whose consecutive collectives switch mesh axes see: 2D, 2.5D, 3D). `calibrated_link` replaces the
topology link's (B, a) by the fitted pair where the calibration has one for (kind, n); the formula is the
same. A table row is (kind, n, alternating, latency, bandwidth) (topologies.calibration.Calibration.comm_table).

Scheduling waits (local CPU ranks that share cores; DeviceSpec.ring_wait_s, 0 on accelerators). When r ranks
share a core, every message a gloo collective passes waits for its receiver to be scheduled (and for the
peers to arrive, which drift apart on a shared core): `wait_steps` messages on a rank's critical path per
call, each waiting DeviceSpec.ring_wait_s. They are gloo's CPU algorithms, not the alpha-beta table above:

    kind                                        wait_steps      why
    all_reduce                                  2 ceil(log2 n)  small payloads (what a training step's calls
                                                                carry on CPU) reduce and spread in log steps
    reduce_scatter                              n (n - 1)       ProcessGroupGloo runs it as n reductions
    all_gather, broadcast, reduce, all_to_all   n - 1
    send                                        1               the receiver's wait

In a mode whose consecutive collectives switch mesh axes (mode.alternating: 2D, 2.5D, 3D) each call waits
ALTERNATING_MEET = 1 more message: its group meets first, and the last rank to arrive comes from its own previous
call in another group, to be scheduled among the others on its core. Measured with `benchmarks/gloo_waits.py`
(8 ranks on a 2-core VM, 4 KB payloads, 2026-12-05): an all_gather over 2 ranks took 0.83 ms calling one group
back to back and 1.39 ms cycling through the three axes of a 2x2x2 grid; reduce_scatter 1.48 -> 2.38 ms,
all_reduce 0.83 -> 1.43 ms, all_gather over 4 ranks 2.92 -> 3.36 ms; a second run +0.45-0.61 ms; a 12 ms
reduce_scatter over 4 ranks showed none beyond its noise (+0.01, -0.36 ms): +0.4-0.9 ms a call, about one message's wait
((r - 1) x 0.28 ms = 0.84 ms with r = 4 ranks a core, topologies/local_cpu.py). Not fitted on any plan.

A send (a pipeline's hand-off) waits at least DeviceSpec.send_wait_s instead (GemmModel.call_wait): its receiver is
woken beside ranks that compute, not beside ranks blocked in the same call (topologies/local_cpu.py).

Measured inside training steps of the tiny GPT, 8 ranks on a 2-core VM (recorder spans, mean seconds per
call): all_reduce 1.5-1.9 ms (n=2), 3.5-4.4 (n=4), 3.6-5.0 (n=8); all_gather 1.1-1.3 (n=2), 2.5 (n=4);
reduce_scatter 1.3-2.6 (n=2), 9.6-10.4 (n=4), independent of the payload (128 B to 128 KB): about 0.9 ms per
wait step; with 4 ranks on 2 cores an all_reduce of 4 ranks took 1.25 ms, a third of it (the wait per step
scales with the r - 1 other ranks on the core, topologies/local_cpu.py). `paracube calibrate`'s collective
table agrees on the kinds' ratios: reduce_scatter 1 : 6.5 : 30 for n = 2, 4, 8 (n (n - 1): 1 : 6 : 28).

API (numpy arrays or scalars for n, count, payload, bandwidth, latency; results are float arrays):
    latency_factor(kind, n, algorithm="ring") -> Arr
    sent_factor(kind, n, algorithm="ring") -> Arr
    ring_steps(kind, n, payload) -> (steps: int, bytes per step per rank: float)     # one call, scalars
    collective_time(kind, n, count, payload, bw, lat, algorithm="ring") -> Arr
        `count` calls whose payloads sum to `payload`; 0 where count == 0
    calibrated_link(table, kind, n, bw, lat, alternating=False) -> (bw, lat)
    best_algorithm(kind, n, payload, bw, lat) -> "ring" | "tree"                      # one call, scalars
    fastest_time(kind, n, count, payload, bw, lat) -> Arr           # the faster of ring and tree per element
    call_steps(kind, n, payload, bw, lat) -> (steps, bytes per step)  # one call of the faster algorithm
    wait_steps(kind, n, alternating=False) -> Arr    # messages of one gloo call that wait to be scheduled
"""

from __future__ import annotations

import numpy as np

from paracube.errors import ParacubeError, check
from paracube.estimate import COLLECTIVE_KINDS, ring_sent_factor

Arr = np.ndarray
ALTERNATING_MEET = 1.0  # messages a call waits for its group to meet when calls switch groups (module docstring)
Table = tuple[tuple[str, int, bool, float, float], ...]  # (kind, n, alternating, latency s, bandwidth B/s)
ALGORITHMS = ("ring", "tree")


def _check(kind: str, algorithm: str) -> None:
    check(kind in COLLECTIVE_KINDS, f"collective kind {kind!r}; valid: {', '.join(COLLECTIVE_KINDS)}")
    if algorithm == "tree" and kind != "all_reduce":
        raise ParacubeError(f"algorithm 'tree' is defined for all_reduce only; valid for {kind}: ring")
    check(algorithm in ALGORITHMS, f"collective algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")


def _tree_depth(n: Arr) -> Arr:
    """ceil(log2 n) for n >= 1 (0 for one rank), exact for integers held as floats."""
    return np.ceil(np.log2(np.maximum(n, 1.0)) - 1e-12).clip(min=0.0)


def latency_factor(kind: str, n: int | Arr, algorithm: str = "ring") -> Arr:
    """Steps of one call that each pay the link latency (table in the module docstring)."""
    _check(kind, algorithm)
    n = np.asarray(n, dtype=float)
    if algorithm == "tree":
        return 2.0 * _tree_depth(n)
    if kind == "all_reduce":
        return 2.0 * (n - 1)
    if kind == "send":
        return np.ones_like(n)
    return n - 1.0


def sent_factor(kind: str, n: int | Arr, algorithm: str = "ring") -> Arr:
    """Bytes one rank sends per payload byte (ring: estimate.ring_sent_factor; tree: its critical path)."""
    _check(kind, algorithm)
    n = np.asarray(n, dtype=float)
    if algorithm == "tree":
        return 2.0 * _tree_depth(n)
    return np.asarray(ring_sent_factor(kind, n), dtype=float)


def ring_steps(kind: str, n: int, payload: float) -> tuple[int, float]:
    """(ring steps, bytes per step per rank) of one call: steps x bytes = sent_factor x payload."""
    steps = int(latency_factor(kind, n))
    return steps, float(payload) if kind == "send" else payload / n


def collective_time(kind: str, n: int | Arr, count: int | Arr, payload: float | Arr, bw: float | Arr,
                    lat: float | Arr, algorithm: str = "ring") -> Arr:
    """Seconds of `count` calls whose payloads sum to `payload` bytes (0 where count is 0)."""
    count = np.asarray(count, dtype=float)
    t = count * latency_factor(kind, n, algorithm) * lat + sent_factor(kind, n, algorithm) * payload / bw
    return np.where(count > 0, t, 0.0)


def fastest_time(kind: str, n: int | Arr, count: int | Arr, payload: float | Arr, bw: float | Arr,
                 lat: float | Arr) -> Arr:
    """`collective_time` of the faster algorithm per element (ring for kinds without a tree)."""
    ring = collective_time(kind, n, count, payload, bw, lat)
    if kind != "all_reduce":
        return ring
    return np.minimum(ring, collective_time(kind, n, count, payload, bw, lat, "tree"))


def call_steps(kind: str, n: int, payload: float, bw: float, lat: float) -> tuple[int, float]:
    """(steps, bytes per step per rank) of one call with the faster algorithm: the ring's `ring_steps`, or
    the tree's 2 ceil(log2 n) steps of the whole payload (the event engine's decomposition)."""
    if best_algorithm(kind, n, payload, bw, lat) == "tree":
        return int(latency_factor(kind, n, "tree")), float(payload)
    return ring_steps(kind, n, payload)


def calibrated_link(table: Table, kind: str, n: int | Arr, bw: Arr, lat: Arr, alternating: bool = False
                    ) -> tuple[Arr, Arr]:
    """(bandwidth, latency) per element of `n` (group sizes): the calibrated pair of (kind, n) where the
    table has one (the alternating-groups fit if asked for and measured, else the fixed-group one), else
    the topology link's `bw`, `lat` (returned as given when no row applies)."""
    # Fixed-group rows first, alternating ones after: a later match overrides an earlier one.
    rows = [(size, a, b) for k, size, alt, a, b in sorted(table, key=lambda r: r[2])
            if k == kind and (not alt or alternating)]
    if not rows:
        return bw, lat
    n = np.asarray(n)
    for size, a, b in rows:
        hit = n == size
        bw, lat = np.where(hit, b, bw), np.where(hit, a, lat)
    return bw, lat


def wait_steps(kind: str, n: int | Arr, alternating: bool = False) -> Arr:
    """Messages of one gloo call over n ranks that wait for a rank to be scheduled (module docstring); one more
    where consecutive calls switch groups (`alternating`: the group meets first)."""
    _check(kind, "ring")
    n = np.asarray(n, dtype=float)
    if alternating:
        return np.where(n >= 2, wait_steps(kind, n) + ALTERNATING_MEET, 0.0)
    if kind == "all_reduce":
        steps = 2.0 * _tree_depth(n)
    elif kind == "reduce_scatter":
        steps = n * (n - 1.0)
    elif kind == "send":
        steps = np.ones_like(n)
    else:
        steps = n - 1.0
    return np.where(n >= 2, steps, 0.0)


def best_algorithm(kind: str, n: int, payload: float, bw: float, lat: float) -> str:
    """The faster algorithm for one call ("ring" on ties and for kinds without a tree)."""
    if kind != "all_reduce":
        return "ring"
    ring, tree = (float(collective_time(kind, n, 1, payload, bw, lat, alg)) for alg in ALGORITHMS)
    return "tree" if tree < ring else "ring"


__all__ = ["ALGORITHMS", "ALTERNATING_MEET", "Table", "best_algorithm", "calibrated_link", "call_steps",
           "collective_time", "fastest_time", "latency_factor", "ring_steps", "sent_factor", "wait_steps"]
