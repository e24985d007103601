"""A topology's calibration, parsed once at load time into frozen dataclasses.

The YAML shape is the `calibration:` section that `paracube calibrate` writes (schema 1; fields documented
in calibration/fit.py). Every section is optional here: the cost model prices what is measured and keeps the
topology's figures for the rest (calibration.calibrate.check_calibration requires the sections a run
compared against this machine needs). `Calibration.from_dict` checks every field and raises one
ParacubeError line naming the field and what it expects; `to_dict` writes the same YAML mapping back
(absent fields stay absent), so files written before this module load and round-trip unchanged.

What the cost model reads (device_model.gemm_model): gemm.{eff_max, m0, n0, k0, mem_eff}, elementwise.op_overhead_s,
op_overhead_by_mode[dtype][mode] (`op_overheads`), step_wait_s and call_wait_s, and the per-kind, per-size
collective fits of `comm`
and `comm_alternating` (`comm_table`, the rows cost_models/collective.calibrated_link reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

from paracube.estimate import COLLECTIVE_KINDS
from paracube.topologies.fields import field_error, floats, known, mapping, number, plain

SECTIONS = ("schema", "created", "machine", "timing", "gemm", "elementwise", "comm", "comm_alternating", "link",
            "residuals", "probes")


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
    POSITIVE = ("eff_max", "m0", "n0", "k0", "mem_eff", "peak_flops", "fp8_eff_max", "fp8_m0", "flash_eff")


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


def _comm(where: str, data: object, alternating: bool) -> tuple[CommFit, ...]:
    out = []
    for kind, by_n in mapping(where, data).items():
        if kind not in COLLECTIVE_KINDS:
            raise field_error(f"{where}.{kind}", f"a collective kind ({', '.join(COLLECTIVE_KINDS)})", kind)
        for n, fit in mapping(f"{where}.{kind}", by_n).items():
            if not str(n).isdigit() or int(n) < 1:
                raise field_error(f"{where}.{kind}.{n}", "a group size (a positive integer) as the key", n)
            f = floats(f"{where}.{kind}.{n}", LinkFit, fit, ("latency", "bandwidth"))
            out.append(CommFit(str(kind), int(n), alternating, f.latency, f.bandwidth, f.rms_rel_err))
    return tuple(out)


def _comm_dict(fits: tuple[CommFit, ...]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for f in fits:
        entry = {"latency": f.latency, "bandwidth": f.bandwidth}
        out.setdefault(f.kind, {})[str(f.n)] = entry if f.rms_rel_err is None else {**entry,
                                                                                     "rms_rel_err": f.rms_rel_err}
    return out


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


@dataclass(frozen=True)
class Calibration:
    """The `calibration:` section of a topology file; None for a section the file does not have."""

    schema: int | None = None
    created: str | None = None
    machine: Machine | None = None
    timing: Timing | None = None
    gemm: GemmFit | None = None
    elementwise: Elementwise | None = None
    comm: tuple[CommFit, ...] | None = None
    comm_alternating: tuple[CommFit, ...] | None = None
    link: LinkFit | None = None
    residuals: dict[str, float] | None = None
    probes: tuple[Probe, ...] | None = None

    @staticmethod
    def from_dict(data: object, where: str = "calibration") -> Calibration:
        """Parse and check; ParacubeError "field calibration.X: expected ..., got ..." when malformed."""
        data = mapping(where, data)
        known(where, data, SECTIONS)
        out: dict[str, Any] = {}
        for key, value in data.items():
            out[key] = _section(f"{where}.{key}", key, value)
        return Calibration(**out)

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping (from_dict(to_dict()) == self; the sections present, in the file's order)."""
        out: dict[str, Any] = {}
        for key in SECTIONS:
            value = getattr(self, key)
            if value is None:
                continue
            if key in ("comm", "comm_alternating"):
                value = _comm_dict(value)
            elif key == "probes":
                value = [p.to_dict() for p in value]
            elif key == "elementwise":
                value = value.to_dict(with_modes=bool(value.op_overhead_by_mode))
            elif key == "timing":
                value = value.to_dict()
            elif key in ("machine", "gemm", "link"):
                value = plain(value)
            elif key == "residuals":
                value = dict(value)
            out[key] = value
        return out

    def comm_table(self) -> tuple[tuple[str, int, bool, float, float], ...]:
        """(kind, n, alternating, latency, bandwidth) of every collective fit: collective.calibrated_link's table."""
        fits = (self.comm or ()) + (self.comm_alternating or ())
        return tuple((f.kind, f.n, f.alternating, f.latency, f.bandwidth)
                     for f in sorted(fits, key=lambda f: (f.alternating, f.kind, f.n)))

    def op_overheads(self, dtype: str) -> dict[str, float]:
        """Seconds per dispatched op of each probed tensor mode for `dtype` (fp16 dispatches like bf16)."""
        by_dtype = self.elementwise.op_overhead_by_mode if self.elementwise else {}
        return dict(by_dtype.get(dtype) or by_dtype.get("bf16" if dtype == "fp16" else dtype) or {})

    def with_op_overheads(self, by_mode: dict[str, dict[str, float]], step_wait_s: float | None = None,
                          call_wait_s: float | None = None) -> Calibration:
        """A copy whose elementwise.op_overhead_by_mode is `by_mode`, step_wait_s `step_wait_s` and call_wait_s
        `call_wait_s` (calibrate's probe fit)."""
        base = self.elementwise or Elementwise()
        return replace(self, elementwise=replace(base, op_overhead_by_mode=by_mode, step_wait_s=step_wait_s,
                                                 call_wait_s=call_wait_s))

    def with_compute_eff(self, eff: float) -> Calibration:
        """A copy whose gemm.eff_max and mem_eff are `eff` x this one's (calibrate's probe fit: the fitted GEMM and
        memory rates as a training step reaches them); this one where eff == 1."""
        if eff == 1.0:
            return self
        gemm = self.gemm or GemmFit()  # absent figures: compute.GemmModel's defaults (0.85, 0.8)
        return replace(self, gemm=replace(gemm, eff_max=eff * (gemm.eff_max or 0.85),
                                          mem_eff=eff * (gemm.mem_eff or 0.8)))


def _section(where: str, key: str, value: object) -> Any:
    """One top-level section of the calibration, parsed."""
    if key == "schema":
        if isinstance(value, bool) or not isinstance(value, int):
            raise field_error(where, "an integer schema version", value)
        return value
    if key == "created":
        if not isinstance(value, str):
            raise field_error(where, "an ISO date string", value)
        return value
    if key in ("comm", "comm_alternating"):
        return _comm(where, value, key == "comm_alternating")
    if key == "residuals":
        return {str(k): number(f"{where}.{k}", v, 0.0) for k, v in mapping(where, value).items()}
    if key == "probes":
        if not isinstance(value, (list, tuple)):
            raise field_error(where, "a list of step probes", value)
        return tuple(Probe.parse(f"{where}[{i}]", p) for i, p in enumerate(value))
    parsers = {"machine": Machine.parse, "timing": Timing.parse, "elementwise": Elementwise.parse,
               "gemm": lambda w, v: floats(w, GemmFit, v),
               "link": lambda w, v: floats(w, LinkFit, v, ("latency", "bandwidth"))}
    return parsers[key](where, value)


def as_calibration(value: object, where: str = "calibration") -> Calibration | None:
    """A Calibration from a Calibration, a mapping in the YAML shape, or None (no calibration)."""
    if value is None or isinstance(value, Calibration):
        return value
    return Calibration.from_dict(value, where)


__all__ = ["Calibration", "CommFit", "Elementwise", "GemmFit", "LinkFit", "Machine", "Probe",
           "Timing", "as_calibration"]
