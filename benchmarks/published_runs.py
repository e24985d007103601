"""Predicted vs measured step time on the published runs of docs/published-runs.md, by device generation.

Prints the shipped efficiencies and where each came from (topologies/efficiency.py), then every row's measured and
predicted step and its layout, fit rows and held-out rows apart, grouped V100, A100, H100, H200, B200/GB200, each
group's mean and max |error|, and a summary per generation with the FSDP and MoE rows apart. Rows the model refuses
are listed with their one-line reason.

Rows (what each run ran, where that comes from, and the readings of the rows the model misses: docs/fidelity.md):
- benchmarks/data/published_runs.csv: Narayanan et al. 2021 table 1 and the Megatron-LM README 2020 tables (DGX A100,
  DGX-2);
- benchmarks/data/published_runs_today.csv: the DGX H100 recipes of NeMo 24.12, NeMo's Blackwell runs (DGX B200,
  GB200 NVL72), the H200 torchtitan FSDP rows and NeMo's long-sequence (context-parallel) sweep;
- benchmarks/data/published_runs_fsdp.csv: torchtitan FSDP2 on 64 A100;
- benchmarks/data/published_runs_moe.csv: the Megatron-Bridge MoE runs on DGX H100 and NeMo's Mixtral 8x7B on
  Blackwell.
Each row is priced by calibration/run_prediction.predict: its layout as pinned in the CSV (what the source leaves
open is the planner's choice for the row's runtime), the analytic engine, the shipped figures, the row's runtime
(column `runtime`, else --runtime), gradient bucket and reduction dtype, capacity factor and dispatcher.

Fit and held out (column `split`): the figures are fitted on the `fit` rows only, a few per device generation and
fabric, never a factor per run. `--refit` re-runs those fits and prints them beside the shipped figures (minutes):
Ampere's overlap drag on the dgx-a100 fit rows (AMPERE_FREE), Hopper's free figures on the dgx-h100 fit rows
(HOPPER_FREE), Blackwell's on the fit rows of both Blackwell systems at once (BLACKWELL_FREE), and the two MoE
figures each on its one fit row by bisection (refit_moe: the all_to_all's a2a_eff, the host's host_scale, the a2a
overlap's a2ao_eff).
Usage: python benchmarks/published_runs.py [--runs CSV] [--today CSV] [--fsdp CSV] [--moe CSV] [--runtime NAME]
       [--refit]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.calibration.from_runs import fit_cluster, fit_runs, shipped_fit  # noqa: E402
from paracube.calibration.run_prediction import predict, preset_topology  # noqa: E402
from paracube.calibration.runs_csv import Run, read_runs  # noqa: E402
from paracube.errors import ParacubeError  # noqa: E402
from paracube.topologies.efficiency import (  # noqa: E402
    A2A_NIC,
    A2AO_OVERLAP,
    FABRICS,
    FP8_GEMM,
    GENERATIONS,
    HOST_ISSUE,
    OVERLAP_DRAG,
    STRAGGLER,
    a2ao_figures,
    host_figures,
    sources,
)
from paracube.topologies.nvswitch import fabrics  # noqa: E402
from paracube.topologies.presets import PRESETS  # noqa: E402

DATA = Path(__file__).with_name("data") / "published_runs.csv"
TODAY = Path(__file__).with_name("data") / "published_runs_today.csv"
FSDP = Path(__file__).with_name("data") / "published_runs_fsdp.csv"
MOE = Path(__file__).with_name("data") / "published_runs_moe.csv"
A2A_FIT_ROW, HOST_FIT_ROW, A2AO_FIT_ROW = "qwen3-235b-256", "qwen3-30b-16-fp8", "qwen3-235b-256-fp8"  # refit_moe
# What each refit frees (from_runs.PARAMS). Hopper: NDR, m0 and NVLink 4 are held (topologies/efficiency.py: NDR at
# NCCL's physical bus bandwidth, m0 at fit2's 108, NVLink 4 at fit5's 0.874; freed, each goes where it absorbs
# other misses: NVLink 4 to its bound 1.0 once the FP8 parameter gather is priced); the FP8 m0 is the 16-bit
# curve's. Blackwell: the FP8 eff_max only, on the fit
# rows of both systems (freeing flash_eff and NVLink 5 too sends the FP8 eff_max to its bound 0.95 and flash
# attention to 0.20: the rows cannot separate them); the 16-bit curve, mem_eff and flash_eff stay Hopper's (no
# 16-bit Blackwell row), NDR is the physical 0.85, NVLink 5 borrows NVLink 4's (NOT FITTED). Each fit frees the
# generation's replica jitter too (cost_models/stragglers.py: Hopper 0.014, Ampere and Blackwell ~0).
HOPPER_FREE = ("eff_max", "mem_eff", "fp8_eff_max", "flash_eff", "overlap_drag", "straggler")
BLACKWELL_FREE = ("fp8_eff_max", "overlap_drag", "straggler")
AMPERE_FREE = ("overlap_drag", "straggler")  # the rest as fitted 2026-11 (topologies/efficiency.py)
BLACKWELL = ("dgx-b200", "gb200-nvl72")
DEVICE_GROUP = {"V100-SXM3-32GB": "V100", "A100-SXM-80GB": "A100", "H100-SXM-80GB": "H100",
                "H200-SXM-141GB": "H200", "B200-SXM-180GB": "B200/GB200", "B200-GB200-186GB": "B200/GB200"}


def _group(r: Run) -> str:
    return DEVICE_GROUP.get(PRESETS[r.cluster].build(1, 1).device.name, r.cluster)


def _figures() -> None:
    print("shipped efficiencies per device generation and fabric (spec-sheet peaks unchanged):")
    for gen, f in GENERATIONS.items():
        v = f.values
        line = (f"  {gen:10s} GEMM eff_max {v['eff_max']:.2f}, m0 = n0 = k0 {v['m0']:.0f}, "
                f"memory-bound {v['mem_eff']:.2f}")
        if "flash_eff" in v:
            line += f", flash attention {v['flash_eff']:.2f} of peak"
        if gen in FP8_GEMM:
            e = FP8_GEMM[gen].values
            line += f"; FP8 GEMM eff_max {e['fp8_eff_max']:.2f}, m0 {e['fp8_m0']:.0f}"
        if gen in OVERLAP_DRAG:
            drag = OVERLAP_DRAG[gen]
            line += f"; overlap drag {drag.values['overlap_drag']:.2f}{'' if drag.fitted else ' (NOT FITTED)'}"
        if gen in STRAGGLER:
            jit = STRAGGLER[gen]
            line += f"; replica jitter {jit.values['straggler']:.3f} sqrt(s){'' if jit.fitted else ' (NOT FITTED)'}"
        print(line)
    print("  fabrics: " + ", ".join(f"{k} {f.values['eff']:.2f}{'' if f.fitted else ' (NOT FITTED)'}"
                                    for k, f in FABRICS.items()))
    print("  MoE all-to-all across nodes, of the NIC's line rate: " + ", ".join(
        f"{k} {f.values['a2a_eff']:.2f}{'' if f.fitted else ' (NOT FITTED)'}" for k, f in A2A_NIC.items()))
    print("  GPU host's issue time, x the ops' measured seconds: " + ", ".join(
        f"{k} {f.values['host_scale']:.2f}{'' if f.fitted else ' (NOT FITTED)'}"
        for k, f in ((g, host_figures(g)) for g in GENERATIONS)))
    print("  MoE a2a overlap (a2ao), the share of the two-stream model's hidden time a run hides: " + ", ".join(
        f"{k} {f.values['a2ao_eff']:.2f}{'' if f.fitted else ' (NOT FITTED)'}"
        for k, f in ((g, a2ao_figures(g)) for g in GENERATIONS)))
    print("where each figure comes from, per preset:")
    for name, p in PRESETS.items():
        if p.fixed_nodes or name not in ("dgx2-v100", "dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72"):
            continue
        for what, src in sources(p.build(1, 1).device, *fabrics(name)).items():
            print(f"  {name:12s} {what:28s} {src}")


def _errors(sel: list) -> str:
    errs = [abs(x[3]) for x in sel]
    return f"mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} ({len(errs)} runs)"


def refit(today: list[Run], runs: list[Run]) -> None:
    """Hopper on the dgx-h100 fit rows; Blackwell on the fit rows of both Blackwell systems at once (the DGX B200
    and the GB200 NVL72 share the generation's figures and NVLink 5; their devices keep their own datasheet peaks);
    Ampere's overlap drag alone on the dgx-a100 fit rows."""
    fit, rows = fit_runs(runs, "dgx-a100", rounds=1, runtime="megatron", free=AMPERE_FREE)
    print(f"refit dgx-a100 ({', '.join(AMPERE_FREE)} free): {fit}")
    for r, lay, pred in rows:
        print(f"  {r.name:18s} {r.split:8s} {r.measured_s:8.3f} {pred:8.3f} {pred / r.measured_s - 1:+7.1%}  {lay}")
    fit, rows = fit_runs(today, "dgx-h100", rounds=1, runtime="megatron", free=HOPPER_FREE)
    print(f"refit dgx-h100 ({', '.join(HOPPER_FREE)} free): {fit}")
    for r, lay, pred in rows:
        print(f"  {r.name:18s} {r.split:8s} {r.measured_s:8.3f} {pred:8.3f} {pred / r.measured_s - 1:+7.1%}  {lay}")
    fit_rows = [r for r in today if r.cluster in BLACKWELL and r.split == "fit"]
    start = shipped_fit(PRESETS["dgx-b200"].build(1, 1).device.name, "dgx-b200")
    layouts = [predict(r, preset_topology(r, start), "megatron")[0] for r in fit_rows]
    fit, res = fit_cluster(fit_rows, start, layouts, "megatron", BLACKWELL_FREE)
    print(f"refit {' + '.join(BLACKWELL)} ({', '.join(BLACKWELL_FREE)} free): {fit}")
    for r, e in zip(fit_rows, res, strict=True):
        print(f"  {r.name:18s} {r.split:8s} {r.measured_s:8.3f} {e:+7.1%}")


def refit_moe(moe: list[Run]) -> None:
    """The MoE figures, each on its one fit row, in turn: the all_to_all's a2a_eff in (0.3, 1] on the all-to-all row
    (a token-drop row: no host waits), the host's host_scale in [1, 4] on the host-bound row, the a2a overlap's
    a2ao_eff in [0, 1] on the one row that runs it, each with the others shipped; by bisection (a faster all-to-all or
    a larger hidden share only shortens the step, a slower host only lengthens it), on presets built with the trial
    figure (a Fit)."""

    def bisect(name: str, figure: str, lo: float, hi: float, rising: bool) -> float:
        r = next(r for r in moe if r.name == name and r.split == "fit")
        start = shipped_fit(PRESETS[r.cluster].build(1, 1).device.name, r.cluster)
        for _ in range(14):
            mid = (lo + hi) / 2
            over = predict(r, preset_topology(r, replace(start, **{figure: mid})), "megatron")[1] > r.measured_s
            lo, hi = (lo, mid) if over == rising else (mid, hi)
        return (lo + hi) / 2

    eff = bisect(A2A_FIT_ROW, "a2a_eff", 0.3, 1.0, rising=False)
    print(f"refit a2a_eff on {A2A_FIT_ROW}: {eff:.3f} (shipped {A2A_NIC['ndr-ib'].values['a2a_eff']:.2f})")
    scale = bisect(HOST_FIT_ROW, "host_scale", 1.0, 4.0, rising=True)
    print(f"refit host_scale on {HOST_FIT_ROW}: {scale:.3f} (shipped {HOST_ISSUE['hopper'].values['host_scale']:.2f})")
    share = bisect(A2AO_FIT_ROW, "a2ao_eff", 0.0, 1.0, rising=False)
    print(f"refit a2ao_eff on {A2AO_FIT_ROW}: {share:.3f} (shipped {A2AO_OVERLAP['hopper'].values['a2ao_eff']:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(DATA))
    ap.add_argument("--today", default=str(TODAY), help="today's runs (H100, H200, B200, GB200)")
    ap.add_argument("--fsdp", default=str(FSDP), help="FSDP runs, held out")
    ap.add_argument("--moe", default=str(MOE), help="mixture-of-experts runs, held out")
    ap.add_argument("--runtime", default="megatron",
                    help="the runtime each row is planned for (a row's runtime column overrides it)")
    ap.add_argument("--refit", action="store_true", help="re-run the Hopper, Blackwell, MoE all-to-all fits (minutes)")
    args = ap.parse_args()
    files = [read_runs(f, tuple(PRESETS)) if f else [] for f in (args.runs, args.today, args.fsdp, args.moe)]
    _figures()
    print(f"runtime: {args.runtime} (rows with a runtime column: theirs)")
    rows, refused = [], []
    for r in [run for f in files for run in f]:
        try:
            lay, pred = predict(r, preset_topology(r), args.runtime)
        except ParacubeError as exc:
            refused.append((r, str(exc)))
            continue
        rows.append((r, lay, pred, pred / r.measured_s - 1))
    fsdp = set(id(r) for r in files[2])
    moe = set(id(r) for r in files[3])
    head = ("run", "cluster", "gpus", "dtype", "measured s", "predicted s", "error")
    for group in dict.fromkeys(DEVICE_GROUP.values()):
        for split in ("fit", "held_out"):
            sel = [x for x in rows if _group(x[0]) == group and x[0].split == split]
            if not sel:
                continue
            print(f"\n{group} {split} rows")
            print("{:18s} {:11s} {:>5s} {:5s} {:>10s} {:>11s} {:>7s}  layout".format(*head))
            for r, lay, pred, err in sel:
                tag = "  [FSDP]" if id(r) in fsdp else ("  [MoE]" if id(r) in moe else "")
                print(f"{r.name:18s} {r.cluster:11s} {r.gpus:5d} {r.training.dtype:5s} {r.measured_s:10.3f} "
                      f"{pred:11.3f} {err:+7.1%}  {lay}{tag}")
            print(f"{group} {split}: {_errors(sel)}")
    for title, sel in (("context-parallel rows (cp > 1) the model refuses",
                        [x for x in refused if x[0].layout.cp > 1]),
                       ("other rows the model refuses", [x for x in refused if x[0].layout.cp == 1])):
        if sel:
            print(f"\nnot planned: {title}, {len(sel)} rows")
            for r, why in sel:
                print(f"  {r.name:18s} [{r.runtime or args.runtime}] {why}")
    print("\nsummary by generation (FSDP and MoE rows apart, held out):")
    for group in dict.fromkeys(DEVICE_GROUP.values()):
        for split in ("fit", "held_out"):
            for label, keep in (("", lambda x: id(x[0]) not in fsdp | moe), (" FSDP", lambda x: id(x[0]) in fsdp),
                                (" MoE", lambda x: id(x[0]) in moe)):
                sel = [x for x in rows if _group(x[0]) == group and x[0].split == split and keep(x)]
                if sel:
                    print(f"  {group:10s} {split + label:14s} {_errors(sel)}")
    if args.refit:
        refit(files[1], files[0])
        refit_moe(files[3])


if __name__ == "__main__":
    main()
