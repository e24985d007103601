"""This machine out of the box: the uncalibrated `local-cpu` preset's step time vs `paracube run`'s.

Plans (`--plans`): `held-out` (default), plan families the local-cpu figures were not fitted on (issue #23 item
6; the preset's per-op and per-call figures were set on the three `fitted` plans): 1D (dp=2,tp=1d:4), 2D
(dp=2,tp=2d:2x2), 2.5D (tp=2.5d:2x2x2), a pipeline with 1D inside (dp=2,pp=2,tp=1d:2) and one of replicas
(dp=4,pp=2), each the tiny GPT at the default plan's global batch 8 and micro-batch 4 where it divides; `fitted`:
the default plan (`paracube run` without a plan: tiny GPT, 3D 2x2x2 on 8 ranks, a fitted plan) and what `paracube
plan --gpus 4` and `--gpus 8` choose (tiny model, every other option at its default; the planner's picks, on
2026-12-03 pipelines, dp=2,pp=2 and dp=4,pp=2, not the fitted dp=4 / dp=8); `all`: both. Each is
trained by `paracube run PLAN --steps N --metrics FILE --data synthetic` (a subprocess, as a user runs it),
N = --steps for the default plan and as many steps as take about as long for the faster plans (at most 80);
the plans take turns, --rounds times (a shared machine's speed drifts by tens of percent over minutes: taking
turns gives every plan the same mix of its moments). Measured = the median step time of steps 2..N of every
round (step 1 is warm-up; the median because other jobs spike single steps), with each round's median and min..max.
The prediction is the analytic model on the uncalibrated preset (this machine's core
figures from the probe cache, topologies/cpu_probe.py, probed first when absent; ranks sharing cores, per-op and
per-call overheads priced by topologies/local_cpu.py; it prints the figures), or on --cal FILE (a
`paracube calibrate` output). Prints predicted vs measured side by side, the error, both orders, and the load
average before each run (timings on a shared machine are only meaningful when the load is low: check it), and
before each round the machine's speed now against the cached probe (a fresh probe; the cache is kept), or with
--cal, before the first round and after the last, against the calibration's own step probes (its parallel fp32
ones run again: about a minute each time on a 2-core VM; a VM's speed drifts by ~10% between a calibrate and a
validate minutes apart, and these two lines say by how much; nothing is refitted). Runtime on the 2-core VM beside
other jobs at nice -20 (2026-12-03): 7-8 minutes for the held-out plans at --rounds 3, 7-9 with --cal (the two
probe lines included).
Acceptance (issue #23): every held-out plan within 30% uncalibrated and 15% with --cal, over --rounds 3.
On a machine other jobs share, run it (and `paracube calibrate`) at a high priority, e.g. `nice -n -20` as
root: the ranks then get the cores whenever they can run, as on a quiet machine (measured on this 2-core VM
beside four busy jobs: the held-out plans' steps within 1-4% of a quiet run's).
Usage: python benchmarks/validate_local.py [--steps 12] [--rounds 3] [--plans held-out|fitted|all] [--cal FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from paracube.calibration.microbench import run_probes  # noqa: E402
from paracube.cli.main import main as cli  # noqa: E402
from paracube.cost_models import estimate  # noqa: E402
from paracube.layout_parse import parse_layout  # noqa: E402
from paracube.plan import Plan, default_plan, load_plan  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.topologies.cpu_probe import CpuFigures, cache_path, cpu_figures, run_probe  # noqa: E402
from paracube.topologies.local_cpu import CPU_STEP_WAIT_S, core_figures, host_cores, sched_slice_s  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def planned(gpus: int, folder: str) -> tuple[Plan, str]:
    """What `paracube plan --gpus N` writes (tiny model, local-cpu, every other option at its default)."""
    path = os.path.join(folder, f"plan{gpus}.json")
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli(["plan", "--gpus", str(gpus), "-o", path])
    if code != 0:
        raise SystemExit(f"paracube plan --gpus {gpus} exited {code}")
    return load_plan(path), path


HELD_OUT = ("dp=2,tp=1d:4,mb=4", "dp=2,tp=2d:2x2,mb=4", "tp=2.5d:2x2x2,mb=4", "dp=2,pp=2,tp=1d:2,mb=2",
            "dp=4,pp=2,mb=1")


def held_out(folder: str) -> dict[str, tuple[Plan, str | None]]:
    """The held-out plan families (module docstring) as plan files."""
    out: dict[str, tuple[Plan, str | None]] = {}
    for text in HELD_OUT:
        plan = default_plan(text)
        path = os.path.join(folder, f"held_{len(out)}.json")
        plan.save(path)
        out[f"held-out {plan.layout.mode}{' pp' if plan.layout.pp > 1 else ''}"] = (plan, path)
    return out


def run(plan_path: str | None, steps: int, folder: str) -> list[float]:
    """Step times (s) of steps 2..N of `paracube run` (the default plan when `plan_path` is None)."""
    metrics = os.path.join(folder, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    argv = [sys.executable, "-m", "paracube", "run", *([plan_path] if plan_path else []), "--steps", str(steps),
            "--metrics", metrics, "--data", "synthetic", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:])} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    with open(metrics) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [float(r["step_time_s"]) for r in rows if r["step"] >= 2]


def drift(cached: CpuFigures | None) -> str:
    """This machine's speed now (a fresh probe, the cache untouched) against the cached figures the prediction
    uses: the preset cannot know that other jobs slow the machine down after it probed."""
    now = run_probe()
    if cached is None or now is None:
        return "machine speed now: no probe to compare"
    gemm = statistics.geometric_mean([now.gemm_flops[k] / cached.gemm_flops[k] for k in cached.gemm_flops])
    return (f"machine speed now vs the cached probe: {cached.op_s / now.op_s:.2f}x per op "
            f"({now.op_s * 1e6:.1f} vs {cached.op_s * 1e6:.1f} us), {gemm:.2f}x GEMM FLOP/s")


def cal_drift(source: str) -> str:
    """This machine's speed now against when `source` (a `paracube calibrate` output) was measured: its parallel
    fp32 step probes at the shortest sequence run again now (calibration/microbench.run_probes, as calibrate ran
    them; the file keeps the faster of its rounds) and compared. Nothing is refitted: the prediction stays the
    calibration's, and this line says how far the machine moved from it."""
    topo = load_topology(source)
    probes = [p for p in (topo.calibration.probes or ()) if p.dtype == "fp32"
              and parse_layout(p.layout).world_size > 1]
    if not probes:
        return "machine speed now: the calibration has no parallel probes to compare"
    seq = min(p.seq_len for p in probes)
    probes = [p for p in probes if p.seq_len == seq]
    now = run_probes(tuple(p.layout for p in probes), ("fp32",), 6, topo.num_devices, seqs=(seq,))
    ratios = [(p, n["time_s"] / p.time_s) for p, n in zip(probes, now, strict=True)]
    each = ", ".join(f"{p.layout} {p.time_s * 1e3:.1f} -> {r * p.time_s * 1e3:.1f} ms" for p, r in ratios)
    mean = statistics.geometric_mean([r for _, r in ratios])
    return f"machine now vs the calibration's probes: steps {mean - 1:+.0%} ({each})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="steps of the default plan per run (1 is warm-up)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each plan, the plans taking turns")
    ap.add_argument("--plans", choices=("held-out", "fitted", "all"), default="held-out",
                    help="held-out plan families (default), the three the preset was fitted on, or both")
    ap.add_argument("--cal", help="a calibrated topology file (paracube calibrate) instead of the preset")
    args = ap.parse_args()
    source = args.cal or "local-cpu"
    print(f"{source}{'' if args.cal else ' (uncalibrated preset)'}; {os.cpu_count()} CPUs; `paracube run`, "
          f"{args.rounds} rounds, median of steps 2..N", flush=True)
    print(f"{'plan':<18}{'layout':<32}{'predicted':>11}{'measured':>11}{'error':>9}   {'min..max':<17} "
          "steps x rounds: each round's median; load average before each run", flush=True)
    if not args.cal:
        figs = cpu_figures(host_cores())
        peak, op_s = core_figures(figs)
        where = f"probed, cache {cache_path()}" if figs is not None else "fixed (probe disabled or failed)"
        print(f"core figures ({where}): fp32 peak {peak / 1e9:.0f} GFLOP/s, {op_s * 1e6:.1f} us per op; "
              f"{CPU_STEP_WAIT_S * 1e3:.2f} ms wait per collective message and other rank on the core (fixed; one "
              "message more a call where the mode's calls switch groups), "
              f"{sched_slice_s() * 1e3:.2f} ms (the scheduler's slice) per point-to-point message and other rank; "
              "the pipeline bubble at its share on shared cores (cost_models/shared_cores.py)",
              flush=True)
    pred: dict[str, float] = {}
    meas: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        plans: dict[str, tuple[Plan, str | None]] = {}
        if args.plans != "held-out":
            plans["default (run)"] = (default_plan(), None)
            for gpus in (4, 8):
                plans[f"plan --gpus {gpus}"] = planned(gpus, folder)
        if args.plans != "fitted":
            plans.update(held_out(folder))
        if args.cal:  # a calibration prices the rank count it was measured with (calibrate --nproc)
            world = load_topology(source).num_devices
            for name in [n for n, (plan, _) in plans.items() if plan.layout.world_size != world]:
                print(f"{name}: {plans.pop(name)[0].layout.world_size} ranks, not priced by {source} ({world} ranks)")
        for name, (plan, _) in plans.items():
            layout = plan.layout.with_(micro_batch=plan.micro_batch)
            topo = load_topology(source, gpus=layout.world_size)
            pred[name] = estimate(plan.model, plan.training, layout, topo, with_events=False).step_time_s
        # every plan runs about as long as the default plan would (3D 2x2x2: its prediction on this source)
        ref = default_plan()
        budget = args.steps * estimate(ref.model, ref.training, ref.layout.with_(micro_batch=ref.micro_batch),
                                       load_topology(source, gpus=8), with_events=False).step_time_s
        steps = {name: min(80, max(args.steps, round(budget / pred[name]))) for name in plans}
        times: dict[str, list[list[float]]] = {name: [] for name in plans}
        loads: dict[str, list[str]] = {name: [] for name in plans}
        for k in range(args.rounds):
            if args.cal and k == 0:
                print(f"before round 1: {cal_drift(source)}", flush=True)
            elif not args.cal:
                print(f"round {k + 1}: {drift(cpu_figures(host_cores()))}", flush=True)
            for name, (_, path) in plans.items():
                loads[name].append(load())
                times[name].append(run(path, steps[name], folder))
        if args.cal:
            print(f"after round {args.rounds}: {cal_drift(source)}", flush=True)
        for name, (plan, _) in plans.items():
            layout = plan.layout.with_(micro_batch=plan.micro_batch)
            every = [t for rnd in times[name] for t in rnd]
            meas[name] = statistics.median(every)
            err = pred[name] / meas[name] - 1
            rounds = " / ".join(f"{statistics.median(rnd) * 1e3:.0f}" for rnd in times[name])
            print(f"{name:<18}{str(layout):<32}{pred[name] * 1e3:>9.1f}ms{meas[name] * 1e3:>9.1f}ms{err:>+9.1%}   "
                  f"{min(every) * 1e3:.0f}..{max(every) * 1e3:.0f} ms{'':<4} {steps[name]} x {args.rounds}: "
                  f"{rounds} ms; load {' | '.join(loads[name])}", flush=True)
    errs = [abs(pred[k] / meas[k] - 1) for k in pred]
    p_order, m_order = sorted(pred, key=pred.__getitem__), sorted(meas, key=meas.__getitem__)
    print(f"predicted order: {' < '.join(p_order)}")
    print(f"measured order:  {' < '.join(m_order)}  ({'same' if p_order == m_order else 'DIFFERENT'})")
    bound = 0.15 if args.cal else 0.30
    print(f"|error|: max {max(errs):.0%}, mean {sum(errs) / len(errs):.0%} (load now {load()}); "
          f"{sum(e <= bound for e in errs)} of {len(errs)} plans within {bound:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
