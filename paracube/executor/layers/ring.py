"""Ring collectives decomposed into point-to-point steps, each step's exchange in flight while a GEMM chunk runs.

The building blocks of collective matmul (Layout.tpo; collective_matmul.py). On a group of n ranks, index r
(mesh.index(axes)), a ring sends to index r + 1 and receives from r - 1 (mod n), one block per step, with
`torch.distributed.batch_isend_irecv` (both directions posted together, so no rank waits on an unposted
receive), Wang et al. 2023 ("Overlap communication with dependent computation via decomposition in large deep
learning models", ASPLOS '23) and Megatron-LM's ring-exchange / torch's async TP (`_fused_all_gather_matmul`):
- `ring_all_gather`: n steps; at step i the rank holds block (r - i) mod n, posts its exchange (sends it on,
  receives the next), then runs `on_block(k, block)` (the GEMM on the block already there) and waits. The
  last step has nothing left to move: n - 1 exchanges of one block each.
- `ring_reduce_scatter`: n steps; at step i the rank computes the partial of block b = (r - 1 - i) mod n with
  `produce(b)` (the GEMM) while the accumulated partial of step i - 1 travels to r + 1 and that of r - 1
  arrives, then adds it: after n - 1 exchanges block r holds the sum over the group (the chain of block b
  starts at rank b + 1). The sum runs in ring order instead of gloo's / NCCL's: equal up to rounding.
- `ring_all_gathers`: several all-gather rings of one group size in lock step (the 2D and 3D forwards: X's and
  the weight's; collective_matmul_2d.py / _3d.py), every step's exchanges posted before the GEMM chunks that the
  blocks then held allow.
Each is recorded as ONE CommEvent with the unoverlapped collective's key (kind, axes, payload, dtype: what the
cost models predict; recorder.py), plus one RingStep per exchange (its bytes: one block, so the steps sum to
the ring's (n - 1)/n x payload, CommEvent.sent_bytes; its issue and completion times and the GEMM chunk's).
Why our own ring instead of torch's `torch.distributed._symmetric_memory` fused ops: those need CUDA symmetric
memory (NCCL, one node) and do not run on gloo CPU ranks, where the tests and benchmarks run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.executor.mesh import Mesh
from paracube.executor.recorder import Axes


def ring_peers(mesh: Mesh, axes: Axes) -> tuple[int, int, int]:
    """(this rank's index in the group of `axes`, the global rank of index - 1, of index + 1)."""
    n, r = mesh.size(axes), mesh.index(axes)
    rows = mesh.layout.groups(tuple(axes)).tolist()
    row = next(ranks for ranks in rows if mesh.rank in ranks)  # global ranks in index order (first axis major)
    return r, int(row[(r - 1) % n]), int(row[(r + 1) % n])


def _exchange(send: Tensor, recv: Tensor, prev: int, nxt: int, mesh: Mesh, axes: Axes) -> list:
    group = mesh.group(tuple(axes))
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt, group),
                                   dist.P2POp(dist.irecv, recv, prev, group)])


class GatherRing:
    """One all-gather of `x` over `axes` run as a ring (`ring_all_gathers`): index r sends to r + 1 and receives
    from r - 1, so at step i it holds block (r - i) mod n."""

    def __init__(self, x: Tensor, mesh: Mesh, axes: Axes, label: str, backward: bool = False) -> None:
        self.x, self.mesh, self.axes, self.label, self.backward = x.contiguous(), mesh, tuple(axes), label, backward
        self.n = mesh.size(axes)
        self.r, self.src, self.dst = ring_peers(mesh, axes) if self.n > 1 else (0, mesh.rank, mesh.rank)

    def block(self, step: int) -> int:
        """The index of the block this rank holds at `step`."""
        return (self.r - step) % self.n


def ring_all_gathers(rings: list[GatherRing], on_step: Callable[[int, list[tuple[int, Tensor]]], bool]) -> None:
    """Several all-gather rings of the same group size in lock step: at each of the n steps every ring's exchange
    is posted, then `on_step(step, [(k, block k) per ring])` runs the GEMM chunks the blocks now held allow
    (returns whether any ran: the ring steps record its span, or None), then the exchanges are waited for.
    Each ring is one CommEvent (the unoverlapped all-gather's key) with its n - 1 RingSteps."""
    n = rings[0].n
    assert all(ring.n == n for ring in rings), [ring.n for ring in rings]
    if n == 1:
        on_step(0, [(0, ring.x) for ring in rings])
        return
    rec = rings[0].mesh.recorder
    with ExitStack() as stack:
        events = [stack.enter_context(rec.issue("all_gather", ring.axes, n, ring.x, ring.x.numel() * n,
                                                ring.backward, ring.label)) for ring in rings]
        cur = [ring.x for ring in rings]
        for step in range(n):
            works, nxt_bufs, t0 = [], cur, 0.0
            if step < n - 1:
                nxt_bufs = [torch.empty_like(c) for c in cur]
                t0 = time.perf_counter()
                works = [_exchange(c, b, ring.src, ring.dst, ring.mesh, ring.axes)
                         for ring, c, b in zip(rings, cur, nxt_bufs, strict=True)]
            g0 = time.perf_counter()
            ran = on_step(step, [(ring.block(step), c) for ring, c in zip(rings, cur, strict=True)])
            g1 = time.perf_counter()
            for ring_works in works:
                for w in ring_works:
                    w.wait()
            done = time.perf_counter()
            for event, c in zip(events, cur, strict=True) if works else ():
                rec.ring_step(event, step, c.numel() * c.element_size(), t0, done, (g0, g1) if ran else None)
            cur = nxt_bufs


def ring_all_gather(x: Tensor, mesh: Mesh, axes: Axes, on_block: Callable[[int, Tensor], None],
                    backward: bool = False, label: str = "") -> None:
    """All-gather of `x` over `axes` as n - 1 ring exchanges; `on_block(k, block k)` runs for every block
    (this rank's first) while the next one is in flight. A group of one: on_block(0, x), nothing recorded."""

    def step(_: int, blocks: list[tuple[int, Tensor]]) -> bool:
        on_block(*blocks[0])
        return True

    ring_all_gathers([GatherRing(x, mesh, axes, label, backward)], step)


def ring_reduce_scatter(produce: Callable[[int], Tensor], mesh: Mesh, axes: Axes, block_numel: int,
                        dtype: torch.dtype, backward: bool = False, label: str = "") -> Tensor:
    """Reduce-scatter over `axes` of a tensor of n blocks of `block_numel` elements each, whose partial block b
    `produce(b)` computes (the GEMM chunk), as n - 1 ring exchanges overlapped with the next block's GEMM.
    Returns this rank's block (index r), summed over the group."""
    n = mesh.size(axes)
    if n == 1:
        return produce(0)
    rec = mesh.recorder
    r, prev, nxt = ring_peers(mesh, axes)
    acc: Tensor | None = None
    probe = torch.empty((), dtype=dtype)  # the recorder reads the dtype and element size
    with rec.issue("reduce_scatter", tuple(axes), n, probe, block_numel * n, backward, label) as event:
        for step in range(n):
            works, buf, t0 = [], None, 0.0
            if acc is not None:
                buf = torch.empty_like(acc)
                t0 = time.perf_counter()
                works = _exchange(acc, buf, prev, nxt, mesh, axes)
            g0 = time.perf_counter()
            part = produce((r - 1 - step) % n)
            g1 = time.perf_counter()
            for w in works:
                w.wait()
            if buf is not None and acc is not None:
                rec.ring_step(event, step, acc.numel() * acc.element_size(), t0, time.perf_counter(), (g0, g1))
                part = part + buf
            acc = part.contiguous()
    assert acc is not None
    return acc


__all__ = ["GatherRing", "ring_all_gather", "ring_all_gathers", "ring_peers", "ring_reduce_scatter"]
