"""This machine out of the box: the uncalibrated `local-cpu` preset's step time vs `paracube run`'s.

Plans: the default plan (`paracube run` without a plan: tiny GPT, 3D 2x2x2 on 8 ranks) and what `paracube plan
--gpus 4` and `--gpus 8` choose (tiny model, every other option at its default). Each is trained by `paracube
run PLAN --steps N --metrics FILE --data synthetic` (a subprocess, as a user runs it); measured = the median
step time of steps 2..N (step 1 is warm-up; the median because other jobs on a shared machine spike single
steps), with min..max. The prediction is the analytic model on the uncalibrated preset (this machine's core
figures from the probe cache, topologies/cpu_probe.py, probed first when absent; ranks sharing cores, per-op and
per-call overheads priced by topologies/local_cpu.py; it prints the figures), or on --cal FILE (a
`paracube calibrate` output). Prints predicted vs measured side by side, the error, both orders, and the load
average before each run (timings on a shared machine are only meaningful when the load is low: check it).
Usage: python benchmarks/validate_local.py [--steps 12] [--cal FILE]
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

from paracube.cli.main import main as cli  # noqa: E402
from paracube.cost_models import estimate  # noqa: E402
from paracube.plan import Plan, default_plan, load_plan  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.topologies.cpu_probe import cache_path, cpu_figures  # noqa: E402
from paracube.topologies.local_cpu import core_figures, host_cores  # noqa: E402


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="steps per run (step 1 is warm-up)")
    ap.add_argument("--cal", help="a calibrated topology file (paracube calibrate) instead of the preset")
    args = ap.parse_args()
    source = args.cal or "local-cpu"
    print(f"{source}{'' if args.cal else ' (uncalibrated preset)'}; {os.cpu_count()} CPUs; `paracube run` "
          f"--steps {args.steps}, median of steps 2..{args.steps}", flush=True)
    print(f"{'plan':<15}{'layout':<32}{'predicted':>11}{'measured':>11}{'error':>9}   {'min..max':<17} load before",
          flush=True)
    if not args.cal:
        figs = cpu_figures(host_cores())
        peak, op_s, wait_s = core_figures(figs)
        where = f"probed, cache {cache_path()}" if figs is not None else "fixed (probe disabled or failed)"
        print(f"core figures ({where}): fp32 peak {peak / 1e9:.0f} GFLOP/s, {op_s * 1e6:.1f} us per op, "
              f"{wait_s * 1e3:.2f} ms call wait per other rank on the core", flush=True)
    pred: dict[str, float] = {}
    meas: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        plans: dict[str, tuple[Plan, str | None]] = {"default (run)": (default_plan(), None)}
        for gpus in (4, 8):
            plans[f"plan --gpus {gpus}"] = planned(gpus, folder)
        for name, (plan, path) in plans.items():
            layout = plan.layout.with_(micro_batch=plan.micro_batch)
            topo = load_topology(source, gpus=layout.world_size)
            pred[name] = estimate(plan.model, plan.training, layout, topo, with_events=False).step_time_s
            before = load()
            times = run(path, args.steps, folder)
            meas[name] = statistics.median(times)
            err = pred[name] / meas[name] - 1
            print(f"{name:<15}{str(layout):<32}{pred[name] * 1e3:>9.1f}ms{meas[name] * 1e3:>9.1f}ms{err:>+9.1%}   "
                  f"{min(times) * 1e3:.0f}..{max(times) * 1e3:.0f} ms{'':<4} {before}", flush=True)
    errs = [abs(pred[k] / meas[k] - 1) for k in pred]
    p_order, m_order = sorted(pred, key=pred.__getitem__), sorted(meas, key=meas.__getitem__)
    print(f"predicted order: {' < '.join(p_order)}")
    print(f"measured order:  {' < '.join(m_order)}  ({'same' if p_order == m_order else 'DIFFERENT'})")
    print(f"|error|: max {max(errs):.0%}, mean {sum(errs) / len(errs):.0%} (load now {load()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
