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
  (HOST_ISSUE, cost_models/host_issue.py); both ride in a preset's calibration (gemm.a2a_eff, gemm.host_scale), so
  a refit prices a trial value by building a preset with it (efficiency_calibration.Fit).
Fitted by `paracube calibrate --from-runs benchmarks/data/published_runs.csv` (calibration/from_runs.py; fit and
held-out rows: benchmarks/published_runs.py), 2026-11, on the A100 and V100 rows (eff_max and mem_eff end at
the upper ends of their plausible ranges, 0.95 and 0.9; with m0 ~ 330 a 4096^3 fp16 GEMM runs at 75% of peak).
Since rings cross nodes through the NICs their members own (fit3/fit4, topology.ring_channels) the A100 rows'
128-way data-parallel ring of tp=none / 2 / 4 (8, 4, 2 members per node) is NVLink-bound (150 GB/s, 8 x 19.5 GB/s
of HDR beside it) where it was NIC-bound (19.5 GB/s); the rd-dp rows go from -3.3 / -5.1 / -5.1% to -6.5 / -6.8 /
-5.8% (tp=8, one member per node: +1.0%, unchanged). The miss is not a fabric figure: refitting NVLink 3 and HDR
with channels (0.47, 0.59) leaves them at -6.4 / -6.2 / -4.5% and moves the held-out rows from 1.7% to 2.8%; a
longer network step latency (NCCL's Simple protocol, ~14 us) sends the tp=4 / tp=8 rows to +10 / +18%; 16-bit
gradients (2020 Megatron's fp16 grads) make them faster still. Measured, those three rows pay 75-80 ms over
their dp=1 rows where the tp=8 one pays 37 ms. Two model errors explained part of it (fit5, 2026-12): the overlap
model priced the queue's tail at the embedding's bucket alone where the last block's gradients and the bucket it
completes leave with it (grad_overlap.py, modes/buckets.release_counts), and the tensor-parallel collectives of
the last backward ran as if the dp ring's NVLink hops were not beside them (cost_models/contention.py). With
both the rows are -5.8 / -5.2 / -3.8%; tp=none (no tensor collective) keeps most of its miss. Figures kept as
fitted (2026-11); the channel split is what NCCL does.
Hopper and Blackwell (2026-12): calibration/from_runs.fit_runs (runtime megatron) on the fit rows of
benchmarks/data/published_runs_today.csv (`python benchmarks/published_runs.py --refit` re-runs both fits):
- hopper, on 8 DGX H100 rows (Nemotron-4 15B bf16 and FP8 at 16 and 128 GPUs, Nemotron-4 340B FP8 at 1024,
  Llama 2 7B FP8 at 16K tokens, Llama 3.1 8B bf16 cp=2 on one node, Llama 3.1 70B bf16 at 64 GPUs), with each
  row's gradient element (grad_reduce) and Megatron-core's 16-bit parameter all-gather priced. NDR is not fitted:
  it is held at 0.85, NCCL's bus bandwidth on 400 Gb/s ConnectX-7 (nccl-tests all_reduce on DGX H100 SuperPODs
  reaches ~42-45 GB/s per NIC of the 50 nominal, 0.85-0.9). Freed, it absorbed what the model missed elsewhere:
  0.46 (fit2, rings crossing nodes through one NIC) and 0.42 (fit3), which made the Blackwell rows that cross
  NDR with a wide dp ring wrong (b200-n4-340B +40%). Free (fit5, 2026-12, after the overlap tail and the
  tensor / data-parallel link sharing were priced): the 16-bit eff_max 0.690, the FP8 eff_max 0.629 (at the
  16-bit curve's m0, so that no FP8 GEMM runs slower than its bf16 copy), flash attention's fraction of the
  16-bit peak 0.347 (compute.attention_core_time: the long-sequence rows fix it), NVLink 4 at 0.874, and mem_eff
  (0.9, its bound). m0 stays at fit2's 108: freed it goes to its bound 16 (the fit then memorises rows; held-out
  3.1% either way). The H200 shares the generation and its fabrics.
  Refit 2026-12-03 (fit6) once zero=1's FP8 parameter gather (fp8.gathered_fraction), Transformer Engine's fused
  FP8 casts (fp8.TE_CASTS: 4 bytes a cast with delayed scaling, less where the norm / activation writes FP8) and
  the fp32 cross-entropy's passes (compute.CE_BYTES, 28 bytes a logit, was 12) are priced: eff_max 0.694, FP8
  eff_max 0.572, flash 0.348, mem_eff 0.9 (bound); NVLink 4 held at fit5's 0.874: freed, it goes to its bound
  1.0 (with the FP8 gather priced, with or without the other two), trading the Nemotron-4 15B FP8 fit rows (+3 /
  +4%, too slow) against the 340B FP8 one (-4%, too fast); a link figure does not explain that. The 340B FP8
  rows' miss grows with dp (-0.8% at dp=2 to -8.0% at dp=32: measured +0.33 s, predicted +0.08 s; the bf16 cp=2
  rows -1.3% to -5.5%), where the Llama 3.1 405B FP8 rows at the same tp=8 are +7..+9% (too slow). Tried and
  not shipped (bw9, measured before the refit): NCCL's tuning-model ring latencies (src/graph/tuning.cc: 14 us a
  network step) as the NIC latency of every collective take b200-n4-15B from -19% to -1%, but the A100 dp=128
  all_reduce rows to +8..+81% (their ring of 128); added to the zero=1 reduce-scatters and gathers alone (8.4 us
  a call, 3.4 / 14 us an NVLink / network step) they made rows faster through the overlap formulas (not
  understood); 1D GEMMs split into t chunks of m / t rows (340B FP8 to -5..+2%, but its bf16 rows +11..+16%, the
  405B's +7..+12%, the A100 pipelines' up to +30%); TE's amax all_reduce at every fp8_autocast exit (fp8.py:
  0.4-0.7 points); after it, TE's FP8 userbuffers for the tpo all-gathers (1 byte an element: Nemotron-4 15B FP8 -2.4
  points, 340B -0.8, 405B -1.0; H100 fit 2.6 / 4.2% -> 2.3 / 5.0%, Blackwell held out 11.4 -> 12.1%).
- blackwell, on 4 FP8 rows of both systems (DGX B200 and GB200 NVL72: Llama 3 8B on 8 GPUs, GPT-3 175B on 512 /
  128): the FP8 eff_max only, 0.557 at Hopper's m0 (fit6, 2026-12-03, with the FP8 gather, casts and
  cross-entropy above: 0.520) (freeing flash_eff and NVLink 5 too sends it to its bound
  0.95 and flash to 0.20). The misses are structural: on one node the GB200 runs Llama 3 8B 27% faster than the
  B200 where the datasheet peaks differ by 11% (a newer NeMo, 25.04 vs 25.02, and a 1200 W power limit). The
  rows whose step is a 64-way data-parallel ring with 8 members per node (Nemotron-4 15B, tp=none) are 13-21%
  fast, as the A100 dp=128 tp=none row is: the exposed part of a wide NVLink-bound gradient ring is larger than
  the overlap model gives. The 16-bit curve, mem_eff and flash_eff are Hopper's (no 16-bit Blackwell row),
  NVLink 5 borrows NVLink 4's figure and NDR is the physical 0.85.
  The held-out rows, read with benchmarks/step_breakdown.py (2026-12, bw8; datasheet peaks rechecked: dense, per
  GPU): the same Nemotron-4 340B layout (dp=4, pp=4, tp=8, v=12) is measured 1.22x slower on the B200 than on the
  GB200 and predicted 1.47x. Compute differs by the peaks' 1.10 (1.145 vs 1.043 s); the rest is the B200's dp ring,
  one member per node over NDR (0.777 s, 0.566 s of it exposed) where the GB200's stays in NVLink 5 (0.043 s): NDR
  is 0.30 of the B200 step, NVLink 5 0.06 of the GB200's. Measured, every same-layout pair is 1.21-1.27x apart (Llama
  3 8B on one node, Nemotron-4 15B dp=64 inside NVLink, the 340B across NDR), as if the B200's NDR traffic were
  hidden and the device itself were 1.2x slower, not the peaks' 1.11x (1000 W vs 1200 W, NeMo 25.02 vs 25.04):
  neither a generation figure nor NVLink 5's can move the two rows apart the other way. Pricing the FP8 parameter
  all-gather Megatron-core runs (fp8.gathered_fraction, since fit6) takes b200-n4-340B from +2.9% to -7.8% and the
  H100 340B FP8 rows from -2..-7% to -4..-11%, gb200-n4-340B -14.2 to -14.9% (before fit6's other changes and
  refit: after them +2.9 -> -6.4%, -14.2 -> -13.6%): the 340B steps' compute is predicted too fast. Share of
  the step per figure (step_breakdown.py): FP8 GEMMs 0.69-0.70 on GPT-3 175B (the fit rows that hold
  BLACKWELL_FP8_MAX), 0.50-0.66 on the others, where flash attention (0.13-0.28), memory-bound work (0.15-0.17)
  and the bf16 head (0.06-0.12) are Hopper's fractions: a slower non-FP8 part on Blackwell would slow the held-out
  rows more than the 175B ones, but no fit row separates it (freed, mem_eff goes to 0.42, flash_eff to 0.20).
  By model, not by device: on the GB200 the Nemotron-4 rows are 16-19 points below GPT-3 175B and Llama 3 8B
  (-14.1 / -14.2% vs +1.8 / +4.8%), on the B200 the 15B row 11-24 points (-21.3% vs -10.1 / +2.3%; the 340B's
  exposed NDR ring covers it there); the 15B rows stay -11.6 / -9.6% with no gradient overlap at all, so no
  collective explains them, and one FP8 figure per device would trade the fit rows against them.
  Checked again after fit6 (bw1, 2026-12-03; nothing shipped). At equal tokens per GPU and step (n4-15B-fp8-16,
  l31-8B-fp8-8, n4-340B-fp8-128 against the Blackwell rows of those models) B200 is measured 1.84 / 1.87 / 1.86x
  the H100, 0.81-0.82 of the FP8 peaks' 2.27 on three models and layouts, GB200 2.22 / 2.38 / 2.27x (0.88-0.94 of
  2.53); priced 2.39 / 2.23 / 1.97x and 2.64 / 2.44 / 2.61x. With the dp stream hidden nowhere (no gradient and no
  gather overlap) b200 / gb200-n4-15B price -2.4 / -4.9%, but the 340B +13.9 / -11.9% and GPT-3 175B +7.1 / +6.5%.
  NCCL's ring latencies (8.4 us a call, 3.4 / 14 us an NVLink / network step; by hand, not priced) add ~0.3 ms to
  each of the 15B row's 131 bucket calls, ~0.04 s a pass: on the B200 the gathers (0.087 s priced) then still fit
  in the first forward (0.145 s) and the reduce-scatters in the last backward. FP8 m0 512 with eff_max refit
  (0.609): the fit rows +3.0 / -10.4 / +2.1 / +4.1%, the Nemotron rows -21.2 / -5.3 / -14.1 / -12.3%; flash_eff
  freed with it (0.297, FP8 0.539): -19.9 / -7.5 / -12.8 / -14.7%. NVLink 5 at 0.6: gb200-n4-340B -8.3%, the 15B
  rows unchanged. Overlap drag 0.23 (Ampere's): b200 / gb200-n4-15B -16.5 / -11.0%. Nemotron's encoding moves the
  bytes it should (by hand: squared ReLU on f and a gated MLP on 2f/3 each move ~18-19 f bytes a token through
  activation, casts and operand reads; the 256k-vocabulary cross-entropy is 16 ms of the 15B B200 step).
  gb200-n4-340B and gb200-gpt3-175B price with nearly one mix of figures (FP8 0.69 / 0.76, memory 0.08 / 0.09,
  flash 0.07 / 0.04, bf16 0.06 / 0.02) and miss by -13.6 / +1.5%: no generation figure can separate them.
Scale (scale1, 2026-12-03): the step's wait for the slowest data-parallel replica priced (cost_models/stragglers.py,
whose docstring gives the weak-scaling series' growth and what else was checked); Hopper refit with it on its fit
rows: s 0.014 (STRAGGLER), eff_max 0.704, FP8 eff_max 0.587, flash 0.344 (mem_eff at its bound).
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
    return {**GENERATIONS[device.generation].values, **(fp8.values if fp8 and device.has_fp8 else {}), **drag,
            **jitter, **host}


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
