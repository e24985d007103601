"""One training step timed on every rank of a benchmark's launch (benchmarks/executor_step.py, torch_peers.py).

`time_step(step, steps, warmup, traffic)`: `warmup` untimed steps, one step traced inside `traffic()` (a context
manager whose `events` are the step's CommEvents: tracing slows it, so it is not timed), then `steps` timed steps,
each started together (barrier). Returns (the mean over timed steps of the slowest rank's time, in s; bytes sent per
rank in the traced step; its collectives).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def time_step(step, steps: int, warmup: int, traffic) -> tuple:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        step()
    with traffic() as t:
        step()  # one traced step for the bytes (tracing slows it: not timed)
    sent = sum(e.sent_bytes() for e in t.events)
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.mean()), sent, len(t.events)
