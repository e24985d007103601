"""This machine as a preset (`local-cpu`): one CPU process per rank, gloo through shared memory.

The figures a local-cpu process gets before `paracube calibrate` measures them: one core's fp32 GEMM peak and
seconds per dispatched op, then each rank's share of a core when ranks outnumber the cores this process may
use (r = ranks_per_core = max(1, ranks / cores)): peaks, memory bandwidth and hub links' bandwidth run at 1/r
(the ranks take turns on a core), each dispatched op costs r x op seconds of wall time, and every message a
collective passes (collective.wait_steps: gloo's algorithms, e.g. 2 ceil(log2 n) for an all_reduce, n (n - 1)
for a reduce_scatter, one more where the mode's calls switch groups) waits (r - 1) x CPU_STEP_WAIT_S for its
receiver to be scheduled among the r - 1 other ranks on its core (DeviceSpec.ring_wait_s). The cost model reads
these overheads from the device (DeviceSpec.op_overhead_s, ring_wait_s; device_model.gemm_model) only when the
topology has no calibration. The device also carries, calibrated or not, the wait of a point-to-point message
(DeviceSpec.send_wait_s: the scheduler's, below) and r (DeviceSpec.ranks_per_core): a pipeline's idle stages give
their ranks' core share to the busy ones, so the bubble costs only what the cores sit idle
(cost_models/shared_cores.py; with 8 ranks on 2 cores a 2-stage pipeline's bubble is free).

Where a core's figures come from (core_figures): this machine's probe (cpu_probe.py: measured once, a second
or so plus torch's import in a subprocess, by the first local-cpu load that needs it, then read from the
JSON cache `~/.cache/paracube/local_cpu_probe.json`; `PARACUBE_CACHE_DIR` moves it, deleting it re-probes),
else, with `PARACUBE_NO_CPU_PROBE=1` or a failed probe, the fixed figures below:
- peak = geometric mean over the probed GEMM shapes of rate / eff(m, n, k), eff = MODEL_EFF_MAX x m/(m+8) x
  n/(n+8) x k/(k+8): the cost model's uncalibrated curve (compute.GemmModel, eff_max 0.85, half-efficiency
  dimension CPU_GEMM_HALF_DIM = 8: a core runs torch's single-thread fp32 GEMM at ~0.7 of its 256^3 rate
  already at 64^3, not the accelerators' 64) through the measured rates; fixed: 100 GFLOP/s;
- op seconds = the probed op_s (small autograd ops, forward and backward); fixed: CPU_OP_S = 4 us;
- step wait = CPU_STEP_WAIT_S = 0.28 ms per message and other rank on the core, a fixed figure (the
  scheduler's, not the machine's op speed: the probe's op_s moved from 4.0-4.5 us to 2.5 us between two
  sessions on the same VM type while the default 3D plan's step moved from 839 to 820 ms). Measured inside
  training steps (recorder spans, collective.py's table): about 0.9 ms per message with 4 ranks per core,
  0.3 ms with 2. The figure is the least-squares fit (relative errors) of the three `fitted` plans of
  `benchmarks/validate_local.py` (2-core x86 VM, torch eager, gloo, the tiny GPT, run at nice -20 so that other
  jobs on the machine do not slow it) over every run of them recorded, on two days: default 3D 2x2x2 820, 834,
  742, 651, 652 ms, dp=4 13.1 ms, dp=8 34.3, 23.7 ms; priced 725 ms (-12..+11%), 12.8 ms (-2%), 25.4 ms (-26%,
  +7%). The VM's speed drifts by day (the 3D plan's step 651-834 ms), so one day's runs set the figure up to
  ~20% off another day's (0.35 ms, fitted on the 820 / 13.1 / 34.3 ms day alone, priced the 3D
  plan +37% on the 651 ms night). Its plan families 1D, 2D, 2.5D and pipelines were held out (that benchmark's
  table, issue #23). A gloo microbenchmark of the calls themselves agrees (`benchmarks/gloo_waits.py`, 8 ranks,
  one group called back to back, 2026-12-05): 0.25-0.35 ms per message and other rank (all_gather and
  reduce_scatter over 2 and 4 ranks: 0.83, 1.48, 2.92, 12.48 ms a call, priced 0.89, 1.73, 2.68, 10.24 ms).
- meet wait: a mode whose consecutive collectives switch mesh axes (2D, 2.5D, 3D) waits one message more per
  call (collective.ALTERNATING_MEET: its group meets first), measured by the same microbenchmark (+0.4-0.9 ms a
  call cycling through a 2x2x2 grid's axes; priced +0.84 ms) and not fitted on any plan. Without it the held-out
  2D and 2.5D plans priced 22-31% fast on 2026-12-04 (155 / 289 ms against 195-225 / 385-419 ms measured); the
  fitted 3D plan now prices 917 ms (its runs above: 651-834 ms; 950-1180 ms on 2026-12-05, a slow day).
- send wait = (r - 1) x the scheduler's time slice (sched_slice_s: Linux's base slice, 1.5 ms on 2 CPUs) per
  point-to-point message (a pipeline's hand-off of activations or gradients; DeviceSpec.send_wait_s, in place
  of the step wait where longer: compute.GemmModel.call_wait): a collective's ranks wait together, each of the
  r - 1 others on a core gives it up as soon as it blocks in the same call, but a pipeline's stages compute
  while the other stage hands off, so the receiver is woken beside r - 1 ranks that each run out their slice.
  A physical figure, not fitted. Measured on the 2-core VM, 8 ranks, at normal priority beside other jobs
  (2026-12-03, one run each): the pipeline of replicas (dp=4,pp=2, one layer a stage) took 6.1 ms more than
  dp=8 on the same work at 2 micro-batches a replica (33.6 vs 27.5 ms) and 48.8 ms more at 8 (106.3 vs 57.5
  ms), its workers burning more CPU seconds per step than dp=8's, not idling; priced 5.1 and 33.8 ms more
  (30.5 / 25.4, 77.3 / 43.5 ms); with the step wait for each send, -2.2 and 4.5 ms (23.2, 48.0 ms).
- hub link latency SHM_LATENCY per hop, not scaled by r: the scheduling is priced by the step wait.
Neither the probe nor the fixed figures know about other jobs on the machine: a loaded machine runs slower
than this preset says (`paracube calibrate` measures it as it is).
"""

from __future__ import annotations

import math
import os

from paracube.topologies.cpu_probe import CpuFigures, cpu_figures
from paracube.topologies.device import DeviceSpec

GiB = 2**30
SHM_BANDWIDTH, SHM_LATENCY = 2e9, 25e-6  # each process's link to the shared-memory hub
CPU_OP_S = 4e-6  # per dispatched op (fixed figure; the probe measures this machine's)
CPU_STEP_WAIT_S = 0.28e-3  # per message of a collective (collective.wait_steps) and other rank on the core
SCHED_BASE_SLICE_S = 0.75e-3  # Linux's sysctl_sched_base_slice before its CPU-count scaling (kernel/sched/fair.c)
CPU_GEMM_HALF_DIM = 8.0  # a core runs a [128, 64] x [64, 64] GEMM at ~0.85 of its 512^3 rate (m0 = n0 = k0)
CPU_PEAK_FP32 = 100e9  # fixed figure: one core's fp32 peak priced by the cost model
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


def sched_slice_s(cpus: int | None = None) -> float:
    """The scheduler's time slice on this host: Linux (EEVDF, 6.6+; CFS's minimum granularity before it) scales
    its base slice by 1 + log2(min(online CPUs, 8)) (sched_tunable_scaling's default, "log"): 1.5 ms on 2 CPUs."""
    n = min(max(1, cpus or os.cpu_count() or 1), 8)
    return SCHED_BASE_SLICE_S * (1 + int(math.log2(n)))


def ranks_per_core(processes: int, cores: int | None = None) -> float:
    """Oversubscription of `processes` CPU ranks on the host's cores (1 when each has a core)."""
    return max(1.0, processes / (cores or host_cores()))


def _gemm_eff(m: int, n: int, k: int) -> float:
    """The cost model's uncalibrated GEMM efficiency at half-efficiency dimension CPU_GEMM_HALF_DIM."""
    h = CPU_GEMM_HALF_DIM
    return MODEL_EFF_MAX * m / (m + h) * n / (n + h) * k / (k + h)


def core_figures(figs: CpuFigures | None) -> tuple[float, float]:
    """(fp32 peak FLOP/s, seconds per op) of one core: probed, else fixed.

    peak = geometric mean over the probed shapes of rate / eff(m, n, k) (the peak whose priced curve best fits
    the measured rates, in relative terms); op = the probed op_s."""
    if figs is None:
        return CPU_PEAK_FP32, CPU_OP_S
    rates = figs.rates()
    log_peak = sum(math.log(rate / _gemm_eff(*shape)) for shape, rate in rates) / len(rates)
    return math.exp(log_peak), figs.op_s


def local_cpu_device(processes: int, cores: int | None = None, figures: CpuFigures | None = None) -> DeviceSpec:
    """One local-cpu process: a core's figures (`figures`, else this machine's probed ones via the cache,
    else the fixed ones), an equal share of host memory. Ranks that outnumber the cores
    (r = ranks_per_core > 1) each get 1/r of a core: peaks and memory bandwidth / r, r x op seconds per
    dispatched op, (r - 1) x CPU_STEP_WAIT_S per message of a collective (collective.wait_steps) and (r - 1)
    scheduler slices per point-to-point message (module docstring)."""
    if figures is None:
        figures = cpu_figures(host_cores())
    peak, op_s = core_figures(figures)
    r = ranks_per_core(processes, cores)
    # fp8: emulated (bf16 GEMMs on bf16 inputs rounded through FP8), priced at the bf16 rate
    flops = {"fp32": peak, "fp16": peak / 4, "bf16": peak / 4, "fp8": peak / 4}
    return DeviceSpec("cpu-process", {k: v / r for k, v in flops.items()}, _host_memory_bytes() / processes,
                      10e9 / r, op_overhead_s=op_s * r, ring_wait_s=CPU_STEP_WAIT_S * (r - 1),
                      send_wait_s=sched_slice_s() * (r - 1), gemm_half_dim=CPU_GEMM_HALF_DIM, ranks_per_core=r)


def local_cpu_link(processes: int, cores: int | None = None) -> tuple[float, float]:
    """(bandwidth, latency) of a process's link to the hub: copies run on a 1/r share of a core; the wait to be
    scheduled is the device's step wait (module docstring), not a longer hop."""
    r = ranks_per_core(processes, cores)
    return SHM_BANDWIDTH / r, SHM_LATENCY


__all__ = ["CPU_GEMM_HALF_DIM", "CPU_OP_S", "CPU_PEAK_FP32", "CPU_STEP_WAIT_S", "SHM_BANDWIDTH", "SHM_LATENCY",
           "SCHED_BASE_SLICE_S", "core_figures", "host_cores", "local_cpu_device", "local_cpu_link",
           "ranks_per_core", "sched_slice_s"]
