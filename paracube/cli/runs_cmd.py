"""`paracube calibrate --from-runs` and `paracube validate --from-runs`: published (or your) runs as a table.

calibrate: fit a cluster preset's few efficiencies (calibration/from_runs.py) on the runs' `fit` rows, print
them and every run's residual (fit and held-out rows apart), write the calibrated cluster file.
validate: predicted vs measured per run on a cluster (preset name or a file calibrate wrote).
Bad input (missing column, unknown preset, non-numeric time, layout not matching the GPU count): one line
naming the row and the field, exit 2, nothing written (every row is read before anything is fitted).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from paracube.errors import ParacubeError


def _table(title: str, rows: list) -> Table:
    table = Table(title=title)
    for col in ("run", "split", "gpus", "measured s", "predicted s", "error", "layout"):
        table.add_column(col, justify="left" if col in ("run", "split", "layout") else "right")
    for r, lay, pred in rows:
        table.add_row(r.name, r.split, str(r.gpus), f"{r.measured_s:.3f}", f"{pred:.3f}",
                      f"{pred / r.measured_s - 1:+.1%}", str(lay))
    return table


def _summary(rows: list) -> list[str]:
    out = []
    for split in ("fit", "held_out"):
        errs = [abs(p / r.measured_s - 1) for r, _, p in rows if r.split == split]
        if errs:
            out.append(f"{split}: mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} ({len(errs)} runs)")
    return out


def calibrate_from_runs(args: argparse.Namespace) -> int:
    import yaml

    from paracube.calibration.from_runs import FITTABLE, cluster_file, fit_runs
    from paracube.calibration.runs_csv import read_runs
    from paracube.topologies.presets import PRESETS

    if args.cluster not in FITTABLE:
        raise ParacubeError(f"--cluster {args.cluster!r} has no efficiencies to fit from runs; valid: "
                            f"{', '.join(FITTABLE)}")
    runs = read_runs(args.from_runs, tuple(PRESETS))
    with Console(stderr=True).status(f"fitting {args.cluster} efficiencies on {len(runs)} runs ..."):
        fit, rows = fit_runs(runs, args.cluster)
    console = Console()
    console.print(_table(f"{args.cluster}: predicted vs measured after the fit", rows))
    for line in _summary(rows):
        console.print(line)
    console.print(f"fitted: GEMM eff_max {fit.eff_max:.3f}, shape constant m0 = n0 = k0 {fit.m0:.0f}, memory-bound "
                  f"eff {fit.mem_eff:.3f}; NVLink/NVSwitch eff {fit.intra:.3f}, InfiniBand eff {fit.inter:.3f}")
    path = Path(args.out)
    path.write_text(yaml.safe_dump(cluster_file(args.cluster, fit), sort_keys=False))
    console.print(f"wrote {path}; use it with --cluster {path}")
    return 0


def validate_from_runs(args: argparse.Namespace) -> int:
    from paracube.calibration.run_prediction import predict
    from paracube.calibration.runs_csv import read_runs
    from paracube.topologies import load_topology
    from paracube.topologies.presets import PRESETS

    cluster = args.cluster
    if cluster is None:
        raise ParacubeError("validate --from-runs needs --cluster (a preset name or a calibrated cluster file)")
    runs = read_runs(args.from_runs, tuple(PRESETS) if cluster in PRESETS else (*PRESETS, cluster))
    rows = []
    for r in runs:
        lay, pred = predict(r, load_topology(cluster, gpus=r.gpus))
        rows.append((r, lay, pred))
    console = Console()
    console.print(_table(f"predicted on {cluster} vs measured", rows))
    for line in _summary(rows):
        console.print(line)
    return 0
