"""Starting the ranks: checks before any rank starts, torchrun's agent for local/multi-node runs, Slurm.

Ranks are `python -m paracube.executor.run --worker ...` processes started by torch's elastic agent
(`torch.distributed.launcher.api.elastic_launch`, what `torchrun` runs), static rendezvous at
`master_addr:master_port` (127.0.0.1 and a free port for local runs), no restarts. When a rank dies the
agent stops the others and we report which rank died; workers also carry a gloo/NCCL timeout.
Local runs listen on loopback only: the agent's TCPStore (which torch binds to every interface) is started
by us on a socket bound to 127.0.0.1, and gloo (and NCCL's bootstrap) are pinned to the loopback interface.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from paracube.errors import ParacubeError, check
from paracube.executor import checkpoint as ckpt
from paracube.executor.data import parse_source
from paracube.launch_text import WORKER_MODULE, slurm_script, torchrun_argv
from paracube.plan import Plan
from paracube.workload import with_seq_len


@dataclass(frozen=True)
class NodeSpec:
    """This node's share of the job."""

    nnodes: int = 1
    nproc_per_node: int | None = None  # None: the plan's
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port (local runs only)


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
    from paracube.executor.step import check_divisibility
    from paracube.modes import runnable_modes

    nproc = node.nproc_per_node or plan.launch.nproc_per_node
    world = plan.layout.world_size
    check(node.nnodes * nproc == world,
          f"--nnodes={node.nnodes} x nproc_per_node={nproc} = {node.nnodes * nproc} ranks, but layout "
          f"{plan.layout} needs {world}")
    check(0 <= node.node_rank < node.nnodes, f"--node-rank={node.node_rank} must be in 0..{node.nnodes - 1}")
    check(node.nnodes == 1 or (node.master_addr.strip() and not is_loopback(node.master_addr) and node.master_port),
          "a run over several nodes needs --master-addr (the address of node 0, reachable from every node) "
          "and --master-port")
    support = plan.layout.tensor_mode.executor  # paracube/modes: what the executor runs
    check(plan.layout.pp == 1 or (support is not None and support.pipeline),
          f"the executor runs pp=1 only; layout {plan.layout} has pp={plan.layout.pp}")
    check(support is not None, f"the executor runs tensor modes {', '.join(runnable_modes())}, not {plan.layout.mode}")
    backend = backend_for(plan) if check_devices else plan.launch.backend
    if backend == "nccl" and check_devices:
        have = torch.cuda.device_count()
        check(have >= nproc, f"backend nccl needs {nproc} GPUs on this node; it has {have} (use backend gloo)")
    seq = plan.seq_len
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


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _importable() -> Iterator[None]:
    """Workers are fresh interpreters: make sure they import this paracube even when it is not installed."""
    root = str(Path(__file__).resolve().parents[2])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root + (os.pathsep + old if old else "")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@contextmanager
def _workers_in_our_session() -> Iterator[None]:
    """torch's agent starts every worker in a new session, to be able to kill the worker's process group.
    With Linux's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled, on by default in many
    kernels) each session is its own CPU scheduling group, and ranks sharing cores then wake each other's
    communication threads late: the default plan (8 ranks, 2 cores) took 1,480-1,500 ms per step that way
    and 910-950 ms with the same workers in one session. Start each worker in a new process group of this
    session instead (Python >= 3.11): the agent still kills each worker's group."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler as handler

    cls = handler.SubprocessHandler
    if os.name != "posix" or sys.version_info < (3, 11) or not hasattr(cls, "_popen"):
        yield
        return
    original = cls._popen

    def popen(self: Any, args: tuple, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(args=args, env=env, stdout=self._stdout, stderr=self._stderr, process_group=0)

    cls._popen = popen  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls._popen = original  # type: ignore[method-assign]


@contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """Set an environment variable for the workers (they inherit ours), unless the user set it."""
    if value is None or name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def _loopback_interface() -> str | None:
    names = {name for _, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return next((n for n in ("lo", "lo0") if n in names), None)


@contextmanager
def _loopback_store(port: int) -> Iterator[None]:
    """A TCPStore server listening on 127.0.0.1:port only. torch's static rendezvous then creates its
    store with multi_tenant=True, which reuses this server instead of binding one to every interface."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ParacubeError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}); choose another --master-port") \
            from None
    store = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=600), wait_for_workers=False,
                          multi_tenant=True, master_listen_fd=sock.detach())  # the store owns the socket now
    try:
        yield
    finally:
        del store


def describe_failure(failures: dict[int, object]) -> str:
    """One line naming the rank that died first (a signal other than the agent's SIGTERM, else earliest)."""
    items = sorted(failures.items(), key=lambda kv: getattr(kv[1], "timestamp", 0))

    def killed(f: object) -> bool:
        code = getattr(f, "exitcode", 0)
        return code < 0 and -code != signal.SIGTERM

    rank, first = next(((r, f) for r, f in items if killed(f)), items[0])
    code = getattr(first, "exitcode", "?")
    how = f"signal {signal.Signals(-code).name}" if isinstance(code, int) and code < 0 else f"exit code {code}"
    msg = str(getattr(first, "message", "") or "").strip().splitlines()
    detail = f": {msg[-1][:200]}" if msg and "Signal" not in msg[-1] and "exitcode" not in msg[-1] else ""
    others = sorted(r for r in failures if r != rank)
    tail = f"; ranks {others} stopped after it" if others else "; the other ranks were stopped"
    return f"rank {rank} died ({how}){detail}{tail}"


def launch(plan: Plan, node: NodeSpec, nproc: int, worker_args: Sequence[str], run_id: str = "paracube") -> int:
    """Start this node's ranks with torch's elastic agent and wait; returns the exit status (0 ok, 1 failed)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    port = node.master_port or free_port()
    local = node.nnodes == 1 and is_loopback(node.master_addr) and ":" not in node.master_addr  # IPv4 loopback
    config = LaunchConfig(
        min_nodes=node.nnodes, max_nodes=node.nnodes, nproc_per_node=nproc, run_id=run_id,
        rdzv_backend="static", rdzv_endpoint=f"{node.master_addr}:{port}",
        rdzv_configs={"rank": node.node_rank, "timeout": 600}, max_restarts=0, monitor_interval=0.1,
        local_addr=node.master_addr if node.nnodes == 1 else None,
    )
    try:
        with ExitStack() as stack:
            stack.enter_context(_importable())
            stack.enter_context(_workers_in_our_session())
            if local:
                stack.enter_context(_loopback_store(port))
                for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # pairs / NCCL bootstrap on loopback
                    stack.enter_context(_env(var, _loopback_interface()))
            elastic_launch(config, sys.executable)("-u", "-m", WORKER_MODULE, "--worker", *worker_args)
    except ChildFailedError as exc:
        print(f"paracube: run failed: {describe_failure(exc.failures)}", file=sys.stderr)
        return 1
    return 0


__all__ = ["NodeSpec", "backend_for", "describe_failure", "free_port", "is_loopback", "launch", "preflight",
           "slurm_script", "torchrun_argv"]
