"""Tensor-parallel collectives slowed by a data-parallel stream that shares their links.

When the data-parallel stream runs beside the compute stream -- the gradient buckets under the last backward
(`overlap`, grad_overlap.py), zero=1's parameter gathers under the first forward (`param_overlap`), zero=2/3's
prefetched unit gathers and asynchronous reduce-scatters (fsdp_overlap.py) -- its rings and the tensor-parallel
rings can cross the same links: inside a node a data-parallel ring's NVLink hops leave the GPU through the ports
its tensor-parallel ring uses, and since rings cross nodes over every NIC their members own (topology.ring_channels)
that stream is fast enough to take a large share of them. The event engine splits every link max-min fairly
between the two (event_network.py); topologies/sharing.py gives the share r of its bandwidth the tensor group keeps
(LinkCache.get_shared, Links[SHARED]). The analytic engine charges the tensor collectives' bandwidth seconds T of
the phase, for the fraction rho of it the stream is busy, at that share:
    extra = rho x T x (1 / r - 1),   rho = min(1, stream time / phase time)
(the stream's busy time spread evenly over the phase) for the gradient buckets (`grad_extra`) and zero=1's
gathers. zero=2/3's stream is priced where it falls instead: fsdp_overlap.py's recursion knows, unit by unit, from
when to when the stream runs beside a unit's compute (the previous unit's reduce-scatter, then the next unit's
prefetched gather, from the unit's start), slows that unit's tensor collectives for that part (their seconds spread
over the unit) and lets a unit whose stream is the critical path absorb it in its slack, as the event engine does
(before 2026-12 `fsdp_extra` spread the stream over the whole phase for every zero=2/3 layout: 2.5-3.2% apart on
three; it still does with pipelines, whose unit collectives run in line: the stream beside a stage's tensor
collectives is then the other stages', not synchronized with its ops). A
collective that tpo overlaps with its GEMM (tpo.py) counts only its exposed part (T x exposed / ring time): a slowed
ring step its GEMM chunk still hides costs nothing. Without the key (r = 1) nothing changes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]


def slowdown(links: dict, n: int) -> Arr:
    """Per layout, 1 / r - 1 for the tensor collectives beside the data-parallel stream (0: no shared link)."""
    from paracube.cost_models.links import SHARED

    if SHARED not in links:
        return np.zeros(n)
    r = np.broadcast_to(np.asarray(links[SHARED][0], dtype=np.float64), (n,))
    return np.where(r > 0, 1.0 / np.maximum(r, 1e-12) - 1.0, 0.0)


def extra(stream: Arr, phase: Arr, tensor_bw: Arr, slow: Arr) -> Arr:
    """rho x T x (1 / r - 1) (module docstring): stream and phase in seconds, T the phase's tensor bandwidth s."""
    rho = np.clip(stream / np.maximum(phase, 1e-30), 0.0, 1.0)
    return rho * tensor_bw * slow


def grad_extra(grad: Arr, backward: Arr, tensor_bw: Arr, slow: Arr, x1: Arr, s_end: Arr) -> Arr:
    """The last backward's share: the buckets run between the first release (x1 of the backward) and its end,
    (1 - s_end) of G then (grad_overlap.stream_window); tensor_bw: that backward's tensor bandwidth seconds."""
    window = backward * (1.0 - x1)
    return extra(grad * (1.0 - s_end), window, tensor_bw * (1.0 - x1), slow)


def fsdp_extra(fsdp: dict[str, tuple[Arr, Arr]], compute: Arr, micro: Arr, tensor_bw: Arr, tensor_bwd: Arr,
               slow: Arr, full_recompute: bool, zero: int, overlap: Arr) -> Arr:
    """zero=2/3 with pipelines (pp > 1, the unit collectives in line; with pp = 1 fsdp_overlap.py's recursion prices
    where the stream falls): the other stages' in-line streams, not synchronized with this stage's ops, spread over
    its phases; forward beside zero=3's forward gathers (half the gathers), backward beside the other half and the
    reduce-scatters where the layout overlaps (`overlap`), each by its bandwidth seconds (its latency steps leave
    the links free); the compute side's phases split 1/3 : 2/3 (1/4 : 3/4 under full recomputation), the tensor
    seconds as sent (tensor_bwd: backward's)."""
    def seconds(kind: str, part: int | None = None) -> Arr:  # part 1: the bandwidth seconds (links busy) only
        if kind not in fsdp:
            return np.zeros_like(compute)
        return fsdp[kind][part] if part is not None else sum(fsdp[kind])  # type: ignore[return-value]

    share_f = 0.25 if full_recompute else 1.0 / 3.0
    gathers = seconds("all_gather", 1) / 2 if zero == 3 else np.zeros_like(compute)
    side = compute + micro - seconds("all_gather") - seconds("reduce_scatter")
    return (extra(gathers, share_f * side, tensor_bw - tensor_bwd, slow)
            + extra(gathers + np.where(overlap, seconds("reduce_scatter", 1), 0.0), (1 - share_f) * side, tensor_bwd,
                    slow))


__all__ = ["extra", "fsdp_extra", "grad_extra", "slowdown"]
