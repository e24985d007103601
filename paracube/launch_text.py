"""The text of a torchrun command line and of an sbatch script for a plan (no torch import).

Shared by `paracube launch` (paracube/executor/launch/start.py) and `paracube export --to torchrun|slurm`:
both start `python -m paracube.executor.launch.worker --worker PLAN ...` on every node with torchrun
(`python -m torch.distributed.run`), c10d rendezvous at node 0, no restarts.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from paracube.plan import Plan

WORKER_MODULE = "paracube.executor.launch.worker"


def torchrun_argv(node_args: Sequence[str], worker_args: Sequence[str]) -> list[str]:
    return ["python", "-m", "torch.distributed.run", *node_args, "--max-restarts=0", "-m", WORKER_MODULE,
            "--worker", *worker_args]


def uses_gpus(plan: Plan) -> bool:
    """The script runs on the cluster, not here: GPUs unless the plan says gloo or targets local CPUs."""
    return plan.launch.backend == "nccl" or (plan.launch.backend == "auto" and plan.cluster != "local-cpu")


def slurm_script(plan: Plan, worker_args: Sequence[str], job_name: str = "paracube", time_limit: str = "01:00:00",
                 partition: str | None = None, master_port: int = 29500, header: Sequence[str] = ()) -> str:
    """A ready sbatch script: one torchrun agent per node (srun), c10d rendezvous at node 0, explicit.
    `header`: comment lines placed after the #SBATCH lines."""
    nnodes, nproc = plan.launch.nnodes, plan.launch.nproc_per_node
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={nnodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --time={time_limit}"]
    if uses_gpus(plan):
        lines.append(f"#SBATCH --gpus-per-node={nproc}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [f"# {line}" for line in header]
    node_args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                 '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', '--rdzv-id="$SLURM_JOB_ID"']
    cmd = " ".join(torchrun_argv(node_args, [shlex.quote(a) for a in worker_args]))
    lines += [
        "set -euo pipefail",
        f"# layout {plan.layout}: {plan.layout.world_size} ranks = {nnodes} nodes x {nproc} per node",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={master_port}",
        "export MASTER_ADDR MASTER_PORT",
        f"srun --kill-on-bad-exit=1 {cmd}",
    ]
    return "\n".join(lines) + "\n"


def torchrun_script(plan: Plan, worker_args: Sequence[str], master_port: int = 29500,
                    header: Sequence[str] = ()) -> str:
    """A shell script to run on every node: one node runs standalone; several set NODE_RANK and MASTER_ADDR."""
    nnodes, nproc = plan.launch.nnodes, plan.launch.nproc_per_node
    lines = ["#!/bin/bash", *(f"# {line}" for line in header), "set -euo pipefail",
             f"# layout {plan.layout}: {plan.layout.world_size} ranks = {nnodes} node(s) x {nproc} per node"]
    if nnodes == 1:
        node_args = ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc}"]
    else:
        lines += ["# run on every node: NODE_RANK=0..N-1, MASTER_ADDR = the address of node 0",
                  ': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"',
                  ': "${NODE_RANK:?set NODE_RANK to the rank of this node, 0 on the master}"',
                  f'MASTER_PORT="${{MASTER_PORT:-{master_port}}}"']
        node_args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", '--node-rank="$NODE_RANK"',
                     "--rdzv-backend=c10d", '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"']
    lines.append(" ".join(torchrun_argv(node_args, [shlex.quote(a) for a in worker_args])))
    return "\n".join(lines) + "\n"


__all__ = ["WORKER_MODULE", "slurm_script", "torchrun_argv", "torchrun_script", "uses_gpus"]
