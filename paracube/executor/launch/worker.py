"""The worker entry: one rank of `paracube run` (or of torchrun, from the Slurm script).

  python -m paracube.executor.launch.worker --worker [PLAN] [the options of run_args.add_train_args]
                                  [--status-file F]   (the launcher's: rank 0 writes its progress there)
Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and the rendezvous (MASTER_ADDR/PORT) from the
environment, binds CPU ranks to cores (affinity.py), trains (train.py) and prints one summary line on
rank 0. The command line (`paracube run`, `paracube launch`) is paracube/cli/run_cmd.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from paracube.executor.launch.run_args import add_train_args
from paracube.plan import default_plan, load_plan


def status_writer(path: str, steps: int) -> Callable[[dict[str, Any], str | None], None]:
    """After each step: {"step", "steps", "checkpoint"} to `path`, replaced atomically (the launcher reads it
    after Ctrl-C to say where the run stopped)."""
    target = Path(path)

    def write(row: dict[str, Any], last_checkpoint: str | None) -> None:
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": row["step"], "steps": steps, "checkpoint": last_checkpoint}))
        os.replace(tmp, target)

    return write


def summary_line(metrics: list[dict]) -> str:
    """One line a user reads after a run: loss from first to last step, speed and traffic per rank."""
    first, last = metrics[0], metrics[-1]
    timed = metrics[1:] or metrics  # step 1 includes warm-up
    step_s = sum(m["step_time_s"] for m in timed) / len(timed)
    tokens_s = sum(m["tokens_per_s"] for m in timed) / len(timed)
    return (f"steps {first['step']}-{last['step']}: loss {first['loss']:.3f} -> {last['loss']:.3f}; "
            f"{step_s * 1e3:.0f} ms/step, {tokens_s:,.0f} tokens/s, "
            f"{last['bytes_sent_per_rank'] / 2**20:.2f} MiB sent per rank per step")


def worker_main(argv: Sequence[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    from paracube.executor.launch.affinity import bind_cpu_rank
    from paracube.executor.training.hooks import TrainHooks
    from paracube.executor.training.loop import TrainConfig, backend_of, train

    p = argparse.ArgumentParser(prog="paracube-worker")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--status-file", default=None)
    add_train_args(p)
    args = p.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    plan = load_plan(args.plan) if args.plan else default_plan()
    if backend_of(plan) == "gloo":  # CPU ranks share the node's cores: bind them (affinity.py)
        bind_cpu_rank(local_rank, local_world)
    config = TrainConfig(lr=args.lr, warmup_steps=args.warmup, seed=args.seed, data=args.data,
                         on_nonfinite=args.on_nonfinite, comm_timeout_s=args.comm_timeout,
                         overlap=not args.no_overlap)
    report = status_writer(args.status_file, args.steps) if args.status_file and rank == 0 else None

    @record  # an exception is written to TORCHELASTIC_ERROR_FILE: the launcher names it in its one line
    def _go() -> None:
        result = train(plan, rank, world, args.steps, metrics_path=args.metrics,
                       checkpoint_dir=args.checkpoint_dir, save_every=args.save_every, resume=args.resume,
                       config=config, progress=not args.no_progress and rank == 0, local_rank=local_rank,
                       hooks=TrainHooks(after_step=report))
        if rank == 0 and result.metrics:
            print(summary_line(result.metrics), flush=True)

    _go()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
