"""Event-engine scale: one training step of GPT-3 175B on 1024 DGX A100 GPUs (target: under 30 s here).

Prints, per layout: wall time of the simulation, simpy events per second, ring steps simulated (steps that
the fast path jumps over included) and collectives, and the simulated step time next to the analytic one.
Usage: python benchmarks/event_scale.py [layout ...]   (default: a 3D and a Megatron-style 1D+PP layout)
"""

from __future__ import annotations

import sys
import time

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import simulate
from paracube.layout import parse_layout
from paracube.topologies import load_topology
from paracube.workload import PRESETS, TrainingSpec

DEFAULT_LAYOUTS = ("dp=2,tp=3d:8x8x8,mb=64", "dp=8,pp=16,tp=1d:8,mb=1", "dp=8,pp=16,tp=1d:8,mb=1,v=2")


def main(layouts: list[str]) -> None:
    t0 = time.perf_counter()
    topo = load_topology("dgx-a100", gpus=1024)
    model = PRESETS["gpt3-175b"]
    training = TrainingSpec(global_batch=1536, dtype="bf16", recompute="full")
    print(f"topology dgx-a100 x 1024 built in {time.perf_counter() - t0:.2f} s; model gpt3-175b, "
          f"global batch {training.global_batch}, bf16, full recompute")
    print(f"{'layout':34s} {'wall s':>7s} {'events':>9s} {'events/s':>9s} {'ring steps':>11s} "
          f"{'collectives':>11s} {'event step s':>12s} {'analytic s':>10s} {'ratio':>6s}")
    for text in layouts:
        layout = parse_layout(text)
        an = estimate(model, training, layout, topo, with_events=False)
        t = time.perf_counter()
        res = simulate(model, training, layout, topo, timeline=False, with_events=False)
        wall = time.perf_counter() - t
        ev, st = res.estimate, res.stats
        print(f"{text:34s} {wall:7.2f} {st['simpy_events']:9.0f} {st['simpy_events'] / wall:9.0f} "
              f"{st['ring_steps']:11.0f} {st['jobs']:11.0f} {ev.step_time_s:12.3f} {an.step_time_s:10.3f} "
              f"{ev.step_time_s / an.step_time_s:6.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT_LAYOUTS))
