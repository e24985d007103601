"""Enumerate the layouts of N GPUs: tensor shapes per mode, dp x pp splits, distinct placements.

Tensor shapes: each mode's `shapes` (paracube/modes): 1d p >= 2 (p = 1 is `none`); 2d q x q, q >= 2;
2.5d q x q x d, q >= 2, d >= 2 (d = 1 is 2d); 3d q^3, q >= 2. Placements: every order of the axes of
size > 1 (axes of size 1 do not change any group), deduplicated by what the cost model sees: two orders
whose groups over every axis set the model queries are the same rank sets (same merged runs,
links.runs_for) score identically, so only the first is kept.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from paracube.cost_models.comm_axes import axes_used
from paracube.frozen_hash import frozen_hash, frozen_state
from paracube.layout import TENSOR_AXES, Layout
from paracube.modes import MODES
from paracube.modes.base import divisors
from paracube.modes.stages import split_ok


def tensor_shapes(mode: str, gpus: int) -> list[tuple[int, ...]]:
    return MODES[mode].shapes(gpus)


NO_SHAPE = {name: m.no_shape for name, m in MODES.items()}


@dataclass(frozen=True)
class Structure:
    """A mode, tensor shape, dp, pp and cp (context parallelism): everything but micro-batch, interleave, sp and
    placement. dp x pp x cp x tensor ranks = the GPUs."""

    mode: str
    shape: tuple[int, ...]
    dp: int
    pp: int
    cp: int = 1

    def __hash__(self) -> int:  # computed once (frozen_hash.py): a key of the inner loops' caches and dicts
        return frozen_hash(self)

    def __getstate__(self) -> dict:
        return frozen_state(self)

    def sizes(self) -> dict[str, int]:
        m = MODES[self.mode]
        q, t = (self.shape[0] if self.shape else 1), math.prod(self.shape)
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, **m.axis_sizes(q, t, m.depth(self.shape))}

    def placements(self) -> list[tuple[tuple[tuple[str, int], ...], list[bytes]]]:
        """Distinct placements, innermost first, as (axis, size) pairs (size-1 axes left out), each with one
        key per axis set of axes_used(mode): equal keys mean equal rank groups (see _keys). Computed once per
        structure (every recomputation pass asks again): the list is shared, read it only."""
        return _placements(self)

    def _placements(self) -> list[tuple[tuple[tuple[str, int], ...], list[bytes]]]:
        sizes = self.sizes()
        big = [a for a in ("pp", "dp", "cp", *TENSOR_AXES[self.mode]) if sizes[a] > 1]
        default = tuple(reversed(big))  # tensor axes innermost, then cp, dp, then pp (Megatron's order)
        perms = [default, *(p for p in itertools.permutations(big) if p != default)]
        used = axes_used(self.mode, cp=self.cp > 1)
        keys = _keys(perms, sizes, used)
        first: dict[bytes, int] = {}
        for i, row in enumerate(keys):  # first placement of each distinct key row, in enumeration order
            first.setdefault(row.tobytes(), i)
        width = keys.shape[2] * keys.itemsize  # one axis set's key, in bytes of the row
        pair = {a: (a, sizes[a]) for a in big}
        return [
            (tuple(map(pair.__getitem__, perms[i])), [row[j * width:(j + 1) * width] for j in range(len(used))])
            for row, i in first.items()
        ]


@lru_cache(maxsize=4096)
def _placements(st: Structure) -> list[tuple[tuple[tuple[str, int], ...], list[bytes]]]:
    return st._placements()


def _keys(perms: list[tuple[str, ...]], sizes: dict[str, int], used: list[tuple[str, ...]]) -> np.ndarray:
    """[P, J, k + 2] int64: for placement p and axis set j, the merged runs of links.runs_for encoded as the
    first axis' membership, the prefix products of sizes where membership changes (0 elsewhere), and the
    world size. Two placements with equal rows have equal groups over that axis set."""
    P, k, J = len(perms), len(perms[0]) if perms else 0, len(used)
    if k == 0:
        return np.zeros((max(P, 1), J, 2), dtype=np.int64)
    idx = {a: i for i, a in enumerate(perms[0])}
    order = np.array([[idx[a] for a in p] for p in perms])
    names = perms[0]
    size = np.array([sizes[a] for a in names])[order]  # [P, k]
    member = np.array([[a in ax for ax in used] for a in names])[order]  # [P, k, J]
    prefix = np.cumprod(size, axis=1)
    change = np.zeros_like(member)
    change[:, 1:] = member[:, 1:] != member[:, :-1]
    bounds = np.where(change, np.concatenate([np.ones((P, 1), int), prefix[:, :-1]], axis=1)[:, :, None], 0)
    return np.concatenate(
        [
            member[:, :1].transpose(0, 2, 1).astype(np.int64),
            bounds.transpose(0, 2, 1),
            prefix[:, -1:, None].repeat(J, axis=1),
        ],
        axis=2,
    )


LONG_SEQUENCE = 8192  # context parallelism is searched from this sequence length on (Megatron: CP for long contexts)
MIN_CP_TOKENS = 2048  # ... down to this many tokens of a sequence per cp rank (its attention blocks stay large)


def context_degrees(seq: int, gpus: int, pinned: int = 1, offered: bool = True) -> list[int]:
    """cp values to search (a structural axis: dp x pp x cp x tensor ranks = GPUs): the pin where cp is pinned;
    else 1, and where the runtime runs cp and sequences are long (>= LONG_SEQUENCE), the powers of two cp >= 2
    that divide the GPUs and split a sequence into 2 cp equal chunks of s / cp >= 2 MIN_CP_TOKENS / 2 tokens per
    rank (modes/context.py: s % (2 cp) == 0)."""
    if pinned > 1:
        return [pinned]
    if not offered or seq < LONG_SEQUENCE:
        return [1]
    out, cp = [1], 2
    while cp <= gpus and seq // cp >= MIN_CP_TOKENS:
        if gpus % cp == 0 and seq % (2 * cp) == 0:
            out.append(cp)
        cp *= 2
    return out


def cp_unsearched(seq: int, gpus: int, fixed: Layout | None = None, offered: bool = True) -> str | None:
    """Why context_degrees leaves out cp > 1 where a layout may still take it (a short sequence on a runtime that runs
    cp, with ranks left over by the pinned dp, pp and tensor shape); None where cp is searched, pinned, not run or
    left no ranks (then cp=1 is the only valid value)."""
    if fixed is not None:
        if fixed.cp > 1:
            return None
        gpus //= max(fixed.dp, 1) * max(fixed.pp, 1) * (fixed.tensor_size if fixed.shape else 1)
    if gpus < 2 or not offered or seq >= LONG_SEQUENCE:
        return None
    return f"cp > 1 is searched for sequences of {LONG_SEQUENCE:,} tokens or more; --layout cp=N prices it"


def structures(mode: str, gpus: int, layers: int, cp: int = 1) -> list[Structure]:
    """Every (shape, dp, pp) of `mode` on `gpus` GPUs with a cp-way context-parallel axis (cp | gpus)."""
    out: list[Structure] = []
    if gpus % cp:
        return out
    for shape in tensor_shapes(mode, gpus // cp):
        t = math.prod(shape) if shape else 1
        for pp in divisors(gpus // cp // t):
            if pp == 1 or split_ok(layers, pp, 1):  # even, or uneven by modes/stages.py's rule
                out.append(Structure(mode, shape, gpus // cp // t // pp, pp, cp))
    return out
