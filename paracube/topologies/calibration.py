"""A topology's calibration, parsed once at load time into frozen dataclasses.

The YAML shape is the `calibration:` section that `paracube calibrate` writes (schema 1; fields documented in
calibration/fit.py; one dataclass per section: calibration_sections.py). Every section is optional here: the cost
model prices what is measured and keeps the topology's figures for the rest (calibration.calibrate.check_calibration
requires the sections a run compared against this machine needs). `Calibration.from_dict` checks every field and
raises one ParacubeError line naming the field and what it expects; `to_dict` writes the same YAML mapping back
(absent fields stay absent), so files written before this module load and round-trip unchanged.

What the cost model reads (device_model.gemm_model): gemm.{eff_max, m0, n0, k0, mem_eff}, elementwise.op_overhead_s,
op_overhead_by_mode[dtype][mode] (`op_overheads`), step_wait_s and call_wait_s, and the per-kind, per-size
collective fits of `comm`
and `comm_alternating` (`comm_table`, the rows cost_models/collective.calibrated_link reads).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from paracube.estimate import COLLECTIVE_KINDS
from paracube.topologies.calibration_sections import CommFit, Elementwise, GemmFit, LinkFit, Machine, Probe, Timing
from paracube.topologies.fields import field_error, floats, known, mapping, number, plain

SECTIONS = ("schema", "created", "machine", "timing", "gemm", "elementwise", "comm", "comm_alternating", "link",
            "residuals", "probes")


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


__all__ = ["Calibration", "as_calibration"]
