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

import math
import os

from paracube.topologies.cpu_probe import CpuFigures, cpu_figures
from paracube.topologies.device import DeviceSpec

GiB = 2**30
SHM_BANDWIDTH, SHM_LATENCY = 2e9, 25e-6  # each process's link to the shared-memory hub
CPU_OP_S, CPU_CALL_WAIT_S = 4e-6, 1.1e-3  # per op; per collective call and other rank sharing the core
CPU_GEMM_HALF_DIM = 8.0  # a core runs a [128, 64] x [64, 64] GEMM at ~0.85 of its 512^3 rate (m0 = n0 = k0)
CPU_PEAK_FP32 = 100e9  # fixed figure: one core's fp32 peak priced by the cost model
CALL_WAIT_OPS = 275.0  # probed: a call's wait per other rank on the core, in probed op dispatches
MODEL_EFF_MAX = 0.85  # the cost model's GEMM efficiency ceiling without a calibration (compute.GemmModel)


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


def _gemm_eff(m: int, n: int, k: int) -> float:
    """The cost model's uncalibrated GEMM efficiency at half-efficiency dimension CPU_GEMM_HALF_DIM."""
    h = CPU_GEMM_HALF_DIM
    return MODEL_EFF_MAX * m / (m + h) * n / (n + h) * k / (k + h)


def core_figures(figs: CpuFigures | None) -> tuple[float, float, float]:
    """(fp32 peak FLOP/s, seconds per op, call wait per other rank) of one core: probed, else fixed.

    peak = geometric mean over the probed shapes of rate / eff(m, n, k) (the peak whose priced curve best fits
    the measured rates, in relative terms); op = the probed op_s; wait = CALL_WAIT_OPS x op_s."""
    if figs is None:
        return CPU_PEAK_FP32, CPU_OP_S, CPU_CALL_WAIT_S
    rates = figs.rates()
    log_peak = sum(math.log(rate / _gemm_eff(*shape)) for shape, rate in rates) / len(rates)
    return math.exp(log_peak), figs.op_s, CALL_WAIT_OPS * figs.op_s


def local_cpu_device(processes: int, cores: int | None = None, figures: CpuFigures | None = None,
                     probe: bool = True) -> DeviceSpec:
    """One local-cpu process: a core's figures (`figures`, else this machine's probed ones via the cache
    when `probe`, else the fixed ones), an equal share of host memory. Ranks that outnumber the cores
    (r = ranks_per_core > 1) each get 1/r of a core: peaks and memory bandwidth / r, r x op seconds per
    dispatched op, and (r - 1) x the call wait per collective call."""
    if figures is None and probe:
        figures = cpu_figures(host_cores())
    peak, op_s, wait_s = core_figures(figures)
    r = ranks_per_core(processes, cores)
    flops = {"fp32": peak, "fp16": peak / 4, "bf16": peak / 4}
    return DeviceSpec("cpu-process", {k: v / r for k, v in flops.items()}, _host_memory_bytes() / processes,
                      10e9 / r, op_overhead_s=op_s * r, call_overhead_s=wait_s * (r - 1),
                      gemm_half_dim=CPU_GEMM_HALF_DIM)


def local_cpu_link(processes: int, cores: int | None = None) -> tuple[float, float]:
    """(bandwidth, latency) of a process's link to the hub: copies run on a 1/r share of a core."""
    r = ranks_per_core(processes, cores)
    return SHM_BANDWIDTH / r, SHM_LATENCY * r


__all__ = ["CALL_WAIT_OPS", "CPU_CALL_WAIT_S", "CPU_GEMM_HALF_DIM", "CPU_OP_S", "CPU_PEAK_FP32", "SHM_BANDWIDTH",
           "SHM_LATENCY", "core_figures", "host_cores", "local_cpu_device", "local_cpu_link", "ranks_per_core"]
