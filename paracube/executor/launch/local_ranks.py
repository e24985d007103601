"""One local multi-rank harness: `run_on_ranks(fn, nproc, args)` runs fn(rank, nproc, device, *args) on nproc
processes of this machine and returns the results in rank order.

Used by calibration (microbenchmarks, step probes), validation and the multi-process tests. Ranks fork from a
forkserver that has imported torch once (a launch takes ~0.3 s instead of seconds; `fresh`: new interpreters,
as `paracube run` starts them, for timings that must describe its runs), join the rendezvous store
that this process hosts on 127.0.0.1 (rendezvous.py: bound on port 0 by the store itself, so no other job can
take the port between choosing and binding it; the ranks are its clients, as under torchrun's agent), use
gloo on CPU (bound to cores as `paracube run` binds them, affinity.py) or NCCL on CUDA, and report back
through a queue (results pickled by value). A rank that fails, dies or outlives `timeout_s` raises RanksFailed
(a ParacubeError naming the rank; `details` holds its whole traceback); the others are then stopped.
"""

from __future__ import annotations

import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paracube.errors import ParacubeError
from paracube.executor.launch.affinity import bind_cpu_rank
from paracube.executor.launch.rendezvous import agent_env, launcher_store

# What the forkserver imports once; callers add the modules their `fn` lives in. torch._dynamo: torch imports it
# lazily on the first call of a function wrapped by torch._disable_dynamo, and Optimizer.add_param_group is one,
# so every rank that builds an optimizer paid it on its own (0.9-2.5 CPU-s per rank measured on a loaded 2-core VM,
# 8 ranks of a test launch: most of a tiny model's case).
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "paracube.executor.training.loop")


class RanksFailed(ParacubeError):
    """A local multi-rank run failed; `details` holds the failing rank's whole traceback (tests print it)."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def resolve_backend(backend: str) -> str:
    return backend if backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")


def _worker(rank: int, nproc: int, port: int, backend: str, fn: Callable[..., Any], args: tuple,
            results: Any) -> None:
    if backend == "gloo":
        bind_cpu_rank(rank, nproc)  # as the executor's CPU workers do
    else:
        torch.set_num_threads(1)
    os.environ.update(agent_env("127.0.0.1", port))  # env:// joins the launcher's store as a client
    try:
        device = torch.device("cpu")
        if backend == "nccl":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=rank, world_size=nproc)
        # Pickled by value here: torch's queue pickler would send tensors as file descriptors that the parent
        # fetches from this process later, which fails (EOFError) once the rank has exited, as under load.
        results.put((rank, True, pickle.dumps(fn(rank, nproc, device, *args))))
    except BaseException:  # report to the parent instead of hanging it
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _collect(procs: list[Any], results: Any, nproc: int, timeout_s: float) -> tuple[dict[int, Any], str, str]:
    """(results by rank, error, the failing rank's traceback): stops at the first failure."""
    outs: dict[int, Any] = {}
    error, details = "", ""
    deadline = time.monotonic() + timeout_s
    while len(outs) < nproc and not error:
        try:
            rank, ok, out = results.get(timeout=1.0)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in outs]
            if dead:  # a rank died without reporting (e.g. could not start): do not wait for the rest
                error = f"rank {dead[0]} exited with code {procs[dead[0]].exitcode}"
            elif time.monotonic() > deadline:
                error = f"timed out after {timeout_s:.0f} s"
            continue
        if ok:
            outs[rank] = pickle.loads(out)
        else:
            error, details = f"rank {rank} failed: {out.strip().splitlines()[-1]}", out
    return outs, error, details


def run_on_ranks(fn: Callable[..., Any], nproc: int, args: tuple = (), backend: str = "auto",
                 timeout_s: float = 300.0, what: str = "run", preload: Sequence[str] = (),
                 fresh: bool = False) -> list[Any]:
    """fn(rank, nproc, device, *args) on nproc local ranks (fn importable at module level); results in rank
    order. RanksFailed naming the rank if one fails, dies or the run times out. `preload`: modules the
    forkserver imports once (honoured by the first call of this process, which starts the server). `fresh`:
    each rank a new interpreter (spawn: seconds to import torch) instead of a forkserver child, as `paracube
    run`'s workers are. Why it matters for timing: forkserver children share the server's interpreter heap
    copy-on-write, which ranks sharing a core keep warm in its caches; measured on a 2-core VM, 8 ranks, the
    tiny GPT's dp=2,tp=2d:2x2 step (train(), alternating runs) took 165 / 167 ms forked and 203 / 197 ms
    fresh, as `paracube run` (200 ms)."""
    backend = resolve_backend(backend)
    if fresh:
        ctx = mp.get_context("spawn")
    else:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(dict.fromkeys([*PRELOAD, *preload])))
    results = ctx.Queue()
    store = launcher_store()  # lives until every rank has ended (the finally below)
    procs = [ctx.Process(target=_worker, args=(r, nproc, store.port, backend, fn, args, results), daemon=True)
             for r in range(nproc)]
    error = "not finished"
    try:
        for p in procs:
            p.start()
        outs, error, details = _collect(procs, results, nproc, timeout_s)
    finally:
        for p in procs:
            if p.pid is None:
                continue  # never started
            p.join(timeout=5 if not error else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
        del store
    if error:
        raise RanksFailed(f"{what}: {error}", details)
    return [outs[r] for r in range(nproc)]


__all__ = ["RanksFailed", "resolve_backend", "run_on_ranks"]
