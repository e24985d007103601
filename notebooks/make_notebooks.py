"""Writes the notebooks from the cell sources below (outputs stripped). Run: python notebooks/make_notebooks.py"""

from __future__ import annotations

from pathlib import Path

import nbformat
from moe_cells import CELLS as MOE_CELLS  # notebook 06's
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from seed_cells import CELLS as SEED_CELLS  # notebook 05's cells live next to this file

HERE = Path(__file__).parent

NOTEBOOKS: dict[str, list[tuple[str, str]]] = {
    "01_paper_experiment": [
        ("md", """# 1D vs 2D vs 3D tensor parallelism on 64 V100s (Bian et al. 2021, with paracube's cost model)

Bian, Xu, Wang and You ran GPT-style layers on TACC Longhorn (4 x V100-16GB per node, NVLink, EDR InfiniBand)
with every GPU in one tensor-parallel group. Here the `longhorn` preset and the analytic cost model replay that
setting: the best layout of each tensor mode with dp = pp = 1, then weak and strong scaling over 8, 64 and 512
GPUs, and the memory per GPU. The figures are *predictions* of paracube's model, not the paper's measurements."""),
        ("code", """import matplotlib.pyplot as plt
from paracube.layout import Layout
from paracube.planner import search
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec
from paracube.errors import ParacubeError

# A GPT-style model whose sizes divide every mode at 8, 64 and 512 GPUs (heads and hidden powers of two).
model = ModelSpec("gpt-paper", layers=12, hidden=4096, heads=64, ffn_hidden=16384, vocab=51200, seq_len=2048)
training = TrainingSpec(global_batch=512, dtype="fp16", recompute="selective")
MODES = {"1d": lambda n: (n,), "2d": lambda n: (round(n ** 0.5),) * 2, "3d": lambda n: (round(n ** (1 / 3)),) * 3}

def best_tensor_only(mode, gpus, training=training):
    shape = MODES[mode](gpus)
    if Layout(mode=mode, shape=shape).tensor_size != gpus:
        return None
    try:
        return search(model, training, load_topology("longhorn", gpus=gpus), gpus,
                      fixed=Layout(mode=mode, shape=shape), top_k=1).ranked[0]
    except ParacubeError as err:
        print(f"{mode} on {gpus}: {err}")
        return None

results = {mode: best_tensor_only(mode, 64) for mode in ("1d", "2d", "3d")}
base = results["1d"][1].step_time_s
for mode, (layout, est) in results.items():
    print(f"{mode}: {layout}  step {est.step_time_s:.2f} s  speedup over 1D {base / est.step_time_s:.2f}x  "
          f"memory {est.memory.total / 2**30:.1f} GiB  sent {est.comm_bytes_per_gpu / 2**30:.1f} GiB/GPU")"""),
        ("code", """from paracube.cli.plots import plot_estimates
plot_estimates([e for _, e in results.values()], [f"{m} {l.shape}" for m, (l, _) in results.items()],
               "paper_64_v100.png", title="GPT (12 x 4096) on 64 V100 (longhorn), all GPUs tensor-parallel")
from IPython.display import Image
Image("paper_64_v100.png")"""),
        ("md", """## Weak and strong scaling
Strong scaling keeps the global batch (512 sequences); weak scaling grows it with the GPU count
(64 sequences per 8 GPUs). 2D needs a square and 3D a cube, so 8 and 512 suit 3D, 64 suits all
three; 1D over 512 GPUs would need 512 attention heads, so its curve stops at 64."""),
        ("code", """counts = [8, 64, 512]
fig, axes = plt.subplots(1, 3, figsize=(14, 4))
for ax, (title, batch_of) in zip(axes[:2], [("strong scaling (global batch 512)", lambda n: 512),
                                             ("weak scaling (64 sequences per 8 GPUs)", lambda n: 8 * n)]):
    for mode in ("1d", "2d", "3d"):
        xs, ys = [], []
        for n in counts:
            r = best_tensor_only(mode, n, TrainingSpec(global_batch=batch_of(n), dtype="fp16", recompute="selective"))
            if r:
                xs.append(n)
                ys.append(batch_of(n) * 2048 / r[1].step_time_s)
        ax.plot(xs, ys, "o-", label=mode)
    ax.set_xscale("log", base=2); ax.set_yscale("log")
    ax.set_xlabel("GPUs"); ax.set_ylabel("throughput (tokens/s)"); ax.set_title(title); ax.legend()
for mode in ("1d", "2d", "3d"):
    xs, ys = [], []
    for n in counts:
        r = best_tensor_only(mode, n)
        if r:
            xs.append(n); ys.append(r[1].memory.total / 2**30)
    axes[2].plot(xs, ys, "o-", label=mode)
axes[2].set_xscale("log", base=2); axes[2].set_xlabel("GPUs"); axes[2].set_ylabel("memory per GPU (GiB)")
axes[2].set_title("memory per GPU (global batch 512)"); axes[2].legend()
fig.tight_layout()"""),
    ],
    "02_plan_a_large_model": [
        ("md", """# Plan GPT-3 175B and LLaMA-2 70B on DGX H100 clusters

The planner enumerates every layout (dp x pp x tensor mode and shape, micro-batch, interleaving, placement of
the mesh axes on the machine), rejects what does not divide or fit in 80 GB, and ranks the rest by predicted
step time. The best one becomes a plan file that `paracube run` executes as is."""),
        ("code", """from paracube.planner import search
from paracube.topologies import load_topology
from paracube.model_presets import PRESETS
from paracube.workload import TrainingSpec

training = TrainingSpec(global_batch=1536, dtype="bf16", recompute="selective")
topo = load_topology("dgx-h100", gpus=1024)
result = search(PRESETS["gpt3-175b"], training, topo, 1024, top_k=5)
print(f"scored {result.scored} layouts in {result.elapsed_s:.2f} s; rejected {sum(result.rejected.values())}:")
for reason, n in result.rejected.most_common(5):
    print(f"  {n:6d}  {reason}")
for layout, est in result.ranked:
    print(f"{str(layout):55s} {est.step_time_s:7.2f} s  MFU {est.mfu:.1%}  "
          f"{est.memory.total / 2**30:5.1f} GiB")"""),
        ("code", """for mode, (layout, est) in sorted(result.best_per_mode.items()):
    print(f"best {mode:5s}: {str(layout):50s} {est.step_time_s:7.2f} s  MFU {est.mfu:.1%}")"""),
        ("md", """## Read the plan
The plan file is plain JSON: model, training, cluster, layout (with placement), the prediction, and how to
launch it."""),
        ("code", """import json
from paracube.plan import LaunchSpec, Plan
layout, est = result.ranked[0]
plan = Plan(model=PRESETS["gpt3-175b"], training=training, layout=layout, cluster="dgx-h100", gpus=1024,
            launch=LaunchSpec(nproc_per_node=8, nnodes=128), prediction=est.to_dict())
plan.save("gpt3_175b_plan.json")
print(json.dumps({k: v for k, v in plan.to_dict().items() if k != "prediction"}, indent=1))
print({k: plan.prediction[k] for k in ("step_time_s", "memory_per_gpu_bytes", "comm_bytes_per_gpu", "mfu")})"""),
        ("code", """llama = search(PRESETS["llama2-70b"], TrainingSpec(global_batch=1024, dtype="bf16"),
               load_topology("dgx-h100", gpus=256), 256, top_k=3)
for layout, est in llama.ranked:
    print(f"{str(layout):55s} {est.step_time_s:6.2f} s  MFU {est.mfu:.1%}  {est.memory.total / 2**30:5.1f} GiB")"""),
    ],
    "03_before_buying_compute": [
        ("md", """# Before buying compute: time and cost to train

For a model and a token budget, sweep GPU types and counts: the best layout of each, its step time, days and
dollars to train, and the Pareto front of time vs cost. Prices are inputs: the defaults are illustrative
list prices per GPU-hour (`paracube.cli.sweep_cmd.DEFAULT_PRICE_PER_GPU_HOUR`); put your own quotes in."""),
        ("code", """from paracube.cli.sweep_cmd import plot_sweep, sweep
from paracube.model_presets import PRESETS
from paracube.workload import TrainingSpec

model = PRESETS["gpt3-6.7b"]
prices = {"dgx-a100": 1.80, "dgx-h100": 2.50}
tokens = 20 * model.num_parameters()  # Chinchilla-optimal budget
points = sweep(model, TrainingSpec(global_batch=1024, dtype="bf16"), list(prices), [16, 32, 64, 128, 256],
               prices, tokens)
for p in points:
    print(f"{p.cluster:9s} {p.gpus:4d} GPUs  {str(p.layout):45s} {p.train_hours / 24:6.2f} days  "
          f"${p.cost_usd:>10,.0f}  {'Pareto' if p.pareto else ''}")
plot_sweep(points, "sweep_6p7b.png", title=f"{model.name}, {tokens:.3g} tokens")
from IPython.display import Image
Image("sweep_6p7b.png")"""),
    ],
    "04_run_and_check": [
        ("md", """# Run a plan on local CPU ranks and check it against its prediction

A plan is run as is: `paracube run plan.json` starts one process per rank with torchrun's agent (gloo on CPU,
NCCL on GPUs). Here: the tiny GPT as a 2x2x2 cube on 8 local CPU processes. The executor records every
collective it issues; the bytes each rank sends must equal the cost model's prediction exactly, and the
loss must fall."""),
        ("code", """import json, subprocess, sys
from paracube.cost_models import estimate
from paracube.plan import default_plan
from paracube.topologies import load_topology

plan = default_plan("dp=1,tp=3d:2x2x2,mb=4")
prediction = estimate(plan.model, plan.training, plan.layout, load_topology("local-cpu", gpus=8))
plan.save("plan.json")
print(plan.layout, f"predicted: {prediction.comm_bytes_per_gpu:,.0f} B sent per rank per step, "
      f"{len(prediction.events)} collectives, {prediction.memory.parameters:,.0f} B of parameters per rank")"""),
        ("code", """done = subprocess.run([sys.executable, "-m", "paracube", "run", "plan.json", "--steps", "8",
                       "--metrics", "metrics.jsonl", "--no-progress"], capture_output=True, text=True)
print(done.stdout[-2000:], done.stderr[-2000:])
assert done.returncode == 0
metrics = [json.loads(line) for line in open("metrics.jsonl")]
for m in metrics[:3] + metrics[-2:]:
    print(f"step {m['step']:3d}  loss {m['loss']:.3f}  {m['step_time_s'] * 1e3:7.1f} ms  "
          f"sent {m['bytes_sent_per_rank']:,.0f} B")"""),
        ("code", """import matplotlib.pyplot as plt
assert all(m["bytes_sent_per_rank"] == prediction.comm_bytes_per_gpu for m in metrics), "traffic differs"
print("bytes sent per rank: measured == predicted for every step")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
ax1.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], "o-")
ax1.set_xlabel("step"); ax1.set_ylabel("training loss (nats/token)"); ax1.set_title("loss falls")
ax2.plot([m["step"] for m in metrics], [m["step_time_s"] * 1e3 for m in metrics], "o-", label="measured")
ax2.axhline(prediction.step_time_s * 1e3, color="k", ls="--", label="predicted (uncalibrated local-cpu)")
ax2.set_xlabel("step"); ax2.set_ylabel("step time (ms)"); ax2.legend(); ax2.set_title("step time")
fig.tight_layout()"""),
        ("md", """The uncalibrated `local-cpu` preset guesses this machine's speed. `paracube calibrate --out cal.yaml`
measures it (GEMMs and every collective under the load of a real run) and `paracube validate plan.json
--cluster cal.yaml` prints predicted against measured time, bytes and memory per rank."""),
    ],
    "05_seed_experiment": SEED_CELLS,
    "06_mixture_of_experts": MOE_CELLS,
}


def build(name: str, cells: list[tuple[str, str]]) -> Path:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = HERE / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    for name, cells in NOTEBOOKS.items():
        print(build(name, cells))
