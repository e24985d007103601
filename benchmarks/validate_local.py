"""This machine out of the box: the uncalibrated `local-cpu` preset's step time vs `paracube run`'s.

Plans: the default plan (`paracube run` without a plan: tiny GPT, 3D 2x2x2 on 8 ranks) and what `paracube plan
--gpus 4` and `--gpus 8` choose (tiny model, defaults). Each runs `--steps` training steps on local ranks
(validation.validate: the executor's train(), the loop of `paracube run`; step 1 is warm-up and left out); the
prediction is the analytic model on the preset as shipped (no calibration: ranks sharing cores, per-op and
per-call overheads priced by topologies/presets.local_cpu). Prints predicted vs measured side by side, the
error, the predicted and measured order, and the load average before each run (timings on a shared machine
are only meaningful when the load is low: check it).
With --cal FILE (written by `paracube calibrate`, or calibrated here with --calibrate), the same for the
calibrated file instead of the preset.
Usage: python benchmarks/validate_local.py [--steps 6] [--repeats 1] [--cal FILE [--calibrate] [--quick]]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.cli.main import main as cli  # noqa: E402
from paracube.plan import Plan, default_plan, load_plan  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.validation.validate import validate  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def planned(gpus: int, folder: str) -> Plan:
    """What `paracube plan --gpus N` writes (tiny model, local-cpu, every other option at its default)."""
    path = os.path.join(folder, f"plan{gpus}.json")
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli(["plan", "--gpus", str(gpus), "-o", path])
    if code != 0:
        raise SystemExit(f"paracube plan --gpus {gpus} exited {code}")
    return load_plan(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per run (step 1 is warm-up)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cal", help="a calibrated topology file to compare instead of the preset")
    ap.add_argument("--calibrate", action="store_true", help="write --cal first (paracube calibrate)")
    ap.add_argument("--quick", action="store_true", help="quick calibration")
    args = ap.parse_args()
    if args.calibrate:
        from paracube.calibration.calibrate import calibrate, write_topology

        print(f"calibrate (load {load()}) ...", flush=True)
        t0 = time.perf_counter()
        topo, _, _ = calibrate("local-cpu", 8, quick=args.quick)
        write_topology(topo, args.cal)
        print(f"wrote {args.cal} in {time.perf_counter() - t0:.0f} s", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        plans = {"default (run)": default_plan(), "plan --gpus 4": planned(4, folder),
                 "plan --gpus 8": planned(8, folder)}
    source = args.cal or "local-cpu (uncalibrated preset)"
    print(f"{source}; {os.cpu_count()} CPUs; {args.steps} steps per run, step 1 left out", flush=True)
    print(f"{'plan':<15}{'layout':<34}{'predicted':>11}{'measured':>11}{'error':>9}   load before", flush=True)
    pred: dict[str, float] = {}
    meas: dict[str, list[float]] = {k: [] for k in plans}
    for _ in range(args.repeats):
        for name, plan in plans.items():
            topo = load_topology(args.cal or "local-cpu", gpus=plan.layout.world_size)
            before = load()
            out = validate(plan, args.steps, topo, source)
            c = next(c for c in out["comparisons"] if c["name"] == "step_time_s")
            pred[name] = c["predicted"]
            meas[name].append(c["measured"])
            print(f"{name:<15}{out['layout']:<34}{c['predicted'] * 1e3:>9.1f}ms{c['measured'] * 1e3:>9.1f}ms"
                  f"{c['rel_err']:>+9.1%}   {before}", flush=True)
    mean = {k: sum(v) / len(v) for k, v in meas.items()}
    errs = [abs(pred[k] / mean[k] - 1) for k in plans]
    p_order, m_order = sorted(plans, key=pred.__getitem__), sorted(plans, key=mean.__getitem__)
    print(f"predicted order: {' < '.join(p_order)}")
    print(f"measured order:  {' < '.join(m_order)}  ({'same' if p_order == m_order else 'DIFFERENT'})")
    print(f"|error| of the mean over {args.repeats} repeat(s): max {max(errs):.0%}, mean {sum(errs) / len(errs):.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
