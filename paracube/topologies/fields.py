"""Checked readers of YAML fields: one ParacubeError line naming the field and what it expects.

`where` is the field's dotted path (e.g. "calibration.comm.all_reduce.4.latency"); the loader prefixes the
file name. Numbers may be strings such as "3e-6", which YAML 1.1 does not read as floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from paracube.errors import ParacubeError


def field_error(where: str, expected: str, value: object) -> ParacubeError:
    """The one-line error for a field that is not what it should be."""
    return ParacubeError(f"field {where}: expected {expected}, got {value!r}")


def number(where: str, value: object, low: float = -math.inf, positive: bool = False) -> float:
    """A finite number (YAML 1.1 reads 3e-6 as a string: accepted) >= low, or > 0 if positive."""
    expected = "a number > 0" if positive else ("a number" if low == -math.inf else f"a number >= {low:g}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise field_error(where, expected, value)
    try:
        number = float(value)
    except ValueError:
        raise field_error(where, expected, value) from None
    if not math.isfinite(number) or number < low or (positive and number <= 0):
        raise field_error(where, expected, value)
    return number


def mapping(where: str, value: object) -> Mapping[str, Any]:
    """`value` if it is a mapping."""
    if not isinstance(value, Mapping):
        raise field_error(where, "a mapping", value)
    return value


def known(where: str, data: Mapping[str, Any], valid: tuple[str, ...]) -> None:
    """Refuse the first key of `data` not in `valid` (a typo would otherwise be ignored silently)."""
    unknown = [str(k) for k in data if k not in valid]
    if unknown:
        raise ParacubeError(f"field {where}.{unknown[0]}: unknown; valid: {', '.join(valid)}")


def floats(where: str, cls: type, data: object, required: tuple[str, ...] = ()) -> Any:
    """A dataclass of optional float fields (required ones must be present) from a mapping."""
    data = mapping(where, data)
    names = tuple(f.name for f in fields(cls))
    known(where, data, names)
    for name in required:
        if name not in data:
            raise ParacubeError(f"field {where}.{name}: missing; expected a number")
    positive = getattr(cls, "POSITIVE", ())
    return cls(**{k: number(f"{where}.{k}", v, 0.0, k in positive) for k, v in data.items()})


def plain(obj: Any) -> dict[str, Any]:
    """A dataclass's fields that are set (not None): what its YAML mapping holds."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) is not None}


__all__ = ["field_error", "floats", "known", "mapping", "number", "plain"]
