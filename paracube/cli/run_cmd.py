"""`paracube run` and `paracube launch`: options, checks and handlers (the ranks: paracube/executor/launch/worker.py).

  paracube run [PLAN] [--model M --gpus G] [--steps N] [--metrics F.jsonl] [--checkpoint-dir D] [--resume]
               [--nnodes N --node-rank R --nproc-per-node P --master-addr A --master-port P]
  paracube launch [PLAN] --slurm        prints an sbatch script (srun + torchrun, rendezvous explicit)
Without PLAN: the default plan (tiny GPT, 3D 2x2x2, 8 local CPU ranks). `--model` / `--gpus` run the plan's
layout scaled down (cli/scale_down.py: same mode, schedule, zero, sp, recompute, overlap; dp, pp and the tensor
shape shrunk to G ranks). Every check that can fail is made before any rank starts (exit 2 with one line).
Registering these commands imports no torch: the handlers do.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from paracube.errors import ParacubeError
from paracube.executor.launch.run_args import add_train_args, int_at_least, worker_args

if TYPE_CHECKING:
    from paracube.plan import Plan

RUN_HELP = """Train a plan: one process per rank (gloo on CPU, NCCL on CUDA).
Without PLAN: the embedded default (tiny GPT, 3D 2x2x2, 8 local CPU ranks). World size, divisibility,
data and checkpoint directory are checked before any rank starts (exit 2, one line). A rank that dies
stops the others (exit 1, naming it); the last complete checkpoint stays loadable. Ctrl-C stops every rank
(exit 130, one line: the step and the last checkpoint).
Several nodes: run the same command on each with --nnodes, --node-rank, --master-addr, --master-port.
A plan for a cluster on local CPU ranks: `--model tiny --gpus 8` keeps the plan's tensor mode, pipeline
schedule, zero, sp, recompute and overlap, shrinks dp / pp / the tensor shape to 8 ranks and prints the layout.
Checkpoints are trusted input: torch.distributed.checkpoint reads a checkpoint's .metadata with pickle, which
can run code. --resume refuses a directory whose paracube.json manifest (sizes and sha256 of every file, itself
checksummed) is missing or does not match the files, before DCP reads anything; that catches corruption and
edits, not a malicious author: resume only from checkpoints you made or trust."""


def _port(text: str) -> int:
    value = int_at_least(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} must be <= 65535")
    return value


def add_run_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("run", help="train a plan on local (or several) nodes",
                              description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_args(p)
    s = p.add_argument_group("scale down (the plan's layout family on another model / fewer ranks)")
    s.add_argument("--model", default=None, help="run this model (preset or config.json) instead of the plan's")
    s.add_argument("--gpus", type=int_at_least(1), default=None, help="run on this many ranks (default: the plan's)")
    g = p.add_argument_group("nodes")
    g.add_argument("--nnodes", type=int_at_least(1), default=1, help="number of nodes (default 1)")
    g.add_argument("--node-rank", type=int_at_least(0), default=0, help="this node's rank (default 0)")
    g.add_argument("--nproc-per-node", type=int_at_least(1), default=None,
                   help="ranks on this node (default: the plan's)")
    g.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
    g.add_argument("--master-port", type=_port, default=None,
                   help="port of the rendezvous store node 0's launcher hosts (default: one it binds on port 0)")
    p.set_defaults(handler=run_command)
    return p


def add_launch_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("launch", help="print a batch script that runs a plan (--slurm)")
    add_train_args(p)
    p.add_argument("--slurm", action="store_true", help="print an sbatch script (the only format so far)")
    p.add_argument("--job-name", default="paracube")
    p.add_argument("--time", default="01:00:00", help="Slurm time limit (default 01:00:00)")
    p.add_argument("--partition", default=None)
    p.add_argument("--master-port", type=_port, default=29500)
    p.set_defaults(handler=launch_command)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """For paracube/cli/main.py."""
    add_run_parser(subparsers)
    add_launch_parser(subparsers)


def _plan(args: argparse.Namespace) -> Plan:
    from paracube.plan import default_plan, load_plan  # pydantic: only once a plan is needed

    return load_plan(args.plan) if args.plan else default_plan()


def runnable_plan(plan: Plan, source: str | None) -> Plan:
    """`paracube run` runs runtime paracube's plans; a plan made for another runtime runs as is where the paracube
    runtime runs its layout (the same layout, executed by paracube), else it is refused in one line."""
    from paracube.runtimes import DEFAULT_RUNTIME, get_runtime

    if plan.runtime == DEFAULT_RUNTIME:
        return plan
    made_for = get_runtime(plan.runtime)
    why = get_runtime(DEFAULT_RUNTIME).refusal(plan.layout, plan.model.family, plan.model.tied_embeddings,
                                               plan.training.dtype, moe=plan.model.moe is not None,
                                               windowed=plan.model.sliding_window is not None,
                                               sinks=plan.model.attention_sinks)
    if why:
        hint = f"; export it with `paracube export {source} --to {made_for.export_target}`" if made_for.export_target \
            else ""
        raise ParacubeError(f"{source}: made for runtime {plan.runtime}: {why}{hint}")
    print(f"paracube run: {source} was made for runtime {plan.runtime}; paracube runs its layout as is",
          file=sys.stderr)
    return plan


def oversubscription_line(nproc: int, cores: int) -> str | None:
    """Said once when local CPU ranks outnumber the cores they share: each step is then ~nproc/cores slower
    than with a core per rank (ranks take turns on the cores)."""
    if nproc <= cores:
        return None
    return (f"paracube run: {nproc} ranks share {cores} CPU core{'s' if cores > 1 else ''}: expect steps about "
            f"{nproc / cores:.1f}x slower than with a core per rank")


def _scaled(args: argparse.Namespace, plan: Plan) -> Plan:
    """--model / --gpus: the plan scaled down (cli/scale_down.py), written where the ranks read it."""
    if args.model is None and args.gpus is None:
        return plan
    import tempfile
    from pathlib import Path

    from paracube.cli.scale_down import scale_down
    from paracube.model_presets import resolve_model

    model = resolve_model(args.model) if args.model else plan.model
    scaled, notes = scale_down(plan, model, args.gpus or plan.gpus)
    for note in notes:
        print(f"paracube run: {note}", file=sys.stderr)
    args.plan = str(scaled.save(Path(tempfile.mkdtemp(prefix="paracube-scaled-")) / "plan.json"))
    print(f"paracube run: scaled plan written to {args.plan}", file=sys.stderr)
    return scaled


def run_command(args: argparse.Namespace) -> int:
    from paracube.executor.launch.affinity import available_cores
    from paracube.executor.launch.start import NodeSpec, backend_for, launch, preflight

    plan = _scaled(args, runnable_plan(_plan(args), args.plan))
    node = NodeSpec(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, node_rank=args.node_rank,
                    master_addr=args.master_addr, master_port=args.master_port)
    nproc = preflight(plan, node, data=args.data, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                      seed=args.seed)
    if args.resume:
        print(resumed_line(args.checkpoint_dir, args.steps), file=sys.stderr)
    print(f"paracube run: {plan.model.name}, layout {plan.layout}, {plan.layout.world_size} ranks "
          f"({node.nnodes} node(s) x {nproc}), steps up to {args.steps}", file=sys.stderr)
    crowded = oversubscription_line(nproc, len(available_cores())) if backend_for(plan) == "gloo" else None
    if crowded:
        print(crowded, file=sys.stderr)
    return launch(plan, node, nproc, worker_args(args), checkpoint_dir=args.checkpoint_dir)


def resumed_line(checkpoint_dir: str, steps: int) -> str:
    """`paracube run: resuming from ck/step_10 (step 10 done; steps 11-20 to run)`."""
    from paracube.executor.checkpoint.files import find_checkpoint, read_meta

    found = find_checkpoint(checkpoint_dir)
    done = int(read_meta(found)["step"])
    todo = f"steps {done + 1}-{steps} to run" if steps > done else f"--steps {steps}: nothing left to run"
    return f"paracube run: resuming from {found} (step {done} done; {todo})"


def launch_command(args: argparse.Namespace) -> int:
    from paracube.executor.launch.start import NodeSpec, preflight, slurm_script

    if not args.slurm:
        raise ParacubeError("paracube launch needs a format; valid: --slurm")
    plan = runnable_plan(_plan(args), args.plan)
    # Same checks as `run`, for the plan's own node shape (the script runs elsewhere: no GPU count check).
    node = NodeSpec(nnodes=plan.launch.nnodes, master_addr="node0", master_port=args.master_port)
    preflight(plan, node, data=args.data, check_devices=False)
    sys.stdout.write(slurm_script(plan, worker_args(args), job_name=args.job_name, time_limit=args.time,
                                  partition=args.partition, master_port=args.master_port))
    return 0


__all__ = ["add_launch_parser", "add_run_parser", "launch_command", "oversubscription_line", "register",
           "run_command", "runnable_plan"]
