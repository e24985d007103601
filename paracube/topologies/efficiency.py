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
Hopper and Blackwell (2026-12): calibration/from_runs.fit_runs (runtime megatron) on the fit rows of
benchmarks/data/published_runs_today.csv (`python benchmarks/published_runs.py --refit` re-runs both fits):
- hopper, on 6 DGX H100 rows (Nemotron-4 15B bf16 and FP8 at 16 and 128 GPUs, Nemotron-4 340B FP8 at 1024,
  Llama 2 7B FP8 at 16K tokens): the 16-bit eff_max, mem_eff, the FP8 curve's eff_max, flash attention's
  fraction of the 16-bit peak (`flash_eff`, compute.attention_core_time: the long-sequence row fixes it), and
  the NVLink 4 and NDR efficiencies (both end at their bound 1.0, mem_eff at 0.9: see NVLINK4); both curves'
  m0 stay ampere's (one or two shapes per dtype cannot separate
  m0 from eff_max; freed, the FP8 m0 did not move). The H200 shares the generation and its fabrics.
- blackwell, on 2 DGX B200 FP8 rows (Llama 3 8B on 8 GPUs, GPT-3 175B on 512): the FP8 eff_max only, 0.71;
  the misses are structural (GPT-3 with TP4 PP4 is predicted 14% slow, Llama 3 8B on data parallelism alone
  14% fast; the GB200 rows, on a newer NeMo and a higher power limit, run faster still). The 16-bit curve,
  mem_eff and flash_eff are Hopper's (freeing mem_eff too sends it to an implausible 0.42), NVLink 5 borrows
  NVLink 4's figure and NDR is Hopper's fit.
What no run exercises is borrowed from the nearest fitted generation / fabric and flagged (`fitted=False`, or a
`note` naming the figure) with its source; `paracube topologies` prints every preset's sources (`sources`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paracube.topologies.device import DeviceSpec

if TYPE_CHECKING:
    from paracube.topologies.calibration import Calibration

RUNS = "benchmarks/data/published_runs.csv"
TODAY = "benchmarks/data/published_runs_today.csv"

# Fitted 2026-12 (calibration/from_runs.fit_runs, runtime megatron; benchmarks/published_runs.py --refit):
HOPPER_BF16_MAX, HOPPER_MEM, HOPPER_FP8_MAX, HOPPER_FLASH = 0.766, 0.90, 0.784, 0.307
# Both fabrics end at their upper bound 1.0 (and mem_eff at 0.9): the fit credits these recipes' collectives at
# the nominal rate, absorbing what the model exposes of them (TE's userbuffers overlap, FP8 all-gathers).
NVLINK4, NDR = 1.0, 1.0
BLACKWELL_FP8_MAX = 0.709  # the two B200 rows' misses have opposite signs (+14%, -14%): structural, see above


@dataclass(frozen=True)
class Figures:
    """Efficiency figures and where they came from: fitted on runs, or borrowed (flagged) from another one.
    `note`: a figure of the group the runs did not exercise and where it was taken from."""

    values: dict[str, float]
    source: str
    fitted: bool
    note: str = ""


_VOLTA = {"eff_max": 0.95, "m0": 171.0, "mem_eff": 0.90}
_AMPERE = {"eff_max": 0.95, "m0": 332.0, "mem_eff": 0.90}
_HOPPER = {"eff_max": HOPPER_BF16_MAX, "m0": _AMPERE["m0"], "mem_eff": HOPPER_MEM, "flash_eff": HOPPER_FLASH}
_SHAPES = "one or two model shapes per dtype cannot separate it from eff_max"
GENERATIONS: dict[str, Figures] = {
    "volta": Figures(_VOLTA, f"fitted on the dgx2-v100 rows of {RUNS}", True),
    "ampere": Figures(_AMPERE, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "hopper": Figures(_HOPPER, f"fitted on the dgx-h100 rows of {TODAY}", True,
                      f"m0 NOT FITTED: borrowed from ampere ({_SHAPES})"),
    "blackwell": Figures(_HOPPER, "borrowed from hopper", False,
                         "no 16-bit Blackwell run in the set; mem_eff freed with fp8_eff_max went to 0.42, "
                         "compensating what the model misses on B200, so it is held at hopper's"),
}
# FP8 GEMMs (Transformer Engine, per-tensor scaling): a curve of their own at the FP8 peak.
FP8_GEMM: dict[str, Figures] = {
    "hopper": Figures({"fp8_eff_max": HOPPER_FP8_MAX, "fp8_m0": _AMPERE["m0"]},
                      f"fitted on the dgx-h100 fp8 rows of {TODAY}", True,
                      f"fp8_m0 NOT FITTED: ampere's m0 (freed, the fit left it there: {_SHAPES})"),
    "blackwell": Figures({"fp8_eff_max": BLACKWELL_FP8_MAX, "fp8_m0": _AMPERE["m0"]},
                         f"fitted on the dgx-b200 rows of {TODAY}", True,
                         f"fp8_m0 NOT FITTED: ampere's m0 ({_SHAPES})"),
}

FABRICS: dict[str, Figures] = {
    "nvlink2-nvswitch": Figures({"eff": 0.47}, f"fitted on the dgx2-v100 rows of {RUNS}", True),
    "nvlink3-nvswitch": Figures({"eff": 0.50}, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "hdr-ib": Figures({"eff": 0.78}, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "nvlink4-nvswitch": Figures({"eff": NVLINK4}, f"fitted on the dgx-h100 rows of {TODAY}", True),
    "ndr-ib": Figures({"eff": NDR}, f"fitted on the dgx-h100 rows of {TODAY}", True),
}
for _name, _like in (("edr-ib", "hdr-ib"), ("xdr-ib", "ndr-ib"), ("nvlink5-nvswitch", "nvlink4-nvswitch")):
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
    return (f.source if f.fitted else f"NOT FITTED: {f.source}") + (f"; {f.note}" if f.note else "")


def published_calibration(device: DeviceSpec, eff: dict[str, float] | None = None) -> Calibration | None:
    """The device's GEMM / memory efficiencies (`eff`, else its generation's) as a calibration (None: none)."""
    shipped = device_eff(device)
    eff = shipped if eff is None else {**(shipped or {}), **eff}  # a fit without an FP8 curve keeps the shipped one
    if eff is None:
        return None
    from paracube.topologies.calibration import Calibration, GemmFit

    m0 = eff["m0"]
    return Calibration(gemm=GemmFit(eff_max=eff["eff_max"], m0=m0, n0=m0, k0=m0, mem_eff=eff["mem_eff"],
                                    fp8_eff_max=eff.get("fp8_eff_max"), fp8_m0=eff.get("fp8_m0"),
                                    flash_eff=eff.get("flash_eff")))


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
    flash_eff: float | None = None  # fused attention's fraction of the 16-bit peak (None: the shipped figure)

    def device(self) -> dict[str, float]:
        out = {"eff_max": self.eff_max, "m0": self.m0, "mem_eff": self.mem_eff}
        if self.fp8_eff_max is not None and self.fp8_m0 is not None:
            out.update(fp8_eff_max=self.fp8_eff_max, fp8_m0=self.fp8_m0)
        if self.flash_eff is not None:
            out["flash_eff"] = self.flash_eff
        return out


# The tables as the rest of the package reads them: per device name, per fabric name.
def _devices() -> dict[str, dict[str, float]]:
    from paracube.topologies.devices import DEVICES

    return {name: eff for name, d in DEVICES.items() if (eff := device_eff(d)) is not None}


DEVICE_EFF: dict[str, dict[str, float]] = _devices()
FABRIC_EFF: dict[str, float] = {name: f.values["eff"] for name, f in FABRICS.items()}
