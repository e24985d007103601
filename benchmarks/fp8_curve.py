"""FP8 vs bf16 training curves of `small` on CPU ranks (issue #24's must-show for `--dtype fp8`).

The same plan twice, `--dtype bf16` and `--dtype fp8` (executor/layers/fp8.py: TE hybrid delayed scaling, the
FP8 GEMMs emulated on CPU), planned and run through the CLI as a user does (`paracube plan --layout ...`,
`paracube run --steps N --metrics ...`) on local-cpu gloo ranks, same seed and data (Python's pydoc text).
Prints the losses every 20 steps side by side, both final losses (the mean of the last 10 steps, which smooths
the batch-to-batch noise the two runs share) and their relative difference; the claim is |diff| < 2% at 200.
Slow on a shared CPU: run it once, not in CI. `--parallel` runs the two at once (on a machine shared with
others the pair finishes sooner); `--out DIR` keeps the plans and metrics; `--report DIR` prints from them.
Pin zero=1 (or 2/3) in --layout: a layout's zero=0 reads as unpinned and the planner may pick zero=3 for one
dtype and not the other (same math, different comm).
Measured 2026-12-01 on 2 shared cores (`--model tiny --steps 200`, dp=2): final loss bf16 2.5510, fp8 2.5515,
+0.02% (100 steps: +0.33%).
`small` (4 x 256, vocab 256) at 200 steps, --seq 32 --global-batch 4 --layout dp=2,mb=2,zero=1 (128 tokens a
step: bf16 GEMMs run ~60x slower than fp32 on this CPU, which has no bf16 instructions, and the load average
was ~40-50 on 2 cores: median 8.0 s a bf16 step, 4.0 s fp8, whose GEMMs are emulated in fp32), measured
2026-12-01 (`--parallel`-style: the two runs at once): final loss (mean of the last 10 steps) bf16 2.9233, fp8
2.9085, -0.51% (last step 2.4403 / 2.4334; step 1 5.6521 / 5.6523; step 101 2.7792 / 2.7827).
Usage: python benchmarks/fp8_curve.py [--steps 200] [--layout dp=2,mb=2,zero=1] [--global-batch 4] [--seq 32]
       [--model small] [--parallel] [--out DIR | --report DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("bf16", "fp8")


def start(dtype: str, args: argparse.Namespace, out: Path) -> subprocess.Popen:
    """Plan `dtype` (the same layout and batch) and start its run; the run writes out/metrics_<dtype>.jsonl."""
    plan, metrics = out / f"plan_{dtype}.json", out / f"metrics_{dtype}.jsonl"
    gpus = str(eval_world(args.layout))
    cli = [sys.executable, "-m", "paracube"]
    subprocess.run([*cli, "plan", "--model", args.model, "--cluster", "local-cpu", "--gpus", gpus, "--layout",
                    args.layout, "--dtype", dtype, "--global-batch", str(args.global_batch), "-o", str(plan),
                    "--force", *(["--seq", str(args.seq)] if args.seq else [])], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    return subprocess.Popen([*cli, "run", str(plan), "--steps", str(args.steps), "--metrics", str(metrics),
                             "--seed", "0"], cwd=ROOT, stdout=subprocess.DEVNULL)


def finish(dtype: str, proc: subprocess.Popen, t0: float) -> None:
    if proc.wait() != 0:
        raise SystemExit(f"the {dtype} run failed (exit {proc.returncode})")
    print(f"{dtype}: done in {time.perf_counter() - t0:.0f} s", flush=True)


def losses(out: Path, dtype: str) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / f"metrics_{dtype}.jsonl").read_text().splitlines()]


def eval_world(layout: str) -> int:
    sys.path.insert(0, str(ROOT))
    from paracube.layout_parse import parse_layout

    return parse_layout(layout).world_size


def report(out: Path) -> None:
    curves = {dtype: losses(out, dtype) for dtype in DTYPES}
    steps = min(len(c) for c in curves.values())
    print(f"{'step':>5} {'bf16':>8} {'fp8':>8}")
    for k in [*range(0, steps, 20), steps - 1]:
        print(f"{k + 1:5d} {curves['bf16'][k]:8.4f} {curves['fp8'][k]:8.4f}")
    tail = min(10, steps)
    end = {d: sum(c[steps - tail:steps]) / tail for d, c in curves.items()}
    rel = (end["fp8"] - end["bf16"]) / end["bf16"]
    print(f"final loss (mean of the last {tail} of {steps} steps): bf16 {end['bf16']:.4f}  fp8 {end['fp8']:.4f}  "
          f"relative difference {100 * rel:+.2f}%  (last step: bf16 {curves['bf16'][steps - 1]:.4f}, "
          f"fp8 {curves['fp8'][steps - 1]:.4f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layout", default="dp=2,mb=2,zero=1")
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq", type=int, default=32, help="sequence length (0: the model's)")
    ap.add_argument("--parallel", action="store_true", help="run the two dtypes at once")
    ap.add_argument("--out", type=Path, default=None, help="keep plans and metrics here (default: a temp dir)")
    ap.add_argument("--report", type=Path, default=None, help="print the curves of an earlier --out DIR")
    args = ap.parse_args()
    if args.report is not None:
        report(args.report)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if args.parallel:
            procs = {dtype: start(dtype, args, out) for dtype in DTYPES}
            for dtype, proc in procs.items():
                finish(dtype, proc, t0)
        else:
            for dtype in DTYPES:
                finish(dtype, start(dtype, args, out), time.perf_counter())
        report(out)


if __name__ == "__main__":
    main()
