"""Which CPU cores a rank of a CPU (gloo) job runs on.

Left to the scheduler, ranks that outnumber the cores migrate between them. Measured on a 2-core VM, 8 ranks,
the default model: steps of dp=2,tp=1d:4 / dp=2,tp=2d:2x2 / tp=3d:2x2x2 took 110 / 267 / 605 ms unbound and
85 / 227 / 545 ms bound (rank r on core r mod 2); a 64 KiB all-reduce on groups of 4 took 6.2-9.6 ms per call
over four trials unbound and 4.2-5.1 ms bound. Binding is the usual practice of CPU training (torchrun
--numa-binding, MPI's --bind-to core); `paracube calibrate`, `validate` and `run` bind alike, so that a
calibration describes the runs.

Policy "spread" (default): with at least as many ranks as cores, local rank r gets core r mod C (ranks of
a tensor group, consecutive in the rank grid, land on different cores and compute in parallel); with fewer
ranks, each gets a disjoint block of C // P cores and as many intra-op threads. "none": no binding, one
thread per core share. Cores are those this process may use (`taskset`, cgroups), in ascending order.
Set PARACUBE_CPU_BIND=none to keep the scheduler's placement; OMP_NUM_THREADS, when set, wins for threads.
"""

from __future__ import annotations

import os

import torch

from paracube.errors import check

POLICIES = ("spread", "none")
ENV = "PARACUBE_CPU_BIND"


def available_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))  # macOS/Windows: no affinity API


def cores_for(local_rank: int, local_world: int, cores: list[int], policy: str = "spread") -> list[int]:
    """The cores local rank `local_rank` of `local_world` ranks gets out of `cores` (all of them for "none")."""
    check(policy in POLICIES, f"{ENV}={policy!r} is not a CPU binding policy; valid: {', '.join(POLICIES)}")
    check(0 <= local_rank < local_world, f"local rank {local_rank} is outside 0..{local_world - 1}")
    if policy == "none" or not cores:
        return list(cores)
    if local_world >= len(cores):
        return [cores[local_rank % len(cores)]]
    per = len(cores) // local_world
    return cores[local_rank * per:(local_rank + 1) * per]


def policy_from_env() -> str:
    """$PARACUBE_CPU_BIND (default "spread"), checked."""
    policy = os.environ.get(ENV, "spread")
    check(policy in POLICIES, f"{ENV}={policy!r} is not a CPU binding policy; valid: {', '.join(POLICIES)}")
    return policy


def bind_cpu_rank(local_rank: int, local_world: int, policy: str | None = None) -> list[int]:
    """Bind this process (a CPU rank) per `policy` (default: $PARACUBE_CPU_BIND or "spread") and set its
    intra-op threads to its share of cores; returns the cores it may run on."""
    policy = policy or policy_from_env()
    cores = available_cores()
    mine = cores_for(local_rank, local_world, cores, policy)
    if policy != "none" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, mine)
    if "OMP_NUM_THREADS" not in os.environ:
        share = len(mine) if policy != "none" else len(cores) // local_world
        torch.set_num_threads(max(1, share))
    return mine


__all__ = ["ENV", "POLICIES", "available_cores", "bind_cpu_rank", "cores_for", "policy_from_env"]
