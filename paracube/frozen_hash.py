"""A frozen dataclass's hash, computed once per instance: for the value objects the cost model and the planner use
as cache and dict keys in their inner loops (cost_models.dims.Dims: every lru cache of per-stage sizes; planner
Structure: each configuration's placements and links), hashed ~10^5 times a search.

The hash is the dataclass's own (its fields' tuple, as `@dataclass(frozen=True)` generates it), so it agrees with
`==`; it is kept in the instance's __dict__ (a frozen instance's fields never change) and left out of pickles
(`frozen_state`: another interpreter hashes strings with another seed).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def frozen_hash(obj: Any) -> int:
    """hash(obj's fields' tuple), computed at the first call only."""
    h = obj.__dict__.get("_hash")
    if h is None:
        h = obj.__dict__["_hash"] = hash(tuple(getattr(obj, f.name) for f in fields(obj)))
    return h


def frozen_state(obj: Any) -> dict[str, Any]:
    """The instance's state for pickle and copy, without the cached hash."""
    return {k: v for k, v in obj.__dict__.items() if k != "_hash"}


__all__ = ["frozen_hash", "frozen_state"]
