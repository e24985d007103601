"""Analytic vs event engine on every published layout (docs/published-runs.md), without contention knobs.

For every row of benchmarks/data/published_runs.csv: the planner's layout for the row (calibration.run_prediction.
predict: TP/PP/DP pinned, mb and v chosen), its analytic step time, the event engine's (same layout, the
layout's own `overlap` of gradient buckets with backward; no tensor-parallel overlap option), their relative
difference, the exposed communication of each, and the event engine's wall time. Both engines price the row's
gradient bucket (its grad_bucket column, e.g. Megatron-core's max(40M, 1M x dp x cp) elements; calibration/
runs_csv.py), as the search that chose the layout did; `--bucket default` prices both with modes/buckets.py's
25 MiB instead (the figures before the event engine took the bucket). Ends with the mean and max |difference|
(the issue asks <= 5%).
Usage: python benchmarks/engines_agree.py [--runs CSV] [--only NAME ...] [--bucket run|default]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.calibration.run_prediction import predict, preset_topology  # noqa: E402
from paracube.calibration.runs_csv import read_runs  # noqa: E402
from paracube.cost_models.analytic import estimate  # noqa: E402
from paracube.cost_models.event import estimate_event  # noqa: E402
from paracube.topologies.presets import PRESETS  # noqa: E402

DATA = Path(__file__).with_name("data") / "published_runs.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(DATA))
    ap.add_argument("--only", nargs="*", default=[], help="run names to compare (default: every row)")
    ap.add_argument("--bucket", choices=("run", "default"), default="run", help="gradient bucket of both engines")
    args = ap.parse_args()
    head = ("run", "analytic s", "event s", "diff", "exposed a/e s", "event wall")
    print("{:12s} {:>10s} {:>10s} {:>7s} {:>15s} {:>10s}  layout".format(*head), flush=True)
    diffs = []
    for r in read_runs(args.runs, tuple(PRESETS)):
        if args.only and r.name not in args.only:
            continue
        topo = preset_topology(r)
        lay, _ = predict(r, topo)
        bucket = {"bucket_bytes": r.bucket_bytes} if args.bucket == "run" and r.bucket_bytes is not None else {}
        an = estimate(r.model, r.training, lay, topo, with_events=False, **bucket)
        t0 = time.perf_counter()
        ev = estimate_event(r.model, r.training, lay, topo, with_events=False, **bucket)
        wall = time.perf_counter() - t0
        diff = ev.step_time_s / an.step_time_s - 1
        diffs.append(abs(diff))
        print(f"{r.name:12s} {an.step_time_s:10.3f} {ev.step_time_s:10.3f} {diff:+7.1%} "
              f"{an.exposed_comm_time_s:7.3f}/{ev.exposed_comm_time_s:<7.3f} {wall:9.1f}s  {lay}", flush=True)
    if diffs:
        print(f"|event / analytic - 1|: mean {sum(diffs) / len(diffs):.1%}, max {max(diffs):.1%} "
              f"({len(diffs)} layouts)")


if __name__ == "__main__":
    main()
