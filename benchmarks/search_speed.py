"""`paracube plan` GPT-3 175B on 1,024 A100s exactly as the command runs it (its parser, defaults and search
configuration: planner/config.py), in process and end to end (process start to exit), cold and warm.

In process: the search of a fresh topology (cold: every group query routed) and again on the same topology
(warm: its caches filled), layouts enumerated / scored / pruned, layouts per second, the best per mode.
End to end: `python -m paracube plan ...` as a subprocess, timed from start to exit. Cold: a fresh
PYTHONPYCACHEPREFIX (every module compiled from source; the OS page cache is not dropped: that needs root);
warm: the same command again (bytecode cached). `--trees A B ...` times the same command on other checkouts
(PYTHONPATH=tree) in the same run, side by side (e.g. the code before a change, unpacked with `git archive`).
`--exhaustive` also runs the search without pruning and checks the ranking is identical.
Usage: python benchmarks/search_speed.py [plan flags, default: --model gpt3-175b --cluster dgx-a100 --gpus 1024]
                                         [--trees DIR ...] [--exhaustive] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from paracube.cli.main import build_parser  # noqa: E402
from paracube.cli.options import workload_from_args  # noqa: E402
from paracube.cli.planning_cmd import EXPLAIN_POOL, search_config  # noqa: E402
from paracube.planner import search  # noqa: E402

JOB = ["--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024"]


def end_to_end(tree: Path, job: list[str], repeat: int) -> tuple[float, list[float]]:
    """(cold, [warm ...]) seconds of `python -m paracube plan JOB` with PYTHONPATH=tree."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": tmp}
        cmd = [sys.executable, "-m", "paracube", "plan", *job, "-o", f"{tmp}/plan.json", "--force"]
        times = []
        for _ in range(1 + repeat):
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, cwd=tmp, check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
    return times[0], times[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="*", default=[], help="other checkouts to time end to end beside this one")
    ap.add_argument("--exhaustive", action="store_true", help="also search without pruning (slow)")
    ap.add_argument("--repeat", type=int, default=2)
    ours, job = ap.parse_known_args()
    job = job or JOB
    args = build_parser(["plan"]).parse_args(["plan", *job])
    w = workload_from_args(args, partial_layout=True)
    config = search_config(w, args.memory_headroom, max(args.top, args.refine, EXPLAIN_POOL))
    print(f"paracube plan {' '.join(job)}: {config}; load: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    topo = w.topology
    t_topo = time.perf_counter() - t0
    runs = []
    for _ in range(ours.repeat):
        t0 = time.perf_counter()
        res = config.run(w.model, w.training, topo, w.gpus, fixed=w.layout)
        runs.append((time.perf_counter() - t0, res))
    (cold, res), (warm, _) = runs[0], min(runs[1:] or runs, key=lambda r: r[0])
    enumerated = res.enumerated
    print(f"topology built in {t_topo:.3f} s; search cold {cold:.3f} s (group queries routed), warm {warm:.3f} s")
    print(f"layouts enumerated {enumerated:,}  scored {res.scored:,}  pruned by bound {res.pruned:,}  "
          f"rejected {sum(res.rejected.values()):,}  topology queries {res.topology_queries}")
    print(f"layouts/s: cold {enumerated / cold:,.0f}, warm {enumerated / warm:,.0f} "
          f"(scored/s warm {res.scored / warm:,.0f})")
    print("best per mode:")
    for mode, (lay, est) in sorted(res.best_per_mode.items(), key=lambda kv: kv[1][1].step_time_s):
        print(f"  {mode:5} {est.step_time_s:8.3f} s  MFU {est.mfu:5.1%}  "
              f"mem {est.memory.total / 2**30:6.1f} GiB  {lay}")
    print("end to end (process start to exit; cold: no bytecode cache, warm: cached):")
    for tree in [REPO, *map(Path, ours.trees)]:
        c, ws = end_to_end(tree, job, ours.repeat)
        print(f"  {str(tree):40} cold {c:6.2f} s   warm {min(ws):6.2f} s   (load {os.getloadavg()[0]:.1f})")
    if not ours.exhaustive:
        return
    model, training = w.model, w.training
    args = SimpleNamespace(repeat=1)
    wall = warm
    full_runs = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        full = search(model, training, topo, w.gpus, top_k=config.top_k, recomputes=config.recomputes(),
                      runtime=config.runtime, memory_headroom=config.memory_headroom, prune=False)
        full_runs.append(time.perf_counter() - t0)
    same = [(str(lay), est.step_time_s) for lay, est in full.ranked] == \
        [(str(lay), est.step_time_s) for lay, est in res.ranked]
    print(f"without pruning: scored {full.scored:,}, best of {args.repeat}: {min(full_runs):.3f} s "
          f"({min(full_runs) / wall:.2f}x the pruned search; ranking {'identical' if same else 'DIFFERENT'})")
    # Scoring throughput alone: lift the memory limit so every layout that passes the size rules is scored.
    # The first call pays the topology's group queries for structures not seen above; report the warm one.
    unlimited = _Unlimited(topo)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        big = search(model, training, unlimited, w.gpus, recomputes=config.recomputes(), prune=False)
        times.append(time.perf_counter() - t0)
    print(f"memory limit lifted: scored {big.scored:,} layouts; cold {times[0]:.3f} s, warm {times[1]:.3f} s "
          f"= {big.scored / times[1]:,.0f} scored/s")


class _Unlimited:
    """The same topology with unbounded device memory (for the throughput figure only)."""

    def __init__(self, topo: object) -> None:
        dev = topo.device  # type: ignore[attr-defined]
        self._topo = topo
        self.device = SimpleNamespace(name=dev.name, peak_flops=dev.peak_flops, memory_bytes=float("inf"),
                                      memory_bandwidth=dev.memory_bandwidth)
        self.calibration = getattr(topo, "calibration", None)

    def group_link(self, ranks: object, concurrent: object = ()) -> object:
        return self._topo.group_link(ranks, concurrent=concurrent)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
