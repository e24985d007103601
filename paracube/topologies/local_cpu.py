"""This machine as a preset (`local-cpu`): one CPU process per rank, gloo through shared memory.

The figures a local-cpu process gets before `paracube calibrate` measures them: one core's fp32 GEMM peak,
seconds per dispatched op and a collective call's wait, then each rank's share of a core when ranks outnumber
the cores this process may use (r = ranks_per_core = max(1, ranks / cores)): peaks, memory bandwidth and hub
links run at 1/r (the ranks take turns on a core), each dispatched op costs r x op seconds of wall time, each
collective call waits (r - 1) x the call wait for the group's ranks to be scheduled (a slice of every other
rank on the core), and where r > 1 each step of a ring of 3 or more ranks waits r x the ring wait for the
ring's ranks to run in turn (collective.ring_wait_steps: how many steps; a pair does not wait). The cost model
reads the overheads from the device (DeviceSpec.op_overhead_s, call_overhead_s, ring_wait_s;
compute.gemm_model) only when the topology has no calibration.

Where a core's figures come from (core_figures): this machine's probe (cpu_probe.py: measured once, a second
or so plus torch's import in a subprocess, by the first local-cpu load that needs it, then read from the
JSON cache `~/.cache/paracube/local_cpu_probe.json`; `PARACUBE_CACHE_DIR` moves it, deleting it re-probes),
else, with `PARACUBE_NO_CPU_PROBE=1` or a failed probe, the fixed figures below:
- peak = geometric mean over the probed GEMM shapes of rate / eff(m, n, k), eff = MODEL_EFF_MAX x m/(m+8) x
  n/(n+8) x k/(k+8): the cost model's uncalibrated curve (compute.GemmModel, eff_max 0.85, half-efficiency
  dimension CPU_GEMM_HALF_DIM = 8: a core runs torch's single-thread fp32 GEMM at ~0.7 of its 256^3 rate
  already at 64^3, not the accelerators' 64) through the measured rates; fixed: 100 GFLOP/s;
- op seconds = the probed op_s (small autograd ops, forward and backward); fixed: CPU_OP_S = 4 us;
- ring wait = RING_WAIT_OPS x op_s, fixed: CPU_RING_WAIT_S = 0.16 ms, host work of the same kind as the call
  wait. RING_WAIT_OPS = 40 is the least-squares fit, with CALL_WAIT_OPS, of the three plans below over four
  runs each (0.18 ms at op_s = 4.5 us): a bare all_reduce of 1 KB..1 MB over 8 ranks on 2 cores takes 16-20 ms
  (14 steps: r x 0.33 ms a step), over 4 ranks 4.0-4.7 ms (6 steps: r x 0.36 ms), a part of which the ranks'
  own compute hides in a training step;
- call wait = CALL_WAIT_OPS x op_s, fixed: CPU_CALL_WAIT_S = 1.1 ms. A call on a rank that shares its core
  runs the gloo call path (Python wrappers, the process group's worker thread, the transport's loop thread),
  each woken on a core that r - 1 other ranks keep busy: host work of the kind an op's dispatch is, so it
  scales with the machine's op speed (a VM that runs at half speed waits twice as long; a pipe ping-pong of
  blocking processes 4 per core showed no ms-scale scheduler waits, so it is not a fixed scheduler slice).
  CALL_WAIT_OPS = 275 = 1.1 ms / 4 us, the quiet-machine fit below, where the probe measured 4.0-4.5 us.
The fixed figures are least squares over the quiet-machine step times of `benchmarks/validate_local.py`'s three
plans (2-core x86 VM, torch eager, gloo, the tiny GPT: default 3D 2x2x2: 839 ms, 214 calls with 4 ranks per
core; dp=4: 14.0 ms; dp=8: 34.6 ms). Neither the probe nor the fixed figures know about other jobs on the
machine: a loaded machine runs slower than this preset says (`paracube calibrate` measures it as it is).
"""

from __future__ import annotations

import math
import os

from paracube.topologies.cpu_probe import CpuFigures, cpu_figures
from paracube.topologies.device import DeviceSpec

GiB = 2**30
SHM_BANDWIDTH, SHM_LATENCY = 2e9, 25e-6  # each process's link to the shared-memory hub
CPU_OP_S, CPU_CALL_WAIT_S = 4e-6, 1.1e-3  # per op; per collective call and other rank sharing the core
CPU_RING_WAIT_S = 0.16e-3  # per ring step (rings of >= 3 ranks) and rank sharing the core
CPU_GEMM_HALF_DIM = 8.0  # a core runs a [128, 64] x [64, 64] GEMM at ~0.85 of its 512^3 rate (m0 = n0 = k0)
CPU_PEAK_FP32 = 100e9  # fixed figure: one core's fp32 peak priced by the cost model
CALL_WAIT_OPS = 275.0  # a call's wait per other rank on the core, in op times (1.1 ms / 4 us, the fixed pair)
RING_WAIT_OPS = 40.0  # a ring step's wait per rank on the core, in op times (0.16 ms / 4 us, the fixed pair)
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


def core_figures(figs: CpuFigures | None) -> tuple[float, float, float, float]:
    """(fp32 peak FLOP/s, seconds per op, call wait per other rank, ring wait per step and rank) of one core:
    probed, else fixed.

    peak = geometric mean over the probed shapes of rate / eff(m, n, k) (the peak whose priced curve best fits
    the measured rates, in relative terms); op = the probed op_s; waits = CALL_WAIT_OPS, RING_WAIT_OPS x op_s."""
    if figs is None:
        return CPU_PEAK_FP32, CPU_OP_S, CPU_CALL_WAIT_S, CPU_RING_WAIT_S
    rates = figs.rates()
    log_peak = sum(math.log(rate / _gemm_eff(*shape)) for shape, rate in rates) / len(rates)
    return math.exp(log_peak), figs.op_s, CALL_WAIT_OPS * figs.op_s, RING_WAIT_OPS * figs.op_s


def local_cpu_device(processes: int, cores: int | None = None, figures: CpuFigures | None = None) -> DeviceSpec:
    """One local-cpu process: a core's figures (`figures`, else this machine's probed ones via the cache,
    else the fixed ones), an equal share of host memory. Ranks that outnumber the cores
    (r = ranks_per_core > 1) each get 1/r of a core: peaks and memory bandwidth / r, r x op seconds per
    dispatched op, (r - 1) x the call wait per collective call and, where r > 1, r x the ring wait per step of
    a ring of 3 or more ranks."""
    if figures is None:
        figures = cpu_figures(host_cores())
    peak, op_s, wait_s, ring_s = core_figures(figures)
    r = ranks_per_core(processes, cores)
    # fp8: emulated (bf16 GEMMs on bf16 inputs rounded through FP8), priced at the bf16 rate
    flops = {"fp32": peak, "fp16": peak / 4, "bf16": peak / 4, "fp8": peak / 4}
    return DeviceSpec("cpu-process", {k: v / r for k, v in flops.items()}, _host_memory_bytes() / processes,
                      10e9 / r, op_overhead_s=op_s * r, call_overhead_s=wait_s * (r - 1),
                      ring_wait_s=ring_s * r if r > 1 else 0.0, gemm_half_dim=CPU_GEMM_HALF_DIM)


def local_cpu_link(processes: int, cores: int | None = None) -> tuple[float, float]:
    """(bandwidth, latency) of a process's link to the hub: copies run on a 1/r share of a core."""
    r = ranks_per_core(processes, cores)
    return SHM_BANDWIDTH / r, SHM_LATENCY * r


__all__ = ["CALL_WAIT_OPS", "CPU_CALL_WAIT_S", "CPU_GEMM_HALF_DIM", "CPU_OP_S", "CPU_PEAK_FP32", "CPU_RING_WAIT_S",
           "RING_WAIT_OPS", "SHM_BANDWIDTH", "SHM_LATENCY", "core_figures", "host_cores", "local_cpu_device",
           "local_cpu_link", "ranks_per_core"]
