"""Event-engine scale: one training step of GPT-3 175B on 1,024 DGX A100 GPUs and of Llama 3 405B on 16,384
DGX H100 GPUs (issue 26: each under 3 s on this machine).

Prints, per layout: wall time of `simulate` (programs, templates and the simulation; the analytic estimate it
reuses for memory and FLOPs included), simpy events, ring steps (steps that the network's fast path and
event_fuse.py's fused runs jump over included), collectives, fused runs, and the simulated step time next to the
analytic one (their ratio). `--unfused` also runs every op one by one (event_fuse.py off: the engine before
fusion) and prints both side by side with the relative difference of the step times.
`--trace DIR` also simulates each layout with its timeline and writes its Chrome trace there (event_trace.py:
past TRACE_SPANS spans merged by event_reduce.py's rule), printing the file's size and the rule it states.
Usage: python benchmarks/event_scale.py [--unfused] [--trace DIR] [--case 175b|405b ...] [--layout TEXT ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.cost_models.analytic import estimate  # noqa: E402
from paracube.cost_models.event import simulate  # noqa: E402
from paracube.cost_models.event_trace import write_chrome_trace  # noqa: E402
from paracube.layout_parse import parse_layout  # noqa: E402
from paracube.model_presets import PRESETS  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.workload import ModelSpec, TrainingSpec

# Llama 3 405B on 16,384 H100s as Dubey et al. 2024 (Table 4) ran it: 16M tokens per step (2,048 sequences of
# 8,192), TP 8, PP 16, DP 128.
CASES = {
    "175b": ("dgx-a100", 1024, PRESETS["gpt3-175b"], TrainingSpec(global_batch=1536, dtype="bf16", recompute="full"),
             ("dp=8,pp=16,tp=1d:8,mb=1", "dp=2,tp=3d:8x8x8,mb=64", "dp=8,pp=16,tp=1d:8,mb=1,v=2")),
    "405b": ("dgx-h100", 16384, PRESETS["llama3-405b"], TrainingSpec(global_batch=2048, dtype="bf16", recompute="full"),
             ("dp=128,pp=16,tp=1d:8,mb=1",)),
}


def _run(model: ModelSpec, training: TrainingSpec, layout: object, topo: object, fuse: bool) -> tuple[float, object]:
    t = time.perf_counter()
    res = simulate(model, training, layout, topo, timeline=False, with_events=False, fuse=fuse)
    return time.perf_counter() - t, res


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--layout", nargs="*", default=[], help="layouts to run (default: each case's own)")
    ap.add_argument("--unfused", action="store_true", help="also run with event_fuse.py off, side by side")
    ap.add_argument("--trace", default="", help="directory to write each layout's Chrome trace into")
    args = ap.parse_args(argv)
    print(f"{'case':5s} {'layout':28s} {'engine':7s} {'wall s':>7s} {'events':>8s} {'ring steps':>11s} "
          f"{'collectives':>11s} {'fused':>6s} {'event step s':>12s} {'analytic s':>10s} {'ratio':>6s}")
    for name in args.case:
        preset, gpus, model, training, layouts = CASES[name]
        t0 = time.perf_counter()
        topo = load_topology(preset, gpus=gpus)
        print(f"# {name}: {model.name} on {preset} x {gpus} (built in {time.perf_counter() - t0:.2f} s), global batch "
              f"{training.global_batch}, {training.dtype}, {training.recompute} recompute", flush=True)
        for text in args.layout or layouts:
            layout = parse_layout(text)
            an = estimate(model, training, layout, topo, with_events=False).step_time_s
            steps = {}
            for fuse in ([True, False] if args.unfused else [True]):
                wall, res = _run(model, training, layout, topo, fuse)
                st, ev = res.stats, res.estimate.step_time_s
                steps[fuse] = ev
                print(f"{name:5s} {text:28s} {'fused' if fuse else 'unfused':7s} {wall:7.2f} {st['simpy_events']:8.0f} "
                      f"{st['ring_steps']:11.0f} {st['jobs']:11.0f} {st.get('fused_runs', 0):6.0f} {ev:12.4f} "
                      f"{an:10.4f} {ev / an:6.3f}", flush=True)
            if len(steps) == 2:
                print(f"      fused / unfused step time - 1: {steps[True] / steps[False] - 1:+.2e}")
            if args.trace:
                Path(args.trace).mkdir(parents=True, exist_ok=True)
                res = simulate(model, training, layout, topo, timeline=True, with_events=False)
                path = write_chrome_trace(res, Path(args.trace) / f"{name}_{text.replace(',', '_')}.json")
                meta = json.loads(path.read_text())["otherData"]["paracube_spans"]
                print(f"      trace {path}: {path.stat().st_size / 1e6:.1f} MB; {meta['rule']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
