"""The one exception type for mistakes a user can make: the CLI prints it on one line, exit status 2.

`did_you_mean` and `unknown` give every "unknown X" message the same shape: the bad value, the closest valid
name (difflib's ratio >= 0.6, the standard library's own cutoff), then every valid name.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable


class ParacubeError(ValueError):
    """A bad value supplied by the user (name, file, size, layout). The message names the value and
    what would be valid."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ParacubeError(message)


def divisors(n: int, most: int = 10**7) -> list[int] | None:
    """The divisors of n in order, by trial division up to sqrt(n), for an error message's valid values; None
    past `most` (a fuzzed or mistyped size must not stall the message)."""
    if n < 1 or n > most:
        return None
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def divisors_text(n: int) -> str:
    """'1, 2, 4, 8' (divisors), or 'a divisor of n' where n is too large to list them."""
    found = divisors(n)
    return ", ".join(map(str, found)) if found is not None else f"a divisor of {n}"


def did_you_mean(value: object, valid: Iterable[str]) -> str:
    """'did you mean dgx-h100? ' for a near miss (case and '-'/'_' ignored), else ''."""
    names = list(valid)
    def fold(s: str) -> str:
        return s.lower().replace("_", "").replace("-", "").replace(" ", "")
    folded = {fold(n): n for n in names}
    text = fold(str(value))
    if text in folded:
        return f"did you mean {folded[text]}? "
    close = difflib.get_close_matches(text, list(folded), n=1, cutoff=0.6)
    return f"did you mean {folded[close[0]]}? " if close else ""


def unknown(what: str, value: object, valid: Iterable[str], tail: str = "") -> ParacubeError:
    """`unknown topology 'dgxh100'; did you mean dgx-h100? valid: a, b, c<tail>` as an error to raise."""
    names = list(valid)
    return ParacubeError(f"unknown {what} {value!r}; {did_you_mean(value, names)}valid: {', '.join(names)}{tail}")
