"""The rank processes of one node: start them, watch them, stop them all.

`RankProcs.start(worker_command(args), ...)` starts `nproc` workers (`python -u -m paracube.executor.launch.worker
--worker ...`) with the environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_ERROR_FILE, OMP_NUM_THREADS=1 unless
set), so the worker runs alike under `paracube run` and under torchrun (the Slurm script).

Each worker leads its own process group (stopped by group, and a terminal's Ctrl-C reaches only the
launcher, which then stops every rank once) but stays in the launcher's session: with Linux's autogroup
scheduling (/proc/sys/kernel/sched_autogroup_enabled, on by default in many kernels) each session is its own
CPU scheduling group, and ranks sharing cores then wake each other's communication threads late: the default
plan (8 ranks, 2 cores) took 1,480-1,500 ms per step with a session per worker (torch's elastic agent starts
them so) and 910-950 ms with the workers in one session.

`wait()` returns when every rank has exited 0, or as soon as one fails: the others are then stopped (SIGTERM
to their groups, SIGKILL after `grace_s`), and the exits are returned for `describe_failure`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from paracube.launch_text import WORKER_MODULE  # one name for the worker entry (also in batch scripts)

POLL_S = 0.05


@dataclass(frozen=True)
class RankExit:
    """How a rank ended: exit code (negative: the signal), when it was seen, and its error (if it wrote one)."""

    exitcode: int
    timestamp: float
    message: str = ""


def _error_message(path: Path) -> str:
    """The exception a worker recorded (torch.distributed.elastic's @record writes this JSON), or ''."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    message = data.get("message", "")
    return str(message.get("message", "") if isinstance(message, dict) else message)


def worker_command(worker_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-u", "-m", WORKER_MODULE, "--worker", *worker_args]


class RankProcs:
    """This node's worker processes."""

    def __init__(self, procs: list[subprocess.Popen], error_files: list[Path], first_rank: int) -> None:
        self.procs = procs
        self.error_files = error_files
        self.first_rank = first_rank

    @classmethod
    def start(cls, command: Sequence[str], nproc: int, node_rank: int, nnodes: int, env: Mapping[str, str],
              workdir: Path) -> RankProcs:
        """Start `command` (worker_command()) once per local rank; `env` is added to ours (rendezvous,
        sockets). A failed start stops those begun."""
        base = {**os.environ, **env, "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nnodes * nproc),
                "GROUP_RANK": str(node_rank), "ROLE_NAME": "default"}
        if nproc > 1:
            base.setdefault("OMP_NUM_THREADS", "1")  # as torchrun; affinity.py binds CPU ranks to cores
        procs: list[subprocess.Popen] = []
        error_files = [workdir / f"error_{local}.json" for local in range(nproc)]
        self = cls(procs, error_files, node_rank * nproc)
        try:
            for local in range(nproc):
                rank_env = {**base, "RANK": str(self.first_rank + local), "LOCAL_RANK": str(local),
                            "TORCHELASTIC_ERROR_FILE": str(error_files[local])}
                procs.append(subprocess.Popen(list(command), env=rank_env, process_group=0))
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self, grace_s: float = 10.0) -> dict[int, RankExit]:
        """Block until all ranks exit 0 ({} returned) or one fails: then stop the rest; the failed exits."""
        exits: dict[int, RankExit] = {}
        while len(exits) < len(self.procs):
            for local, proc in enumerate(self.procs):
                code = proc.poll()
                if code is not None and self.first_rank + local not in exits:
                    exits[self.first_rank + local] = RankExit(code, time.monotonic())
            if any(e.exitcode != 0 for e in exits.values()):
                self.stop(grace_s)
                break
            time.sleep(POLL_S)
        for local, proc in enumerate(self.procs):
            rank = self.first_rank + local
            prev = exits.get(rank)
            exits[rank] = RankExit(proc.returncode, prev.timestamp if prev else time.monotonic(),
                                   _error_message(self.error_files[local]))
        return {rank: e for rank, e in exits.items() if e.exitcode != 0}

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every live worker's process group, SIGKILL what is left after grace_s; reap them all."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self._signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()

    def _signal(self, sig: signal.Signals) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)  # the worker and anything it started


def describe_failure(failures: Mapping[int, object]) -> str:
    """One line naming the rank that died first (a signal other than our SIGTERM, else earliest)."""
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


__all__ = ["WORKER_MODULE", "RankExit", "RankProcs", "describe_failure", "worker_command"]
