"""The analytic engine's interleaved-pipeline bubble against an exact replay of Megatron's schedule, per v.

The analytic engine prices an interleaved 1F1B bubble by Narayanan et al.'s closed form, (pp - 1) / (v N) of the
slowest stage's work (cost_models/pipeline_bubble.py), which assumes every model chunk equally heavy. When the
layers do not split evenly over pp x v virtual stages (modes/stages.chunk_layers: 24 layers on 10 -> 2, 3 x 6, 2,
1, 1), the schedule is paced chunk by chunk and the closed form misses, most with few micro-batches. This replays
modes/stages.schedule, the order both the event engine and the executor run, with each virtual stage's forward
and backward in proportion to its layers (backward 2 x forward; no embedding, head or window weights: "layer
units"), and prints per v, side by side:
- the split, the closed form's and the replay's bubble in layer units, their ratio R (1 on even splits: the closed
  form is exact there);
- the analytic and event engines' step times for the layout and their difference;
- the analytic step with its bubble scaled by R: how much of the engines' gap the chunk split alone explains.
Found so (2026-12-05): llama3-70b on 64 H100s, dp=2,pp=4,tp=1d:8,mb=2 (4 micro-batches): the engines -6.5% apart at
v=3 (R 0.62), -4.4% at v=7 (R 0.33), within 1% on even splits; scaled by R +0.4% and +1.3%, but v=6 (its last
chunks of one layer, the head on one of them) +1.4% -> +3.8%: the replay wants the head's and the embedding's
weight on the edge chunks before it can replace the closed form. gpt-oss-20b on 32 B200s with 2 micro-batches is
another gap: +4.6..+8.2% on even splits with `overlap`, -3.0..0% without (the gradients' overlap under interleaving,
not the split).
Usage: python benchmarks/interleaved_bubble.py --model gpt-oss-20b --cluster dgx-b200 --gpus 32 --global-batch 64
           --layout dp=16,pp=2,ep=8,mb=2,zero=1,overlap --runtime megatron [--dtype fp8] [--v 2 3 4 5 6 7 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.cost_models.analytic import estimate  # noqa: E402
from paracube.cost_models.event import estimate_event  # noqa: E402
from paracube.errors import ParacubeError  # noqa: E402
from paracube.layout_parse import parse_layout  # noqa: E402
from paracube.model_presets import PRESETS as MODELS  # noqa: E402
from paracube.modes.stages import chunk_layers, schedule, split_ok, split_text  # noqa: E402
from paracube.runtimes import RUNTIMES  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.workload import TrainingSpec  # noqa: E402


def makespan(pp: int, v: int, n_micro: int, forward: list[float], backward: list[float]) -> float:
    """Seconds until every stage has run its `schedule`, virtual stage j's ops costing forward[j] / backward[j]:
    each op starts when its stage is free and its input has arrived (the forward of j - 1, the backward of j + 1;
    no transfer time)."""
    orders = [schedule(pp, v, n_micro, s) for s in range(pp)]
    at, free, ends = [0] * pp, [0.0] * pp, {}
    last = pp * v - 1
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s in range(pp):
            while at[s] < len(orders[s]):
                kind, c, m = orders[s][at[s]]
                j = c * pp + s
                dep = (None if j == 0 else ("F", j - 1, m)) if kind == "F" else \
                    (("F", j, m) if j == last else ("B", j + 1, m))
                if dep is not None and dep not in ends:
                    break
                start = max(free[s], ends[dep] if dep is not None else 0.0)
                free[s] = ends[(kind, j, m)] = start + (forward[j] if kind == "F" else backward[j])
                at[s], left, moved = at[s] + 1, left - 1, True
        if not moved:
            raise RuntimeError("schedule deadlocked")  # modes/stages.schedule's orders never do
    return max(free)


def layer_unit_bubbles(layers: int, pp: int, v: int, n_micro: int) -> tuple[float, float]:
    """(closed form, replay) bubble in layer units (a layer's forward 1, backward 2): both beyond the slowest
    stage's n_micro micro-batches."""
    split = chunk_layers(layers, pp, v)
    per_stage = [sum(split[c * pp + s] for c in range(v)) for s in range(pp)]
    work = 3.0 * max(per_stage)
    replay = makespan(pp, v, n_micro, [float(n) for n in split], [2.0 * n for n in split]) - n_micro * work
    return (pp - 1) * work / v, replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-20b")
    ap.add_argument("--cluster", default="dgx-b200")
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--runtime", default="megatron")
    ap.add_argument("--layout", default="dp=16,pp=2,ep=8,mb=2,zero=1,overlap", help="without v")
    ap.add_argument("--v", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8])
    args = ap.parse_args()
    model, rt = MODELS[args.model], RUNTIMES[args.runtime]
    training = TrainingSpec(global_batch=args.global_batch, dtype=args.dtype, seq_len=args.seq)
    topo = load_topology(args.cluster, gpus=args.gpus)
    print(f"{args.model} on {args.gpus} x {args.cluster}, {args.runtime}, {args.dtype}, batch {args.global_batch}, "
          f"{args.layout}")
    print(f"{'v':>2s} {'split (layers per virtual stage)':34s} {'closed':>7s} {'replay':>7s} {'R':>5s} "
          f"{'analytic s':>10s} {'event s':>8s} {'ev/an':>6s} {'an x R':>8s} {'ev/(an x R)':>11s}")
    for v in args.v:
        try:
            lay = parse_layout(f"{args.layout},v={v}")
            n_micro = args.global_batch // (lay.dp * lay.micro_batch)
            if not split_ok(model.layers, lay.pp, v):
                continue
            an = estimate(model, training, lay, topo, with_events=False, options=rt.engine_options())
            ev = estimate_event(model, training, lay, topo, with_events=False, options=rt.engine_options())
        except ParacubeError as e:
            print(f"{v:2d} refused: {e}")
            continue
        closed, replay = layer_unit_bubbles(model.layers, lay.pp, v, n_micro)
        ratio = replay / closed if closed > 0 else 1.0
        scaled = an.step_time_s + (ratio - 1.0) * an.bubble_time_s
        print(f"{v:2d} {split_text(model.layers, lay.pp, v):34s} {closed:7.2f} {replay:7.2f} {ratio:5.2f} "
              f"{an.step_time_s:10.4f} {ev.step_time_s:8.4f} {ev.step_time_s / an.step_time_s - 1:+6.1%} "
              f"{scaled:8.4f} {ev.step_time_s / scaled - 1:+11.1%}")


if __name__ == "__main__":
    main()
