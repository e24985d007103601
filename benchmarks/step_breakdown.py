"""Where a published row's predicted step goes, side by side for the rows named: compute, exposed communication,
pipeline bubble, each mesh axis's communication (as if serialized), and the step's share per efficiency figure.

For each row (benchmarks/data/published_runs*.csv; the layout `published_runs.py` plans for it, analytic engine,
shipped figures): measured and predicted step, StepEstimate's compute / exposed / bubble / comm_time_by_axis, then
`share[f]` = -d ln(step) / d ln(f) for each efficiency figure f the row's cluster prices with (calibration/
figure_shares.py: eff_max, mem_eff, fp8_eff_max, flash_eff, intra, inter where set): the fraction of the step
that runs at that figure's speed. A row missing by e needs a figure's speed changed by about e / share.
Used to read the Blackwell and H200 held-out rows (topologies/efficiency.py's docstring).
Usage: python benchmarks/step_breakdown.py ROW[,ROW...] [--runtime NAME]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.calibration.figure_shares import figure_shares  # noqa: E402
from paracube.calibration.run_prediction import predict, preset_topology, run_estimate  # noqa: E402
from paracube.calibration.runs_csv import Run, read_runs  # noqa: E402
from paracube.errors import ParacubeError, check  # noqa: E402
from paracube.topologies.presets import PRESETS  # noqa: E402

DATA = Path(__file__).with_name("data")
FILES = ("published_runs.csv", "published_runs_today.csv", "published_runs_fsdp.csv", "published_runs_moe.csv")


def breakdown(run: Run, runtime: str) -> list[str]:
    """The row's lines: layout, measured vs predicted, the estimate's parts, the shares per figure."""
    lay, pred = predict(run, preset_topology(run), runtime)
    est = run_estimate(run, lay, preset_topology(run), runtime)
    axes = ", ".join(f"{k} {v:.3f}" for k, v in est.comm_time_by_axis.items() if v >= 5e-4)
    share = ", ".join(f"{k} {v:.2f}" for k, v in figure_shares(run, lay, runtime).items())
    return [f"{run.name} ({run.cluster}, {run.gpus} GPUs, {run.training.dtype}) {lay}",
            f"  measured {run.measured_s:.3f} s, predicted {pred:.3f} s ({pred / run.measured_s - 1:+.1%})",
            f"  compute {est.compute_time_s:.3f}, exposed comm {est.exposed_comm_time_s:.3f}, bubble "
            f"{est.bubble_time_s:.3f}, comm (serialized) {est.comm_time_s:.3f}: {axes}",
            f"  share of the step per figure: {share}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", help="comma-separated row names of the published CSVs")
    ap.add_argument("--runtime", default="megatron", help="rows without a runtime column are planned for it")
    args = ap.parse_args()
    runs = {r.name: r for f in FILES for r in read_runs(DATA / f, tuple(PRESETS))}
    names = [n for n in args.rows.split(",") if n]
    bad = [n for n in names if n not in runs]
    try:
        check(not bad, f"unknown row(s) {', '.join(bad)}: valid rows are those of {', '.join(FILES)} "
              f"(e.g. {', '.join(list(runs)[:3])})")
    except ParacubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    for n in names:
        print("\n".join(breakdown(runs[n], runs[n].runtime or args.runtime)))


if __name__ == "__main__":
    main()
