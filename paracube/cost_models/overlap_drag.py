"""Compute slowed by the data-parallel collectives that run beside it (the "overlap drag").

An overlapped collective is not free for the compute it hides behind. NCCL moves a ring's NVLink hops with its
own kernels: one CTA per channel, each resident on an SM for the whole call, loading, reducing and storing the
chunks at NVLink speed through HBM (NCCL runs up to 32 channels; DeepSeek-V3's report dedicates 20 of the H800's
132 SMs to communication; Megatron / Transformer Engine reserve SMs for their comm kernels, TE's userbuffers
`num_sm`, cuBLAS's SM_COUNT_TARGET, torch's `_set_sm_carveout`). GEMMs and the other kernels of the compute
stream, sized for every SM, run slower while such a call is resident. The hops that cross nodes are moved by the
NIC (GPUDirect RDMA) at a few times lower rate, their kernels mostly waiting. So the drag of a data-parallel
collective is priced per second it runs beside the compute stream, in proportion to the NVLink share of its ring:
    compute extended by  D x f x (seconds the stream runs beside compute work)
D: the device generation's drag (topologies/efficiency.py OVERLAP_DRAG, fitted on fit rows; GemmModel.overlap_drag),
f: the share of the data-parallel ring's hops inside a node, (n - k) / n for n ranks on k > 1 nodes, 1 on one node
(`nvlink_share`; topology.ring_channels' node-major ring). The compute side is its kernels and its in-line
collectives (both engines' compute-side time); a collective the compute side waits for, or a pipeline arrival,
absorbs the drag in its idle time. Applied where the data-parallel stream runs beside compute: the gradient buckets
under the last backward (`overlap`, grad_overlap.py), zero=1's parameter gathers under the first forward
(`param_overlap`), zero=2/3's prefetched gathers and asynchronous reduce-scatters (fsdp_overlap.py's recursion);
not HSDP's replica all-reduce (one per step, across replicas: its ring crosses nodes). Tensor-parallel collectives
overlapped with their GEMMs (tpo) are priced by their own fitted figures (tpo.py).
Analytic engine: `beside` per unit or phase; event engine (event_sim.py): when such a collective ends after running
dur seconds, of which the compute side idled i (waits, arrivals), the compute stream owes
    max(0, D f (dur - i) - i)
seconds, paid before its next compute op or at the end of the pass (the same max-plus form: the drag of a phase
whose stream is the critical path falls in the wait for it).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]
DRAG = ("drag",)  # Links key of the data-parallel ring's hop shares (in a node, across: links.LinkCache.nvlink_share)


def nvlink_share(ranks: NDArray[np.int64], devices_per_node: int) -> float:
    """The share f of a node-major ring's hops between GPUs of one node: 1 on one node, (n - k) / n across k nodes,
    0 without node structure (devices_per_node 0) or for one rank."""
    n = int(np.size(ranks))
    if n <= 1 or devices_per_node <= 0:
        return 0.0
    k = len(np.unique(np.asarray(ranks) // devices_per_node))
    return 1.0 if k == 1 else (n - k) / n


def beside(start: Arr, end: Arr, busy_end: Arr, drag: Arr | float) -> Arr:
    """Seconds a compute phase over [start, end] gains beside the stream busy from `start` until `busy_end`
    (drag = D f): drag x the overlap of the two."""
    if np.ndim(drag) == 0 and float(drag) == 0.0:  # type: ignore[arg-type]
        return np.zeros_like(end)
    return drag * np.clip(busy_end - start, 0.0, np.maximum(end - start, 0.0))


def per_layout(links: dict, n: int, figure: float) -> Arr:
    """D x f per layout: the generation's drag `figure` times the data-parallel ring's NVLink share (Links[DRAG],
    analytic.layout_links; 0 where the links do not carry it: the search's own pass, as contention.slowdown)."""
    if DRAG not in links or figure == 0.0:
        return np.zeros(n)
    return figure * np.broadcast_to(np.asarray(links[DRAG][0], dtype=np.float64), (n,))


def owed(drag: float, dur: float, idle: float) -> float:
    """The event engine's debt of one collective (module docstring): max(0, drag (dur - idle) - idle)."""
    return max(0.0, drag * (dur - idle) - idle)


__all__ = ["DRAG", "beside", "nvlink_share", "owed", "per_layout"]
