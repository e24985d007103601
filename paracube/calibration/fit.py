"""Fits of the cost model's parameters to measured microbenchmarks (scipy), with their residuals.

The `calibration:` section of a topology file (what `paracube calibrate` writes; schema 1; parsed and checked
at load time into topologies.calibration.Calibration):

    calibration:
      schema: 1
      machine: {hostname, cpu_model, nproc, torch_version, backend, cpu_count, cpu_bind}   # where measured
      timing: {basis: wall | cpu, ranks_per_core, cores}   # how a measured point became seconds (below)
      gemm: {eff_max, m0, n0, k0, mem_eff, peak_flops, rms_rel_err}
      elementwise: {op_overhead_s, bandwidth, rms_rel_err, step_wait_s,   # s per collective message, probes
                    call_wait_s,                                           # s per collective call, probes
                    op_overhead_by_mode: {fp32: {none, 1d, ...}, bf16: {...}}}   # s per op, serial probe
      comm:                                    # per collective kind, per group size (string key)
        all_reduce: {"2": {latency, bandwidth, rms_rel_err}, "4": {...}, "8": {...}}
        all_gather: {...}
        reduce_scatter: {...}
      comm_alternating: {...}                  # the same, calls cycling through every stride of each size
      link: {latency, bandwidth, rms_rel_err}  # one joint fit over every kind and size
      residuals: {gemm, elementwise, comm, link, probe}   # RMS relative error of each fit; probe: spread of
                                                          # the step probes over rounds (calibrate.probe_spread)
      probes: [{layout, dtype, seq_len, ops, time_s, cpu_s, round_times_s}]   # what the probe figures were
                                                          # fitted to (time_s: the faster round)

Every fit reads a point's cost: its wall time per call, or, when CPU ranks outnumber the cores they share
(`timing.basis: cpu`), ranks_per_core x its CPU seconds per call (calibrate.timing_basis says why).

What the cost model reads: `device_model.gemm_model` reads gemm.{eff_max, m0, n0, k0, mem_eff} (peak and
memory bandwidth come from the device, which calibrate sets to the fitted peak_flops and bandwidth, so
eff_max = mem_eff = 1 for the microbenchmarks, times the probe fit's efficiency below).
cost_models/collective.py prices a call on a group of n ranks with link (B, a) as
latency_factor(kind, n) a + sent_factor(kind, n) P / B (ring), e.g.
    all_reduce: 2(n-1) a + 2(n-1)/n P / B,   all_gather / reduce_scatter: (n-1) a + (n-1)/n P / B;
the per-kind, per-size (latency, bandwidth) here are the a and B of exactly that formula (fit_alpha_beta
uses collective.py's factors), and the cost model uses them in place of the link's for that kind and group
size (collective.calibrated_link; `device_model.gemm_model` carries them). The joint
`link` fit also goes into the topology graph (hub links of latency a/2 and bandwidth B: a ring hop crosses two
of them) for kinds and sizes that were not measured. Modes whose collectives alternate mesh axes (2D, 2.5D,
3D) read `comm_alternating` (microbench.py: measured with calls cycling through the groups of every stride,
which includes the wait for peers last synchronized with other ranks), for every collective of the step;
other modes read `comm`. compute.py prices `step_ops.ops_per_step` dispatched ops per step at
`elementwise.op_overhead_by_mode[dtype][mode]` (else `op_overhead_s`, the bare in-place op of the elementwise fit)
and each collective message (collective.wait_steps) at `elementwise.step_wait_s` plus each collective call at
`elementwise.call_wait_s`: host_overheads.fit_host_overheads sets the first, and gemm.eff_max = gemm.mem_eff (the
fraction of the microbenchmarks' GEMM and memory rates a training step reaches), from the serial probe steps at
two sequence lengths, and the waits, by non-negative least squares, from the parallel ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from paracube.cost_models.collective import latency_factor, sent_factor
from paracube.errors import check


@dataclass(frozen=True)
class Fit:
    params: dict[str, float]
    rel_err: tuple[float, ...]  # (predicted - measured) / measured, per point

    @property
    def rms(self) -> float:
        return rms(self.rel_err)


def rms(values: Sequence[float]) -> float:
    return float(math.sqrt(np.mean(np.square(values)))) if len(values) else 0.0


def _nonneg_linear(A: np.ndarray, t: np.ndarray) -> np.ndarray:
    """x >= 0 minimizing the relative residuals (A x - t) / t (all points weigh alike)."""
    W = A / t[:, None]
    res = least_squares(lambda x: W @ x - 1.0, x0=np.full(A.shape[1], 1e-9), bounds=(0.0, np.inf),
                        x_scale="jac", method="trf")
    return res.x


def fit_alpha_beta(points: Sequence[tuple[str, int, float, float]]) -> Fit:
    """One (latency, bandwidth) for points (kind, group size n, payload bytes, seconds per call)."""
    check(len(points) >= 2, f"need at least 2 measured collective points to fit alpha/beta, got {len(points)}")
    kinds = [p[0] for p in points]
    n = np.array([p[1] for p in points], dtype=float)
    P = np.array([p[2] for p in points], dtype=float)
    t = np.array([p[3] for p in points], dtype=float)
    check(bool(np.all(t > 0)), "measured collective times must be positive")
    A = np.stack([np.array([latency_factor(k, ni) for k, ni in zip(kinds, n, strict=True)]),
                  np.array([sent_factor(k, ni) for k, ni in zip(kinds, n, strict=True)]) * P], axis=1)
    alpha, inv_bw = _nonneg_linear(A, t)
    inv_bw = max(inv_bw, 1e-15)  # bandwidth stays finite in the YAML
    pred = A @ np.array([alpha, inv_bw])
    return Fit({"latency": float(alpha), "bandwidth": float(1.0 / inv_bw)}, tuple((pred - t) / t))


def gemm_time(m: np.ndarray, n: np.ndarray, k: np.ndarray, peak: float, m0: float, n0: float,
              k0: float) -> np.ndarray:
    """compute.GemmModel's form with eff_max folded into `peak`."""
    eff = m / (m + m0) * n / (n + n0) * k / (k + k0)
    return 2.0 * m * n * k / (peak * eff)


def fit_gemm(points: Sequence[tuple[int, int, int, float]]) -> Fit:
    """(peak FLOP/s, m0, n0, k0) from points (m, n, k, seconds), least squares on log time."""
    check(len(points) >= 4, f"need at least 4 measured GEMM shapes to fit peak, m0, n0, k0, got {len(points)}")
    m, n, k, t = (np.array([p[i] for p in points], dtype=float) for i in range(4))
    best_flops = float(np.max(2 * m * n * k / t))

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(gemm_time(m, n, k, *np.exp(x))) - np.log(t)

    x0 = np.log([best_flops * 1.5, 16.0, 16.0, 16.0])
    res = least_squares(resid, x0, bounds=(np.log([best_flops * 0.5, 1e-3, 1e-3, 1e-3]),
                                           np.log([best_flops * 1e3, 1e5, 1e5, 1e5])))
    peak, m0, n0, k0 = (float(v) for v in np.exp(res.x))
    pred = gemm_time(m, n, k, peak, m0, n0, k0)
    return Fit({"peak_flops": peak, "m0": m0, "n0": n0, "k0": k0}, tuple((pred - t) / t))


def fit_elementwise(points: Sequence[tuple[int, float]]) -> Fit:
    """t = overhead + bytes / bandwidth from points (bytes, seconds)."""
    check(len(points) >= 2, f"need at least 2 elementwise points, got {len(points)}")
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    o, inv_bw = _nonneg_linear(np.stack([np.ones_like(b), b], axis=1), t)
    inv_bw = max(inv_bw, 1e-15)
    pred = o + b * inv_bw
    return Fit({"op_overhead_s": float(o), "bandwidth": float(1.0 / inv_bw)}, tuple((pred - t) / t))


__all__ = ["Fit", "fit_alpha_beta", "fit_elementwise", "fit_gemm", "gemm_time", "rms"]
