"""Predicted vs measured step time on the published runs of docs/published-runs.md, by device generation.

Rows (every row's residual is printed, fit and held-out rows apart, grouped V100, A100, H100, H200, B200/GB200):
- benchmarks/data/published_runs.csv: Narayanan et al. 2021 table 1 (step time = F / (GPUs x TFLOP/s)) and the
  Megatron-LM README 2020 tables on DGX A100 / DGX-2. Each row's TP/PP/DP pinned, sequence parallelism forbidden,
  Megatron's unfused attention pinned (`fa=0`: those runs predate flash attention), recomputation as run;
  micro-batch and interleaving the planner's choice. Assumption: the data-parallel all-reduce overlaps the last
  micro-batch's backward (`overlap`; the sources do not say).
- benchmarks/data/published_runs_today.csv (docs/published-runs.md sections 3, 5, 6, 7): DGX H100 recipes (NeMo
  24.12 / Megatron-core: distributed optimizer zero=1, sp, TP-comm overlap, flash attention, bf16 and FP8),
  Blackwell (NeMo 25.02 DGX-B200, 25.04 GB200 NVL72, FP8; step = GBS x seq / (tokens/s/GPU x GPUs)), the
  H200 torchtitan FSDP rows, NeMo's long-sequence sweep (Llama 2 7B FP8; step = NeMo's llama2 FLOP count /
  (GPUs x model TFLOP/s)). Nemotron-4's squared-ReLU MLP (ffn f, 2 matrices) is the FLOP-equivalent gated
  llama MLP of ffn 2f/3 (3 matrices). Megatron-core rows price Megatron-core's own gradient bucket
  (grad_bucket=mcore: max(40M, 1M x dp x cp) elements; calibration/runs_csv.py).
- benchmarks/data/published_runs_fsdp.csv: torchtitan FSDP2 on 64 A100 (held out, not fitted). Its `selective` rows
  and the H200 ones are torchtitan's per-op selective AC, priced by that runtime's rule (Runtime.selective "op",
  cost_models/recompute.py); the Llama 3 8B row is the source's "selective op AC" figure (2973 tokens/s/GPU; its
  "selective layer AC" 2904 is a mode torchtitan 0.3.0 no longer has). The H200 rows ran torchao's tensorwise
  recipe with float8 FSDP all-gather (the only recipe that has it); the runtime declares 0.3.0's rowwise without it:
  pricing the FP8 gather would halve the gathered bytes and drop the per-use weight casts, a faster step, so it is
  not their miss. Every torchtitan FSDP row's measured step lies between the model's prefetched step (all too fast,
  -6% to -24%) and its step with every gather and reduce-scatter in line (+4% to +9% on A100, -2% on H200): the
  FSDP2 collectives hide less than fsdp_overlap.py's recursion gives (on H200, none). Two parts are priced: the
  overlap drag (cost_models/overlap_drag.py: compute beside a data-parallel NVLink ring slowed, D per generation
  fitted on the fit rows; Ampere's D = 0.25 takes these rows from -6 / -8 / -14 / -24% to -3 / -5 / -10 / -17%)
  and FSDP2's copy-out / copy-in kernels on the compute stream (cost_models/fsdp_copies.py: to -1 / -3 / -7 /
  -12.5%; H200 -14 / -15% to -12 / -14%). Hopper's and Blackwell's refits send D to 0 (their Megatron-core fit
  rows show none), so the H200 rows and the B200 / GB200 wide data-parallel rows keep most of their miss. Since
  fit6 (2026-12-03: the cross-entropy's fp32 passes priced, compute.CE_BYTES; Ampere's D refit to 0.23; Hopper's
  FP8 eff_max to 0.572) the A100 rows are -0.9 / -2.8 / -7.5 / -13.1%, the H200 ones -7.5 / -9.1%.
  The H200 runs compiled (torch.compile, docs/published-runs.md), so their FP8 casts are fused as fp8.py prices
  dynamic scaling's (6 bytes per element). Their step (step_breakdown.py, fit6): FP8 GEMMs 0.51, flash attention
  0.26 (Hopper's 0.348 of the bf16 peak, fitted on Megatron-core's cuDNN attention), memory-bound 0.16, bf16 0.06;
  torchtitan runs attention through PyTorch's SDPA (0.3.0 puts cuDNN first; the 2025-06 run's backend is not
  stated): at 0.23 of the peak (FlashAttention-2's range on H100) the rows would be +4.7 / +2.9%. Not priced: no
  fit row runs SDPA's attention on Hopper.
- benchmarks/data/published_runs_moe.csv (docs/published-runs.md section 4, and section 5's Mixtral 8x7B):
  Megatron-Bridge MoE runs on DGX H100 and NeMo's Mixtral 8x7B on DGX-B200 / GB200 NVL72 (held out; never in
  published_runs_today.csv, whose rows are dense shapes; NeMo 2.2's MixtralConfig: alltoall dispatcher, dropless, no
  recomputation set). Step = GBS x seq / (tokens/s/GPU x GPUs), the presets' shapes, routing force-balanced as run,
  Megatron-core's bucket, NeMo's grad_reduce convention (bf16 with fp8, else fp32) unless the recipe says otherwise.
  GPT-OSS-120B (26.04, bf16, 64 GPUs; the gpt-oss-120b preset: 128-key windows in every other block, priced by
  cost_models/attention_window.py) runs its recipe (Megatron-Bridge 0.6.2 recipes/gpt_oss/h100/gpt_oss.py and
  perf_recipes/gpt_oss/h100/gpt_oss.py: PP 4 without VP (`v=1` pinned: the MoE search interleaves), EP 8, the
  alltoall dispatcher, selective recomputation of
  recompute_modules ["layernorm", "moe_act"], Layout rcm=layernorm+moe_act priced by
  cost_models/recompute_modules_cost.py: the pre-MLP norm's output and the experts' activation re-made, the attention
  core kept; the input norm runs inside linear_qkv, Transformer Engine's LayerNormLinear, and is no module to
  recompute, Runtime.fused_norms), gradients reduced in bf16 (the performance scripts' get_precision_config),
  dropless. It prices -35.2% (9.132 s against 14.10, 52.03 GiB per GPU; tefuse 2026-12-03: 9.143 s and 51.24 GiB
  when both norms were priced as re-made, every other row unchanged; rcm 2026-12-03: before, assumed rc=none on
  DeepEP, 8.910 s, -36.8%; the alltoall dispatcher alone 9.050 s, the modules alone 9.003 s; rc=selective's core_attn
  instead 9.261 s, full recomputation 11.231 s; each stage priced with its own 9 blocks, 4 or 5 of them windowed:
  cost_models/window_stages.py), a held-out miss not read yet. Every other MoE row unchanged by rcm (before -> after:
  qwen3-235b-256 +0.3 -> +0.3% (fit), qwen3-30b-16 +0.6 -> +0.6%, deepseek-v3-1024 +16.0 -> +16.0%,
  qwen3-30b-16-fp8 -35.8 -> -35.8%, qwen3-235b-256-fp8 -18.4 -> -18.4%, Mixtral -2.4 -> -2.4% (B200), -10.2 -> -10.2%
  (GB200)).
  The preset is GPT-OSS exactly
  (gpt_oss_spec.py): its 40.1M bias and sink parameters are priced as parameters, gradients (their reduction) and
  optimizer state (8.913452 -> 8.913518 s, 55.962 -> 55.974 GiB per GPU when they were added); their elementwise work
  is not priced apart: the sink column (one more score per softmax row; megatron-core's softmax_type "learnable", in
  whichever attention kernel Transformer Engine picks, not visible here), the bias adds and the clamped SwiGLU
  (megatron-core fuses the clamped gate, weighted_bias_quick_geglu_impl) move no bytes the priced passes do not;
  its 64-wide heads run at the flash_eff fitted on 128-wide ones. What each run ran, where a recipe states it
  (Megatron-Bridge 0.6.2's flat perf recipes, perf_recipes/qwen/h100/qwen3_moe.py, whose FP8 Qwen3 configs have the
  26.04 rows' GBS and layouts; the 25.09 rows' configs are not in any released package): the 26.04 FP8 rows ran no
  recomputation, Qwen3-30B on HybridEP (flex backend `hybridep`: DeepEP's bytes, its kernels permute) without the
  a2a overlap,
  Qwen3-235B on the alltoall dispatcher with --overlap-moe-expert-parallel-comm (layout `a2ao`); DeepSeek-V3's recipe
  reduces gradients in bf16 (grad_reduce_in_fp32=False from 0.1.0rc4 on). The 25.09 rows keep selective recomputation
  (assumed) and the runtime's dispatcher (megatron: DeepEP, Runtime.moe_dispatch) except on the "tokendrop" rows
  (capacity_factor 1.0: alltoall, DeepEP refuses padding to capacity; cost_models/moe_dispatch.py); the `dispatcher`
  column names a row's own. DeepSeek-V3's node-limited routing (4 of 8 groups) from its preset. Two MoE figures are
  fitted, each on one row (split `fit`): the all-to-all's NIC efficiency (cost_models/moe_a2a.A2A_NIC_EFF) on
  qwen3-235b-256 (an alltoall row), the GPU host's issue factor (devices.HOST_ISSUE_SCALE) on qwen3-30b-16-fp8 (below);
  the other rows are held out. The block's token moves follow the dispatcher (moe_passes.py: DeepEP
  permutes the tokens that arrived, without alltoall's sort; HybridEP's kernels permute and pad): deepseek-v3-1024
  +22.5 -> +20.5%; FP8 experts copy their tokens into TE's quantization padding and back (moe_passes.fp8_padded; -26.9
  -> -23.2% and -8.1 -> -5.5% on the FP8 rows as first priced). The 25.09 Qwen3 rows reduce gradients in bf16:
  Megatron-Bridge 0.1.0rc4's recipes set grad_reduce_in_fp32=False on the precision config they are given
  (recipes/qwen/qwen3_30b_a3b.py:175, qwen3_235b_a22b.py:172), which MixedPrecisionConfig.setup writes over the ddp
  config's True (training/mixed_precision.py:90-133, config.py:1120); 0.6.2's _perf_precision says the performance
  scripts' get_precision_config always sets it False (perf_recipes/_common.py:90-110). qwen3-30b-16 (pp 2 x v 24,
  mb 2, edp 1: the experts' optimizer state unsharded, as Megatron-core's expert-data-parallel group of one holds it)
  prices 79.2 GiB of 80 under core-attention-only recomputation (parameters 4.8, gradients 4.8, optimizer 21.3,
  activations 41.2 over 49 in-flight chunk micro-batches, temporaries 7.0 of the last stage's logits); it was refused
  at 86.3 GiB with fp32 gradients (9.7) and the wide-head attention's optimizer state counted unsharded (23.6; moe.py).
  It prices -1.9% (qwen3-235b-256 -0.2 -> -0.3%: refit_moe gave 0.896, the shipped 0.90 stood); full
  recomputation, 0.1.0rc4's recipe default, needs 40.9 GiB and prices +24.1%. moe12 (2026-12-03) priced three pieces
  as Megatron-core runs them, each general: DeepEP / HybridEP calls pay one route latency, not (n - 1) (one kernel to
  every peer at once, moe_a2a.py); selective recomputation re-runs the attention core at its true head widths
  (attention_correction.delta_again: MLA's 192 / 128, Qwen3's 128 against the dense part's hidden / heads); each
  stage's blocks take their own MLP width (mlp_delta.py: DeepSeek-V3's shared expert 2048, not the 2816-wide mean, and
  no 128-wide stand-in where a block has no shared expert). Refit on the fit row: A2A_NIC_EFF 0.911 (shipped 0.91).
  Rows before -> after: qwen3-235b-256 -0.3 -> +0.1% (fit), qwen3-30b-16 -1.9 -> +0.3%, deepseek-v3-1024 +20.4 ->
  +15.7%, qwen3-30b-16-fp8 -35.0 -> -39.0%, qwen3-235b-256-fp8 -16.2 -> -17.0%, Mixtral -1.9 -> -2.2% (B200), -9.7 ->
  -10.3% (GB200); every dense row unchanged. Since the Hopper refit beside the replica jitter
  (cost_models/stragglers.py, scale1) and the host issue (host_issue.py, moe11): qwen3-235b-256 +0.3% (fit),
  qwen3-30b-16 +0.6%, deepseek-v3-1024 +16.0%, qwen3-30b-16-fp8 -34.9%, qwen3-235b-256-fp8 -17.0%, Mixtral -2.2%
  (B200), -10.2% (GB200). qn2 (2026-12-03) prices Qwen3's attention at its true widths everywhere (cost_models/dims.py:
  qkv [h, q + 2 kv], proj [q, h] in the dense engines' GEMMs, parameters, gradient buckets and tensor collectives, the
  q / k norms' gammas and their gradient sum; before, the width difference was a compute and memory correction whose
  gradients were never reduced, its GEMMs on the bf16 curve with FP8) and no longer charges the dense buckets' exposed
  tail twice beside the expert gradients (moe_step.py): qwen3-235b-256 27.304 -> 27.296 s (+0.3%, fit), qwen3-30b-16
  12.562 -> 12.563 s (+0.6%; +23.6% under full recomputation), qwen3-30b-16-fp8 -34.9 -> -35.8% (the wide linears'
  FP8 GEMMs: compute 14.47 -> 14.21 s), qwen3-235b-256-fp8 -17.0 -> -18.4%, gpt-oss-120b-64 8.913 -> 8.910 s
  (-36.8%), Mixtral -2.2 -> -2.4% (B200), GB200 unchanged (-10.2%); every dense row unchanged. Readings of the
  held-out misses (step_breakdown.py). Dropless blocks idle the GPU while their host waits for the expert counts
  (cost_models/host_sync.py, Runtime.moe_host_sync, 50 us a wait, NOT FITTED): +0.1 to +0.6 points on these rows.
  qwen3-30b-16-fp8 (-35.8%) is not FP8's GEMMs (in bf16 this layout prices 20.0 s, -32.2%); its all_to_alls price at
  DeepEP's own rate (0.91 of the line rate, one route latency a call); it missed 3.7 ms per block and micro-batch (9.6
  measured, 5.8 priced), about 75 host waits' worth. Between two waits the GPU runs no faster than its host issues the
  block's ops (cost_models/host_issue.py, moe11; the recipe keeps cuda_graph_impl "none", the later recipes' CUDA
  graphs of attn / moe_router / moe_preprocess and full-iteration graphs target it): Megatron-core's layer issues 145
  + 12 x 8 = 241 aten ops a block forward and 329 backward (benchmarks/host_ops.py), at 10 / 5.6 us an op
  (devices.HOST_OP_S, measured on a Xeon, NOT FITTED) 2.41 ms forward against about 2.1 ms of priced GPU work: -39.0
  -> -35.1% (before moe12's one-latency DeepEP calls: 2.26 ms of GPU work, -35.0 -> -33.4%); its backward (1.84 ms of
  host, 3.5 of GPU) and every other row's blocks are GPU-bound (the capacity-padded rows do not wait; a dense block's
  91 + 147 ops, 1.7 ms, are at most 0.32 of any dense row's GPU block). The count leaves out each kernel's CUDA
  launch, the ep = 16 dispatcher's own ops (the row runs HybridEP, whose kernels permute), Transformer Engine's
  per-module Python and FP8 current scaling's amax and cast per GEMM input (its fused norms, rotary and SwiGLU issue
  fewer ops than the count's); and each wait also lasts until the slowest of the 16 peers has issued its dispatch
  (HybridEP exchanges the counts first: host_sync.py). host (2026-12-03) fits what a GPU host adds as ONE factor on the
  measured seconds per op, devices.HOST_ISSUE_SCALE, on this row, which becomes the second MoE fit row (split `fit`;
  `--refit`: 2.144, shipped 2.14; the row -35.8 -> -0.2%): 21 us an op forward, 12 backward. Held out: gpt-oss-120b-64
  (bf16, 16 local experts, pp 4, the alltoall dispatcher; its blocks now host-bound too) -35.2 -> -0.4%, once its
  experts' biases issue their own ops (Runtime.moe_host_ops bias: TEGroupedMLP._apply_bias weights fc2's bias per
  token expert by expert, 5 + 2 L forward and 4 + 7 L backward, benchmarks/host_ops.py --bias; without them -11.9%).
  Fitted on gpt-oss-120b-64 instead, the factor is 2.15 and this row +0.3%; an added launch per op instead of a
  factor, 8.5 us fitted here, gives gpt-oss +0.6%. The token-drop rows (qwen3-30b-16, qwen3-235b-256) never wait;
  deepseek-v3-1024 and qwen3-235b-256-fp8 (4 local experts) and the Mixtral rows (1) stay GPU-bound: unchanged, as
  every dense row. Then each pipeline stage's expert gradients from its own last backward (moe_step.py: the slow
  stage's run while earlier stages drain; the analytic engine had added them after the whole drain, up to 10% above
  the event engine on few long micro-batches): deepseek-v3-1024 +16.0 -> +15.9%, gpt-oss-120b-64 -0.4 -> -0.3%.
  qwen3-235b-256-fp8 (-18.4%) prices all_to_all-bound combined steps
  (moe_a2a_overlap.py; +28.6% without `a2ao`): the measured step needs its all_to_alls 27% slower (A2A_NIC_EFF 0.72 on
  this row alone; one layer's combined 1F1B streams scheduled by hand, dependencies included, take 9.8 ms against the
  model's 10.2), i.e. the overlapped all_to_alls run slower than alone, or hide 0.64 of what the model hides (no
  independently sourced figure found: overlap_drag.py's Hopper drag is 0, moe_contention.py needs edp > 1, the
  SM share s only slows the partner's compute, which is not this row's bound). deepseek-v3-1024 (+15.7%): its priced
  compute (19.8 s: per MoE block and micro-batch 17.8 ms, of which the MLA core 4.9 at flash_eff 0.348 with its
  selective re-run, the routed experts' GEMMs 6.8 at 0.63-0.65 of the peak, their memory-bound passes 1.0) plus its
  all_to_alls (9.3 s at 0.91 of the line rate, DeepEP's own EP64 rate) and the tp / pp / bubble (1.6 s) exceed the
  measured 25.3 s; no A2A_NIC_EFF meets it (even 1.5), so the run hid part of its all_to_alls (with `a2ao` it prices
  -13.6%; hiding 0.54 of what the model's `a2ao` hides would meet it, near qwen3-235b-256-fp8's 0.64) or ran other
  settings than assumed (0.6.2's recompute of mla_up_proj + mlp instead of the core: about -0.8 s); its FLOPs, 8.12e15 a
  GPU and step, are within 1% of 6 x its 37.5B active parameters (DeepSeek-V3's "37B") plus MLA's attention core.
  Its recipe's pipeline layout "Et|(tt|)*30mL" (chunks of 1, 30 x 2 and 0 blocks; ours 1, 29 x 2, 1, 1) leaves the
  same slowest stage, 8 MoE blocks; its multi-token-prediction layer (mtp_num_layers 1 in every release, on the last
  stage with the loss) is not priced: that stage would run 7 MoE blocks and two heads (227 ms a micro-batch by the
  model's figures, against 215 for 8 MoE blocks), a longer step, not a shorter one. The 26.04 FP8 rows ran Transformer
  Engine's current scaling (Megatron-Bridge's fp8_cs: "tensorwise"),
  priced as delayed scaling except the experts' casts (already at dynamic scaling's 6 bytes; the dense linears' casts
  would add under 1% by a rough count). 0.6.2's perf recipe for DeepSeek-V3 (GBS 16384, not the row's 8192) recomputes
  mla_up_proj + mlp instead of core attention, turns overlap_grad_reduce off and runs HybridEP without the a2a
  overlap: not applied. Mixtral 8x7B: -2.4% (B200), -10.2% (GB200: the GB200 dense rows miss alike).
  mprobs (2026-12-03): Megatron-core's alltoall dispatcher sends the routing weights by an all_to_all of their own
  (token_dispatcher.py l.647-673; Runtime.moe_probs, moe_dispatch.sends_probs; DeepEP / HybridEP carry them in their
  dispatch kernel): qwen3-235b-256 27.296 -> 27.745 s (+0.3 -> +1.9%, fit; A2A_NIC_EFF kept at 0.91, moe_a2a.py says
  why), qwen3-30b-16 +0.6 -> +0.7%, qwen3-235b-256-fp8 -18.4 -> -16.5%, gpt-oss-120b-64 9.132 -> 9.137 s (-35.2%),
  Mixtral -2.3% (B200), -10.1% (GB200); the DeepEP / HybridEP rows and every dense row unchanged.
  mid (2026-12-04): memory counts the middle stage too (memory.stage_memory: stage 1, its micro-batches in flight;
  moe_step._heaviest with its experts): an uneven split leaves stage 1 a block more than the first, and DeepSeek-V3's
  3 dense first blocks leave the middle stages the most experts. deepseek-v3-1024's layout (pp 8 x v 4) then needs
  81.1 GiB of 80 under core-attention recomputation; its first rcm= rung that fits, layernorm + moe_act (72.8 GiB),
  re-runs less than the MLA core: 29.293 -> 28.236 s, +15.9 -> +11.8% (0.6.2's mla_up_proj + mlp, 62.6 GiB: 28.696 s,
  +13.6%).
  Every other row unchanged.
Every ring that crosses nodes runs as NCCL's channels over the NICs its members own (topology.ring_channels: a
full-node dp ring uses the node's eight NICs, a dp ring with one member per node one NIC); the A100 dp=128 rows'
residuals under that split, and why no fabric figure is refitted for them: topologies/efficiency.py.
gb200-l3-70B-fsdp (NeMo 25.04 on GB200 NVL72: Llama 3 70B, FSDP over 64 GPUs, seq 8192, mb 1, fp8; held out, nothing
fitted on it): the activations of its 80 blocks without recomputation do not fit (225.8 GiB a device; it was refused
"memory > 186 GiB" until 2026-12-03). With activation offloading (Layout off=N: Megatron-core's --cpu-offloading
--cpu-offloading-num-layers N, priced by cost_models/offload.py over the GB200's NVLink-C2C, 225 GB/s a GPU and
direction, host memory 240 GB a GPU: datasheet figures, NOT FITTED) the search offloads the fewest blocks of its ladder
(eighths) that fit, 30 of 80 (178.6 GiB; 20, the rung below, and 25 do not fit), and prices 4.134 s against 4.061
measured, +1.8% (the event engine 4.136 s; the copies expose 31 ms in both: 4.103 s were everything kept on the
device). The recipe's own offload setting is not stated in
docs/published-runs.md: off=30 is the planner's choice, not the run's.
Rows the model cannot plan yet are listed with their one-line reason: context-parallel layouts (cp > 1) wait
for their pricing here (calibration/run_prediction.py).
The shipped efficiencies (topologies/efficiency.py, per device generation and fabric) are printed first with
where each came from ("NOT FITTED" where no run exercises a figure). `--refit` re-runs the fits that produced
the Hopper and Blackwell figures (calibration/from_runs.fit_runs on each cluster's fit rows, the free figures of
HOPPER_FREE / BLACKWELL_FREE) and the MoE all-to-all's (refit_moe, on its one fit row), and prints them (minutes).
Usage: python benchmarks/published_runs.py [--runs CSV] [--today CSV] [--fsdp CSV] [--moe CSV] [--runtime NAME]
       [--refit]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.calibration.from_runs import fit_cluster, fit_runs, shipped_fit  # noqa: E402
from paracube.calibration.run_prediction import predict, preset_topology  # noqa: E402
from paracube.calibration.runs_csv import Run, read_runs  # noqa: E402
from paracube.errors import ParacubeError  # noqa: E402
from paracube.topologies.efficiency import (  # noqa: E402
    A2A_NIC,
    FABRICS,
    FP8_GEMM,
    GENERATIONS,
    HOST_ISSUE,
    OVERLAP_DRAG,
    STRAGGLER,
    host_figures,
    sources,
)
from paracube.topologies.nvswitch import fabrics  # noqa: E402
from paracube.topologies.presets import PRESETS  # noqa: E402

DATA = Path(__file__).with_name("data") / "published_runs.csv"
TODAY = Path(__file__).with_name("data") / "published_runs_today.csv"
FSDP = Path(__file__).with_name("data") / "published_runs_fsdp.csv"
MOE = Path(__file__).with_name("data") / "published_runs_moe.csv"
A2A_FIT_ROW, HOST_FIT_ROW = "qwen3-235b-256", "qwen3-30b-16-fp8"  # the MoE fit rows (refit_moe)
# What each refit frees (from_runs.PARAMS). Hopper: NDR, m0 and NVLink 4 are held (topologies/efficiency.py: NDR at
# NCCL's physical bus bandwidth, m0 at fit2's 108, NVLink 4 at fit5's 0.874; freed, each goes where it absorbs
# other misses: NVLink 4 to its bound 1.0 once the FP8 parameter gather is priced); the FP8 m0 is the 16-bit
# curve's. Blackwell: the FP8 eff_max only, on the fit
# rows of both systems (freeing flash_eff and NVLink 5 too sends the FP8 eff_max to its bound 0.95 and flash
# attention to 0.20: the rows cannot separate them); the 16-bit curve, mem_eff and flash_eff stay Hopper's (no
# 16-bit Blackwell row), NDR is the physical 0.85, NVLink 5 borrows NVLink 4's (NOT FITTED). Each fit frees the
# generation's replica jitter too (cost_models/stragglers.py: Hopper 0.014, Ampere and Blackwell ~0).
HOPPER_FREE = ("eff_max", "mem_eff", "fp8_eff_max", "flash_eff", "overlap_drag", "straggler")
BLACKWELL_FREE = ("fp8_eff_max", "overlap_drag", "straggler")
AMPERE_FREE = ("overlap_drag", "straggler")  # the rest as fitted 2026-11 (topologies/efficiency.py)
BLACKWELL = ("dgx-b200", "gb200-nvl72")
DEVICE_GROUP = {"V100-SXM3-32GB": "V100", "A100-SXM-80GB": "A100", "H100-SXM-80GB": "H100",
                "H200-SXM-141GB": "H200", "B200-SXM-180GB": "B200/GB200", "B200-GB200-186GB": "B200/GB200"}


def _group(r: Run) -> str:
    return DEVICE_GROUP.get(PRESETS[r.cluster].build(1, 1).device.name, r.cluster)


def _figures() -> None:
    print("shipped efficiencies per device generation and fabric (spec-sheet peaks unchanged):")
    for gen, f in GENERATIONS.items():
        v = f.values
        line = (f"  {gen:10s} GEMM eff_max {v['eff_max']:.2f}, m0 = n0 = k0 {v['m0']:.0f}, "
                f"memory-bound {v['mem_eff']:.2f}")
        if "flash_eff" in v:
            line += f", flash attention {v['flash_eff']:.2f} of peak"
        if gen in FP8_GEMM:
            e = FP8_GEMM[gen].values
            line += f"; FP8 GEMM eff_max {e['fp8_eff_max']:.2f}, m0 {e['fp8_m0']:.0f}"
        if gen in OVERLAP_DRAG:
            drag = OVERLAP_DRAG[gen]
            line += f"; overlap drag {drag.values['overlap_drag']:.2f}{'' if drag.fitted else ' (NOT FITTED)'}"
        if gen in STRAGGLER:
            jit = STRAGGLER[gen]
            line += f"; replica jitter {jit.values['straggler']:.3f} sqrt(s){'' if jit.fitted else ' (NOT FITTED)'}"
        print(line)
    print("  fabrics: " + ", ".join(f"{k} {f.values['eff']:.2f}{'' if f.fitted else ' (NOT FITTED)'}"
                                    for k, f in FABRICS.items()))
    print("  MoE all-to-all across nodes, of the NIC's line rate: " + ", ".join(
        f"{k} {f.values['a2a_eff']:.2f}{'' if f.fitted else ' (NOT FITTED)'}" for k, f in A2A_NIC.items()))
    print("  GPU host's issue time, x the ops' measured seconds: " + ", ".join(
        f"{k} {f.values['host_scale']:.2f}{'' if f.fitted else ' (NOT FITTED)'}"
        for k, f in ((g, host_figures(g)) for g in GENERATIONS)))
    print("where each figure comes from, per preset:")
    for name, p in PRESETS.items():
        if p.fixed_nodes or name not in ("dgx2-v100", "dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72"):
            continue
        for what, src in sources(p.build(1, 1).device, *fabrics(name)).items():
            print(f"  {name:12s} {what:28s} {src}")


def _errors(sel: list) -> str:
    errs = [abs(x[3]) for x in sel]
    return f"mean |error| {sum(errs) / len(errs):.1%}, max {max(errs):.1%} ({len(errs)} runs)"


def refit(today: list[Run], runs: list[Run]) -> None:
    """Hopper on the dgx-h100 fit rows; Blackwell on the fit rows of both Blackwell systems at once (the DGX B200
    and the GB200 NVL72 share the generation's figures and NVLink 5; their devices keep their own datasheet peaks);
    Ampere's overlap drag alone on the dgx-a100 fit rows."""
    fit, rows = fit_runs(runs, "dgx-a100", rounds=1, runtime="megatron", free=AMPERE_FREE)
    print(f"refit dgx-a100 ({', '.join(AMPERE_FREE)} free): {fit}")
    for r, lay, pred in rows:
        print(f"  {r.name:18s} {r.split:8s} {r.measured_s:8.3f} {pred:8.3f} {pred / r.measured_s - 1:+7.1%}  {lay}")
    fit, rows = fit_runs(today, "dgx-h100", rounds=1, runtime="megatron", free=HOPPER_FREE)
    print(f"refit dgx-h100 ({', '.join(HOPPER_FREE)} free): {fit}")
    for r, lay, pred in rows:
        print(f"  {r.name:18s} {r.split:8s} {r.measured_s:8.3f} {pred:8.3f} {pred / r.measured_s - 1:+7.1%}  {lay}")
    fit_rows = [r for r in today if r.cluster in BLACKWELL and r.split == "fit"]
    start = shipped_fit(PRESETS["dgx-b200"].build(1, 1).device.name, "dgx-b200")
    layouts = [predict(r, preset_topology(r, start), "megatron")[0] for r in fit_rows]
    fit, res = fit_cluster(fit_rows, start, layouts, "megatron", BLACKWELL_FREE)
    print(f"refit {' + '.join(BLACKWELL)} ({', '.join(BLACKWELL_FREE)} free): {fit}")
    for r, e in zip(fit_rows, res, strict=True):
        print(f"  {r.name:18s} {r.split:8s} {r.measured_s:8.3f} {e:+7.1%}")


def refit_moe(moe: list[Run]) -> None:
    """The MoE figures, each on its one fit row, in turn: the all_to_all's a2a_eff in (0.3, 1] on the all-to-all row
    (a token-drop row: no host waits), then the host's host_scale in [1, 4] on the host-bound row at the shipped
    a2a_eff; each by bisection (a faster all-to-all only shortens the step, a slower host only lengthens it), on
    presets built with the trial figure (a Fit), the shipped figures otherwise."""

    def bisect(name: str, figure: str, lo: float, hi: float, rising: bool) -> float:
        r = next(r for r in moe if r.name == name and r.split == "fit")
        start = shipped_fit(PRESETS[r.cluster].build(1, 1).device.name, r.cluster)
        for _ in range(14):
            mid = (lo + hi) / 2
            over = predict(r, preset_topology(r, replace(start, **{figure: mid})), "megatron")[1] > r.measured_s
            lo, hi = (lo, mid) if over == rising else (mid, hi)
        return (lo + hi) / 2

    eff = bisect(A2A_FIT_ROW, "a2a_eff", 0.3, 1.0, rising=False)
    print(f"refit a2a_eff on {A2A_FIT_ROW}: {eff:.3f} (shipped {A2A_NIC['ndr-ib'].values['a2a_eff']:.2f})")
    scale = bisect(HOST_FIT_ROW, "host_scale", 1.0, 4.0, rising=True)
    print(f"refit host_scale on {HOST_FIT_ROW}: {scale:.3f} (shipped {HOST_ISSUE['hopper'].values['host_scale']:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(DATA))
    ap.add_argument("--today", default=str(TODAY), help="today's runs (H100, H200, B200, GB200)")
    ap.add_argument("--fsdp", default=str(FSDP), help="FSDP runs, held out")
    ap.add_argument("--moe", default=str(MOE), help="mixture-of-experts runs, held out")
    ap.add_argument("--runtime", default="megatron",
                    help="the runtime each row is planned for (a row's runtime column overrides it)")
    ap.add_argument("--refit", action="store_true", help="re-run the Hopper, Blackwell, MoE all-to-all fits (minutes)")
    args = ap.parse_args()
    files = [read_runs(f, tuple(PRESETS)) if f else [] for f in (args.runs, args.today, args.fsdp, args.moe)]
    _figures()
    print(f"runtime: {args.runtime} (rows with a runtime column: theirs)")
    rows, refused = [], []
    for r in [run for f in files for run in f]:
        try:
            lay, pred = predict(r, preset_topology(r), args.runtime)
        except ParacubeError as exc:
            refused.append((r, str(exc)))
            continue
        rows.append((r, lay, pred, pred / r.measured_s - 1))
    fsdp = set(id(r) for r in files[2])
    moe = set(id(r) for r in files[3])
    head = ("run", "cluster", "gpus", "dtype", "measured s", "predicted s", "error")
    for group in dict.fromkeys(DEVICE_GROUP.values()):
        for split in ("fit", "held_out"):
            sel = [x for x in rows if _group(x[0]) == group and x[0].split == split]
            if not sel:
                continue
            print(f"\n{group} {split} rows")
            print("{:18s} {:11s} {:>5s} {:5s} {:>10s} {:>11s} {:>7s}  layout".format(*head))
            for r, lay, pred, err in sel:
                tag = "  [FSDP]" if id(r) in fsdp else ("  [MoE]" if id(r) in moe else "")
                print(f"{r.name:18s} {r.cluster:11s} {r.gpus:5d} {r.training.dtype:5s} {r.measured_s:10.3f} "
                      f"{pred:11.3f} {err:+7.1%}  {lay}{tag}")
            print(f"{group} {split}: {_errors(sel)}")
    for title, sel in (("context-parallel rows (cp > 1) the model refuses",
                        [x for x in refused if x[0].layout.cp > 1]),
                       ("other rows the model refuses", [x for x in refused if x[0].layout.cp == 1])):
        if sel:
            print(f"\nnot planned: {title}, {len(sel)} rows")
            for r, why in sel:
                print(f"  {r.name:18s} [{r.runtime or args.runtime}] {why}")
    print("\nsummary by generation (FSDP and MoE rows apart, held out):")
    for group in dict.fromkeys(DEVICE_GROUP.values()):
        for split in ("fit", "held_out"):
            for label, keep in (("", lambda x: id(x[0]) not in fsdp | moe), (" FSDP", lambda x: id(x[0]) in fsdp),
                                (" MoE", lambda x: id(x[0]) in moe)):
                sel = [x for x in rows if _group(x[0]) == group and x[0].split == split and keep(x)]
                if sel:
                    print(f"  {group:10s} {split + label:14s} {_errors(sel)}")
    if args.refit:
        refit(files[1], files[0])
        refit_moe(files[3])


if __name__ == "__main__":
    main()
