"""`paracube calibrate` then `paracube validate` of the default model's 1D, 2D and 3D plans on this machine.

Prints, per plan and repeat, predicted vs measured step time (error and the prediction's band), the
predicted and measured order of the three, and the load average before each run (timings on a shared
2-core machine are only meaningful when the load is low: check it); then, per plan, the mean measured
step over the repeats with its spread (min..max) and the error of the prediction against that mean.
Usage: python benchmarks/validate_local.py [--cal /tmp/cal.yaml] [--reuse] [--repeats 3] [--steps 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.calibration.calibrate import calibrate, write_topology  # noqa: E402
from paracube.plan import default_plan  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.validation.validate import validate  # noqa: E402

LAYOUTS = ("dp=2,tp=1d:4", "dp=2,tp=2d:2x2", "tp=3d:2x2x2")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cal", default="/tmp/cal.yaml", help="calibrated topology file to write / read")
    ap.add_argument("--reuse", action="store_true", help="use an existing --cal file instead of calibrating")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="steps per validate run (step 1 is warm-up)")
    ap.add_argument("--quick", action="store_true", help="quick calibration")
    args = ap.parse_args()
    if not args.reuse:
        print(f"calibrate (load {load()}) ...", flush=True)
        t0 = time.perf_counter()
        topo, _, _ = calibrate("local-cpu", 8, quick=args.quick)
        write_topology(topo, args.cal)
        print(f"wrote {args.cal} in {time.perf_counter() - t0:.0f} s", flush=True)
    topo = load_topology(args.cal)
    print(f"{'layout':<26}{'predicted':>11}{'measured':>11}{'error':>9}{'band':>7}   load", flush=True)
    orders_ok = 0
    runs: dict[str, list[float]] = {t: [] for t in LAYOUTS}
    pred: dict[str, float] = {}
    for rep in range(args.repeats):
        meas: dict[str, float] = {}
        for text in LAYOUTS:
            before = load()
            out = validate(default_plan(text), args.steps, topo, args.cal)
            c = next(c for c in out["comparisons"] if c["name"] == "step_time_s")
            pred[text], meas[text] = c["predicted"], c["measured"]
            runs[text].append(c["measured"])
            print(f"{out['layout']:<26}{c['predicted'] * 1e3:>9.1f}ms{c['measured'] * 1e3:>9.1f}ms"
                  f"{c['rel_err']:>+9.1%}{c['band']:>7.0%}   {before}", flush=True)
        p_order, m_order = sorted(LAYOUTS, key=pred.__getitem__), sorted(LAYOUTS, key=meas.__getitem__)
        orders_ok += p_order == m_order
        print(f"repeat {rep + 1}: predicted order {' < '.join(p_order)}; measured order "
              f"{'equal' if p_order == m_order else 'DIFFERENT: ' + ' < '.join(m_order)}", flush=True)
    print(f"order equal in {orders_ok}/{args.repeats} repeats")
    print(f"{'layout':<26}{'predicted':>11}{'mean meas.':>11}{'error':>9}   measured min..max")
    for text in LAYOUTS:
        mean = sum(runs[text]) / len(runs[text])
        print(f"{text:<26}{pred[text] * 1e3:>9.1f}ms{mean * 1e3:>9.1f}ms{(pred[text] - mean) / mean:>+9.1%}   "
              f"{min(runs[text]) * 1e3:.1f}..{max(runs[text]) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
