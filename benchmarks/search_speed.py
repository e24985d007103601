"""`paracube plan` GPT-3 175B on 1,024 A100s exactly as the command runs it (its parser, defaults and search
configuration: planner/config.py), in process and end to end (process start to exit), cold and warm, beside the
code before (`--compare-rev REV`, default 6e31b23: the tree before the search-speed work, unpacked with
`git archive` into a temporary directory) in the same run.

In process (per tree, in a subprocess with PYTHONPATH=tree): the imports of the plan path, the topology built,
the search of a fresh topology (cold: every group query routed) and again on the same topology (warm: its caches
filled); layouts enumerated / scored / pruned, enumerated layouts per second (the issue's goal: >= 1M/s).
End to end: `python -m paracube plan ...` as a subprocess, timed from start to exit. Cold: a fresh
PYTHONPYCACHEPREFIX (every module compiled from source; the OS page cache is not dropped: that needs root);
warm: the same command again (bytecode cached), the min of `--repeat` runs (other processes load the machine:
the load average is printed beside every figure). `--trees A B ...` adds other checkouts.
`--exhaustive` also runs this tree's search without pruning and checks the ranking is identical.
Usage: python benchmarks/search_speed.py [plan flags, default: --model gpt3-175b --cluster dgx-a100 --gpus 1024]
                                         [--compare-rev REV | --compare-rev ''] [--trees DIR ...] [--exhaustive]
                                         [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

T_START = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("PARACUBE_TREE", str(REPO)))  # the tree measured (default: this checkout)

from paracube.cli.main import build_parser  # noqa: E402
from paracube.cli.options import workload_from_args  # noqa: E402
from paracube.cli.planning_cmd import EXPLAIN_POOL, search_config  # noqa: E402
from paracube.planner import search  # noqa: E402

T_IMPORTS = time.perf_counter() - T_START
JOB = ["--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024"]
BEFORE = "6e31b23"  # main before the search-speed work (issue 26, item 2)


def end_to_end(tree: Path, job: list[str], repeat: int) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """(cold, [warm ...]) (wall, CPU) seconds of `python -m paracube plan JOB` with PYTHONPATH=tree."""
    with tempfile.TemporaryDirectory() as tmp:
        # bytecode written (a PYTHONDONTWRITEBYTECODE in the caller's environment would make every run cold)
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "PYTHONPATH": str(tree),
               "PYTHONPYCACHEPREFIX": tmp}
        cmd = [sys.executable, "-m", "paracube", "plan", *job, "-o", f"{tmp}/plan.json", "--force"]
        times = []
        for _ in range(1 + repeat):
            t0, c0 = time.perf_counter(), _child_cpu()
            subprocess.run(cmd, env=env, cwd=tmp, check=True, capture_output=True)
            times.append((time.perf_counter() - t0, _child_cpu() - c0))
    return times[0], times[1:]


def _child_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: less sensitive to other load than wall."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def in_process(job: list[str], repeat: int) -> dict:
    """This process's tree: imports, topology, search cold and warm (min of `repeat`), the result's counts."""
    args = build_parser(["plan"]).parse_args(["plan", *job])
    w = workload_from_args(args, partial_layout=True)
    config = plan_config(w, args)
    t0 = time.perf_counter()
    topo = w.topology
    t_topo = time.perf_counter() - t0
    runs = []
    for _ in range(max(repeat, 2)):
        t0, c0 = time.perf_counter(), time.process_time()
        res = config.run(w.model, w.training, topo, w.gpus, fixed=w.layout)
        runs.append((time.perf_counter() - t0, time.process_time() - c0, res))
    (cold, cold_cpu, res), (warm, warm_cpu) = runs[0], min((t, c) for t, c, _ in runs[1:])
    return {"config": str(config), "imports": T_IMPORTS, "topology": t_topo, "cold": cold, "warm": warm,
            "cold_cpu": cold_cpu, "warm_cpu": warm_cpu,
            "enumerated": res.enumerated, "scored": res.scored, "pruned": res.pruned,
            "rejected": sum(res.rejected.values()), "queries": res.topology_queries,
            "ranked": [(str(lay), est.step_time_s) for lay, est in res.ranked],
            "best_per_mode": sorted((est.step_time_s, m, str(lay), est.mfu, est.memory.total)
                                    for m, (lay, est) in res.best_per_mode.items())}


def plan_config(w: object, args: argparse.Namespace) -> object:
    """The search configuration `paracube plan` runs (its pool; no exact best per mode where the tree has the
    option, planning_cmd.PLAN_MODE_BESTS: a tree without it keeps them)."""
    import paracube.cli.planning_cmd as pc

    pool = max(args.top, args.refine, EXPLAIN_POOL)
    if hasattr(pc, "PLAN_MODE_BESTS"):
        return search_config(w, args.memory_headroom, pool, pc.PLAN_MODE_BESTS)  # type: ignore[arg-type]
    return search_config(w, args.memory_headroom, pool)  # type: ignore[arg-type]


def measure(tree: Path, job: list[str], repeat: int) -> dict:
    env = {**os.environ, "PARACUBE_TREE": str(tree), "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--inner", "--repeat", str(repeat), *job], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare-rev", default=BEFORE, help=f"git revision to time beside this tree (default {BEFORE}; "
                    "'' for none)")
    ap.add_argument("--trees", nargs="*", default=[], help="other checkouts to time beside this one")
    ap.add_argument("--exhaustive", action="store_true", help="also search without pruning (slow)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # one tree's in-process figures
    ours, job = ap.parse_known_args()
    job = job or JOB
    if ours.inner:
        print(json.dumps(in_process(job, ours.repeat)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("this tree", REPO)]
        if ours.compare_rev:
            old = Path(tmp) / ours.compare_rev
            old.mkdir()
            subprocess.run(f"git -C {REPO} archive {ours.compare_rev} | tar -x -C {old}", shell=True, check=True)
            trees.append((ours.compare_rev, old))
        trees += [(t, Path(t)) for t in ours.trees]
        print(f"paracube plan {' '.join(job)}; {os.cpu_count()} CPUs, {load()} (1 min average)")
        results = {}
        for name, tree in trees:
            r = results[name] = measure(tree, job, ours.repeat)
            r["load_in"] = load()
            c, ws = end_to_end(tree, job, ours.repeat)
            r["e2e_cold"], r["e2e_warm"], r["load_e2e"] = c, min(ws), load()
        print("seconds: wall (CPU of the process); warm: min of --repeat")
        print(f"search configuration: {results['this tree']['config']}")
        print(f"{'':12} {'imports':>7} {'topology':>8} {'search cold':>14} {'search warm':>14} {'layouts/s warm':>15} "
              f"{'e2e cold':>14} {'e2e warm':>14}")
        for name, r in results.items():
            (cw, cc), (ww, wc) = r["e2e_cold"], r["e2e_warm"]
            print(f"{name[:12]:12} {r['imports']:6.2f}s {r['topology']:7.2f}s {r['cold']:6.2f}s ({r['cold_cpu']:5.2f}) "
                  f"{r['warm']:6.2f}s ({r['warm_cpu']:5.2f}) {r['enumerated'] / r['warm']:15,.0f} "
                  f"{cw:6.2f}s ({cc:5.2f}) {ww:6.2f}s ({wc:5.2f})  ({r['load_in']} in process, {r['load_e2e']} e2e)")
        for name, r in results.items():
            print(f"{name[:28]:28} enumerated {r['enumerated']:,}  scored {r['scored']:,}  pruned by bound "
                  f"{r['pruned']:,}  rejected {r['rejected']:,}  topology queries {r['queries']}")
        ref = results["this tree"]
        for name, r in list(results.items())[1:]:
            # best per mode where both trees keep them (plan's configuration does not: SearchConfig.mode_bests)
            modes = bool(r["best_per_mode"]) and bool(ref["best_per_mode"])
            same = r["ranked"] == ref["ranked"] and (not modes or r["best_per_mode"] == ref["best_per_mode"])
            print(f"ranking ({len(ref['ranked'])} layouts){' and best per mode' if modes else ''} vs {name}: "
                  f"{'identical' if same else 'DIFFERENT'}")
    shown = next((n for n, r in results.items() if r["best_per_mode"]), None)
    print(f"best per mode ({shown or 'none kept'}):")
    for t, mode, lay, mfu, mem in results[shown]["best_per_mode"] if shown else []:
        print(f"  {mode:5} {t:8.3f} s  MFU {mfu:5.1%}  mem {mem / 2**30:6.1f} GiB  {lay}")
    if not ours.exhaustive:
        return
    args = build_parser(["plan"]).parse_args(["plan", *job])
    w = workload_from_args(args, partial_layout=True)
    config = plan_config(w, args)
    topo = w.topology
    t0 = time.perf_counter()
    res = config.run(w.model, w.training, topo, w.gpus, fixed=w.layout)
    warm = time.perf_counter() - t0
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
        self._topo = topo
        # every field of the device (the cost model reads its generation, overheads...), memory unbounded (1e30 B:
        # DeviceSpec refuses inf)
        self.device = replace(topo.device, memory_bytes=1e30)  # type: ignore[attr-defined]
        self.calibration = getattr(topo, "calibration", None)

    def group_link(self, ranks: object, concurrent: object = ()) -> object:
        return self._topo.group_link(ranks, concurrent=concurrent)  # type: ignore[attr-defined]

    def partition_links(self, parts: object) -> object:  # the batched queries (LinkCache.prefetch), as the topology's
        return self._topo.partition_links(parts)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
