"""LayoutBatch: many layouts of one tensor mode as int64 arrays, one entry per layout (the vectorized path).

Fields: dp, pp, t (tensor ranks), q (grid side; p in 1D), depth (2.5D depth, else 1), mb (sequences per
micro-batch per replica), v (interleave), sp (1 with sequence parallelism). The cost models and the mode
declarations compute on these arrays; a single layout is a batch of length 1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

FIELDS = ("dp", "pp", "t", "q", "depth", "mb", "v", "sp")


@dataclass(frozen=True)
class LayoutBatch:
    dp: np.ndarray
    pp: np.ndarray
    t: np.ndarray
    q: np.ndarray
    depth: np.ndarray
    mb: np.ndarray
    v: np.ndarray
    sp: np.ndarray

    @classmethod
    def of_rows(cls, rows: list[tuple[int, ...]]) -> LayoutBatch:
        """From tuples ordered as FIELDS."""
        cols = np.array(rows, dtype=np.int64).reshape(len(rows), len(FIELDS))
        return cls(*(cols[:, i].copy() for i in range(len(FIELDS))))

    @classmethod
    def one(cls, **values: int) -> LayoutBatch:
        return cls(**{k: np.array([values[k]], dtype=np.int64) for k in FIELDS})

    def __len__(self) -> int:
        return len(self.dp)

    def take(self, idx: np.ndarray) -> LayoutBatch:
        return LayoutBatch(*(getattr(self, f.name)[idx] for f in fields(self)))

    def row(self, i: int) -> tuple[int, ...]:
        return tuple(int(getattr(self, k)[i]) for k in FIELDS)

    def micro_batches(self, global_batch: int) -> np.ndarray:
        """N: micro-batches per step per replica."""
        return global_batch // (self.dp * self.mb)
