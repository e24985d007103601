"""A tensor mode's collectives as data: kind, mesh axes, dtype, payload bytes as a function of `Sizes`, and how
collective matmul (tpo) overlaps them with their GEMM (the `Collective` fields say each). Modes declare lists of
them (base.TensorMode); cost_models/traffic.py expands them per event, cost_models/comm.py sums them vectorized,
and the executor's recorder logs what it sends against the same payloads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

F32 = "float32"
COMPUTE = "compute"  # the training's compute dtype (Dims.dtype)
IntOrArr = Any  # int (one layout) or np.ndarray of int64 (a LayoutBatch)


@dataclass(frozen=True)
class Sizes:
    """Sizes a payload depends on: T tokens of a micro-batch (on one cp rank: b s / cp), tensor ranks t, grid side q,
    2.5D depth, sp flag, V the padded vocabulary, (per-step collectives) blocks of the stage and its edge flags, and
    cp the context-parallel ranks."""

    T: IntOrArr
    t: IntOrArr
    q: IntOrArr
    depth: IntOrArr
    sp: IntOrArr
    V: IntOrArr
    layers: IntOrArr = 0
    first: IntOrArr = 0
    last: IntOrArr = 0
    cp: IntOrArr = 1  # context parallelism (Layout.cp): T is then a rank's b s / cp tokens (modes/context.py)


Payload = Callable[[Sizes], IntOrArr]
Ring = Callable[[int, bool], tuple[float, ...]]  # tpo: (group size, paired) -> GEMM fraction per exchange


def first_exposed(n: int, paired: bool) -> tuple[float, ...]:
    """The default tpo ring (1D + sp, priced so since tpo was added): its first exchange exposed, the whole GEMM
    spread over the other n - 2 (cost_models/tpo.py)."""
    return (0.0,) + (1.0 / (n - 2),) * (n - 2) if n > 2 else (0.0,) * (n - 1)


def chunks(n: int, paired: bool) -> tuple[float, ...]:
    """A ring with one GEMM chunk (1/n of it) alongside each of its n - 1 exchanges (executor/layers/ring.py: an
    all-gather's chunk s on the block held at step s, a reduce-scatter's chunk of step s >= 1; the remaining
    chunk runs with no exchange in flight)."""
    return (1.0 / n,) * (n - 1)


@dataclass(frozen=True)
class Collective:
    kind: str  # all_gather | reduce_scatter | all_reduce | send
    axes: tuple[str, ...]
    dtype: str  # COMPUTE or F32
    payload: Payload  # bytes, per call
    label: str
    phase: str = "fwd"  # edge / per-step collectives; layer collectives take theirs from their list
    when: str = ""  # "sp" | "no_sp" | "" (always)
    # A weight collective (a linear's weight / bias, the position table): with kept weights (Layout kw=1)
    # the forward gather runs once per step (the first micro-batch's forward, not in recompute) and the
    # gradient reduce-scatter once (the last micro-batch's backward), gradients accumulated in gathered form.
    kept: bool = False
    # 1 where this collective is issued for these Sizes, 0 where not (None: always), e.g. the key / value
    # gather of a sequence split over ranks, issued over the one group that holds a whole sequence.
    applies: Callable[[Sizes], IntOrArr] | None = None
    # tpo (Layout.tpo: collective matmul): the GEMM this collective is decomposed against, "LINEAR.GEMM" with
    # LINEAR a name of Dims.linears and GEMM f (Y = X A), dx (dX = dY A^T) or da (dA = X^T dY); "": not overlapped.
    tpo: str = ""
    # Calls per issue, each of `payload` bytes (None: one), e.g. SUMMA's q broadcast steps per GEMM operand.
    calls: Callable[[Sizes], IntOrArr] | None = None
    # tpo: the executor's ring schedule, ring(n, paired) -> the fraction of the `tpo` GEMM alongside each of the
    # ring's n - 1 exchanges on its slowest rank (paired: the linear's weight ring ran in this forward, i.e. not a
    # kept weight reused); `lockstep`: run in lock step with that weight ring (2D / 3D forwards: X's and A's
    # rings), the two sharing those GEMM chunks (cost_models/tpo.py).
    ring: Ring = first_exposed
    lockstep: bool = False


TPO_GEMMS = ("f", "dx", "da")


def coll(kind: str, axes: tuple[str, ...] | str, dtype: str, payload: Payload, label: str,
         phase: str = "fwd", when: str = "", kept: bool = False,
         applies: Callable[[Sizes], IntOrArr] | None = None, tpo: str = "",
         calls: Callable[[Sizes], IntOrArr] | None = None, ring: Ring = first_exposed,
         lockstep: bool = False) -> Collective:
    return Collective(kind, (axes,) if isinstance(axes, str) else tuple(axes), dtype, payload, label, phase, when,
                      kept, applies, tpo=tpo, calls=calls, ring=ring, lockstep=lockstep)
