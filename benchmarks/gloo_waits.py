"""What one gloo collective costs a rank when ranks share cores: one group called back to back vs calls cycling
through the groups of every axis (what 2D, 2.5D and 3D do), measured beside the local-cpu preset's price.

8 ranks (`--ranks`) as `paracube run` starts them (run_on_ranks with fresh interpreters, bound to cores as the
executor binds them), on the rank grid arange(8).view(2, 2, 2): groups of 2 along each axis, groups of 4 over the
first two axes and over the last two. Per (kind, group size): `--iters` calls of a 4 KB payload after 5 untimed
ones, each loop started together (barrier); ms per call = the loop's wall time / iters, the mean over ranks, the
median over `--repeats` loops. "same": every call on the rank's group along one axis; "alternating": call i on
the group along axis i mod (number of axes). Priced: the preset's call wait for that call (GemmModel.call_wait:
(r - 1) x CPU_STEP_WAIT_S per message, collective.wait_steps, one more message when alternating;
topologies/local_cpu.py) plus its alpha-beta time at the preset's link (microseconds here). The payload is small
because a training step's calls on this machine are latency-bound (collective.py's table); every rank calls
(no compute between calls), so the waits are the scheduling of ranks blocked in the same call.
Usage: python benchmarks/gloo_waits.py [--ranks 8] [--iters 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

CASES = (("all_gather", 2), ("reduce_scatter", 2), ("all_reduce", 2), ("all_gather", 4), ("reduce_scatter", 4),
         ("all_reduce", 8))
PAYLOAD = 1024  # fp32 elements: 4 KB


def _rank(rank: int, world: int, device: object, iters: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist

    del device
    grid = torch.arange(world).view(2, 2, world // 4)

    def mine(rows: torch.Tensor) -> dist.ProcessGroup:
        """This rank's group among `rows` (every rank creates every group, in the same order)."""
        out = None
        for row in rows.tolist():
            group = dist.new_group(row)
            if rank in row:
                out = group
        assert out is not None
        return out

    by_size = {2: [mine(grid.movedim(d, -1).reshape(-1, 2)) for d in range(3)],
               4: [mine(grid.reshape(-1, 4)), mine(grid.movedim(0, -1).reshape(-1, 4))],
               world: [dist.group.WORLD]}
    x = torch.randn(PAYLOAD)

    def call(kind: str, group: dist.ProcessGroup, n: int) -> None:
        if kind == "all_gather":
            dist.all_gather([torch.empty(PAYLOAD) for _ in range(n)], x, group=group)
        elif kind == "reduce_scatter":
            dist.reduce_scatter(torch.empty(PAYLOAD // n), list(x.chunk(n)), group=group)
        else:
            dist.all_reduce(x, group=group)

    out = {}
    for kind, n in CASES:
        n = min(n, world)
        for cycle in ("same", "alternating"):
            groups = by_size[n] if cycle == "alternating" else by_size[n][:1]
            if cycle == "alternating" and len(groups) == 1:
                continue
            times = []
            for _ in range(repeats):
                for i in range(5):
                    call(kind, groups[i % len(groups)], n)
                dist.barrier()
                t0 = time.perf_counter()
                for i in range(iters):
                    call(kind, groups[i % len(groups)], n)
                times.append((time.perf_counter() - t0) / iters)
            out[kind, n, cycle] = times
    return out


def priced(kind: str, n: int, world: int, alternating: bool) -> float:
    """The uncalibrated local-cpu preset's seconds for one such call (module docstring)."""
    from paracube.cost_models.collective import fastest_time
    from paracube.cost_models.device_model import gemm_model
    from paracube.topologies import load_topology

    topo = load_topology("local-cpu", gpus=world)
    g = gemm_model(topo, "fp32")
    link = topo.group_link(list(range(n)))
    wait = float(g.call_wait(kind, n, PAYLOAD * 4, "float32", alternating))
    return wait + float(fastest_time(kind, n, 1, PAYLOAD * 4, link.bandwidth, link.latency))


def main() -> None:
    from paracube.executor.launch.local_ranks import run_on_ranks
    from paracube.topologies.local_cpu import CPU_STEP_WAIT_S, host_cores, ranks_per_core

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8, choices=(4, 8))
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    per_rank = run_on_ranks(_rank, args.ranks, (args.iters, args.repeats), "gloo", 900.0, "gloo waits", fresh=True)
    r = ranks_per_core(args.ranks, host_cores())
    print(f"{args.ranks} ranks on {host_cores()} cores (r = {r:g} a core); 4 KB payloads; ms per call, median of "
          f"{args.repeats} loops of {args.iters} (mean over ranks); priced: (r - 1) x {CPU_STEP_WAIT_S * 1e3:.2f} "
          "ms per message (collective.wait_steps) + alpha-beta")
    print(f"{'kind':15} {'n':>2} {'same':>8} {'priced':>8} {'alternating':>12} {'priced':>8} {'extra':>8} "
          f"{'priced':>8}")
    for kind, n in CASES:
        n = min(n, args.ranks)
        same = statistics.median(statistics.mean(r[kind, n, "same"][k] for r in per_rank)
                                 for k in range(args.repeats))
        p_same = priced(kind, n, args.ranks, False)
        line = f"{kind:15} {n:2d} {same * 1e3:8.2f} {p_same * 1e3:8.2f}"
        if (kind, n, "alternating") in per_rank[0]:
            alt = statistics.median(statistics.mean(r[kind, n, "alternating"][k] for r in per_rank)
                                    for k in range(args.repeats))
            p_alt = priced(kind, n, args.ranks, True)
            line += f" {alt * 1e3:12.2f} {p_alt * 1e3:8.2f} {(alt - same) * 1e3:+8.2f} {(p_alt - p_same) * 1e3:+8.2f}"
        print(line)
    print(f"(wall {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
