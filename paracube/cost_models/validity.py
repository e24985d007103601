"""Size rules a layout must satisfy (docs/algorithms.md), vectorized so the planner can check many at once.

Each rule is (reason text, predicate that must hold). Arrays carry one entry per layout: dp, pp, t (tensor
ranks), q (grid side), d (2.5D depth), mb (sequences per micro-batch per replica), v (interleave), sp.
The vocabulary is NOT required to divide: for cost only it is padded to a multiple of the vocab split
(the executor checks exact divisibility itself).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from paracube.cost_models.dims import Dims
from paracube.errors import ParacubeError
from paracube.layout import Layout

Arrays = dict[str, np.ndarray]
Rule = tuple[str, Callable[[Dims, Arrays], np.ndarray]]


def _div(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    return np.asarray(a) % np.asarray(b) == 0


COMMON: list[Rule] = [
    ("global batch % (dp * micro-batch) != 0", lambda d, a: _div(d.global_batch, a["dp"] * a["mb"])),
    ("layers % (pp * interleave) != 0", lambda d, a: _div(d.L, a["pp"] * a["v"])),
    (
        "interleaved 1F1B needs micro-batches % pp == 0",
        lambda d, a: (a["v"] == 1) | _div(d.global_batch // (a["dp"] * a["mb"]), a["pp"]),
    ),
]

MODE_RULES: dict[str, list[Rule]] = {
    "none": [],
    "1d": [
        ("heads % p != 0", lambda d, a: _div(d.heads, a["t"])),
        ("ffn hidden % p != 0", lambda d, a: _div(d.f, a["t"])),
        ("kv heads % p != 0", lambda d, a: _div(d.kv // (d.h // d.heads), a["t"])),
        ("sequence parallel: seq % p != 0", lambda d, a: ~a["sp"].astype(bool) | _div(d.s, a["t"])),
    ],
    "2d": [
        ("micro-batch % q != 0", lambda d, a: _div(a["mb"], a["q"])),
        ("heads % q != 0", lambda d, a: _div(d.heads, a["q"])),
        ("kv heads % q != 0", lambda d, a: _div(d.kv // (d.h // d.heads), a["q"])),
        ("hidden % q^2 != 0", lambda d, a: _div(d.h, a["q"] ** 2)),
        ("ffn hidden % q^2 != 0", lambda d, a: _div(d.f, a["q"] ** 2)),
        ("seq % q != 0", lambda d, a: _div(d.s, a["q"])),
    ],
    "2.5d": [
        ("micro-batch % (q * depth) != 0", lambda d, a: _div(a["mb"], a["q"] * a["d"])),
        ("heads % q != 0", lambda d, a: _div(d.heads, a["q"])),
        ("kv heads % q != 0", lambda d, a: _div(d.kv // (d.h // d.heads), a["q"])),
        ("hidden % q^2 != 0", lambda d, a: _div(d.h, a["q"] ** 2)),
        ("ffn hidden % q^2 != 0", lambda d, a: _div(d.f, a["q"] ** 2)),
        ("seq % q != 0", lambda d, a: _div(d.s, a["q"])),
    ],
    "3d": [
        ("micro-batch % q^2 != 0", lambda d, a: _div(a["mb"], a["q"] ** 2)),
        ("heads % q != 0", lambda d, a: _div(d.heads, a["q"])),
        ("kv heads % q != 0", lambda d, a: _div(d.kv // (d.h // d.heads), a["q"])),
        ("hidden % q^3 != 0", lambda d, a: _div(d.h, a["q"] ** 3)),
        ("3 * hidden % q^3 != 0", lambda d, a: _div(3 * d.h, a["q"] ** 3)),
        ("ffn hidden % q^3 != 0", lambda d, a: _div(d.f, a["q"] ** 3)),
        ("seq % q^2 != 0", lambda d, a: _div(d.s, a["q"] ** 2)),
    ],
}


def rules(mode: str) -> list[Rule]:
    return COMMON + MODE_RULES[mode]


def first_violation(mode: str, d: Dims, arrays: Arrays) -> np.ndarray:
    """Index into rules(mode) of the first broken rule per layout, -1 where all hold."""
    n = len(next(iter(arrays.values())))
    out = np.full(n, -1, dtype=np.int64)
    for i, (_, pred) in enumerate(rules(mode)):
        bad = (out < 0) & ~np.broadcast_to(pred(d, arrays), (n,))
        out[bad] = i
    return out


def layout_arrays(layout: Layout, mb: int) -> Arrays:
    """One layout as length-1 arrays (the vectorized formulas take these)."""
    vals = {
        "dp": layout.dp,
        "pp": layout.pp,
        "t": layout.tensor_size,
        "q": layout.q,
        "d": layout.depth,
        "mb": mb,
        "v": layout.interleave,
        "sp": int(layout.sequence_parallel),
    }
    return {k: np.array([v], dtype=np.int64) for k, v in vals.items()}


def violations(layout: Layout, d: Dims, mb: int) -> list[str]:
    arrays = layout_arrays(layout, mb)
    return [text for text, pred in rules(layout.mode) if not bool(np.all(pred(d, arrays)))]


def micro_batch_candidates(layout: Layout, d: Dims) -> list[int]:
    """Valid micro-batch sizes for a layout (divisors of global_batch / dp that satisfy every rule)."""
    if d.global_batch % layout.dp:
        return []
    per_replica = d.global_batch // layout.dp
    return [mb for mb in range(1, per_replica + 1) if per_replica % mb == 0 and not violations(layout, d, mb)]


def resolve_micro_batch(layout: Layout, d: Dims) -> tuple[int, str | None]:
    """The layout's micro-batch, or the smallest valid one when it is None (with a note saying so)."""
    if layout.micro_batch is not None:
        bad = violations(layout, d, layout.micro_batch)
        if bad:
            raise ParacubeError(
                f"layout {layout}: {'; '.join(bad)} (global batch {d.global_batch}, "
                f"{d.L} layers, hidden {d.h}, heads {d.heads}, seq {d.s})"
            )
        return layout.micro_batch, None
    cands = micro_batch_candidates(layout, d)
    if not cands:
        bad = violations(layout, d, 1) or ["no micro-batch size divides the global batch"]
        raise ParacubeError(
            f"layout {layout}: no valid micro-batch size for global batch {d.global_batch}: {'; '.join(bad)}"
        )
    return cands[0], f"micro-batch not given: chose the smallest valid one, mb={cands[0]}"
