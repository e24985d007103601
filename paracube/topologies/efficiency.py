"""Efficiencies per device generation and per fabric, each with where it came from.

Peaks stay the spec sheets' (devices.py, rates.py). These few efficiencies, the same for every run, scale them:
- per device generation, the GEMM efficiency curve eff_max x m/(m+m0) x n/(n+m0) x k/(k+m0) (compute.GemmModel,
  m0 = n0 = k0) of the 16-bit GEMMs and, where the generation has FP8 tensor cores, one of the FP8 GEMMs
  (`fp8_eff_max`, `fp8_m0`), and the memory-bound efficiency mem_eff (fraction of HBM bandwidth the fused
  elementwise kernels, the FP8 casts and Adam reach);
- per fabric, the fraction of the nominal per-direction rate a collective reaches (NCCL bus bandwidth / link).
Fitted by `paracube calibrate --from-runs benchmarks/data/published_runs.csv` (calibration/from_runs.py; fit and
held-out rows: benchmarks/published_runs.py), 2026-11, on the A100 and V100 rows (eff_max and mem_eff end at
the upper ends of their plausible ranges, 0.95 and 0.9; with m0 ~ 330 a 4096^3 fp16 GEMM runs at 75% of peak).
No run of that set is on Hopper or Blackwell, uses FP8, NVLink 4/5, NDR or XDR: those figures are borrowed from
the nearest fitted generation / fabric and flagged `fitted=False` with the source they were taken from;
`paracube topologies` prints every preset's sources (`sources`). Every figure is a parameter from_runs.Fit can
fit per generation once runs on it are in the runs file (issue #23 item 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paracube.topologies.device import DeviceSpec

if TYPE_CHECKING:
    from paracube.topologies.calibration import Calibration

RUNS = "benchmarks/data/published_runs.csv"


@dataclass(frozen=True)
class Figures:
    """Efficiency figures and where they came from: fitted on runs, or borrowed (flagged) from another one."""

    values: dict[str, float]
    source: str
    fitted: bool


_VOLTA = {"eff_max": 0.95, "m0": 171.0, "mem_eff": 0.90}
_AMPERE = {"eff_max": 0.95, "m0": 332.0, "mem_eff": 0.90}
GENERATIONS: dict[str, Figures] = {
    "volta": Figures(_VOLTA, f"fitted on the dgx2-v100 rows of {RUNS}", True),
    "ampere": Figures(_AMPERE, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "hopper": Figures(_AMPERE, "borrowed from ampere: no run of the set is on Hopper", False),
    "blackwell": Figures(_AMPERE, "borrowed from ampere: no run of the set is on Blackwell", False),
}
# FP8 GEMMs (Transformer Engine, per-tensor scaling): a curve of their own at the FP8 peak.
FP8_GEMM: dict[str, Figures] = {
    gen: Figures({"fp8_eff_max": GENERATIONS[gen].values["eff_max"], "fp8_m0": GENERATIONS[gen].values["m0"]},
                 f"borrowed from {gen}'s 16-bit curve: no FP8 run in the set", False)
    for gen in ("hopper", "blackwell")}

FABRICS: dict[str, Figures] = {
    "nvlink2-nvswitch": Figures({"eff": 0.47}, f"fitted on the dgx2-v100 rows of {RUNS}", True),
    "nvlink3-nvswitch": Figures({"eff": 0.50}, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "hdr-ib": Figures({"eff": 0.78}, f"fitted on the dgx-a100 rows of {RUNS}", True),
}
for _name, _like in (("edr-ib", "hdr-ib"), ("ndr-ib", "hdr-ib"), ("xdr-ib", "hdr-ib"),
                     ("nvlink4-nvswitch", "nvlink3-nvswitch"), ("nvlink5-nvswitch", "nvlink3-nvswitch")):
    FABRICS[_name] = Figures(FABRICS[_like].values, f"borrowed from {_like}: no run of the set uses {_name}", False)

# Devices priced with their generation's figures. The SXM2 V100 (longhorn) and the RTX 5000 keep the model's
# defaults (compute.GemmModel): no published run is on them, and the seed experiment's figures use those.
CALIBRATED_DEVICES = ("V100-SXM3-32GB", "A100-SXM-80GB", "H100-SXM-80GB", "H200-SXM-141GB", "B200-SXM-180GB",
                      "B200-GB200-186GB")


def device_eff(device: DeviceSpec) -> dict[str, float] | None:
    """The device's generation figures (16-bit curve, memory-bound, FP8 curve where it has one), or None."""
    if device.name not in CALIBRATED_DEVICES or device.generation not in GENERATIONS:
        return None
    fp8 = FP8_GEMM.get(device.generation)
    return {**GENERATIONS[device.generation].values, **(fp8.values if fp8 and device.has_fp8 else {})}


def fabric_eff(name: str) -> float:
    """The efficiency of a fabric (fitted, or borrowed from the nearest fitted one: FABRICS says which)."""
    return FABRICS[name].values["eff"] if name in FABRICS else 1.0


def sources(device: DeviceSpec, intra: str = "", inter: str = "") -> dict[str, str]:
    """Where each efficiency a preset prices with came from (`paracube topologies`): "fitted on ..." or
    "NOT FITTED: borrowed from ..."; devices without figures price with the model's defaults."""
    out: dict[str, str] = {}
    gen = GENERATIONS.get(device.generation)
    if device_eff(device) is None or gen is None:
        out["gemm"] = "model defaults (eff_max 0.85, m0 64, mem_eff 0.8): no fit for this device"
    else:
        out["gemm"] = _say(gen)
        if device.has_fp8 and device.generation in FP8_GEMM:
            out["fp8 gemm"] = _say(FP8_GEMM[device.generation])
    for tier, fabric in (("intra-node", intra), ("inter-node", inter)):
        if fabric:
            out[f"{tier} {fabric}"] = _say(FABRICS[fabric]) if fabric in FABRICS else "nominal rate: no figure"
    return out


def _say(f: Figures) -> str:
    return f.source if f.fitted else f"NOT FITTED: {f.source}"


def published_calibration(device: DeviceSpec, eff: dict[str, float] | None = None) -> Calibration | None:
    """The device's GEMM / memory efficiencies (`eff`, else its generation's) as a calibration (None: none)."""
    shipped = device_eff(device)
    eff = shipped if eff is None else {**(shipped or {}), **eff}  # a fit without an FP8 curve keeps the shipped one
    if eff is None:
        return None
    from paracube.topologies.calibration import Calibration, GemmFit

    m0 = eff["m0"]
    return Calibration(gemm=GemmFit(eff_max=eff["eff_max"], m0=m0, n0=m0, k0=m0, mem_eff=eff["mem_eff"],
                                    fp8_eff_max=eff.get("fp8_eff_max"), fp8_m0=eff.get("fp8_m0")))


@dataclass(frozen=True)
class Fit:
    """Efficiencies of one cluster (a device and its two fabrics), as fitted by calibration/from_runs.py;
    a preset built with `fit=` uses them instead of the shipped figures. fp8_*: the FP8 GEMM curve (None:
    the shipped one)."""

    eff_max: float
    m0: float
    mem_eff: float
    intra: float  # NVLink / NVSwitch: fraction of the nominal rate a collective reaches
    inter: float  # InfiniBand
    fp8_eff_max: float | None = None
    fp8_m0: float | None = None

    def device(self) -> dict[str, float]:
        out = {"eff_max": self.eff_max, "m0": self.m0, "mem_eff": self.mem_eff}
        if self.fp8_eff_max is not None and self.fp8_m0 is not None:
            out.update(fp8_eff_max=self.fp8_eff_max, fp8_m0=self.fp8_m0)
        return out


# The tables as the rest of the package reads them: per device name, per fabric name.
def _devices() -> dict[str, dict[str, float]]:
    from paracube.topologies.devices import DEVICES

    return {name: eff for name, d in DEVICES.items() if (eff := device_eff(d)) is not None}


DEVICE_EFF: dict[str, dict[str, float]] = _devices()
FABRIC_EFF: dict[str, float] = {name: f.values["eff"] for name, f in FABRICS.items()}
