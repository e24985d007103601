"""The device model a topology prices with: its compute.GemmModel for a training dtype.

`gemm_model(topo, dtype)` reads:
- the device's spec sheet (DeviceSpec): the dtype's peak FLOP/s, HBM bandwidth, and the host-side figures priced
  without a calibration: op_overhead_s, call_overhead_s, ring_wait_s (local-cpu's oversubscribed ranks; 0 on
  accelerators), send_wait_s and sync_s (always the device's), gemm_half_dim (m0 = n0 = k0 of the uncalibrated
  curve, else GemmModel's 64), ranks_per_core (else the calibration's
  timing.ranks_per_core);
- the topology's calibration (topologies/calibration.py, written by `paracube calibrate` or the shipped
  per-generation figures, topologies/efficiency.py): gemm.{eff_max, m0, n0, k0, mem_eff, flash_eff,
  overlap_drag, straggler, host_scale, a2ao_eff}, elementwise.op_overhead_s, op_overhead_by_mode[dtype][mode] (fp16
  dispatches like bf16), step_wait_s (GemmModel.ring_wait) and call_wait_s, and the collective fits
  (Calibration.comm_table);
- the device generation's overlap drag, straggler, host issue and a2a overlap figures (efficiency.overlap_drag /
  straggler / host_scale / a2ao_eff) where the calibration has none.
fp8: the bf16 model with an FP8 model of the block linears' GEMMs as its `linear` (fp8 peak; the calibration's
fp8_eff_max / fp8_m0 where fitted, else the 16-bit curve; cost_models/fp8.py); refused in one line on a device
without an fp8 peak (workload.check_dtype_on).
"""

from __future__ import annotations

from dataclasses import replace

from paracube.cost_models.compute import GemmModel
from paracube.topologies.calibration import as_calibration
from paracube.topologies.efficiency import a2ao_eff, host_scale, overlap_drag, straggler
from paracube.topologies.protocol import Topology
from paracube.workload import check_dtype_on


def gemm_model(topo: Topology, dtype: str) -> GemmModel:
    """The device's roofline for `dtype` with the topology's calibration (if any) applied. fp8: the bf16
    model with the FP8 model of the block linears' GEMMs as its `linear` (fp8 peak, the calibration's
    fp8_eff_max / fp8_m0 where fitted, else the 16-bit curve); refused on a device without an fp8 peak."""
    device = topo.device
    if dtype == "fp8":
        check_dtype_on(dtype, device.name, device.peak_flops)
        base = gemm_model(topo, "bf16")
        fp8_peak = replace(base, peak=float(device.peak_flops["fp8"]))
        gemm = getattr(as_calibration(topo.calibration), "gemm", None)
        eff_max, m0 = getattr(gemm, "fp8_eff_max", None), getattr(gemm, "fp8_m0", None)
        if eff_max is not None:
            fp8_peak = replace(fp8_peak, eff_max=eff_max)
        if m0 is not None:
            fp8_peak = replace(fp8_peak, m0=m0, n0=m0, k0=m0)
        return replace(base, linear=fp8_peak)
    cal = as_calibration(topo.calibration)
    drag, jitter, host, a2ao = overlap_drag(device), straggler(device), host_scale(device), a2ao_eff(device)
    if cal is None:  # the device's own per-op overhead (local-cpu: oversubscribed CPU ranks), else 0
        half = float(getattr(device, "gemm_half_dim", 0.0)) or GemmModel.m0
        return GemmModel(peak=float(device.peak_flops[dtype]), mem_bw=float(device.memory_bandwidth),
                         m0=half, n0=half, k0=half, op_overhead=float(getattr(device, "op_overhead_s", 0.0)),
                         call_overhead=float(getattr(device, "call_overhead_s", 0.0)),
                         ring_wait=float(getattr(device, "ring_wait_s", 0.0)),
                         send_wait=float(getattr(device, "send_wait_s", 0.0)), overlap_drag=drag, straggler=jitter,
                         ranks_per_core=_ranks_per_core(device, cal), sync=float(getattr(device, "sync_s", 0.0)),
                         host_bw=float(getattr(device, "host_bandwidth", 0.0)), host_scale=host, a2ao_eff=a2ao)
    gemm = cal.gemm
    known = {k: getattr(gemm, k) for k in ("eff_max", "m0", "n0", "k0", "mem_eff", "flash_eff", "overlap_drag",
                                           "straggler", "host_scale", "a2ao_eff")
             if gemm is not None and getattr(gemm, k) is not None}
    known.setdefault("overlap_drag", drag)  # a calibration without it: the generation's
    known.setdefault("straggler", jitter)
    known.setdefault("host_scale", host)
    known.setdefault("a2ao_eff", a2ao)
    overhead = cal.elementwise.op_overhead_s if cal.elementwise is not None else None
    # Per dtype (fp16 dispatches like bf16: the same autocast casts), then per tensor mode.
    by_mode = tuple(sorted(cal.op_overheads(dtype).items()))
    wait = cal.elementwise.step_wait_s if cal.elementwise is not None else None
    call = cal.elementwise.call_wait_s if cal.elementwise is not None else None
    return GemmModel(peak=float(device.peak_flops[dtype]), mem_bw=float(device.memory_bandwidth), **known,
                     op_overhead=overhead or 0.0, op_overhead_by_mode=by_mode, comm=cal.comm_table(),
                     ring_wait=wait or 0.0, call_overhead=call or 0.0,
                     send_wait=float(getattr(device, "send_wait_s", 0.0)),  # the scheduler's: calibrated or not
                     ranks_per_core=_ranks_per_core(device, cal), sync=float(getattr(device, "sync_s", 0.0)),
                     host_bw=float(getattr(device, "host_bandwidth", 0.0)))


def _ranks_per_core(device: object, cal: object) -> float:
    """The device's ranks per core, else (a calibration written before devices carried it) its timing's."""
    r = float(getattr(device, "ranks_per_core", 1.0))
    timing = getattr(cal, "timing", None)
    return r if r != 1.0 or timing is None else float(timing.ranks_per_core)
