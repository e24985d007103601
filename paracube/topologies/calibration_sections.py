"""The sections of a topology's calibration (calibration.Calibration holds one of each), parsed and written back.

One frozen dataclass per section of the `calibration:` mapping `paracube calibrate` writes (schema 1; what each
figure is and how it is fitted: calibration/fit.py): where it was measured (Machine), how a measured point became
seconds (Timing), the GEMM curve (GemmFit: compute.GemmModel's eff_max x m/(m+m0) x n/(n+n0) x k/(k+k0), mem_eff,
the FP8 curve, flash attention's fraction of the peak, the generation figures overlap_drag and straggler), the
joint (latency, bandwidth) link fit (LinkFit) and one per collective kind and group size (CommFit), the per-op and
per-call host overheads (Elementwise), and the step probes they were fitted on (Probe). A malformed field raises
one ParacubeError line naming it and what it expects (topologies/fields.py); absent fields stay None, so the
cost model keeps the topology's figures for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from paracube.topologies.fields import field_error, known, mapping, number, plain


@dataclass(frozen=True)
class Machine:
    """Where the calibration was measured (check_calibration compares it with this machine)."""

    hostname: str | None = None
    cpu_model: str | None = None
    nproc: int | None = None
    torch_version: str | None = None
    backend: str | None = None
    cpu_count: int | None = None
    cpu_bind: str | None = None

    @staticmethod
    def parse(where: str, data: object) -> Machine:
        data = mapping(where, data)
        known(where, data, tuple(f.name for f in fields(Machine)))
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("nproc", "cpu_count"):
                ok = (value is None and key == "cpu_count") or (
                    isinstance(value, int) and not isinstance(value, bool) and value >= 1)
                expected = "a positive integer"
            else:
                ok, expected = isinstance(value, str), "a string"
            if not ok:
                raise field_error(f"{where}.{key}", expected, value)
            out[key] = value
        return Machine(**out)


@dataclass(frozen=True)
class Timing:
    """How a measured point became seconds: wall time, or ranks_per_core x CPU seconds (calibrate.timing_basis)."""

    basis: str = "wall"
    ranks_per_core: float = 1.0
    cores: int | None = None

    @staticmethod
    def parse(where: str, data: object) -> Timing:
        data = mapping(where, data)
        known(where, data, ("basis", "ranks_per_core", "cores"))
        basis = data.get("basis", "wall")
        if basis not in ("wall", "cpu"):
            raise field_error(f"{where}.basis", "wall or cpu", basis)
        cores = data.get("cores")
        if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
            raise field_error(f"{where}.cores", "a positive integer", cores)
        return Timing(basis, number(f"{where}.ranks_per_core", data.get("ranks_per_core", 1.0), positive=True),
                      cores)

    def to_dict(self) -> dict[str, Any]:
        return {"basis": self.basis, "ranks_per_core": self.ranks_per_core, "cores": self.cores}


@dataclass(frozen=True)
class GemmFit:
    """compute.GemmModel's efficiency parameters (absent ones keep its defaults) and the fitted peak."""

    eff_max: float | None = None
    m0: float | None = None
    n0: float | None = None
    k0: float | None = None
    mem_eff: float | None = None
    peak_flops: float | None = None
    rms_rel_err: float | None = None
    # The FP8 GEMMs' curve (at the device's fp8 peak; m0 = n0 = k0); absent: the 16-bit curve's figures.
    fp8_eff_max: float | None = None
    fp8_m0: float | None = None
    # The fused (flash) attention kernel's fraction of the 16-bit peak; absent: its GEMMs on the curve above.
    flash_eff: float | None = None
    # Compute seconds lost per second a data-parallel NVLink ring runs beside it (cost_models/overlap_drag.py);
    # absent: the device generation's figure (topologies/efficiency.OVERLAP_DRAG).
    overlap_drag: float | None = None
    # Per-rank jitter, sqrt(s), that the step's barrier over the data-parallel replicas meets
    # (cost_models/stragglers.py); absent: the device generation's figure (topologies/efficiency.STRAGGLER).
    straggler: float | None = None
    # How much slower the GPU's host issues a MoE block's ops than devices.HOST_OP_S measured
    # (cost_models/host_issue.py); absent: the device generation's figure (topologies/efficiency.HOST_ISSUE).
    host_scale: float | None = None
    # An all_to_all's fraction of the NIC line rate across nodes (cost_models/moe_a2a.py); absent: the inter-node
    # fabric's figure (topologies/efficiency.A2A_NIC).
    a2a_eff: float | None = None
    # The share of what the two-stream a2a overlap model hides that a run hides (cost_models/moe_a2a_overlap.py);
    # absent: the device generation's figure (topologies/efficiency.A2AO_OVERLAP).
    a2ao_eff: float | None = None
    POSITIVE = ("eff_max", "m0", "n0", "k0", "mem_eff", "peak_flops", "fp8_eff_max", "fp8_m0", "flash_eff",
                "host_scale", "a2a_eff", "a2ao_eff")


@dataclass(frozen=True)
class LinkFit:
    """One (latency, bandwidth) pair: the joint fit over every collective kind and size."""

    latency: float
    bandwidth: float
    rms_rel_err: float | None = None
    POSITIVE = ("bandwidth",)


@dataclass(frozen=True)
class Elementwise:
    """Seconds per dispatched op (bare, and per dtype and tensor mode from the step probes), bandwidth, the
    seconds each message of a collective waits to be scheduled (collective.wait_steps) and the seconds each call
    waits for its group's ranks to be scheduled together (both from the step probes)."""

    op_overhead_s: float | None = None
    bandwidth: float | None = None
    rms_rel_err: float | None = None
    step_wait_s: float | None = None
    call_wait_s: float | None = None
    op_overhead_by_mode: dict[str, dict[str, float]] = field(default_factory=dict)

    @staticmethod
    def parse(where: str, data: object) -> Elementwise:
        data = dict(mapping(where, data))
        by_dtype = mapping(f"{where}.op_overhead_by_mode", data.pop("op_overhead_by_mode", None) or {})
        by_mode = {str(dt): {str(m): number(f"{where}.op_overhead_by_mode.{dt}.{m}", s, 0.0)
                             for m, s in mapping(f"{where}.op_overhead_by_mode.{dt}", modes).items()}
                   for dt, modes in by_dtype.items()}
        known(where, data, ("op_overhead_s", "bandwidth", "rms_rel_err", "step_wait_s", "call_wait_s"))
        base = {k: number(f"{where}.{k}", v, 0.0, k == "bandwidth") for k, v in data.items()}
        return Elementwise(**base, op_overhead_by_mode=by_mode)

    def to_dict(self, with_modes: bool) -> dict[str, Any]:
        out = {k: v for k, v in plain(self).items() if k != "op_overhead_by_mode"}
        return {**out, "op_overhead_by_mode": self.op_overhead_by_mode} if with_modes else out


class CommFit(NamedTuple):
    """The fitted (latency, bandwidth) of one collective kind on groups of n ranks."""

    kind: str
    n: int
    alternating: bool  # measured with calls cycling through the groups of every stride
    latency: float
    bandwidth: float
    rms_rel_err: float | None = None


@dataclass(frozen=True)
class Probe:
    """One step probe (calibrate.fit_op_overheads): a layout's measured step and its dispatched ops."""

    layout: str
    dtype: str
    ops: float
    time_s: float
    cpu_s: float
    round_times_s: tuple[float, ...] = ()
    seq_len: int = 16  # tokens per sequence of the probe model (calibration.microbench.PROBE_SEQS)

    @staticmethod
    def parse(where: str, data: object) -> Probe:
        data = mapping(where, data)
        known(where, data, tuple(f.name for f in fields(Probe)))
        for key in ("layout", "dtype"):
            if not isinstance(data.get(key), str):
                raise field_error(f"{where}.{key}", "a string", data.get(key))
        rounds = data.get("round_times_s", [])
        if not isinstance(rounds, (list, tuple)):
            raise field_error(f"{where}.round_times_s", "a list of seconds", rounds)
        nums = {k: number(f"{where}.{k}", data.get(k), 0.0) for k in ("ops", "time_s", "cpu_s")}
        if isinstance(data["ops"], int):
            nums["ops"] = data["ops"]  # a count: written back as the integer it was
        seq = data.get("seq_len", 16)
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise field_error(f"{where}.seq_len", "a positive integer", seq)
        return Probe(data["layout"], data["dtype"], **nums,
                     round_times_s=tuple(number(f"{where}.round_times_s", r, 0.0) for r in rounds), seq_len=seq)

    def to_dict(self) -> dict[str, Any]:
        return {**plain(self), "round_times_s": list(self.round_times_s)}


__all__ = ["CommFit", "Elementwise", "GemmFit", "LinkFit", "Machine", "Probe", "Timing"]
