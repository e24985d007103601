"""Distinct rows of a small integer table, fast: what the cost models key their per-stage caches on.

`unique_rows(rows)` returns what `np.unique(rows, axis=0, return_inverse=True)` returns (the distinct rows in
lexicographic order, and each row's index among them) by a 1-D unique of one mixed-radix int64 per row (column j
offset by its minimum, in radix its range; the first column most significant, so the keys sort as the rows do).
np.unique with axis=0 sorts a structured view instead, several times slower on the search's tables; tables whose
ranges do not fit 62 bits, and anything but a 2-D integer array, go to np.unique itself.
"""

from __future__ import annotations

import numpy as np


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows in lexicographic order, each row's index among them: 1-D), as np.unique(axis=0)."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.dtype.kind not in "iu" or rows.size == 0:
        keys, inverse = np.unique(rows, axis=0, return_inverse=True)
        return keys, np.asarray(inverse).reshape(-1)
    lo = rows.min(axis=0)
    span = rows.max(axis=0).astype(np.int64) - lo + 1
    if float(np.prod(span.astype(np.float64))) >= 2.0 ** 62:
        keys, inverse = np.unique(rows, axis=0, return_inverse=True)
        return keys, np.asarray(inverse).reshape(-1)
    key = np.zeros(len(rows), dtype=np.int64)
    for j in range(rows.shape[1]):
        key = key * int(span[j]) + (rows[:, j] - lo[j]).astype(np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return rows[first], np.asarray(inverse).reshape(-1)


__all__ = ["unique_rows"]
