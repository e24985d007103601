"""How much of a published row's predicted step each efficiency figure prices: share[f] = -d ln(step) / d ln(f).

The step of a fully specified layout (calibration/run_prediction.run_estimate, the row's cluster with its shipped
figures, from_runs.shipped_fit) is, where no overlap max() switches side, a sum of work / (peak x figure) terms and
of latencies: share[f] is then the fraction of the step that runs at figure f's speed (1: a step that is all f's
work; the shares sum to the elasticity of the step in all figures at once, less than 1 by the latency-bound part).
A central difference of +-STEP on f. Which part of a residual a figure could take: a row missing by e needs f's
speed changed by about e / share[f]. Shape constants (m0, fp8_m0) and the overlap drag (a coefficient, not a
speed) are left out. Read by benchmarks/step_breakdown.py (topologies/efficiency.py: the Blackwell and H200
held-out rows).
"""

from __future__ import annotations

from dataclasses import replace

from paracube.calibration.from_runs import PARAMS, shipped_fit
from paracube.calibration.run_prediction import preset_topology, run_estimate
from paracube.calibration.runs_csv import Run
from paracube.layout import Layout
from paracube.topologies.presets import PRESETS, Fit

STEP = 0.01  # +-1% on a figure: small against the kinks of the overlap model's max()es, large against rounding
SPEEDS = tuple(p for p in PARAMS if p not in ("m0", "fp8_m0", "overlap_drag", "straggler"))


def shipped(run: Run) -> Fit:
    """The figures the row's cluster ships (from_runs.shipped_fit for its device and preset)."""
    return shipped_fit(PRESETS[run.cluster].build(1, 1).device.name, run.cluster)


def step_with(run: Run, layout: Layout, fit: Fit, runtime: str) -> float:
    """The row's analytic step with the figures `fit`."""
    return run_estimate(run, layout, preset_topology(run, fit), runtime).step_time_s


def figure_shares(run: Run, layout: Layout, runtime: str, scale: tuple[str, ...] | None = None) -> dict[str, float]:
    """share[f] per speed figure the row's cluster sets (module docstring); `scale`: the figures scaled together
    as one (key "+".join(scale)) instead of one at a time."""
    base = shipped(run)
    groups = [scale] if scale else [(p,) for p in SPEEDS if getattr(base, p) is not None]
    out = {}
    for group in groups:
        t = [step_with(run, layout, replace(base, **{p: getattr(base, p) * (1 + s) for p in group}), runtime)
             for s in (STEP, -STEP)]
        out["+".join(group)] = (t[1] - t[0]) / (t[1] + t[0]) / STEP
    return out
