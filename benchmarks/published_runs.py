"""Predicted vs measured step time on the published runs of docs/published-runs.md.

Rows: benchmarks/data/published_runs.csv (Narayanan et al. 2021 table 1, step time = F / (GPUs x TFLOP/s);
Megatron-LM README 2020 tables). Each row's TP/PP/DP is pinned, sequence parallelism forbidden (those runs
did not use it), Megatron's unfused attention pinned (`fa=0` in every row's layout: those runs predate flash
attention), recomputation as run (full: both sources count 96 B s l h^2 FLOPs, i.e. with it);
micro-batch and interleaving are the planner's choice. Assumption: the data-parallel gradient all-reduce
overlaps the last micro-batch's backward (`overlap` in every row's layout; the sources do not say; torch DDP
and Megatron's local DDP with overlap did so). The presets' shipped efficiencies (topologies/efficiency.py,
per device generation and fabric; refit with `paracube calibrate --from-runs benchmarks/data/published_runs.csv
--cluster dgx-a100`) are printed with every row (fit and held-out rows apart), mean and max |error| per group,
then per device generation.
Usage: python benchmarks/published_runs.py [--runs CSV]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.calibration.from_runs import predict, read_runs  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.topologies.efficiency import FABRICS, GENERATIONS  # noqa: E402
from paracube.topologies.presets import PRESETS  # noqa: E402

DATA = Path(__file__).with_name("data") / "published_runs.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(DATA))
    args = ap.parse_args()
    runs = read_runs(args.runs, tuple(PRESETS))
    print("shipped efficiencies per device generation and fabric (spec-sheet peaks unchanged):")
    for gen, f in GENERATIONS.items():
        eff = f.values
        print(f"  {gen:10s} GEMM eff_max {eff['eff_max']:.2f}, m0 = n0 = k0 {eff['m0']:.0f}, "
              f"memory-bound eff {eff['mem_eff']:.2f}  ({f.source if f.fitted else 'NOT FITTED: ' + f.source})")
    print("  fabrics: " + ", ".join(f"{k} {f.values['eff']:.2f}{'' if f.fitted else ' (not fitted)'}"
                                    for k, f in FABRICS.items()))
    rows = []
    for r in runs:
        topo = load_topology(r.cluster, gpus=r.gpus)
        lay, pred = predict(r, topo)
        rows.append((r, lay, pred, pred / r.measured_s - 1))
    for split in ("fit", "held_out"):
        sel = [x for x in rows if x[0].split == split]
        print(f"\n{split} rows")
        head = ("run", "cluster", "gpus", "measured s", "predicted s", "error")
        print("{:12s} {:10s} {:>5s} {:>10s} {:>11s} {:>7s}  layout".format(*head))
        for r, lay, pred, err in sel:
            print(f"{r.name:12s} {r.cluster:10s} {r.gpus:5d} {r.measured_s:10.3f} {pred:11.3f} {err:+7.1%}  {lay}")
        if sel:
            errs = [abs(x[3]) for x in sel]
            print(f"{split}: mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} ({len(sel)} runs)")
    # By device generation (the unit the efficiencies are fitted per: topologies/efficiency.py)
    generation = {name: p.build(1, 1).device.generation for name, p in PRESETS.items() if not p.fixed_nodes}
    print()
    for gen in dict.fromkeys(generation[x[0].cluster] for x in rows):
        for split in ("fit", "held_out"):
            errs = [abs(x[3]) for x in rows if generation[x[0].cluster] == gen and x[0].split == split]
            if errs:
                print(f"{gen} {split}: mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} "
                      f"({len(errs)} runs)")


if __name__ == "__main__":
    main()
