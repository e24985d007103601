"""Cells of notebook 06_mixture_of_experts (written by make_notebooks.py): plan mixture-of-experts models for
Megatron-core on DGX H100, put the model next to NVIDIA's published MoE runs, and export the chosen plan."""

CELLS: list[tuple[str, str]] = [
    ("md", """# Plan a mixture of experts on DGX H100 for Megatron-core

A MoE block adds two choices to a layout: `ep`, the ranks its experts are split over, and `etp`, the tensor
parallelism inside one expert. Both fold over the dp x cp x tp ranks of each pipeline stage, as Megatron-core's
"MoE Parallel Folding" does, so attention and experts can use different groups. What the model prices for a MoE
block (`paracube/cost_models/moe.py`): the router and the grouped expert GEMMs, the dispatch and combine
all-to-alls on the topology (each rank's flows to its peers, the cross-node share through its own NIC), the
dispatcher's bytes (DeepEP sends a token once per remote node; NCCL's all-to-all once per expert), the permute
passes, the host's wait for the expert counts of a dropless block, and the experts' memory and gradients.

The runtime says what the stack runs: here `megatron` (Megatron-core 0.16: DeepEP dispatch, the distributed
optimizer, every overlap it has). All figures are predictions of paracube's analytic model."""),
    ("code", """from paracube.model_presets import PRESETS
from paracube.planner import search
from paracube.planner.explain import explain
from paracube.runtimes import get_runtime
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

megatron = get_runtime("megatron")
qwen = PRESETS["qwen3-30b-a3b"]
result = search(qwen, TrainingSpec(global_batch=512, dtype="bf16"), load_topology("dgx-h100", gpus=16), 16,
                runtime=megatron, top_k=5, memory_headroom=0.1)
print(f"{qwen.name}: {qwen.moe.experts} experts, top-{qwen.moe.top_k}, each {qwen.moe.expert_ffn} wide; "
      f"{result.scored} layouts scored")
for layout, est in result.ranked:
    print(f"{str(layout):70s} {est.step_time_s:6.2f} s  MFU {est.mfu:5.1%}  {est.memory.total / 2**30:5.1f} GiB")
for choice in explain(result.ranked):
    if choice.part in ("pp", "tensor", "ep", "etp", "rcm"):
        print(" ", choice.line())"""),
    ("md", """## Against NVIDIA's published MoE runs
`benchmarks/data/published_runs_moe.csv` holds the Megatron-Bridge performance-summary rows for DGX H100
(`docs/published-runs.md` section 4). Each is planned for the Megatron runtime with the run's own tensor,
pipeline, expert and data sizes pinned; two rows fit a figure each (the all-to-all's NIC efficiency, the GPU host's
op issue time), the others are held out. The two large held-out misses are printed as they are: DeepSeek-V3
priced too slow, the FP8 Qwen3-235B run (its all-to-alls overlapped with compute, `a2ao`) priced too fast.
The rows carry their recipes' settings, which the search above did not assume: the 25.09 Qwen3 runs drop tokens at
capacity 1.0 (no host wait for the expert counts) and reduce gradients in bf16 (half the gradient memory), so their
Qwen3-30B layout prices 12.6 s there, against 14.1 s and 93 GiB dropless with fp32 gradients."""),
    ("code", """from pathlib import Path
import paracube
from paracube.calibration.run_prediction import predict, preset_topology
from paracube.calibration.runs_csv import read_runs
from paracube.topologies.presets import PRESETS as CLUSTERS

csv = Path(paracube.__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs_moe.csv"
runs = [r for r in read_runs(csv, tuple(CLUSTERS)) if r.cluster == "dgx-h100"]
print(f"{'run':20s} {'split':8s} {'measured s':>10s} {'predicted s':>11s} {'error':>7s}  layout")
for run in runs:
    layout, predicted = predict(run, preset_topology(run), "megatron")
    print(f"{run.name:20s} {run.split:8s} {run.measured_s:10.3f} {predicted:11.3f} "
          f"{predicted / run.measured_s - 1:+7.1%}  {layout}")"""),
    ("md", """## Why the dispatcher matters at 1024 GPUs
DeepSeek-V3's published layout splits its 256 experts over 64 ranks on 8 nodes. Its router sends each token to
8 experts in at most 4 of 8 node groups. NCCL's all-to-all (Megatron-core's `alltoall` dispatcher) sends one copy
per expert, 7 of 8 of them across nodes on average; DeepEP sends one copy per remote node and forwards it over
NVLink, about half the bytes on the NICs. Same layout, both dispatchers:"""),
    ("code", """from dataclasses import replace
from paracube.calibration.run_prediction import run_estimate
from paracube.cost_models.moe_dispatch import Dispatch

run = next(r for r in runs if r.name == "deepseek-v3-1024")
moe, topo = run.model.moe, preset_topology(run)
layout, _ = predict(run, topo, "megatron")
n, per_node = layout.ep, 8
for dispatcher in ("alltoall", "deepep"):
    est = run_estimate(replace(run, dispatcher=dispatcher), layout, topo, "megatron")
    spec = Dispatch(dispatcher == "deepep", moe.experts, moe.top_k, moe.groups, moe.group_topk)
    remote = (n // per_node - 1) * spec.hit(n // per_node) if spec.dedup else moe.top_k * (n - per_node) / n
    print(f"{dispatcher:8s}: {remote:.2f} copies of a token across nodes; step {est.step_time_s:6.2f} s, "
          f"all-to-all {est.comm_time_by_kind.get('all_to_all', 0.0):5.2f} s, compute {est.compute_time_s:5.2f} s")"""),
    ("md", """## Plan DeepSeek-V3 on 1024 H100s and export it
The search tries ep, etp, pipelines (interleaved where every virtual stage keeps a block), zero stages and, where
memory asks, the rcm= ladder of modules to recompute. Memory is counted on the first, the middle and the last
stage: DeepSeek-V3's three dense first blocks leave the middle stages the most experts. The plan exports to
Megatron-core's arguments, its uneven pipeline split written as `--pipeline-model-parallel-layout`."""),
    ("code", """from paracube.export import export_plan
from paracube.plan import LaunchSpec, Plan

deepseek = PRESETS["deepseek-v3"]
training = TrainingSpec(global_batch=8192, dtype="bf16", recompute="selective")
plans = search(deepseek, training, load_topology("dgx-h100", gpus=1024), 1024, runtime=megatron, top_k=3,
               memory_headroom=0.1)
for layout, est in plans.ranked:
    print(f"{str(layout):75s} {est.step_time_s:6.2f} s  {est.memory.total / 2**30:5.1f} GiB")
print(f"the published layout, as the model prices it: {predict(run, topo, 'megatron')[1]:.2f} s")
layout, est = plans.ranked[0]
plan = Plan(model=deepseek, training=training, layout=layout, cluster="dgx-h100", gpus=1024,
            launch=LaunchSpec(nproc_per_node=8, nnodes=128), prediction=est.to_dict(), runtime="megatron")
flags = export_plan(plan, "megatron").text.splitlines()
print("\\n".join(line for line in flags if any(k in line for k in ("parallel", "expert", "dispatcher", "layout"))))"""),
    ("md", """## What is not modelled yet
- DeepSeek-V3's multi-token-prediction module (`num_nextn_predict_layers`, on the last stage in Megatron's
  recipes) is not priced.
- The all-to-all overlap (`a2ao`, Megatron-core's `--overlap-moe-expert-parallel-comm`) is priced as the combined
  1F1B schedule would run it with the all-to-alls at their own speed; the one published run that uses it was
  slower than that (the FP8 Qwen3-235B row above).
- Routing is force-balanced as the published benchmarks run it (`MoESpec.imbalance` 1.0); a trained router's
  imbalance is a setting, not a prediction."""),
]
