"""Two sets of ring groups running at once on one topology: the bandwidth each keeps.

The event engine shares every link max-min fairly between the ring hops crossing it (cost_models/event_network.py:
progressive filling, all hops of one collective at one rate). For two collectives that run side by side -- a
data-parallel bucket or FSDP gather beside the tensor-parallel collectives of the backward, each with all its
concurrent groups -- the same filling over the two rates Ra, Rb (la, lb: hops of each crossing an edge):
    la(e) Ra + lb(e) Rb <= bw(e) on every edge either group's ring uses;
both rise together until an edge saturates, the class(es) crossing it freeze there, the other rises alone to its
next saturated edge. `ratios` returns Ra / Ra_alone and Rb / Rb_alone (1: no link in common).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _fill(la: np.ndarray, lb: np.ndarray, bw: np.ndarray) -> tuple[float, float]:
    """Progressive filling of two classes over edges with loads la, lb and capacities bw (event_network's rule)."""
    both = la + lb
    level = float(np.min(bw[both > 0] / both[both > 0])) if np.any(both > 0) else np.inf
    tight = (both > 0) & (bw / np.where(both > 0, both, 1.0) <= level * (1 + 1e-9))
    a_frozen, b_frozen = bool(np.any(tight & (la > 0))), bool(np.any(tight & (lb > 0)))
    ra = level if a_frozen else _rest(la, bw - lb * level)
    rb = level if b_frozen else _rest(lb, bw - la * level)
    return ra, rb


def _rest(load: np.ndarray, free: np.ndarray) -> float:
    live = load > 0
    return float(np.min(free[live] / load[live])) if np.any(live) else np.inf


def ratios(topo: object, a: Sequence[int], a_concurrent: Sequence[Sequence[int]], b: Sequence[int],
           b_concurrent: Sequence[Sequence[int]]) -> tuple[float, float]:
    """(Ra / Ra alone, Rb / Rb alone) of ring group `a` (with `a_concurrent`) and `b` (with `b_concurrent`) at once;
    each class's edges are its representative group's (Topology.ring_loads, as group_link prices it alone)."""
    ea, la, bw = topo.ring_loads(a, a_concurrent)  # type: ignore[attr-defined]
    eb, lb, _ = topo.ring_loads(b, b_concurrent)  # type: ignore[attr-defined]
    edges = np.union1d(ea, eb)
    ma, mb = np.isin(edges, ea), np.isin(edges, eb)
    la_e, lb_e, cap = np.where(ma, la[edges], 0.0), np.where(mb, lb[edges], 0.0), bw[edges]
    alone_a, alone_b = _rest(la_e, cap), _rest(lb_e, cap)
    ra, rb = _fill(la_e, lb_e, cap)
    return (ra / alone_a if np.isfinite(alone_a) and alone_a > 0 else 1.0,
            rb / alone_b if np.isfinite(alone_b) and alone_b > 0 else 1.0)


__all__ = ["ratios"]
