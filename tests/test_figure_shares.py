"""calibration/figure_shares.py: the step's share per efficiency figure is the step's elasticity in that figure.

Equivalence: the shares of the figures one at a time (candidate) sum to the elasticity of the step in all of them
scaled together (reference), on a row whose step is a sum of work / speed terms (no overlap max() near a kink:
one node, data parallel, its gradient ring under the backward). Bound 0.01 absolute: with t = sum a_i / f_i + c
both sides agree to second order in the 1% step (~1e-4); 0.01 leaves room for a max() that moves by less than
the step, and it is far below the shares compared (0.5-0.9).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from paracube.calibration.figure_shares import SPEEDS, figure_shares, shipped
from paracube.calibration.run_prediction import predict, preset_topology
from paracube.calibration.runs_csv import read_runs
from paracube.topologies.presets import PRESETS

TODAY = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs_today.csv"


@pytest.mark.parametrize("row", ["b200-l3-8B", "n4-15B-fp8-16"])
def test_shares_sum_to_the_joint_elasticity(row: str) -> None:
    run = next(r for r in read_runs(TODAY, tuple(PRESETS)) if r.name == row)
    lay, _ = predict(run, preset_topology(run), "megatron")
    shares = figure_shares(run, lay, "megatron")
    assert set(shares) == {p for p in SPEEDS if getattr(shipped(run), p) is not None}
    joint = figure_shares(run, lay, "megatron", scale=tuple(shares))
    total = next(iter(joint.values()))
    assert 0.5 < total <= 1.0 + 1e-9  # the latency-bound rest is positive and small on these rows
    assert sum(shares.values()) == pytest.approx(total, abs=0.01)
