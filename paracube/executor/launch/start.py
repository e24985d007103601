"""Starting the ranks: checks before any rank starts, this node's rank processes, Slurm scripts.

Ranks are `python -m paracube.executor.launch.worker --worker ...` processes (rank_procs.py: torchrun's worker
environment, one process group each, in our session), env:// rendezvous at `master_addr:master_port`
on the store node 0's launcher hosts (rendezvous.py; local runs: 127.0.0.1 and the port the store itself bound
on port 0, so no port is chosen free and taken later), no restarts. When a rank dies the others are stopped and one
line names the rank that died; workers also carry a gloo/NCCL timeout. Ctrl-C (or SIGTERM) stops every rank
and prints one line: the step cut short and the last complete checkpoint (rank 0 reports its progress in a
status file). Local runs listen on loopback only: the rendezvous TCPStore is ours, on a socket bound to
127.0.0.1 (every rank is its client, TORCHELASTIC_USE_AGENT_STORE, on every node), and gloo (and NCCL's
bootstrap) are pinned to the loopback interface. On a cluster the Slurm script runs the same worker under torchrun.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paracube.errors import ParacubeError, check
from paracube.executor.checkpoint import store as ckpt
from paracube.executor.launch.rank_procs import RankProcs, describe_failure, worker_command
from paracube.executor.launch.rendezvous import agent_env, launcher_store
from paracube.executor.training.data import parse_source
from paracube.launch_text import slurm_script, torchrun_argv
from paracube.plan import Plan
from paracube.workload import with_seq_len


@dataclass(frozen=True)
class NodeSpec:
    """This node's share of the job."""

    nnodes: int = 1
    nproc_per_node: int | None = None  # None: the plan's
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: one the launcher's store binds (port 0; local runs only)


def is_loopback(addr: str) -> bool:
    """127.x.x.x, ::1 or localhost (what a single-node run uses; never enough for several nodes)."""
    if addr.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.strip()).is_loopback
    except ValueError:
        return False


def backend_for(plan: Plan) -> str:
    if plan.launch.backend != "auto":
        return plan.launch.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def preflight(plan: Plan, node: NodeSpec, data: str = "text", checkpoint_dir: str | None = None,
              resume: bool = False, check_devices: bool = True, seed: int = 0) -> int:
    """Everything that can be checked before a rank starts; returns processes per node.
    Raises ParacubeError (one line: the bad value and what is valid)."""
    from paracube.executor.sizes import check_dtype, check_offload, check_recompute_modules
    from paracube.executor.training.step import check_divisibility

    nproc = node.nproc_per_node or plan.launch.nproc_per_node
    world = plan.layout.world_size
    check(node.nnodes * nproc == world,
          f"--nnodes={node.nnodes} x nproc_per_node={nproc} = {node.nnodes * nproc} ranks, but layout "
          f"{plan.layout} needs {world}")
    check(0 <= node.node_rank < node.nnodes, f"--node-rank={node.node_rank} must be in 0..{node.nnodes - 1}")
    check(node.nnodes == 1 or (node.master_addr.strip() and not is_loopback(node.master_addr) and node.master_port),
          "a run over several nodes needs --master-addr (the address of node 0, reachable from every node) "
          "and --master-port")
    backend = backend_for(plan) if check_devices else plan.launch.backend
    if backend == "nccl" and check_devices:
        have = torch.cuda.device_count()
        check(have >= nproc, f"backend nccl needs {nproc} GPUs on this node; it has {have} (use backend gloo)")
    seq = plan.seq_len
    check_dtype(plan.training.dtype, plan.layout)
    check_offload(plan.model, plan.layout, plan.training.recompute)
    check_recompute_modules(plan.model, plan.layout, plan.training.recompute)
    check_divisibility(with_seq_len(plan.model, seq), plan.layout, plan.micro_batch, plan.training.global_batch, seq)
    parse_source(data, plan.model.vocab, seq)
    if checkpoint_dir is not None:
        if resume:
            found = ckpt.find_checkpoint(checkpoint_dir)
            meta = ckpt.read_meta(found)
            # Missing or truncated files are reported here, before any rank starts; the ranks hash them.
            ckpt.verify_checkpoint(found, meta, hashes=False)
            saved = meta.get("data", {})
            check(saved.get("source") == data and saved.get("seed") == seed,
                  f"the checkpoint in {checkpoint_dir!r} was trained on --data {saved.get('source')} --seed "
                  f"{saved.get('seed')}; resume with the same")
        elif ckpt.has_checkpoint(Path(checkpoint_dir)):
            raise ParacubeError(f"checkpoint directory {checkpoint_dir!r} already holds checkpoints; pass --resume "
                                "to continue them or choose another directory")
    elif resume:
        raise ParacubeError("--resume needs --checkpoint-dir")
    return nproc


def _loopback_interface() -> str | None:
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return next((n for n in ("lo", "lo0") if n in names), None)


def _worker_env(node: NodeSpec, port: int, local: bool) -> dict[str, str]:
    """Rendezvous and sockets for the workers: every rank is a client of the store node 0's launcher hosts
    (rendezvous.py, as under torchrun's agent); local runs also pin gloo/NCCL bootstrap to the loopback
    interface unless the user chose one."""
    root = str(Path(__file__).resolve().parents[3])  # workers import this paracube even when not installed
    old = os.environ.get("PYTHONPATH")
    env = {"PYTHONPATH": root + (os.pathsep + old if old else ""), **agent_env(node.master_addr, port)}
    if local:
        lo = _loopback_interface()
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if lo is not None and var not in os.environ:
                env[var] = lo
    return env


class _Terminated(Exception):
    """SIGTERM reached the launcher (e.g. a batch system's cancel): stop the ranks as for Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def _read_status(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def interrupted_line(status: dict[str, Any], checkpoint_dir: str | None) -> str:
    """One line after Ctrl-C: the step that was cut short and the last complete checkpoint."""
    done = status.get("step")
    where = f"during step {done + 1}" if isinstance(done, int) else "before the first step finished"
    if isinstance(done, int) and status.get("steps"):
        where += f" ({done} of {status['steps']} done)"
    last = "none (no --checkpoint-dir)"
    if checkpoint_dir is not None:
        try:
            last = str(ckpt.find_checkpoint(checkpoint_dir))
        except ParacubeError:
            last = "none saved yet"
    return f"paracube: interrupted {where}; last checkpoint: {last}"


def launch(plan: Plan, node: NodeSpec, nproc: int, worker_args: Sequence[str],
           checkpoint_dir: str | None = None) -> int:
    """Start this node's ranks (rank_procs.py) and wait. Returns 0 (done), 1 (a rank failed: one line names
    it), 130 (Ctrl-C) or 143 (SIGTERM): every rank stopped, one line with the step and last checkpoint."""
    local = node.nnodes == 1 and is_loopback(node.master_addr) and ":" not in node.master_addr  # IPv4 loopback
    in_main = threading.current_thread() is threading.main_thread()
    handlers = (signal.getsignal(signal.SIGINT), signal.signal(signal.SIGTERM, _on_sigterm)) if in_main else None
    procs: RankProcs | None = None
    try:
        with ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="paracube-run-")))
            # Node 0 hosts the store (loopback only for local runs; port 0 unless --master-port): it lives
            # until this node's ranks have ended; the other nodes' ranks connect to master_addr:master_port.
            port = node.master_port or 0
            if node.node_rank == 0:
                store = launcher_store("127.0.0.1" if local else node.master_addr, port)  # held until we return
                port = store.port
            command = worker_command([*worker_args, "--status-file", str(workdir / "status.json")])
            try:
                procs = RankProcs.start(command, nproc, node.node_rank, node.nnodes, _worker_env(node, port, local),
                                        workdir)
                failures = procs.wait()
            except (KeyboardInterrupt, _Terminated) as exc:
                if in_main:
                    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up
                if procs is not None:
                    procs.stop(grace_s=5.0)
                if sys.stdout.isatty():
                    sys.stdout.write("\x1b[?25h\n")  # rank 0's progress bar had hidden the cursor
                    sys.stdout.flush()
                print(interrupted_line(_read_status(workdir / "status.json"), checkpoint_dir), file=sys.stderr)
                return 143 if isinstance(exc, _Terminated) else 130
        if failures:
            print(f"paracube: run failed: {describe_failure(failures)}", file=sys.stderr)
            return 1
        return 0
    finally:
        if handlers is not None:
            signal.signal(signal.SIGINT, handlers[0])
            signal.signal(signal.SIGTERM, handlers[1])


__all__ = ["NodeSpec", "backend_for", "describe_failure", "interrupted_line", "is_loopback", "launch",
           "preflight", "slurm_script", "torchrun_argv"]
