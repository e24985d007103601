"""This machine as a preset (`local-cpu`): one CPU process per rank, gloo through shared memory.

The figures a local-cpu process gets before `paracube calibrate` measures them, per rank with a core of its
own, and the share of a core each rank gets when ranks outnumber the cores this process may use
(r = ranks_per_core = max(1, ranks / cores)): peaks, memory bandwidth and hub links run at 1/r (the ranks
take turns on a core), each dispatched op costs r x CPU_OP_S of wall time, and each collective call waits
(r - 1) x CPU_CALL_WAIT_S for the group's ranks to be scheduled (a time slice of every other rank on the
core). The cost model reads the two overheads from the device (DeviceSpec.op_overhead_s, call_overhead_s;
compute.gemm_model) only when the topology has no calibration.

Figures (2-core x86 VM, torch eager, gloo, the tiny GPT; benchmarks/validate_local.py checks them against
`paracube run`): 10 us of host time per executor op (a single-thread probe of small autograd ops measured
10.6 us of CPU per op), 1.5 ms per waiting rank and call (steps of the default 3D plan: 214 calls, ~1.0 s of
its ~1.2 s step with 4 ranks per core; a 64 KiB all-reduce on groups of 4 took 4.2-5.1 ms with 8 ranks on 2
cores, executor/affinity.py), 100 GFLOP/s fp32 per core (torch's single-thread 256^3 GEMM: 95-135 GFLOP/s).
"""

from __future__ import annotations

import os

from paracube.topologies.device import DeviceSpec

GiB = 2**30
SHM_BANDWIDTH, SHM_LATENCY = 2e9, 25e-6  # each process's link to the shared-memory hub
CPU_OP_S, CPU_CALL_WAIT_S = 10e-6, 1.5e-3  # per op; per collective call and other rank sharing the core


def _host_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a 16 GiB laptop
        return float(16 * GiB)


def host_cores() -> int:
    """Cores this process may use (taskset, cgroups): what the local ranks share."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def ranks_per_core(processes: int, cores: int | None = None) -> float:
    """Oversubscription of `processes` CPU ranks on the host's cores (1 when each has a core)."""
    return max(1.0, processes / (cores or host_cores()))


def local_cpu_device(processes: int, cores: int | None = None) -> DeviceSpec:
    """One local-cpu process: modest peaks until calibrated, an equal share of host memory. Ranks that
    outnumber the cores (r = ranks_per_core > 1) each get 1/r of a core: peaks and memory bandwidth / r,
    r x CPU_OP_S per dispatched op, and (r - 1) x CPU_CALL_WAIT_S per collective call."""
    r = ranks_per_core(processes, cores)
    return DeviceSpec("cpu-process", {k: v / r for k, v in {"fp32": 100e9, "fp16": 25e9, "bf16": 25e9}.items()},
                      _host_memory_bytes() / processes, 10e9 / r, op_overhead_s=CPU_OP_S * r,
                      call_overhead_s=CPU_CALL_WAIT_S * (r - 1))


def local_cpu_link(processes: int, cores: int | None = None) -> tuple[float, float]:
    """(bandwidth, latency) of a process's link to the hub: copies run on a 1/r share of a core."""
    r = ranks_per_core(processes, cores)
    return SHM_BANDWIDTH / r, SHM_LATENCY * r


__all__ = ["CPU_CALL_WAIT_S", "CPU_OP_S", "SHM_BANDWIDTH", "SHM_LATENCY", "host_cores", "local_cpu_device",
           "local_cpu_link", "ranks_per_core"]
