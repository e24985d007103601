"""Cells of notebook 05_seed_experiment (written by make_notebooks.py): Bian et al.'s experiment, reproduced
and explained with paracube's model. Figures go to $PARACUBE_FIG_DIR (default: the working directory);
`python notebooks/seed_figures.py` runs the notebook with it set to docs/img."""

CELLS: list[tuple[str, str]] = [
    ("md", """# The seed's experiment, reproduced and explained

Bian, Xu, Wang and You (2021) measured 3D tensor parallelism **2.32x faster than 1D and 1.57x faster than 2D** on
64 V100s of TACC Longhorn (4 x V100-16GB per node, NVLink pairs, one EDR InfiniBand port per node), every GPU in
one tensor group. This notebook puts paracube's cost model next to that claim:

1. one transformer layer's bytes per GPU, model vs the papers' closed forms (Megatron, Optimus/SUMMA, Tesseract,
   Bian et al.), and the exponents of p, h and b*s;
2. weak and strong scaling, 8 -> 64 GPUs, 1D / 2D / 2.5D / 3D, on `longhorn`, `dgx-a100` and `dgx-h100`;
3. a map over (tokens per step, hidden) of which mode wins, and by how much;
4. where 2.32x and 1.57x fall on that map, and what explains the gap;
5. the paper's comparison against the baseline it used (Optimus' SUMMA, `tp=2d:8x8,summa`) and against our 2D.

**Assumed settings.** The paper's exact benchmark sizes are not in this repository's notes; as the issue states
them we take the headline point as 64 GPUs, fp16, sequence 512, global batch 64 (32,768 tokens per step),
hidden 4096, GPT blocks (f = 4h), 12 layers. All figures are predictions of paracube's analytic model."""),
    ("code", """import os
from pathlib import Path
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from paracube.planner.theory import layer_bytes_table, format_table, scaling_exponent, theory_layer_bytes
from paracube.planner.seed import gpt, scaling, tensor_only_best, win_map
from paracube.planner.verdict import byte_shares, axis_bytes, crosses_nodes, explain_modes, with_events
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

FIG_DIR = Path(os.environ.get("PARACUBE_FIG_DIR", "."))
FIG_DIR.mkdir(parents=True, exist_ok=True)
PAPER = dict(gpus=64, batch=64, seq=512, hidden=4096, layers=12)
MODES = ("1d", "2d", "2.5d", "3d")
COLORS = {"1d": "#4c72b0", "2d": "#dd8452", "2.5d": "#55a868", "3d": "#c44e52"}
_topos = {}
def topo(cluster, gpus):
    if (cluster, gpus) not in _topos:
        _topos[cluster, gpus] = load_topology(cluster, gpus=gpus)
    return _topos[cluster, gpus]
def save(fig, name):
    fig.savefig(FIG_DIR / name, dpi=110, bbox_inches="tight")
    print("wrote", FIG_DIR / name)"""),
    ("md", """## 1. One layer: the model's bytes next to the papers' closed forms

`layer_bytes_table` sums the cost model's CommEvents labelled `layers.0.*` (forward + backward, one micro-batch)
and puts the closed form of each paper next to it (see the docstring of `paracube/planner/theory.py` for the
formulas, their sources and where the constants differ). Ratio = model / theory."""),
    ("code", """rows = layer_bytes_table(modes=("1d", "2d", "3d"), ps=(8, 16, 64, 256, 512))
rows += layer_bytes_table(modes=("2.5d",), ps=(8, 32, 64, 128, 512))
print(format_table(rows))
for mode in MODES:
    sub = [r for r in rows if r.mode == mode and (mode != "2.5d" or r.shape[2] == 2)]
    print(f"{mode:5s} bytes ~ p^{scaling_exponent(sub, 'p'):+.3f} (ring factor (q-1)/q divided out)")"""),
    ("md", """1D is Megatron's four all-reduces exactly. 3D is Bian et al.'s six collectives per linear plus a few
per mille of fp32 LayerNorm and bias traffic. 2D sends 2/3 of Optimus' SUMMA: the executor all-gathers X and A
once and keeps them for backward, where SUMMA broadcasts them again. That constant matters at the paper's point:"""),
    ("code", """T, h, e = PAPER["batch"] * PAPER["seq"], PAPER["hidden"], 2
at = {r.mode: r for r in rows if r.p == 64}
summa = theory_layer_bytes("2d", PAPER["batch"], PAPER["seq"], h, (8, 8), e)
print(f"per layer at p=64, T={T}, h={h}: 1d {at['1d'].model_bytes/1e6:.0f} MB, 2d {at['2d'].model_bytes/1e6:.0f} MB "
      f"(SUMMA as published: {summa/1e6:.0f} MB), 2.5d {at['2.5d'].model_bytes/1e6:.0f} MB, "
      f"3d {at['3d'].model_bytes/1e6:.0f} MB")
print(f"bytes 1d/3d = {at['1d'].model_bytes/at['3d'].model_bytes:.2f}x; "
      f"SUMMA-2d/3d = {summa/at['3d'].model_bytes:.2f}x; "
      f"paracube-2d/3d = {at['2d'].model_bytes/at['3d'].model_bytes:.2f}x")
# Why 3D's p^(1/6) edge over 2D is small at p = 64: 3D moves each activation in (X) AND out (Y, a reduce-scatter
# of partial sums): sum(h_in + h_out) = 16h per layer against 2D's sum(h_in) = 7h.
print(f"activation bytes per token-hidden: 3d 2*(3/4)*16/16 = {2*0.75*16/16:.2f}, 2d 2*(7/8)*7/8 = {2*7/8*7/8:.2f}, "
      f"2.5d (4x4x4) 2*(3/4)*7/16 = {2*0.75*7/16:.2f}")"""),
    ("md", """## 2. Weak and strong scaling, every GPU in the tensor group

Strong scaling: the 12 x 4096 GPT, global batch 64 x 512 tokens, on 8, 16, 32, 64 GPUs. Weak scaling: hidden grows
as sqrt(p) (2048, 3072, 4096, 6144), so the weights per GPU stay about constant, batch fixed. 2D needs a square and
3D a cube, so some modes skip some counts; a missing point means no valid layout (sizes or 16/80 GB memory)."""),
    ("code", """COUNTS = [8, 16, 32, 64]
WEAK_H = {8: 2048, 16: 3072, 32: 4096, 64: 6144}
CLUSTERS = ["longhorn", "dgx-a100", "dgx-h100"]
train = lambda n: TrainingSpec(global_batch=PAPER["batch"], dtype="fp16")
model_of = {"strong": lambda n: gpt(PAPER["hidden"], PAPER["layers"], PAPER["seq"], n),
            "weak": lambda n: gpt(WEAK_H[n], PAPER["layers"], PAPER["seq"], n)}
runs = {kind: scaling(CLUSTERS, COUNTS, make, train, topo) for kind, make in model_of.items()}
for kind, points in runs.items():
    fig, axes = plt.subplots(len(CLUSTERS), 3, figsize=(13, 3.1 * len(CLUSTERS)), sharex=True)
    for row, cluster in zip(axes, CLUSTERS):
        for mode in MODES:
            pts = [p for p in points if p.cluster == cluster and p.mode == mode]
            metrics = (lambda p: p.step_time_s, lambda p: p.memory_bytes / 2**30, lambda p: p.bytes_per_gpu / 1e9)
            for ax, get in zip(row, metrics):
                ax.plot([p.gpus for p in pts], [get(p) for p in pts], "o-", color=COLORS[mode], label=mode)
        for ax, what in zip(row, ("step time (s)", "memory per GPU (GiB)", "sent per GPU per step (GB)")):
            ax.set_xscale("log", base=2); ax.set_title(f"{cluster}: {what}", fontsize=9)
        row[0].legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("GPUs (all in one tensor group)")
    fig.suptitle(f"{kind} scaling, {'hidden 4096' if kind == 'strong' else 'hidden ~ sqrt(p)'}, 64 x 512 tokens, fp16")
    fig.tight_layout(); save(fig, f"seed_{kind}_scaling.png"); plt.close(fig)
for p in runs["strong"]:
    if p.gpus == 64:
        print(f"strong, 64 GPUs, {p.cluster:9s} {p.mode:5s} {p.step_time_s:7.3f} s  {p.memory_bytes/2**30:5.1f} GiB  "
              f"{p.bytes_per_gpu/1e9:6.2f} GB/GPU  {p.layout}")
weak = {p.mode: p.step_time_s for p in runs["weak"] if p.cluster == "longhorn" and p.gpus == 64}
print(f"weak, 64 GPUs, longhorn (hidden {WEAK_H[64]}): 3d/1d = {weak['1d'] / weak['3d']:.2f}x, "
      f"3d/2d = {weak['2d'] / weak['3d']:.2f}x")"""),
    ("md", """## 3. The map: which mode wins where (64 GPUs)

Each cell is the best layout of each mode (micro-batch and placement chosen by the planner) for a 12-layer GPT of
that hidden size and that many tokens per step (global batch x 512). Left: the winner and its margin over the
runner-up. Middle and right: 3D's speed-up over 1D and over 2D; the contour marks the paper's 2.32x and 1.57x,
the star the assumed paper setting."""),
    ("code", """BATCHES = [8, 16, 32, 64, 128, 256, 512]
HIDDENS = [1024, 2048, 4096, 8192, 16384]
maps = {c: win_map(topo(c, 64), 64, BATCHES, HIDDENS, seq=PAPER["seq"], layers=PAPER["layers"])
        for c in ("longhorn", "dgx-h100")}

def plot_map(cluster, times):
    stack = np.stack([np.where(np.isnan(times[m]), np.inf, times[m]) for m in MODES])
    order = np.argsort(stack, axis=0)
    win, second = order[0], order[1]
    with np.errstate(invalid="ignore"):
        margin = np.take_along_axis(stack, second[None], 0)[0] / np.take_along_axis(stack, win[None], 0)[0]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    cmap = matplotlib.colors.ListedColormap([COLORS[m] for m in MODES])
    cmap.set_bad("#dddddd")
    valid = np.isfinite(stack.min(axis=0))
    axes[0].imshow(np.ma.masked_where(~valid, win), cmap=cmap, vmin=-0.5, vmax=3.5, origin="lower", aspect="auto")
    for (i, j), w in np.ndenumerate(win):
        text = f"{MODES[w]}\\n{margin[i, j]:.2f}x" if np.isfinite(margin[i, j]) else f"{MODES[w]}\\nonly"
        text = text if valid[i, j] else "none\\nfits"
        axes[0].text(j, i, text, ha="center", va="center", fontsize=7, color="white" if valid[i, j] else "k")
    axes[0].set_title(f"{cluster}, 64 GPUs: winner, margin over runner-up", fontsize=9)
    for ax, base, paper in ((axes[1], "1d", 2.32), (axes[2], "2d", 1.57)):
        ratio = times[base] / times["3d"]
        im = ax.imshow(np.log2(ratio), cmap="RdBu", vmin=-2, vmax=2, origin="lower", aspect="auto")
        for (i, j), r in np.ndenumerate(ratio):
            if np.isfinite(r):
                ax.text(j, i, f"{r:.2f}", ha="center", va="center", fontsize=7)
        if np.nanmin(ratio) < paper < np.nanmax(ratio):
            ax.contour(np.nan_to_num(ratio, nan=0.0), levels=[paper], colors="k", linewidths=1.5)
        ax.set_title(f"3D speed-up over {base.upper()} (paper: {paper}x, black line)", fontsize=9)
        fig.colorbar(im, ax=ax, label="log2 speed-up")
    for ax in axes:
        ax.set_xticks(range(len(BATCHES)), [f"{b * PAPER['seq'] // 1024}k" for b in BATCHES])
        ax.set_yticks(range(len(HIDDENS)), HIDDENS)
        ax.set_xlabel("tokens per step (global batch x 512)"); ax.set_ylabel("hidden")
        ax.plot(BATCHES.index(PAPER["batch"]), HIDDENS.index(PAPER["hidden"]), "*", ms=16, mfc="gold", mec="k")
    fig.tight_layout(); save(fig, f"seed_map_{cluster}.png"); plt.close(fig)

for cluster, times in maps.items():
    plot_map(cluster, times)
    i, j = HIDDENS.index(PAPER["hidden"]), BATCHES.index(PAPER["batch"])
    t = {m: times[m][i, j] for m in MODES}
    print(f"{cluster}: at the paper's point 3d/1d = {t['1d'] / t['3d']:.2f}x, 3d/2d = {t['2d'] / t['3d']:.2f}x")
    for base, paper in (("1d", 2.32), ("2d", 1.57)):
        ratio = times[base] / times["3d"]
        k = np.unravel_index(np.nanargmin(np.abs(np.log(ratio / paper))), ratio.shape)
        print(f"  3d over {base} closest to the paper's {paper}x: {ratio[k]:.2f}x at hidden {HIDDENS[k[0]]}, "
              f"{BATCHES[k[1]] * PAPER['seq']} tokens; max {np.nanmax(ratio):.2f}x")"""),
    ("md", """## 4. The gap at the paper's point, with numbers

Bytes per GPU by purpose (activations, weight gathers, the embedding lookup, ...) and communication time by mesh
axis, split into axes whose groups stay inside a node (NVLink, X-bus between the two sockets) and axes whose
groups cross nodes (one EDR port per 4 GPUs). The last line is what `paracube compare --tensor-only` prints."""),
    ("code", """c = topo("longhorn", 64)
model = gpt(PAPER["hidden"], PAPER["layers"], PAPER["seq"], 64)
training = TrainingSpec(global_batch=PAPER["batch"], dtype="fp16")
best = with_events(tensor_only_best(model, training, c, 64), model, training, c)
fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(12, 4))
purposes = ["activations", "weights", "embedding", "gradient sync", "norms, biases, loss"]
for x, (mode, (lay, est)) in enumerate(best.items()):
    shares, bottom = byte_shares(est), 0.0
    for k, color in zip(purposes, ("#4c72b0", "#dd8452", "#c44e52", "#8172b3", "#937860")):
        v = shares.get(k, 0.0) / 1e9
        ax_b.bar(x, v, bottom=bottom, color=color, label=k if x == 0 else None); bottom += v
    inside = sum(t for a, t in est.comm_time_by_axis.items() if not crosses_nodes(lay, a, c.devices_per_node))
    across = est.comm_time_s - inside
    ax_t.bar(x, est.compute_time_s, color="#4c72b0", label="compute" if x == 0 else None)
    ax_t.bar(x, inside, bottom=est.compute_time_s, color="#55a868", label="comm inside nodes" if x == 0 else None)
    ax_t.bar(x, across, bottom=est.compute_time_s + inside, color="#c44e52",
             label="comm across nodes (IB)" if x == 0 else None)
    print(f"{mode:5s} {str(lay):42s} step {est.step_time_s:6.3f} s  sent {est.comm_bytes_per_gpu/1e9:6.2f} GB  "
          + ", ".join(f"{k} {v / est.comm_bytes_per_gpu:.0%}" for k, v in shares.items()
                      if v > 0.005 * est.comm_bytes_per_gpu)
          + f"  | comm {est.comm_time_s:.3f} s, across nodes {across / est.comm_time_s:.0%}")
    for axis, t in sorted(est.comm_time_by_axis.items(), key=lambda kv: -kv[1])[:2]:
        moved = axis_bytes(est).get(axis, 0.0)
        tier = "across nodes" if crosses_nodes(lay, axis, c.devices_per_node) else "inside a node"
        print(f"        axis {axis:6s} {tier:13s} {moved / 1e9:6.2f} GB in {t:.3f} s = {moved / t / 1e9:5.1f} GB/s")
for ax, what in ((ax_b, "sent per GPU per step (GB)"), (ax_t, "time per step (s)")):
    ax.set_xticks(range(len(best)), list(best)); ax.set_ylabel(what); ax.legend(fontsize=8)
fig.suptitle("longhorn, 64 V100, 12 x 4096 GPT, 64 x 512 tokens, fp16 (the assumed paper point)")
fig.tight_layout(); save(fig, "seed_gap_longhorn.png"); plt.close(fig)
print(explain_modes(best, model, training, c))"""),
    ("md", """## 5. The paper's comparison against the baseline it used: SUMMA

Bian et al.'s 2D is Optimus, i.e. SUMMA: per GEMM operand q broadcast steps (forward), broadcast + reduce steps
(backward, X and A broadcast again). paracube prices it as a 2D variant (`tp=2d:8x8,summa`, declared in
`paracube/modes/two_d.py`; no runtime here runs it) at the layout of our 2D's best (same micro-batch and
placement), so the two 2Ds differ only in how their GEMMs communicate. 1D vs SUMMA-2D vs our 2D vs 3D, and the
reason for each gap, from the numbers."""),
    ("code", """from paracube.cost_models.analytic import estimate
from paracube.layout_checks import VARIANTS
lay2, est2 = best["2d"]
summa_layout = lay2.with_(mode=VARIANTS["summa"].name, keep_weights=None)
four = {"1d": best["1d"], "SUMMA-2d": (summa_layout, estimate(model, training, summa_layout, c)),
        "our 2d": best["2d"], "3d": best["3d"]}
tensor_axes = lambda lay: set(lay.tensor_axes)
calls = {k: sum(1 for e in est.events if set(e.axes) <= tensor_axes(lay)) for k, (lay, est) in four.items()}
for k, (lay, est) in four.items():
    print(f"{k:9s} {str(lay):44s} step {est.step_time_s:6.3f} s = compute {est.compute_time_s:5.3f} + comm "
          f"{est.comm_time_s:6.3f} s; sent {est.comm_bytes_per_gpu/1e9:6.2f} GB/GPU, {calls[k]:6d} tensor calls, "
          f"{est.memory.total/2**30:5.1f} GiB")
t = {k: est.step_time_s for k, (_, est) in four.items()}
sent = {k: est.comm_bytes_per_gpu for k, (_, est) in four.items()}
print(f"3d over 1d:       {t['1d'] / t['3d']:.2f}x (paper 2.32x): 1d sends {sent['1d'] / sent['3d']:.2f}x 3d's bytes, "
      "all-reduces of whole activations over 64 ranks, most crossing the EDR ports")
print(f"3d over SUMMA-2d: {t['SUMMA-2d'] / t['3d']:.2f}x (paper 1.57x, against this baseline): SUMMA sends "
      f"{sent['SUMMA-2d'] / sent['3d']:.2f}x 3d's bytes in {calls['SUMMA-2d'] / calls['3d']:.1f}x the calls "
      "(q = 8 broadcast steps per GEMM operand, X and A broadcast again in backward)")
print(f"3d over our 2d:   {t['our 2d'] / t['3d']:.2f}x: our 2d gathers each operand once and keeps it for backward: "
      f"{sent['our 2d'] / sent['SUMMA-2d']:.2f}x SUMMA's bytes, {calls['our 2d'] / calls['SUMMA-2d']:.2f}x its calls, "
      f"for {four['our 2d'][1].memory.total / four['SUMMA-2d'][1].memory.total:.2f}x its memory")
fig, ax = plt.subplots(figsize=(7, 3.6))
for x, (k, (lay, est)) in enumerate(four.items()):
    ax.bar(x, est.compute_time_s, color="#4c72b0", label="compute" if x == 0 else None)
    ax.bar(x, est.comm_time_s, bottom=est.compute_time_s, color="#c44e52", label="communication" if x == 0 else None)
    ax.text(x, est.step_time_s, f"{t[k] / t['3d']:.2f}x", ha="center", va="bottom", fontsize=8)
ax.set_xticks(range(len(four)), list(four)); ax.set_ylabel("step time (s)"); ax.legend(fontsize=8)
ax.set_title("longhorn, 64 V100, the paper point: step time (label: over 3d)", fontsize=9)
fig.tight_layout(); save(fig, "seed_summa_longhorn.png"); plt.close(fig)"""),
    ("md", """**Reading the numbers.** The model reproduces the *direction* of the paper (3D ahead of 1D by more
than 2x on Longhorn) but not 3D's 1.57x over 2D at this point, for reasons the cells above quantify:

- *2D is not Optimus.* paracube's 2D gathers X and A once and keeps them for backward (2 passes of traffic);
  Optimus' SUMMA broadcasts again in backward (3 passes), in q steps per operand. Against SUMMA as published
  (section 5, priced by both engines), 3D sends ~1.7x fewer bytes per layer at this point and issues far fewer
  calls, close to the paper's 1.57x; against paracube's 2D only ~1.1x.
- *3D's constant.* 3D moves each activation in and out of every linear (16h per layer vs 2D's 7h), so at p = 64
  its p^(1/6) advantage (a factor 2) is mostly spent on the constant; it pulls ahead where the weight term h^2
  dominates (large hidden, few tokens: the upper left of the map), 2.5D where tokens dominate.
- *Links.* On Longhorn every mode's large groups cross InfiniBand (one 100 Gb/s port per 4 GPUs); which axis is
  innermost (NVLink) decides how much of the traffic stays on the fast tier.
- The known avoidable traffic (2D/3D embedding lookup of the whole micro-batch; per-micro-batch weight gathers)
  is a few per cent of 3D's bytes at this point: the `embedding` and `weights` shares above."""),
]
