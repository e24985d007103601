"""Efficiency figures as the calibration a preset prices with: the shipped ones, or a refit's (`Fit`).

A preset on a device with fitted figures (efficiency.CALIBRATED_DEVICES) carries them as a Calibration with only
its gemm section: eff_max, m0 = n0 = k0, mem_eff, and where the generation has them fp8_eff_max / fp8_m0,
flash_eff, overlap_drag, straggler, host_scale, a2ao_eff, and the inter-node fabric's a2a_eff
(device_model.gemm_model and moe_a2a.nic_scale read them like a measured calibration's). `Fit` is one cluster's
figures as calibration/from_runs.py fits them (the device's, and its two fabrics' `intra` / `inter`
that nvswitch.py scales link rates by); a preset built with `fit=` prices with it in place of the shipped figures
(a figure the fit leaves out, an FP8 curve say, stays the shipped one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paracube.topologies.device import DeviceSpec
from paracube.topologies.efficiency import a2a_eff, device_eff

if TYPE_CHECKING:
    from paracube.topologies.calibration import Calibration


def published_calibration(device: DeviceSpec, eff: dict[str, float] | None = None,
                          inter: str = "") -> Calibration | None:
    """The device's GEMM / memory efficiencies and the `inter` fabric's all_to_all figure (`eff`, else the shipped
    ones) as a calibration (None: none)."""
    shipped = device_eff(device)
    if shipped is not None and a2a_eff(inter) is not None:
        shipped = {**shipped, "a2a_eff": a2a_eff(inter)}
    eff = shipped if eff is None else {**(shipped or {}), **eff}  # a fit without an FP8 curve keeps the shipped one
    if eff is None:
        return None
    from paracube.topologies.calibration import Calibration
    from paracube.topologies.calibration_sections import GemmFit

    m0 = eff["m0"]
    return Calibration(gemm=GemmFit(eff_max=eff["eff_max"], m0=m0, n0=m0, k0=m0, mem_eff=eff["mem_eff"],
                                    fp8_eff_max=eff.get("fp8_eff_max"), fp8_m0=eff.get("fp8_m0"),
                                    flash_eff=eff.get("flash_eff"), overlap_drag=eff.get("overlap_drag"),
                                    straggler=eff.get("straggler"), host_scale=eff.get("host_scale"),
                                    a2a_eff=eff.get("a2a_eff"), a2ao_eff=eff.get("a2ao_eff")))


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
    overlap_drag: float | None = None  # cost_models/overlap_drag.py's D (None: the shipped figure)
    straggler: float | None = None  # cost_models/stragglers.py's s (None: the shipped figure)
    host_scale: float | None = None  # cost_models/host_issue.py's factor (None: the shipped figure)
    a2a_eff: float | None = None  # cost_models/moe_a2a.py's fraction of the NIC line rate (None: the shipped one)
    a2ao_eff: float | None = None  # cost_models/moe_a2a_overlap.py's share hidden (None: the shipped one)

    def device(self) -> dict[str, float]:
        out = {"eff_max": self.eff_max, "m0": self.m0, "mem_eff": self.mem_eff}
        if self.fp8_eff_max is not None and self.fp8_m0 is not None:
            out.update(fp8_eff_max=self.fp8_eff_max, fp8_m0=self.fp8_m0)
        if self.flash_eff is not None:
            out["flash_eff"] = self.flash_eff
        if self.overlap_drag is not None:
            out["overlap_drag"] = self.overlap_drag
        for name in ("straggler", "host_scale", "a2a_eff", "a2ao_eff"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


__all__ = ["Fit", "published_calibration"]
