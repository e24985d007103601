"""zero=2 / zero=3 (FSDP) with prefetch: the exposed part of the per-unit gathers and reduce-scatters.

How the stacks run FSDP (torch FSDP2 as torchtitan applies it, `fully_shard` per block; DeepSpeed stage-3's
prefetch; paracube's executor/data_parallel/fsdp.py): per micro-batch, in registration order of the FSDP units
(embedding, blocks, final norm + head; traffic.py's units and bytes, unchanged here),
- forward: unit u's parameter all_gather is issued when unit u-1's forward starts (prefetch depth one; the
  first unit's gather is exposed) and waited for when unit u's forward starts;
- backward (reverse order): unit u's gather again (all but the last unit, kept from its forward:
  reshard_after_forward=False for it), issued when the previous unit's backward starts, and unit u's fp32
  gradient reduce_scatter issued when its backward ends; the micro-batch's backward ends when its last
  reduce_scatter has finished (FSDP2's finalize_backward waits for it);
- gathers and reduce-scatters of a zero group share one communicator, so one stream: NCCL runs a process
  group's calls in issue order (torch's ProcessGroupNCCL, one NCCL stream per device and group);
- HSDP (with overlap): the per-step replica all_reduce of each unit's shard (traffic.py) is issued as the last
  micro-batch's reduce_scatter of that unit is queued, on the replica group's stream (the recursion's Q); the
  event engine issues each one after its unit's reduce-scatter (fsdp_program.replica_buckets). Both start it when its
  reduce-scatter is issued, not when that ends (FSDP2 waits for the reduce-scatter first): optimistic by at
  most the overlap of the two on their separate streams.
The recursion (times relative to the micro-batch's start; P: when a unit's compute starts, C: when it ends,
S: when the stream is free; a_u, a'_u gathers, r_u reduce-scatter, f_u, b_u the unit's compute plus its
tensor-parallel communication, which runs in line on the compute side):
    forward:  G_u = max(S, P_{u-1}) + a_u;  P_u = max(C_{u-1}, G_u);  C_u = P_u + f_u;  S = G_u
    backward: at P_u issue the next unit's gather: S = max(S, P_u) + a'_next;  C_u = P_u + b_u;
              S = max(S, C_u) + r_u;  P_next = max(C_u, S_after_gather)
    micro-batch = max(C_last, S) ;  exposed = micro-batch - sum (f_u + b_u)
Contention (cost_models/contention.py): where the tensor group shares links with the zero group, a unit's tensor
collectives (bandwidth seconds t_u, spread over its compute) run slower by 1 / r - 1 for the part of the unit the
stream is busy beside it: from P_u until the stream's backlog and the gather issued at P_u are done,
    C_u += t_u (1 / r - 1) w min(1, (G_next - P_u) / (C_u - P_u))   (w: the stream's bandwidth share of its seconds,
                                                                      its latency steps leave the links free)
so a gather falling early in a short unit slows it more than one spread over the phase, and a unit whose stream is
the critical path (P_next = G_next) absorbs it in its slack: what the event engine's max-min links do op by op.
Per micro-batch the compute side is split into the head's compute and equal blocks; a block's compute splits
forward : backward 1/3 : 2/3 (1/4 : 3/4 under full recomputation) and its in-line communication by the tensor
collectives' forward and backward bytes (Entry.backward), which is where the event engine runs them.
The blocks are identical, so the analytic engine iterates `EXACT` blocks and extrapolates the rest by the last
block's increment (the recursion is max-plus with constant increments once its transient is over, which here
takes at most two blocks); the event engine simulates the same issue and wait points op by op
(fsdp_program.prefetch_program). Without prefetch every gather and reduce-scatter runs in line (comm.py).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from paracube.cost_models.compute import GemmModel, stage_compute_time
from paracube.cost_models.dims import Dims
from paracube.cost_models.fsdp_copies import RS_BYTES, gather_copy, scatter_copy
from paracube.cost_models.local_parameters import parameter_units
from paracube.cost_models.overlap_drag import beside
from paracube.modes import LayoutBatch
from paracube.modes.buckets import padded_numel
from paracube.modes.stages import stage_layers

Arr = np.ndarray
EXACT = 4  # blocks iterated exactly before extrapolating (module docstring)


@lru_cache(maxsize=4096)
def _sizes(mode: str, d: Dims, t: int, q: int, first: bool, last: bool, n: int) -> tuple[int, int, int]:
    """Padded lengths of the embedding unit (0 off the first stage), of one block, of the head unit."""
    units = [padded_numel(sum(u), n) for u in parameter_units(mode, d, t, q, 1, first, last)]
    emb = units[0] if first else 0
    head = units[-1] if last else 0
    return emb, units[1 if first else 0], head


def unit_sizes(d: Dims, mode: str, b: LayoutBatch, first: Arr, last: Arr, n: Arr) -> Arr:
    """Per layout: (embedding, block, head) padded unit lengths, shape (layouts, 3). Keyed by the stage's shape."""
    cols = [np.broadcast_to(np.asarray(x, dtype=np.int64), b.dp.shape) for x in (b.t, b.q, first, last, n)]
    keys, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    per = np.array([_sizes(mode, d, int(k[0]), int(k[1]), bool(k[2]), bool(k[3]), int(k[4])) for k in keys],
                   dtype=np.float64)
    return per[inverse.reshape(-1)]


State = tuple[Arr, Arr, Arr, Arr, Arr, Arr, Arr]


def _beside(P: Arr, C: Arr, busy_end: Arr, t: Arr, slow: Arr | float) -> Arr:
    """The unit computing over [P, C] (its tensor collectives' bandwidth seconds t, spread over it) beside the
    zero group's stream, busy from P until busy_end: the extra seconds of the collectives it slows (module
    docstring, contention)."""
    if np.ndim(slow) == 0 and float(slow) == 0.0:  # type: ignore[arg-type]
        return np.zeros_like(C)
    work = C - P
    busy = np.clip(busy_end - P, 0.0, work)
    return np.where(work > 0, t * slow * busy / np.where(work > 0, work, 1.0), 0.0)


def _unit(state: State, a: Arr, work: Arr, r: Arr, live: Arr, prefetch: bool = True, sync: Arr | bool = False,
          ar: Arr | float = 0.0, t: Arr | float = 0.0, slow: Arr | float = 0.0, drag: Arr | float = 0.0) -> State:
    """One unit of the recursion. State (S, P, C, R, Q, A, T): the zero group's stream free, previous unit's compute
    start and end, the previous unit's reduce-scatter not yet queued, the replica stream free (HSDP), the previous
    unit's replica all_reduce not yet queued, the previous unit's tensor bandwidth seconds. This unit's gather `a`
    was issued at the previous unit's start (prefetch; else at its end, in line), before that unit's
    reduce-scatter, which queues at its end (with its replica all_reduce `ar`, on its own stream); the previous
    unit's tensor collectives ran beside the stream from its start until that gather was done (prefetch; else its
    backlog), slowed by `slow` (1 / r - 1) for that part (`_beside`), which moves its end; this unit computes `work`
    (its tensor seconds `t`) once the previous compute and its gather are done (and, `sync`: the previous
    reduce-scatter, in line without overlap); its own reduce-scatter `r` is queued at its end (next step). The
    previous unit's compute beside the stream is slowed by `drag` (overlap_drag.py) too."""
    S, P, C, R, Q, A, T = state
    G = np.maximum(S, P if prefetch else C) + a
    C = C + _beside(P, C, G if prefetch else S, T, slow) + beside(P, C, G if prefetch else S, drag)
    if not prefetch:
        G = np.maximum(S, C) + a
    S2 = np.maximum(G, C) + R
    Q2 = np.maximum(Q, C) + A
    Pn = np.where(sync, S2, np.maximum(C, G))
    out = (S2, Pn, Pn + work, r, Q2, ar + 0.0 * r, t + 0.0 * r)
    return tuple(np.where(live, o, x) for o, x in zip(out, state, strict=True))  # type: ignore[return-value]


def _close(state: State, slow: Arr | float, drag: Arr | float = 0.0) -> State:
    """The last unit of a pass beside what is left of the stream's backlog (no gather follows it)."""
    S, P, C, R, Q, A, T = state
    return (S, P, C + _beside(P, C, S, T, slow) + beside(P, C, S, drag), R, Q, A, T)


def _blocks(state: State, blocks: Arr, a: Arr, work: Arr, r: Arr, prefetch: bool = True, sync: Arr | bool = False,
            ar: Arr | float = 0.0, t: Arr | float = 0.0, slow: Arr | float = 0.0, drag: Arr | float = 0.0) -> State:
    """`blocks` identical units: EXACT of them exactly, then the last one's increment for each of the rest."""
    inc = tuple(np.zeros_like(x) for x in state)
    for k in range(min(int(blocks.max()) if blocks.size else 0, EXACT)):
        nxt = _unit(state, a, work, r, k < blocks, prefetch, sync, ar, t, slow, drag)
        inc = tuple(n - s for n, s in zip(nxt, state, strict=True))
        state = nxt
    rest = np.maximum(blocks - EXACT, 0).astype(float)
    return tuple(s + rest * i for s, i in zip(state, inc, strict=True))  # type: ignore[return-value]


Units = tuple[Arr, Arr, Arr]


def micro_batch_seconds(blocks: Arr, f: Units, bw: Units, ag: Units, rs: Units, prefetch: bool = True,
                        overlap: Arr | bool = True, ar: Units | None = None, tensor: tuple[Units, Units] | None = None,
                        slow: Arr | float = 0.0, drag: Arr | float = 0.0) -> Arr:
    """Seconds of one micro-batch (forward + backward), gathers prefetched (`prefetch`) and reduce-scatters
    asynchronous (`overlap`, per layout), else in line. Per unit kind (embedding, block, head): forward f,
    backward b, gather a (the same in forward and backward), reduce-scatter r and (the step's last micro-batch,
    HSDP with overlap) replica all_reduce `ar`; an absent unit has zeros. The head is kept gathered from its
    forward to its backward (no second gather). `tensor`: per unit kind, the tensor collectives' bandwidth seconds
    in f and in b, slowed by `slow` (1 / r - 1) where the stream runs beside them (contention); the compute side
    beside the stream slowed by `drag` (overlap_drag.py)."""
    sync = ~np.asarray(overlap, dtype=bool)
    z = np.zeros(np.shape(blocks))
    ar = ar or (z, z, z)
    tf, tb = tensor or ((z, z, z), (z, z, z))
    edge = [f[k] + bw[k] + ag[k] + rs[k] > 0 for k in (0, 2)]
    st = _unit((z, z, z, z, z, z, z), ag[0], f[0], z, edge[0], prefetch, t=tf[0], slow=slow, drag=drag)
    st = _blocks(st, blocks, ag[1], f[1], z, prefetch, t=tf[1], slow=slow, drag=drag)
    st = _close(_unit(st, ag[2], f[2], z, edge[1], prefetch, t=tf[2], slow=slow, drag=drag), slow, drag)
    S, P, C = st[:3]
    st = (S, C, C, z, z, z, z)  # the backward starts with the head, its parameters still gathered
    st = _unit(st, z, bw[2], rs[2], edge[1], prefetch, sync, ar[2], tb[2], slow, drag)
    st = _blocks(st, blocks, ag[1], bw[1], rs[1], prefetch, sync, ar[1], tb[1], slow, drag)
    st = _close(_unit(st, ag[0], bw[0], rs[0], edge[0], prefetch, sync, ar[0], tb[0], slow, drag), slow, drag)
    S, P, C, R, Q, A, _ = st
    return np.maximum(np.maximum(C, np.maximum(S, C) + R), np.maximum(Q, C) + A)


def exposed_seconds(blocks: Arr, f: Units, bw: Units, ag: Units, rs: Units, prefetch: bool = True,
                    overlap: Arr | bool = True, ar: Units | None = None, tensor: tuple[Units, Units] | None = None,
                    slow: Arr | float = 0.0, drag: Arr | float = 0.0) -> Arr:
    """Per layout: seconds of one micro-batch's FSDP gathers and reduce-scatters that compute does not hide (and
    what the tensor collectives and the compute beside them lose, `tensor`, `slow`, `drag`: micro_batch_seconds)."""
    busy = f[0] + bw[0] + blocks * (f[1] + bw[1]) + f[2] + bw[2]
    return np.maximum(0.0, micro_batch_seconds(blocks, f, bw, ag, rs, prefetch, overlap, ar, tensor, slow, drag)
                      - busy)


def prefetched_micro(d: Dims, mode: str, b: LayoutBatch, g: GemmModel, rows: Arr, F: Arr, H: Arr, n_zero: Arr,
                     compute: Arr, micro: Arr, fsdp: dict[str, tuple[Arr, Arr]], prefetch: bool = True,
                     overlap: Arr | bool = True, tensor_bw: Arr | float = 0.0, tensor_bwd: Arr | float = 0.0,
                     slow: Arr | float = 0.0, drag: Arr | float = 0.0, block_times: tuple[Arr, Arr] | None = None
                     ) -> tuple[Arr, Arr, Arr]:
    """A stage's per-step communication on the compute side (`micro`, per layout) with its FSDP gathers and
    reduce-scatters (`fsdp[kind]` = (latency seconds summed, bandwidth seconds summed): analytic._stage)
    replaced by what prefetch (`prefetch`) and asynchronous reduce-scatters (`overlap`, the layout's: per layout)
    leave exposed, and the seconds of HSDP's per-step replica all_reduce (`fsdp["replica"]`) to take out of the
    step's communication where it overlaps (it is in the last micro-batch's recursion instead). pp = 1 (with
    pipelines analytic.py keeps the unit collectives in line, exposed). Per micro-batch, the compute side (compute
    and the other in-line communication) is split into the head's compute (compute.py's head and cross entropy)
    and equal blocks; the embedding's lookup is negligible; compute forward 1/3, backward 2/3 (1/4, 3/4 under full
    recomputation: its forward runs inside backward), the in-line communication as the tensor collectives' bytes
    (`tensor_bw` bandwidth seconds per step, `tensor_bwd` of them in backward; module docstring). Those seconds
    are the blocks', slowed by `slow` (contention.slowdown) where the stream runs beside them (`_beside`); the
    compute side beside the stream by `drag` (overlap_drag.per_layout). Third: the step's seconds of FSDP's copy
    kernels (fsdp_copies.py), compute-stream work the caller adds to the stage's compute, as the event engine does.
    `block_times`: compute.block_compute_time of `b` where the caller has it (stage_compute_time's `blocks`)."""
    N = (d.global_batch / (b.dp * b.mb))[rows]
    blocks = stage_layers(d.L, b.pp, b.v, F, H)[rows].astype(float)
    sizes = unit_sizes(d, mode, b, F, H, n_zero)[rows]
    share_f = 0.25 if d.recompute == "full" else 1.0 / 3.0
    inline = sum(a + e for k, (a, e) in fsdp.items() if k != "replica")
    head = ((stage_compute_time(d, mode, b, H, g, F, block_times)
             - stage_compute_time(d, mode, b, 0 * H, g, F, block_times))[rows] / N
            if np.any(H) else np.zeros(len(rows)))
    comm = (micro - inline) / N  # one micro-batch's other in-line communication (the tensor collectives)
    blk_compute = np.maximum(compute / N - head, 0.0) / np.maximum(blocks, 1.0)
    blk_comm = comm / np.maximum(blocks, 1.0)
    t_bw = np.asarray(tensor_bw, dtype=np.float64) * np.ones(len(rows))
    t_bwd = np.asarray(tensor_bwd, dtype=np.float64) * np.ones(len(rows))
    comm_f = np.where(t_bw > 0, (t_bw - t_bwd) / np.where(t_bw > 0, t_bw, 1.0), share_f)  # forward's share
    z = np.zeros(len(rows))
    f = (z, share_f * blk_compute + comm_f * blk_comm, share_f * head)
    bw = (z, (1.0 - share_f) * blk_compute + (1.0 - comm_f) * blk_comm, (1.0 - share_f) * head)
    # the tensor collectives' bandwidth seconds, with the in-line communication, in the blocks
    tensor = ((z, (t_bw - t_bwd) / N / np.maximum(blocks, 1.0), z), (z, t_bwd / N / np.maximum(blocks, 1.0), z))

    def per_call(kind: str, calls: Arr, elements: Arr, per: Arr | float = N) -> tuple[Arr, Arr, Arr]:
        if kind not in fsdp:
            return (np.zeros(len(rows)),) * 3
        alpha, beta = (x / per for x in fsdp[kind])  # per micro-batch (replica: per step)
        one, el = alpha / np.maximum(calls, 1), beta / np.maximum(elements, 1)
        return tuple(np.where(sizes[:, k] > 0, one + el * sizes[:, k], 0.0) for k in range(3))  # type: ignore

    n_units = (sizes[:, 0] > 0) + blocks + (sizes[:, 2] > 0)
    total = sizes[:, 0] + blocks * sizes[:, 1] + sizes[:, 2]
    ag = per_call("all_gather", 2 * n_units - 1, 2 * total - sizes[:, 2])
    rs = per_call("reduce_scatter", n_units, total)
    # FSDP's copy-out after each gather (the head's once: kept gathered) and copy-in before each reduce-scatter,
    # on the compute side of their units (fsdp_copies.py); what they add is paid in full below
    rate = g.mem_bw * g.mem_eff
    out = [np.where(ag[k] > 0, gather_copy(d.c * sizes[:, k], rate), 0.0) for k in range(3)]
    cin = [np.where(rs[k] > 0, scatter_copy(RS_BYTES * sizes[:, k], d.c, rate), 0.0) for k in range(3)]
    f = tuple(f[k] + out[k] for k in range(3))  # type: ignore[assignment]
    bw = (bw[0] + out[0] + cin[0], bw[1] + out[1] + cin[1], bw[2] + cin[2])  # type: ignore[assignment]
    copies = 2 * out[0] + cin[0] + blocks * (2 * out[1] + cin[1]) + out[2] + cin[2]
    ov = np.asarray(overlap, dtype=bool)
    ar = per_call("replica", n_units, total, 1.0)
    replica = np.where(ov, sum(fsdp["replica"]), 0.0) if "replica" in fsdp else np.zeros(len(rows))
    # the stream keeps the links busy for its bandwidth seconds only (its latency steps leave them free)
    stream = [fsdp[k] for k in ("all_gather", "reduce_scatter") if k in fsdp]
    links = sum(e for _, e in stream) / np.maximum(sum(a + e for a, e in stream), 1e-30) if stream else 0.0
    slow = slow * links
    plain = exposed_seconds(blocks, f, bw, ag, rs, prefetch, overlap, None, tensor, slow,  # type: ignore[arg-type]
                            drag)
    # the last micro-batch carries HSDP's replica all_reduce; without one (ar all zero) it is the others' recursion
    last = exposed_seconds(blocks, f, bw, ag, rs, prefetch, overlap, tuple(np.where(ov, x, 0.0) for x in ar),
                           tensor, slow, drag) if "replica" in fsdp else plain  # type: ignore[arg-type]
    # the copies are compute-stream kernels: the caller adds them to the stage's compute (the event engine's ops)
    return micro - inline + (N - 1) * plain + last, replica, N * copies


__all__ = ["EXACT", "exposed_seconds", "micro_batch_seconds", "prefetched_micro", "unit_sizes"]
