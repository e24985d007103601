"""Full planner search for gpt3-175b on 1024 GPUs of dgx-a100 (all modes, all placements).

Prints layouts enumerated / scored / pruned by the lower bound, seconds, layouts per second, the best layout per
mode, the same search without pruning (time, and whether its ranking is identical), and the scoring throughput
with the memory limit lifted.
Usage: python benchmarks/search_speed.py [--model gpt3-175b] [--gpus 1024] [--batch 1536]
                                         [--recompute selective]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.planner import search  # noqa: E402
from paracube.workload import TrainingSpec, resolve_model  # noqa: E402


def _topology(name: str, gpus: int) -> tuple[object, str]:
    try:
        from paracube.topologies import load_topology  # type: ignore[attr-defined]

        return load_topology(name, gpus=gpus), name
    except (ImportError, AttributeError):
        from paracube.cost_models.uniform_topology import dgx_a100_like

        return dgx_a100_like(gpus), "dgx-a100-like (paracube.topologies not available: two-level stand-in)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--cluster", default="dgx-a100")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1536)  # GPT-3: 3.2M tokens = 1536 x 2048
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--recompute", default="selective")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = resolve_model(args.model)
    training = TrainingSpec(global_batch=args.batch, dtype=args.dtype, recompute=args.recompute)
    topo, label = _topology(args.cluster, args.gpus)
    print(
        f"{model.name} on {args.gpus} GPUs of {label}; global batch {args.batch}, {args.dtype}, "
        f"recompute={args.recompute}"
    )
    runs = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        res = search(model, training, topo, args.gpus)
        runs.append((time.perf_counter() - t0, res))
    wall, res = min(runs, key=lambda r: r[0])
    print("runs (s): " + ", ".join(f"{w:.3f}" for w, _ in runs) + "  (the first pays the topology's group queries)")
    enumerated = res.enumerated
    print(
        f"layouts enumerated {enumerated:,}  scored {res.scored:,}  pruned by bound {res.pruned:,}  "
        f"rejected {sum(res.rejected.values()):,}  "
        f"topology queries {res.topology_queries}"
    )
    print(
        f"best of {args.repeat}: {wall:.3f} s   enumerated/s {enumerated / wall:,.0f}   "
        f"scored/s {res.scored / wall:,.0f}"
    )
    for reason, n in res.rejected.most_common():
        print(f"  rejected {n:>9,}  {reason}")
    print("best per mode:")
    for mode, (lay, est) in sorted(res.best_per_mode.items(), key=lambda kv: kv[1][1].step_time_s):
        print(
            f"  {mode:5} {est.step_time_s:8.3f} s  MFU {est.mfu:5.1%}  "
            f"mem {est.memory.total / 2**30:6.1f} GiB  {lay}"
        )
    for mode, why in res.explanations.items():
        print(f"  {mode:5} none: {why}")
    # The same search scoring every placement of every configuration (no lower-bound pruning): same result.
    full_runs = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        full = search(model, training, topo, args.gpus, prune=False)
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
        big = search(model, training, unlimited, args.gpus, prune=False)
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
