"""The one-line verdict of `paracube validate`: is the measured step within the prediction's band?

The band is the prediction's stated uncertainty (validate.compare: each part's share of the step times its
fit's RMS relative error, and the step probes' spread, in quadrature). Within: |rel err| <= band. Without a
calibration there is no band, so no verdict on time can be given; bytes sent are judged exactly either way
(the executor and the model must agree to the byte: a difference is a bug).
"""

from __future__ import annotations

from typing import Any


def verdict(comparisons: list[dict[str, Any]], bytes_equal: bool) -> tuple[bool | None, str]:
    """(within band or None where there is no band, the line)."""
    step = next(c for c in comparisons if c["name"] == "step_time_s")
    err, band = float(step["rel_err"]), float(step["band"])
    bytes_part = ("bytes sent agree exactly" if bytes_equal
                  else "bytes sent DIFFER from the prediction (a bug: report it)")
    if band <= 0:
        return None, (f"verdict: no band to judge the step time's {err:+.1%} against (uncalibrated cluster: run "
                      f"`paracube calibrate`); {bytes_part}")
    within = abs(err) <= band
    word = "WITHIN" if within else "OUTSIDE"
    return within and bytes_equal, (f"verdict: step time {err:+.1%} is {word} the prediction's ±{band:.0%} band; "
                                    f"{bytes_part}")
