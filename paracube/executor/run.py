"""`paracube run` and `paracube launch`: argparse, handlers, and the worker entry torchrun starts.

  paracube run [PLAN] [--steps N] [--metrics F.jsonl] [--checkpoint-dir D] [--save-every K] [--resume]
               [--nnodes N --node-rank R --master-addr A --master-port P]
  paracube launch [PLAN] --slurm        prints an sbatch script (srun + torchrun, rendezvous explicit)
Without PLAN: the default plan (tiny GPT, 3D 2x2x2, 8 local CPU ranks). Every check that can fail is made
before any rank starts (exit 2 with one line). Ranks run `python -m paracube.executor.run --worker ...`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from paracube.cli.options import int_at_least
from paracube.errors import ParacubeError
from paracube.plan import Plan, default_plan, load_plan

if TYPE_CHECKING:
    from paracube.executor.launch import NodeSpec

# torch is imported by the handlers only: registering these commands keeps `paracube --help` fast.
SOURCES_HELP = "synthetic, text (Python's pydoc topics) or text:PATH"  # = paracube.executor.data.SOURCES_HELP

RUN_HELP = """Train a plan: one process per rank, started by torchrun's agent (gloo on CPU, NCCL on CUDA).
Without PLAN: the embedded default (tiny GPT, 3D 2x2x2, 8 local CPU ranks). World size, divisibility,
data and checkpoint directory are checked before any rank starts (exit 2, one line). A rank that dies
stops the others (exit 1, naming it); the last complete checkpoint stays loadable.
Several nodes: run the same command on each with --nnodes, --node-rank, --master-addr, --master-port."""


_positive = int_at_least(0)


def _add_train_args(p: argparse.ArgumentParser) -> None:
    """What every rank needs; forwarded verbatim to the workers."""
    p.add_argument("plan", nargs="?", default=None, help="plan JSON (default: the embedded default plan)")
    p.add_argument("--steps", type=_positive, default=20, help="train up to this step (default 20)")
    p.add_argument("--metrics", default=None, help="write per-step metrics as JSON lines to this file")
    p.add_argument("--checkpoint-dir", default=None, help="directory of sharded checkpoints")
    p.add_argument("--save-every", type=_positive, default=0, help="save every K steps and at the end (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    p.add_argument("--data", default="text", help=f"training data: {SOURCES_HELP} (default text)")
    p.add_argument("--seed", type=_positive, default=0, help="initialization and data seed (default 0)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    p.add_argument("--warmup", type=_positive, default=None, help="warmup steps (default 10%% of --steps)")
    p.add_argument("--on-nonfinite", choices=["stop", "skip"], default="stop",
                   help="NaN/inf loss: stop (default; the last good checkpoint stays) or skip the step")
    p.add_argument("--comm-timeout", type=float, default=120.0, help="collective timeout in seconds (default 120)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _worker_args(args: argparse.Namespace) -> list[str]:
    out = [str(Path(args.plan).resolve())] if args.plan else []
    out += ["--steps", str(args.steps), "--save-every", str(args.save_every), "--data", args.data,
            "--seed", str(args.seed), "--lr", repr(args.lr), "--on-nonfinite", args.on_nonfinite,
            "--comm-timeout", repr(args.comm_timeout)]
    for flag, value in (("--metrics", args.metrics), ("--checkpoint-dir", args.checkpoint_dir)):
        if value:
            out += [flag, str(Path(value).resolve())]
    if args.warmup is not None:
        out += ["--warmup", str(args.warmup)]
    out += ["--resume"] if args.resume else []
    out += ["--no-progress"] if args.no_progress else []
    return out


def _plan(args: argparse.Namespace) -> Plan:
    return load_plan(args.plan) if args.plan else default_plan()


def add_run_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("run", help="train a plan on local (or several) nodes with torchrun's agent",
                              description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_train_args(p)
    g = p.add_argument_group("nodes (torchrun)")
    g.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    g.add_argument("--node-rank", type=int, default=0, help="this node's rank (default 0)")
    g.add_argument("--nproc-per-node", type=int, default=None, help="ranks on this node (default: the plan's)")
    g.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
    g.add_argument("--master-port", type=int, default=None, help="port on node 0 (default: a free port)")
    p.set_defaults(handler=run_command)
    return p


def add_launch_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("launch", help="print a batch script that runs a plan (--slurm)")
    _add_train_args(p)
    p.add_argument("--slurm", action="store_true", help="print an sbatch script (the only format so far)")
    p.add_argument("--job-name", default="paracube")
    p.add_argument("--time", default="01:00:00", help="Slurm time limit (default 01:00:00)")
    p.add_argument("--partition", default=None)
    p.add_argument("--master-port", type=int, default=29500)
    p.set_defaults(handler=launch_command)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """For paracube/cli/main.py."""
    add_run_parser(subparsers)
    add_launch_parser(subparsers)


def _node(args: argparse.Namespace) -> NodeSpec:
    from paracube.executor.launch import NodeSpec

    return NodeSpec(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, node_rank=args.node_rank,
                    master_addr=args.master_addr, master_port=args.master_port)


def run_command(args: argparse.Namespace) -> int:
    from paracube.executor.launch import launch, preflight

    plan = _plan(args)
    node = _node(args)
    nproc = preflight(plan, node, data=args.data, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                      seed=args.seed)
    print(f"paracube run: {plan.model.name}, layout {plan.layout}, {plan.layout.world_size} ranks "
          f"({node.nnodes} node(s) x {nproc}), steps up to {args.steps}", file=sys.stderr)
    return launch(plan, node, nproc, _worker_args(args))


def launch_command(args: argparse.Namespace) -> int:
    from paracube.executor.launch import NodeSpec, preflight, slurm_script

    if not args.slurm:
        raise ParacubeError("paracube launch needs a format; valid: --slurm")
    plan = _plan(args)
    # Same checks as `run`, for the plan's own node shape (the script runs elsewhere: no GPU count check).
    node = NodeSpec(nnodes=plan.launch.nnodes, master_addr="node0", master_port=args.master_port)
    preflight(plan, node, data=args.data, check_devices=False)
    sys.stdout.write(slurm_script(plan, _worker_args(args), job_name=args.job_name, time_limit=args.time,
                                  partition=args.partition, master_port=args.master_port))
    return 0


# --- the worker: one rank, started by torchrun's agent ---------------------------------------------------
def worker_main(argv: Sequence[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    from paracube.executor.affinity import bind_cpu_rank
    from paracube.executor.train import TrainConfig, backend_of, train

    p = argparse.ArgumentParser(prog="paracube-worker")
    p.add_argument("--worker", action="store_true")
    _add_train_args(p)
    args = p.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    plan = _plan(args)
    if backend_of(plan) == "gloo":  # CPU ranks share the node's cores: bind them (affinity.py)
        bind_cpu_rank(local_rank, local_world)
    config = TrainConfig(lr=args.lr, warmup_steps=args.warmup, seed=args.seed, data=args.data,
                         on_nonfinite=args.on_nonfinite, comm_timeout_s=args.comm_timeout)

    @record
    def _go() -> None:
        result = train(plan, rank, world, args.steps, metrics_path=args.metrics,
                       checkpoint_dir=args.checkpoint_dir, save_every=args.save_every, resume=args.resume,
                       config=config, progress=not args.no_progress and rank == 0, local_rank=local_rank)
        if rank == 0 and result.metrics:
            print(summary_line(result.metrics), flush=True)

    _go()
    return 0


def summary_line(metrics: list[dict]) -> str:
    """One line a user reads after a run: loss from first to last step, speed and traffic per rank."""
    first, last = metrics[0], metrics[-1]
    timed = metrics[1:] or metrics  # step 1 includes warm-up
    step_s = sum(m["step_time_s"] for m in timed) / len(timed)
    tokens_s = sum(m["tokens_per_s"] for m in timed) / len(timed)
    return (f"steps {first['step']}-{last['step']}: loss {first['loss']:.3f} -> {last['loss']:.3f}; "
            f"{step_s * 1e3:.0f} ms/step, {tokens_s:,.0f} tokens/s, "
            f"{last['bytes_sent_per_rank'] / 2**20:.2f} MiB sent per rank per step")


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
