"""Checkpoint save and load time of the default tiny GPT on 8 gloo CPU ranks (3D 2x2x2 unless given).

Every rank builds the model, takes one AdamW step (so the moments exist), then saves and loads a checkpoint
`--repeats` times into a fresh temporary directory. Prints per round the wall time of save_checkpoint and of
load_checkpoint, the slowest rank's (both are collective), and the checkpoint's size on disk.
Usage: python benchmarks/checkpoint_io.py [--layout dp=1,tp=3d:2x2x2,mb=4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402


def _rank(rank: int, world: int, device: torch.device, layout: str, repeats: int, root: str) -> list[tuple]:
    import torch.distributed as dist

    from paracube.executor.checkpoint import store as ckpt
    from paracube.executor.mesh import Mesh
    from paracube.executor.model.gpt import build_model
    from paracube.executor.training.data import parse_source, replica_micro_batches
    from paracube.executor.training.step import train_step
    from paracube.plan import default_plan
    from paracube.workload import with_seq_len

    plan = default_plan(layout)
    spec = with_seq_len(plan.model, plan.seq_len)
    mesh = Mesh(plan.layout, rank)
    model = build_model(spec, mesh, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    source = parse_source("synthetic", spec.vocab, plan.seq_len, 0)
    dp_index = mesh.coord("dp") if plan.layout.dp > 1 else 0
    micro = list(replica_micro_batches(source, 1, plan.training.global_batch, plan.layout.dp, dp_index,
                                       plan.micro_batch))
    train_step(model, opt, mesh, micro, plan.training.global_batch * plan.seq_len)
    meta = {"schedule": {}, "data": {}, "layout": layout}
    out = []
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        path = ckpt.save_checkpoint(Path(root) / f"r{i}", 1, model, opt, meta)
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        ckpt.load_checkpoint(path, model, opt, mesh)
        t3 = time.perf_counter()
        size = sum(p.stat().st_size for p in path.iterdir())
        out.append((t1 - t0, t3 - t2, size))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", default="dp=1,tp=3d:2x2x2,mb=4")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    from paracube.calibration.microbench import run_on_ranks
    from paracube.layout_parse import parse_layout

    world = parse_layout(args.layout).world_size
    with tempfile.TemporaryDirectory() as root:
        per_rank = run_on_ranks(_rank, world, (args.layout, args.repeats, root), "gloo", 600.0, "checkpoint io")
    print(f"layout {args.layout}, {world} gloo ranks, default tiny GPT with AdamW moments")
    for i in range(args.repeats):
        save = max(r[i][0] for r in per_rank)
        load = max(r[i][1] for r in per_rank)
        print(f"round {i + 1}: save {save:.3f} s  load {load:.3f} s  ({per_rank[0][i][2] / 1e6:.2f} MB on disk)")


if __name__ == "__main__":
    main()
