"""Multi-process test harness: run `fn(rank, world_size, *args)` on `world_size` gloo ranks.

forkserver start method, 127.0.0.1 and a free port, workers bound to cores as the executor binds them,
a timeout that fails the test (never hangs). `fn` must be importable (module level) and return something picklable.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paracube.executor.affinity import bind_cpu_rank


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, results: Any, fn: Callable[..., Any], args: tuple) -> None:
    bind_cpu_rank(rank, world_size)  # as the executor's CPU workers run (paracube/executor/affinity.py)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        out = fn(rank, world_size, *args)
        results.put((rank, True, out))
    except BaseException:  # report any failure to the parent instead of hanging it
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 240.0) -> list[Any]:
    """Results of fn on every rank, in rank order. Raises AssertionError on any worker failure or timeout."""
    ctx = mp.get_context("forkserver")
    # Workers fork from a server that has already imported torch: start-up drops from seconds to ms.
    # (Takes effect when this process's forkserver first starts; later calls reuse it.)
    ctx.set_forkserver_preload(["torch", "torch.distributed", "paracube.executor"])
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, results, fn, args), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    outs: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(outs) < world_size and not errors:
            try:
                rank, ok, out = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in outs]
                if dead:  # a worker died before reporting (e.g. failed to start): fail now, not at the timeout
                    errors.append(f"ranks {dead} exited with codes {[procs[r].exitcode for r in dead]}")
                elif time.monotonic() > deadline:
                    raise AssertionError(f"distributed run timed out after {timeout}s; "
                                         f"finished ranks: {sorted(outs)}") from None
                continue
            if ok:
                outs[rank] = out
            else:
                errors.append(f"rank {rank}:\n{out}")  # the others may wait forever: stop them below
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("worker failed: " + errors[0])
    return [outs[r] for r in range(world_size)]


# --- comparison helpers shared by the equivalence tests --------------------------------------------------
def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Norm-wise relative error ||a - e|| / ||e|| (absolute when e is all zeros)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff / denom if denom > 0 else diff


def layout_from(text: str) -> Any:
    from paracube.layout import parse_layout

    return parse_layout(text)
