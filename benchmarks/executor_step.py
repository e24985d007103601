"""One training step of the same GPT on 8 gloo CPU ranks: our 1D, 2D, 3D and PyTorch's own tensor parallel.

PyTorch's peer is 1D (Megatron) tensor parallelism with DTensor: `parallelize_module` with ColwiseParallel on
qkv/fc and RowwiseParallel on proj/fc2 of a plain GPT (embeddings, LayerNorms and head replicated). Every
run: AdamW, global-norm clipping, the same global batch and micro-batches. 2D needs a square grid, so its 8
ranks are dp=2 x 2x2. Prints step time (mean over timed steps of the slowest rank) and bytes sent per rank
(ring algorithms; ours from the recorded CommEvents, PyTorch's from the collectives its DTensors dispatch).
"ours pp=1" / "ours pp=2" compare pipeline parallelism (1F1B, executor/pipeline/schedule.py) with data parallelism
on the same 1D tensor group of 4.
`--overlap`: instead, data-parallel layouts (zero=0 and zero=1) with gradient buckets reduced during the
backward (overlap on) and after it (off), side by side in one run.
`--zero`: instead, dp=8 at zero=0/1/2/3 (ours; zero=2/3 reduce-scatter per FSDP unit, zero=3 gathers each unit
before its forward and backward, executor/data_parallel/sharded.py) and torch's FSDP2 on the plain GPT, one
run: `fully_shard` as torchtitan's apply_fsdp wraps (the embeddings, every block, [final norm, head] with
reshard_after_forward=False, the root), fp32; then dp=4 x pp=2 at zero=1/2/3 (each stage's units: gradients
reduce-scattered in the last micro-batch's backward, zero=3 gathering before every micro-batch's forward and backward).
FSDP2's bytes are counted from the c10d collectives it dispatches (_allgather_base_ output, _reduce_scatter_base_
input, allreduce_ tensor; the grad norm's functional all_reduce: a TorchDispatchMode), priced by the same ring
factors as ours.
`--overlap-tp`: instead, 1D + sp, 2D, 2.5D and 3D with tpo (collective matmul: executor/layers/collective_matmul*.py)
on and off side by side, and per ring collective (its label's suffix: in, out, in.regather, X, A, Y, dX, dY, with
ag / rs for all-gather / reduce-scatter: `A rs` is dA's reduce-scatter) from the recorder's ring steps
(recorder.RingStep timestamps) of the timed steps: the share of its ring steps issued while a GEMM chunk ran
(posted before the chunk started, completed after it started) and the share of their in-flight time that the
GEMM covered (|[issue, done] ^ [GEMM start, end]| / (done - issue), averaged over steps).
Usage: python benchmarks/executor_step.py [--model small] [--steps 5] [--warmup 2] [--global-batch 8]
       [--only pp]   (only the pp=1 / pp=2 rows)   [--overlap [--bucket-mb 2]]   [--zero]   [--overlap-tp]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however it is started

import torch  # noqa: E402
from step_timing import time_step  # noqa: E402
from torch_peers import torch_fsdp, torch_tp  # noqa: E402

from paracube.model_presets import resolve_model  # noqa: E402
from paracube.workload import ModelSpec  # noqa: E402

OURS = {"ours 1D": "dp=1,tp=1d:8,mb=4", "ours 2D": "dp=2,tp=2d:2x2,mb=4", "ours 3D": "dp=1,tp=3d:2x2x2,mb=4",
        # pipeline vs none on the same tensor group: the second replica becomes a second stage (1F1B)
        "ours pp=1": "dp=2,tp=1d:4,mb=2", "ours pp=2": "dp=1,pp=2,tp=1d:4,mb=2"}
ZERO = ["dp=8,mb=1", "dp=8,mb=1,zero=1", "dp=8,mb=1,zero=2", "dp=8,mb=1,zero=3"]
ZERO_PP = ["dp=4,pp=2,mb=1,zero=1", "dp=4,pp=2,mb=1,zero=2", "dp=4,pp=2,mb=1,zero=3"]  # each stage's units
OVERLAP = ["dp=8,mb=1", "dp=8,mb=1,zero=1", "dp=2,tp=1d:4,mb=2", "dp=2,tp=1d:4,mb=2,zero=1"]
OVERLAP_TP = ["dp=1,tp=1d:8,mb=4,sp", "dp=2,tp=2d:2x2,mb=4", "dp=1,tp=2.5d:2x2x2,mb=4", "dp=1,tp=3d:2x2x2,mb=4"]


# --- ours ----------------------------------------------------------------------------------------------
def ring_overlap(recorder) -> dict[str, tuple[int, float, float]]:  # type: ignore[no-untyped-def]
    """Per ring collective (label suffix after the linear's name): (ring steps, share issued while a GEMM chunk
    ran, mean share of a step's in-flight time the GEMM covered), from recorder.ring_steps."""
    by: dict[str, list] = {}
    for s in recorder.ring_steps:
        event = recorder.events[s.event]
        kind = {"all_gather": "ag", "reduce_scatter": "rs"}.get(event.kind, event.kind)
        by.setdefault(f"{event.label.split('.', 1)[-1]} {kind}", []).append(s)
    out = {}
    for name, steps in sorted(by.items()):
        during = [s for s in steps if s.gemm is not None and s.start <= s.gemm[0] < s.end]
        covered = [max(0.0, min(s.end, s.gemm[1]) - max(s.start, s.gemm[0])) / max(s.end - s.start, 1e-12)
                   for s in steps if s.gemm is not None]
        out[name] = (len(steps), len(during) / len(steps), sum(covered) / max(len(covered), 1))
    return out


def _ours(rank: int, world: int, spec: ModelSpec, layout_text: str, global_batch: int, steps: int,
          warmup: int, overlap: bool = True, bucket_bytes: int = 25 * 2**20, rings: list | None = None) -> tuple:
    from paracube.executor.data_parallel.optim import build_optimizer
    from paracube.executor.mesh import Mesh
    from paracube.executor.model.gpt import build_model
    from paracube.executor.training.data import parse_source, replica_micro_batches
    from paracube.executor.training.step import train_step
    from paracube.layout_parse import parse_layout

    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    model = build_model(spec, mesh, seed=0)
    opt = build_optimizer(model, mesh, layout.zero, bucket_bytes, lr=1e-3)
    source = parse_source("synthetic", spec.vocab, spec.seq_len)
    dp_index = mesh.coord("dp")
    micro = replica_micro_batches(source, 1, global_batch, layout.dp, dp_index, layout.micro_batch or 1)
    recorder = mesh.recorder

    class _Rec:
        def __enter__(self):  # type: ignore[no-untyped-def]
            recorder.reset()
            return self

        def __exit__(self, *exc: object) -> None:
            self.events = list(recorder.events)

    out = time_step(lambda: train_step(model, opt, mesh, micro, global_batch * spec.seq_len, overlap=overlap,
                                       bucket_bytes=bucket_bytes, param_overlap=overlap), steps,
                    warmup, _Rec)
    if rings is not None:  # the timed steps' ring steps (the recorder is reset before the traced step only)
        rings.append(ring_overlap(recorder))
    return out


def _worker(rank: int, world: int, model_name: str, global_batch: int, steps: int, warmup: int,
            only: str = "", overlap: bool = False, bucket_bytes: int = 25 * 2**20, zero: bool = False,
            overlap_tp: bool = False) -> list:
    from paracube.executor.training.data import parse_source, replica_micro_batches

    spec = resolve_model(model_name)
    rows = []
    if overlap_tp:
        for layout in OVERLAP_TP:
            for on in (True, False):
                text, rings = layout + (",tpo" if on else ""), []
                rows.append((f"tpo {'on' if on else 'off'}", text,
                             *_ours(rank, world, spec, text, global_batch, steps, warmup, rings=rings), rings[0]))
        return rows
    if zero:
        for layout in ZERO:
            rows.append((f"ours zero={layout[-1] if 'zero' in layout else 0}", layout,
                         *_ours(rank, world, spec, layout, global_batch, steps, warmup)))
        for layout in ZERO_PP:
            rows.append((f"ours pp=2 zero={layout[-1]}", layout,
                         *_ours(rank, world, spec, layout, global_batch, steps, warmup)))
        src = parse_source("synthetic", spec.vocab, spec.seq_len)
        mine = replica_micro_batches(src, 1, global_batch, world, rank, 1)
        rows.append(("torch FSDP2", "dp=8 fully_shard (titan)", *torch_fsdp(rank, world, spec, mine, steps,
                                                                              warmup)))
        return rows
    if overlap:
        for layout in OVERLAP:
            for on in (True, False):
                rows.append((f"overlap {'on' if on else 'off'}", layout,
                             *_ours(rank, world, spec, layout, global_batch, steps, warmup, on, bucket_bytes)))
        return rows
    for name, layout in OURS.items():
        if only and only not in name:
            continue
        rows.append((name, layout, *_ours(rank, world, spec, layout, global_batch, steps, warmup)))
    if only:
        return rows
    src = parse_source("synthetic", spec.vocab, spec.seq_len)
    batches = replica_micro_batches(src, 1, global_batch, 1, 0, 4)
    rows.append(("torch DTensor 1D", "tp=8 (Colwise/Rowwise)",
                 *torch_tp(rank, world, spec, batches, steps, warmup)))
    return rows


def main() -> None:
    from dist_helpers import run_distributed

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--only", default="", help="run only our rows whose name contains this (e.g. pp)")
    p.add_argument("--overlap", action="store_true", help="overlap on vs off on data-parallel layouts")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket limit in MiB (default 25)")
    p.add_argument("--zero", action="store_true", help="dp=8 at zero=0/1/2/3 (ours) and torch's FSDP2")
    p.add_argument("--overlap-tp", action="store_true", help="tpo on vs off in 1D + sp, 2D, 3D (collective matmul)")
    args = p.parse_args()
    spec = resolve_model(args.model)
    t0 = time.perf_counter()
    per_rank = run_distributed(_worker, 8, args.model, args.global_batch, args.steps, args.warmup, args.only,
                               args.overlap, int(args.bucket_mb * 2**20), args.zero, args.overlap_tp, timeout=1200)
    rows = per_rank[0]
    if args.overlap_tp:
        rows = [row[:5] for row in rows]
    as_layout = args.overlap or args.zero or args.overlap_tp
    print(f"model {spec.name}: L={spec.layers} h={spec.hidden} heads={spec.heads} f={spec.ffn_hidden} "
          f"V={spec.vocab} s={spec.seq_len}; global batch {args.global_batch}, "
          f"{'micro-batch as the layout says' if as_layout else 'micro-batch 4'}; 8 gloo CPU ranks "
          f"(torch {torch.__version__}); {args.steps} timed steps after {args.warmup} warmup"
          + (f"; buckets of {args.bucket_mb:g} MiB" if args.overlap else ""))
    print(f"{'run':18} {'layout':26} {'step time':>11} {'sent/rank':>12} {'collectives':>12}")
    for name, layout, dt, sent, n in rows:
        print(f"{name:18} {layout:26} {dt * 1e3:8.1f} ms {sent / 2**20:8.2f} MiB {n:12d}")
    if args.overlap_tp:
        _print_rings(per_rank)
    print(f"(wall {time.perf_counter() - t0:.0f} s; tokens per step {args.global_batch * spec.seq_len})")


def _print_rings(per_rank: list) -> None:
    """Per tpo layout and ring collective: ring steps per rank, shares issued during a GEMM and covered by it
    (means over the 8 ranks)."""
    print(f"{'tpo layout':26} {'ring collective':16} {'steps/rank':>10} {'issued in GEMM':>15} "
          f"{'in-flight covered':>18}")
    for i, row in enumerate(per_rank[0]):
        if not row[0].endswith("on"):
            continue
        for name in row[5]:
            stats = [r[i][5][name] for r in per_rank if name in r[i][5]]
            steps = sum(s[0] for s in stats) / len(stats)
            during = sum(s[1] for s in stats) / len(stats)
            covered = sum(s[2] for s in stats) / len(stats)
            print(f"{row[1]:26} {name:16} {steps:10.0f} {during:14.0%} {covered:17.0%}")


if __name__ == "__main__":
    main()
