"""Size rules a layout must satisfy (docs/algorithms.md), vectorized so the planner can check many at once.

Each rule is (reason text, predicate that must hold) over a LayoutBatch (paracube/modes/batch.py: dp, pp,
t tensor ranks, q grid side, depth 2.5D depth, mb sequences per micro-batch per replica, v interleave,
sp). COMMON rules hold for every mode; each mode declares its own (`TensorMode.rules`, paracube/modes).
The vocabulary is NOT required to divide: it is padded as Megatron pads it (modes.base.padded), in the
cost models and the executor alike.
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.dims import Dims
from paracube.errors import ParacubeError, divisors
from paracube.layout import Layout
from paracube.modes import MODES, LayoutBatch
from paracube.modes.base import Rule, divides
from paracube.modes.stages import split_ok

COMMON: list[Rule] = [
    ("global batch % (dp * micro-batch) != 0", lambda d, b: divides(d.global_batch, b.dp * b.mb)),
    ("layers do not split over pp * interleave virtual stages (even, or one block less on the first and/or "
     "last; modes/stages.py)", lambda d, b: split_ok(d.L, b.pp, b.v)),
    (
        "interleaved 1F1B needs micro-batches % pp == 0",
        lambda d, b: (b.v == 1) | divides(d.global_batch // (b.dp * b.mb), b.pp),
    ),
]


def rules(mode: str) -> list[Rule]:
    return COMMON + list(MODES[mode].rules)


def first_violation(mode: str, d: Dims, batch: LayoutBatch) -> np.ndarray:
    """Index into rules(mode) of the first broken rule per layout, -1 where all hold."""
    n = len(batch)
    out = np.full(n, -1, dtype=np.int64)
    for i, (_, pred) in enumerate(rules(mode)):
        bad = (out < 0) & ~np.broadcast_to(pred(d, batch), (n,))
        out[bad] = i
    return out


def layout_arrays(layout: Layout, mb: int) -> LayoutBatch:
    """One layout as a batch of one (the vectorized formulas take these)."""
    return LayoutBatch.one(dp=layout.dp, pp=layout.pp, t=layout.tensor_size, q=layout.q, depth=layout.depth,
                           mb=mb, v=layout.interleave, sp=int(layout.sequence_parallel))


class RuleError(ParacubeError):
    """A layout breaking size rules: the message names the layout and the workload; `rules` the broken rules' texts
    alone (a search counts its refusals by them: the same rule, whatever the layout or the cp rank's sequence)."""

    def __init__(self, message: str, rules: list[str]) -> None:
        super().__init__(message)
        self.rules = tuple(rules)


def violations(layout: Layout, d: Dims, mb: int) -> list[str]:
    batch = layout_arrays(layout, mb)
    return [text for text, pred in rules(layout.mode) if not bool(np.all(pred(d, batch)))]


def micro_batch_candidates(layout: Layout, d: Dims) -> list[int]:
    """Valid micro-batch sizes for a layout (divisors of global_batch / dp that satisfy every rule)."""
    if d.global_batch % layout.dp:
        return []
    per_replica = d.global_batch // layout.dp
    return [mb for mb in divisors(per_replica, most=10**12) or () if not violations(layout, d, mb)]


def resolve_micro_batch(layout: Layout, d: Dims) -> tuple[int, str | None]:
    """The layout's micro-batch, or the smallest valid one when it is None (with a note saying so)."""
    if layout.micro_batch is not None:
        bad = violations(layout, d, layout.micro_batch)
        if bad:
            raise RuleError(f"layout {layout}: {'; '.join(bad)} (global batch {d.global_batch}, "
                            f"{d.L} layers, hidden {d.h}, heads {d.heads}, seq {d.s})", bad)
        return layout.micro_batch, None
    cands = micro_batch_candidates(layout, d)
    if not cands:
        bad = violations(layout, d, 1) or ["no micro-batch size divides the global batch"]
        raise RuleError(f"layout {layout}: no valid micro-batch size for global batch {d.global_batch}: "
                        f"{'; '.join(bad)}", bad)
    return cands[0], f"micro-batch not given: chose the smallest valid one, mb={cands[0]}"
