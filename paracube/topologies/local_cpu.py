"""This machine as a preset (`local-cpu`): one CPU process per rank, gloo through shared memory.

The figures a local-cpu process gets before `paracube calibrate` measures them, per rank with a core of its
own, and the share of a core each rank gets when ranks outnumber the cores this process may use
(r = ranks_per_core = max(1, ranks / cores)): peaks, memory bandwidth and hub links run at 1/r (the ranks
take turns on a core), each dispatched op costs r x CPU_OP_S of wall time, and each collective call waits
(r - 1) x CPU_CALL_WAIT_S for the group's ranks to be scheduled (a time slice of every other rank on the
core). The cost model reads the two overheads from the device (DeviceSpec.op_overhead_s, call_overhead_s;
compute.gemm_model) only when the topology has no calibration.

Figures (2-core x86 VM, torch eager, gloo, the tiny GPT): a core runs torch's single-thread fp32 GEMMs at
120-150 GFLOP/s from [128, 64] x [64, 64] up to 512^3, so its efficiency curve saturates early (half-efficiency
dimension CPU_GEMM_HALF_DIM = 8, not the accelerators' 64; peak priced at 100 GFLOP/s). The two overheads, 4 us
per op and 1.1 ms per waiting rank and call, are least squares over the quiet-machine step times of
`benchmarks/validate_local.py`'s three plans (default 3D 2x2x2: 839 ms, 214 calls with 4 ranks per core;
dp=4: 14.0 ms; dp=8: 34.6 ms); earlier figures (10 us, 1.5 ms) came from a machine loaded by other jobs,
which is what they then measured. A loaded machine runs slower than this preset says: `paracube calibrate`.
"""

from __future__ import annotations

import os

from paracube.topologies.device import DeviceSpec

GiB = 2**30
SHM_BANDWIDTH, SHM_LATENCY = 2e9, 25e-6  # each process's link to the shared-memory hub
CPU_OP_S, CPU_CALL_WAIT_S = 4e-6, 1.1e-3  # per op; per collective call and other rank sharing the core
CPU_GEMM_HALF_DIM = 8.0  # a core runs a [128, 64] x [64, 64] GEMM at ~0.85 of its 512^3 rate (m0 = n0 = k0)


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
                      call_overhead_s=CPU_CALL_WAIT_S * (r - 1), gemm_half_dim=CPU_GEMM_HALF_DIM)


def local_cpu_link(processes: int, cores: int | None = None) -> tuple[float, float]:
    """(bandwidth, latency) of a process's link to the hub: copies run on a 1/r share of a core."""
    r = ranks_per_core(processes, cores)
    return SHM_BANDWIDTH / r, SHM_LATENCY * r


__all__ = ["CPU_CALL_WAIT_S", "CPU_GEMM_HALF_DIM", "CPU_OP_S", "SHM_BANDWIDTH", "SHM_LATENCY", "host_cores",
           "local_cpu_device", "local_cpu_link", "ranks_per_core"]
