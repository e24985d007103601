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
Every row is planned for a runtime (`--runtime`, default megatron: the stack those runs used; its search adds
what the row leaves open, e.g. tpo and overlap where the row has sp, paracube/runtimes); a row the runtime
cannot plan is printed with its one-line reason. Today's stacks (benchmarks/data/published_runs_h100.csv:
docs/published-runs.md section 3, Nemotron-4 15B on DGX H100 as a FLOP-equivalent llama-family shape, ffn
16384 gated = 24576 squared-ReLU; not fitted) are printed as their own held-out group, and so are the FSDP rows
(benchmarks/data/published_runs_fsdp.csv: docs/published-runs.md section 6, torchtitan FSDP2 on 64 A100 80GB,
step time = local batch x seq / (tokens/s/GPU) since TP = PP = CP = 1; layout dp=64,zero=3, micro-batch = the
local batch: no gradient accumulation; not fitted), planned for the runtime of their `runtime` column
(torchtitan) whatever --runtime says.
The MoE rows (benchmarks/data/published_runs_moe.csv: docs/published-runs.md section 4, Megatron-Bridge on
DGX H100, step time = GBS x seq / (tokens/s/GPU x GPUs), the presets' shapes, routing force-balanced as run;
recomputation not published: selective assumed) are a held-out group of their own, not fitted. GPT-OSS-120B
is not listed: sliding-window attention is not described (workload.py). Rows whose pinned layout the model
cannot split (DeepSeek-V3's 61 blocks over pp 8 x v 4) or fit are printed as not planned, with the reason.
Usage: python benchmarks/published_runs.py [--runs CSV] [--today CSV] [--fsdp CSV] [--moe CSV] [--runtime NAME]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.calibration.from_runs import predict, read_runs  # noqa: E402
from paracube.errors import ParacubeError  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.topologies.efficiency import FABRICS, GENERATIONS  # noqa: E402
from paracube.topologies.presets import PRESETS  # noqa: E402

DATA = Path(__file__).with_name("data") / "published_runs.csv"
TODAY = Path(__file__).with_name("data") / "published_runs_h100.csv"
FSDP = Path(__file__).with_name("data") / "published_runs_fsdp.csv"
MOE = Path(__file__).with_name("data") / "published_runs_moe.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(DATA))
    ap.add_argument("--today", default=str(TODAY), help="today's runs, printed apart (not fitted)")
    ap.add_argument("--fsdp", default=str(FSDP), help="FSDP runs, printed apart (not fitted)")
    ap.add_argument("--moe", default=str(MOE), help="mixture-of-experts runs, printed apart (not fitted)")
    ap.add_argument("--runtime", default="megatron",
                    help="the runtime each row is planned for (a row's runtime column overrides it)")
    args = ap.parse_args()
    runs = read_runs(args.runs, tuple(PRESETS))
    today = read_runs(args.today, tuple(PRESETS)) if args.today else []
    fsdp = read_runs(args.fsdp, tuple(PRESETS)) if args.fsdp else []
    moe = read_runs(args.moe, tuple(PRESETS)) if args.moe else []
    print("shipped efficiencies per device generation and fabric (spec-sheet peaks unchanged):")
    for gen, f in GENERATIONS.items():
        eff = f.values
        print(f"  {gen:10s} GEMM eff_max {eff['eff_max']:.2f}, m0 = n0 = k0 {eff['m0']:.0f}, "
              f"memory-bound eff {eff['mem_eff']:.2f}  ({f.source if f.fitted else 'NOT FITTED: ' + f.source})")
    print("  fabrics: " + ", ".join(f"{k} {f.values['eff']:.2f}{'' if f.fitted else ' (not fitted)'}"
                                    for k, f in FABRICS.items()))
    print(f"runtime: {args.runtime} (rows with a runtime column: theirs)")
    rows, refused = [], []
    for r in [*runs, *today, *fsdp, *moe]:
        topo = load_topology(r.cluster, gpus=r.gpus)
        try:
            lay, pred = predict(r, topo, args.runtime)
        except ParacubeError as exc:
            refused.append((r, str(exc)))
            continue
        rows.append((r, lay, pred, pred / r.measured_s - 1))
    groups = [("fit", [x for x in rows if x[0].split == "fit" and x[0] in runs]),
              ("held_out", [x for x in rows if x[0].split == "held_out" and x[0] in runs]),
              ("today (held out, not fitted)", [x for x in rows if x[0] in today]),
              ("FSDP rows, torchtitan, held out, not fitted", [x for x in rows if x[0] in fsdp]),
              ("MoE rows, Megatron-Bridge on DGX H100, held out, not fitted", [x for x in rows if x[0] in moe])]
    for split, sel in groups:
        print(f"\n{split} rows")
        head = ("run", "cluster", "gpus", "measured s", "predicted s", "error")
        print("{:14s} {:10s} {:>5s} {:>10s} {:>11s} {:>7s}  layout".format(*head))
        for r, lay, pred, err in sel:
            print(f"{r.name:14s} {r.cluster:10s} {r.gpus:5d} {r.measured_s:10.3f} {pred:11.3f} {err:+7.1%}  {lay}")
        if sel:
            errs = [abs(x[3]) for x in sel]
            print(f"{split}: mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} ({len(sel)} runs)")
    if refused:
        print(f"\nnot planned ({len(refused)} rows):")
        for r, why in refused:
            print(f"  {r.name:12s} [{r.runtime or args.runtime}] {why}")
    # By device generation (the unit the efficiencies are fitted per: topologies/efficiency.py)
    generation = {name: p.build(1, 1).device.generation for name, p in PRESETS.items() if not p.fixed_nodes}
    print()
    for gen in dict.fromkeys(generation[x[0].cluster] for x in rows):
        for split in ("fit", "held_out"):
            errs = [abs(x[3]) for x in rows if generation[x[0].cluster] == gen and x[0].split == split
                    and x[0] in runs]
            if errs:
                print(f"{gen} {split}: mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} "
                      f"({len(errs)} runs)")
        for name, group in (("today", today), ("FSDP", fsdp), ("MoE", moe)):
            errs = [abs(x[3]) for x in rows if generation[x[0].cluster] == gen and x[0] in group]
            if errs:
                print(f"{gen} {name} (held out): mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} "
                      f"({len(errs)} runs)")


if __name__ == "__main__":
    main()
