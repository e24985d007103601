"""The interleaved-pipeline bubble: the closed form against Megatron's schedule replayed, and both engines, per v.

The closed form (pp - 1) / (v N) of the slowest stage's work (cost_models/pipeline_bubble.py) assumes every model
chunk equally heavy; where the layers split unevenly over pp x v virtual stages (modes/stages.chunk_layers: 24
layers on 10 -> 2, 3 x 6, 2, 1, 1) the analytic engine replays the schedule instead (cost_models/pipeline_replay.py).
Per v, side by side: the split; the closed form's and the replay's bubble in block units (a block's forward 1,
backward 2; no embedding or head) and their ratio R (1 on even splits: the closed form is exact there); the analytic
and event engines' step times for the layout and their difference (the event engine runs the schedule op by op).
Measured (2026-12-05): llama3-70b on 64 H100s, dp=2,pp=4,tp=1d:8,mb=2 (4 micro-batches), event / analytic - 1 at
v = 3, 6, 7, 8 (uneven): -6.5%, +1.4%, -4.4%, +1.3% with the closed form, +0.1%, +0.0%, +0.4%, +0.1% with the
replay. gpt-oss-20b on 32 B200s with 2 micro-batches and `overlap` (the default below), fp8: +4.6..+9.8% on every v,
even splits too, most of it the expert gradients' window (moe_step.py: the backward held the forward's host
waits); with that fixed +0.4% at v = 1, -2.0..+4.7% interleaved (the most at v = 7, 8: one-block chunks).
Usage: python benchmarks/interleaved_bubble.py --model gpt-oss-20b --cluster dgx-b200 --gpus 32 --global-batch 64
           --layout dp=16,pp=2,ep=8,mb=2,zero=1,overlap --runtime megatron [--dtype fp8] [--v 2 3 4 5 6 7 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from paracube.cost_models.analytic import estimate  # noqa: E402
from paracube.cost_models.event import estimate_event  # noqa: E402
from paracube.cost_models.pipeline_replay import interleaved_bubble  # noqa: E402
from paracube.errors import ParacubeError  # noqa: E402
from paracube.layout_parse import parse_layout  # noqa: E402
from paracube.model_presets import PRESETS as MODELS  # noqa: E402
from paracube.modes.stages import split_ok, split_text, stage_layers  # noqa: E402
from paracube.runtimes import RUNTIMES  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402
from paracube.workload import TrainingSpec  # noqa: E402


def layer_unit_bubbles(layers: int, pp: int, v: int, n_micro: int) -> tuple[float, float]:
    """(closed form, replay) bubble in block units (a block's forward 1, backward 2, no edge work), both beyond the
    slowest stage's n_micro micro-batches."""
    middle = (1, 0) if pp == 2 else (0, 0)  # pp = 2 has no middle stage (stage_scores.stage_flags)
    on_stage = [stage_layers(layers, pp, v, first, last) for first, last in ((1, 0), middle, (0, 1))]
    work = np.array([[3.0 * n_micro * n] for n in on_stage])
    closed = (pp - 1) * work.max() / (v * n_micro)
    return closed, float(interleaved_bubble(work, layers, pp, v, n_micro)[0])


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
          f"{'analytic s':>10s} {'event s':>8s} {'ev/an':>6s}")
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
        print(f"{v:2d} {split_text(model.layers, lay.pp, v):34s} {closed:7.2f} {replay:7.2f} {ratio:5.2f} "
              f"{an.step_time_s:10.4f} {ev.step_time_s:8.4f} {ev.step_time_s / an.step_time_s - 1:+6.1%}")


if __name__ == "__main__":
    main()
