"""Efficiencies per device generation and per fabric, each with where it came from.

Peaks stay the spec sheets' (devices.py, rates.py). These few efficiencies, the same for every run, scale them:
- per device generation, the GEMM efficiency curve eff_max x m/(m+m0) x n/(n+m0) x k/(k+m0) (compute.GemmModel,
  m0 = n0 = k0) of the 16-bit GEMMs and, where the generation has FP8 tensor cores, one of the FP8 GEMMs
  (`fp8_eff_max`, `fp8_m0`), and the memory-bound efficiency mem_eff (fraction of HBM bandwidth the fused
  elementwise kernels, the FP8 casts and Adam reach);
- per fabric, the fraction of the nominal per-direction rate a collective reaches (NCCL bus bandwidth / link);
- per device generation, the overlap drag (OVERLAP_DRAG, cost_models/overlap_drag.py): compute seconds lost per
  second a data-parallel collective's NVLink ring runs beside it (its kernels hold SMs and HBM bandwidth);
- per device generation, the replica jitter (STRAGGLER, cost_models/stragglers.py): the step's barrier over the
  data-parallel replicas waits s sqrt(step) E[max of dp normals] for the slowest.
- per inter-node fabric, the fraction of the line rate a MoE all_to_all's cross-node flows reach (A2A_NIC,
  cost_models/moe_a2a.py), and per device generation the host's issue factor on the measured seconds per op
  (HOST_ISSUE, cost_models/host_issue.py), and the share of the a2a overlap's hidden time a run hides (A2AO_OVERLAP,
  cost_models/moe_a2a_overlap.py); they ride in a preset's calibration (gemm.a2a_eff, gemm.host_scale,
  gemm.a2ao_eff), so a refit prices a trial value by building a preset with it (efficiency_calibration.Fit).
Fitted (calibration/from_runs.py; `python benchmarks/published_runs.py --refit` re-runs the fits and prints the fit
and held-out rows; docs/fidelity.md "How the figures were fitted" keeps what each fit freed, held, tried and read):
- volta, ampere: on the dgx2-v100 and dgx-a100 rows of benchmarks/data/published_runs.csv (2026-11: eff_max and
  mem_eff at the upper ends of their ranges, 0.95 and 0.9); Ampere's overlap drag alone since (0.23).
- hopper: on the 8 dgx-h100 fit rows of benchmarks/data/published_runs_today.csv (Nemotron-4 15B bf16 / FP8 at 16
  and 128 GPUs, Nemotron-4 340B FP8 at 1024, Llama 2 7B FP8 at 16K tokens, Llama 3.1 8B bf16 cp=2, Llama 3.1 70B
  bf16 at 64): eff_max, FP8 eff_max, flash attention's fraction of the bf16 peak, mem_eff (at its bound 0.9) and
  the replica jitter free. Held: NDR at 0.85, NCCL's bus bandwidth on 400 Gb/s ConnectX-7 (freed, it absorbs
  misses elsewhere and breaks the Blackwell rows that cross NDR); m0 at 108 (freed, it goes to its bound 16 and
  the fit memorises rows); NVLink 4 at 0.874 (freed, it goes to its bound 1.0, trading fit rows against each
  other). The H200 shares the generation and its fabrics.
- blackwell: the FP8 eff_max only, on the 4 fit rows of both systems (DGX B200, GB200 NVL72); the 16-bit curve,
  mem_eff and flash are Hopper's (no 16-bit Blackwell row), NVLink 5 borrows NVLink 4's, NDR is the physical 0.85.
  Its held-out misses are structural (docs/fidelity.md: the GB200 runs 1.21-1.27x the B200's on every model).
What no run exercises is borrowed from the nearest fitted generation / fabric and flagged (`fitted=False`, or a
`note` naming the figure) with its source; `paracube topologies` prints every preset's sources (`sources`).
"""

from __future__ import annotations

from dataclasses import dataclass

from paracube.topologies.device import DeviceSpec
from paracube.topologies.devices import HOST_BWD_OP_S, HOST_ISSUE_SCALE, HOST_OP_S
from paracube.topologies.host_link import describe

RUNS = "benchmarks/data/published_runs.csv"
TODAY = "benchmarks/data/published_runs_today.csv"

# Fitted 2026-12-03 (fit6; calibration/from_runs.fit_runs, runtime megatron; benchmarks/published_runs.py --refit),
# m0 held at fit2's figure, NVLink 4 at fit5's and NDR at NCCL's physical bus bandwidth (docstring):
HOPPER_BF16_MAX, HOPPER_M0, HOPPER_MEM, HOPPER_FP8_MAX, HOPPER_FLASH = 0.704, 108.0, 0.90, 0.587, 0.344
NVLINK4, NDR = 0.874, 0.85
STRAGGLER_HOPPER = 0.014  # sqrt(s): 20 ms of jitter over a 2 s step (scale1, 2026-12-03; STRAGGLER below)
BLACKWELL_FP8_MAX = 0.520  # the B200 rows' misses have opposite signs (+2.4%, -9.8%): structural, see above


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
_HOPPER = {"eff_max": HOPPER_BF16_MAX, "m0": HOPPER_M0, "mem_eff": HOPPER_MEM, "flash_eff": HOPPER_FLASH}
_SHAPES = "one or two model shapes per dtype cannot separate it from eff_max"
GENERATIONS: dict[str, Figures] = {
    "volta": Figures(_VOLTA, f"fitted on the dgx2-v100 rows of {RUNS}", True),
    "ampere": Figures(_AMPERE, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "hopper": Figures(_HOPPER, f"fitted on the dgx-h100 rows of {TODAY}", True,
                      "m0 NOT FITTED: fit2's 108 held (freed, it goes to its bound 16 and the fit memorises rows)"),
    "blackwell": Figures(_HOPPER, "borrowed from hopper", False,
                         "no 16-bit Blackwell run in the set; mem_eff freed with fp8_eff_max went to 0.42, "
                         "compensating what the model misses on B200, so it is held at hopper's"),
}
# FP8 GEMMs (Transformer Engine, per-tensor scaling): a curve of their own at the FP8 peak.
FP8_GEMM: dict[str, Figures] = {
    "hopper": Figures({"fp8_eff_max": HOPPER_FP8_MAX, "fp8_m0": HOPPER_M0},
                      f"fitted on the dgx-h100 fp8 rows of {TODAY}", True,
                      "fp8_m0 NOT FITTED: the 16-bit curve's m0 (freed, it does not move from its start)"),
    "blackwell": Figures({"fp8_eff_max": BLACKWELL_FP8_MAX, "fp8_m0": HOPPER_M0},
                         f"fitted on the dgx-b200 and gb200-nvl72 rows of {TODAY}", True,
                         f"fp8_m0 NOT FITTED: hopper's m0 ({_SHAPES})"),
}

# Overlap drag (cost_models/overlap_drag.py): compute seconds lost per second a data-parallel collective's
# NVLink ring runs beside the compute stream. Fitted by `benchmarks/published_runs.py --refit` (2026-12, fit8):
# ampere alone (its other figures as fitted 2026-11) on the dgx-a100 fit rows: 0.252 (least squares on log
# residuals; the fit rows' mean |error| 2.4% -> 1.6%, the dp=128 rows -5.8 / -5.2 / -3.8% -> -2.2 / -0.2 / +0.7%,
# the held-out rows unchanged: their rings cross nodes one member per node or they do not overlap); refit
# 2026-12-03 (fit6) with the cross-entropy's 28 bytes a logit (compute.CE_BYTES): 0.231, shipped 0.23; hopper with
# the generation's other free figures on the dgx-h100 fit rows, blackwell with its FP8 eff_max on its fit rows:
# both go to 0 (the Megatron-core rows there show no drag: their FP8 Nemotron rows are already slow).
OVERLAP_DRAG: dict[str, Figures] = {
    "volta": Figures({"overlap_drag": 0.0}, "no run of the set overlaps a data-parallel stream on V100", False),
    "ampere": Figures({"overlap_drag": 0.23}, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "hopper": Figures({"overlap_drag": 0.0}, f"fitted on the dgx-h100 rows of {TODAY} (goes to 0)", True),
    "blackwell": Figures({"overlap_drag": 0.0},
                         f"fitted on the dgx-b200 and gb200-nvl72 rows of {TODAY} (goes to 0)", True),
}

# Per-rank jitter s (sqrt(s)) the step's barrier over the data-parallel replicas meets (cost_models/stragglers.py).
# `benchmarks/published_runs.py --refit` (scale1): hopper 0.01396; ampere 0.0015 beside a drag of 0.21 (shipped 0 and
# the drag fitted alone, 0.23); blackwell 0 on its fit rows; no V100 run has data-parallel replicas.
STRAGGLER: dict[str, Figures] = {
    "volta": Figures({"straggler": 0.0}, "no run of the set has data-parallel replicas on V100", False),
    "ampere": Figures({"straggler": 0.0}, f"fitted on the dgx-a100 rows of {RUNS} (0.0015 beside the drag, under "
                      "0.4% of any A100 step: 0 shipped)", True),
    "hopper": Figures({"straggler": STRAGGLER_HOPPER}, f"fitted on the dgx-h100 rows of {TODAY}", True),
    "blackwell": Figures({"straggler": 0.0},
                         f"fitted on the dgx-b200 and gb200-nvl72 rows of {TODAY} (goes to 0)", True),
}

FABRICS: dict[str, Figures] = {
    "nvlink2-nvswitch": Figures({"eff": 0.47}, f"fitted on the dgx2-v100 rows of {RUNS}", True),
    "nvlink3-nvswitch": Figures({"eff": 0.50}, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "hdr-ib": Figures({"eff": 0.78}, f"fitted on the dgx-a100 rows of {RUNS}", True),
    "nvlink4-nvswitch": Figures({"eff": NVLINK4}, f"fitted on the dgx-h100 rows of {TODAY} (fit5; held in fit6: "
                                "freed, it goes to its bound 1.0)", True),
    "ndr-ib": Figures({"eff": NDR}, "set to NCCL's NDR bus bandwidth (0.85 of 400 Gb/s; held in the Hopper fit "
                      f"on the dgx-h100 rows of {TODAY})", True),
}
for _name, _like in (("edr-ib", "hdr-ib"), ("xdr-ib", "ndr-ib"), ("nvlink5-nvswitch", "nvlink4-nvswitch")):
    FABRICS[_name] = Figures(FABRICS[_like].values, f"borrowed from {_like}: no run of the set uses {_name}", False)

# The fraction of a NIC's line rate an all_to_all's cross-node flows reach, on the fabric links they cross (in place
# of the fabric's ring-fitted efficiency, FABRICS; cost_models/moe_a2a.py). FITTED on ONE row, qwen3-235b-256
# (benchmarks/data/published_runs_moe.csv, Megatron-Bridge 25.09, ep=32 over 4 DGX H100 nodes, the alltoall
# dispatcher of a token-drop run); the other MoE rows are held out. `published_runs.py --refit` gives 0.911 without
# the routing weights' own all_to_all (moe_dispatch.sends_probs: 3,072 calls a step on the fit row's slowest stage,
# 143.7 us each at the fabric's (n - 1) latencies) and 0.946 with it; 0.91 is kept: above DeepEP's own 0.87-0.89 (its
# table, H800 with CX7 400 Gb/s, once its counted bytes are the remote nodes' only: moe_dispatch.py) the refit would
# only carry that small call's latency into the bandwidth of every DeepEP / HybridEP row, none of which sends it.
A2A_NIC_EFF = 0.91
_A2A_ROW = "qwen3-235b-256 of benchmarks/data/published_runs_moe.csv"
A2A_NIC: dict[str, Figures] = {"ndr-ib": Figures({"a2a_eff": A2A_NIC_EFF}, f"fitted on {_A2A_ROW} only", True)}
for _name in ("edr-ib", "hdr-ib", "xdr-ib"):
    A2A_NIC[_name] = Figures(A2A_NIC["ndr-ib"].values, f"borrowed from ndr-ib ({_A2A_ROW}): no MoE run of the set "
                             f"uses {_name}", False)

# How much slower a GPU host issues a MoE block's ops than devices.HOST_OP_S / HOST_BWD_OP_S measured
# (cost_models/host_issue.py; devices.HOST_ISSUE_SCALE says what it carries): fitted on the DGX H100's host, which
# the H200 shares; every other GPU host borrows it.
_HOST_ROW = "qwen3-30b-16-fp8 of benchmarks/data/published_runs_moe.csv"
HOST_ISSUE: dict[str, Figures] = {"hopper": Figures({"host_scale": HOST_ISSUE_SCALE}, f"fitted on {_HOST_ROW}", True)}
_BORROWED_HOST = Figures(HOST_ISSUE["hopper"].values, "borrowed from the DGX H100's host", False)

# The share of what the two-stream model of Megatron-core's a2a overlap hides (Layout `a2ao`,
# cost_models/moe_a2a_overlap.py: each micro-batch's all_to_alls beside its partner's compute, taken over a stage's
# blocks at once, a lower bound on the layer-by-layer pairing) that a run hides. FITTED on ONE row, the only published
# run with the overlap: qwen3-235b-256-fp8 (benchmarks/data/published_runs_moe.csv, Megatron-Bridge 26.04, 0.6.2's
# perf recipe: --overlap-moe-expert-parallel-comm with delayed wgrad, alltoall, ep=32 over 4 DGX H100 nodes; the
# two-stream model alone prices it -16.5%, without the overlap +30.9%; the refit gives 0.652). What it carries is not
# identified (docs/fidelity.md: the host, the layer-by-layer pairing and the overlap drag were checked and are not
# it; the kernels' contention beside the all_to_alls and the schedule's synchronisations are not priced); the other
# generations borrow Hopper's.
A2AO_EFF = 0.65
A2AO_OVERLAP: dict[str, Figures] = {
    "hopper": Figures({"a2ao_eff": A2AO_EFF}, "fitted on qwen3-235b-256-fp8 of benchmarks/data/published_runs_moe.csv",
                      True)}
_BORROWED_A2AO = Figures(A2AO_OVERLAP["hopper"].values, "borrowed from hopper: no other generation's run overlaps "
                         "its MoE all_to_alls", False)

# Devices priced with their generation's figures. The SXM2 V100 (longhorn) and the RTX 5000 keep the model's
# defaults (compute.GemmModel): no published run is on them, and the seed experiment's figures use those.
CALIBRATED_DEVICES = ("V100-SXM3-32GB", "A100-SXM-80GB", "H100-SXM-80GB", "H200-SXM-141GB", "B200-SXM-180GB",
                      "B200-GB200-186GB")


def device_eff(device: DeviceSpec) -> dict[str, float] | None:
    """The device's generation figures (16-bit curve, memory-bound, FP8 curve where it has one), or None."""
    if device.name not in CALIBRATED_DEVICES or device.generation not in GENERATIONS:
        return None
    fp8 = FP8_GEMM.get(device.generation)
    drag = OVERLAP_DRAG[device.generation].values if device.generation in OVERLAP_DRAG else {}
    jitter = STRAGGLER[device.generation].values if device.generation in STRAGGLER else {}
    host = host_figures(device.generation).values
    a2ao = a2ao_figures(device.generation).values
    return {**GENERATIONS[device.generation].values, **(fp8.values if fp8 and device.has_fp8 else {}), **drag,
            **jitter, **host, **a2ao}


def overlap_drag(device: DeviceSpec) -> float:
    """The device generation's overlap drag (OVERLAP_DRAG; 0 for devices without fitted figures)."""
    if device.name not in CALIBRATED_DEVICES or device.generation not in OVERLAP_DRAG:
        return 0.0
    return OVERLAP_DRAG[device.generation].values["overlap_drag"]


def straggler(device: DeviceSpec) -> float:
    """The device generation's per-rank jitter s (STRAGGLER; 0 for devices without fitted figures)."""
    if device.name not in CALIBRATED_DEVICES or device.generation not in STRAGGLER:
        return 0.0
    return STRAGGLER[device.generation].values["straggler"]


def fabric_eff(name: str) -> float:
    """The efficiency of a fabric (fitted, or borrowed from the nearest fitted one: FABRICS says which)."""
    return FABRICS[name].values["eff"] if name in FABRICS else 1.0


def a2a_eff(name: str) -> float | None:
    """An all_to_all's fraction of the line rate on an inter-node fabric (A2A_NIC), None for one without it."""
    return A2A_NIC[name].values["a2a_eff"] if name in A2A_NIC else None


def host_figures(generation: str) -> Figures:
    """A generation's host issue factor: its own where fitted (HOST_ISSUE), else borrowed from the DGX H100's."""
    return HOST_ISSUE.get(generation, _BORROWED_HOST)


def a2ao_figures(generation: str) -> Figures:
    """A generation's a2a-overlap share: its own where fitted (A2AO_OVERLAP), else Hopper's, borrowed."""
    return A2AO_OVERLAP.get(generation, _BORROWED_A2AO)


def a2ao_eff(device: DeviceSpec) -> float:
    """The device's a2a-overlap share (a2ao_figures of its generation)."""
    return a2ao_figures(str(getattr(device, "generation", ""))).values["a2ao_eff"]


def host_scale(device: DeviceSpec) -> float:
    """The device's host issue factor (host_figures of its generation)."""
    return host_figures(str(getattr(device, "generation", ""))).values["host_scale"]


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
        if device.generation in OVERLAP_DRAG:
            out["overlap drag"] = _say(OVERLAP_DRAG[device.generation])
        if device.generation in STRAGGLER:
            out["straggler"] = _say(STRAGGLER[device.generation])
    for tier, fabric in (("intra-node", intra), ("inter-node", inter)):
        if fabric:
            out[f"{tier} {fabric}"] = _say(FABRICS[fabric]) if fabric in FABRICS else "nominal rate: no figure"
    if inter in A2A_NIC:
        f = A2A_NIC[inter]
        out[f"all-to-all {inter}"] = f"{_say(f)} ({f.values['a2a_eff']:.2f} of the line rate, cost_models/moe_a2a.py)"
    if device.host_bandwidth > 0:  # activation offloading's link and host memory (host_link.py)
        out["host link"] = describe(device.host_bandwidth, device.host_memory_bytes)
    if device.generation in GENERATIONS and device_eff(device) is not None:  # Layout a2ao (moe_a2a_overlap.py)
        f = a2ao_figures(device.generation)
        out["a2a overlap"] = f"{_say(f)} ({f.values['a2ao_eff']:.2f} of what the two-stream model hides)"
    if device.sync_s > 0:  # the GPU's idle per host wait (cost_models/host_sync.py)
        out["host wait"] = f"NOT FITTED: {device.sync_s * 1e6:.0f} us, an estimate (devices.HOST_SYNC_S)"
        out["host issue"] = _host_issue(device.generation)
    return out


def _host_issue(generation: str) -> str:
    """Where a GPU host's seconds per op come from (HOST_ISSUE: the measured seconds per op times its factor)."""
    f = host_figures(generation)
    figure = (f"{HOST_OP_S * 1e6:.1f} us an op forward, {HOST_BWD_OP_S * 1e6:.1f} backward measured on a Xeon, x "
              f"{f.values['host_scale']:.2f} ")
    return (figure + f.source if f.fitted else f"NOT FITTED: {figure}{f.source}") + " (devices.HOST_ISSUE_SCALE)"


def _say(f: Figures) -> str:
    return (f.source if f.fitted else f"NOT FITTED: {f.source}") + (f"; {f.note}" if f.note else "")


# The tables as the rest of the package reads them: per device name, per fabric name.
def _devices() -> dict[str, dict[str, float]]:
    from paracube.topologies.devices import DEVICES

    return {name: eff for name, d in DEVICES.items() if (eff := device_eff(d)) is not None}


DEVICE_EFF: dict[str, dict[str, float]] = _devices()
FABRIC_EFF: dict[str, float] = {name: f.values["eff"] for name, f in FABRICS.items()}
