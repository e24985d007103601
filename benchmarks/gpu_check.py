"""A prepared GPU check: one command, under 5 minutes on one GPU, of what a CPU cannot show.

  python benchmarks/gpu_check.py                  # one CUDA GPU, NCCL, GPT-3 350M shapes, topology dgx-h100
  python benchmarks/gpu_check.py --device cpu     # the same checks on CPU / gloo (tiny model, local-cpu)
  [--model NAME] [--topology NAME] [--mb N] [--micro N] [--steps N] [--json FILE]

1. Serial vs a 1-rank plan (layout dp=1) on NCCL (gloo on CPU), both fp32 with TF32 off, `--steps` AdamW
   steps through train_step: loss per step (relative difference <= 1e-5: the same kernels on the same device
   in the same order, so only a different cuBLAS algorithm choice could separate them, ~1e-7) and the
   collectives the plan's rank records against cost_models.traffic.stage_events (zero difference).
2. bf16 GEMMs at the cost model's local shapes (compute.local_shape of every linear of a block and of the head,
   one micro-batch of mb x seq tokens): measured TFLOP/s against GemmModel.gemm_time's prediction for the
   topology's device (peak x eff(m, n, k), compute.py), forward GEMM X [m, k] x A [k, n].
3. Memory of a bf16 step of the same plan: CUDA peak allocated (torch.cuda.max_memory_allocated, second step,
   optimizer state present) against the model's MemoryBreakdown total (parameters + gradients + optimizer +
   activations + temporaries, cost_models/memory.py); on CPU, where there is no allocator peak, the bytes
   autograd saves in one micro-batch's forward against the model's activations.
4. tpo (collective matmul, executor/layers/collective_matmul.py): each block linear's bf16 forward GEMM at the
   local shape of 1D + sp (tp=8; CPU tp=2), 2D (q=2) and 3D (q=2) timed whole and as the ring's n chunks (1D and
   3D: n row blocks of X; 2D: n blocks of the contraction, accumulated), back to back with no communication:
   chunked / whole is the GEMM time the decomposition costs (cost_models/tpo.py prices the chunks at the whole
   GEMM's time: 1.0).
5. Attention sinks (GPT-OSS): the fused kernels' output and gradients against fp32 and against the padded path
   (sink_checks.py: on CUDA the flash / efficient ops, checked on the CPU only on meta tensors).
Checks 1 and 5 decide the exit code (0 passed, 1 failed); 2 and 3 are measurements, printed with their ratio to the
model (flagged outside 0.5-1.5 for GEMMs, 10% for memory: the allocator's cached blocks and cuBLAS workspace
come on top of what the model counts). Everything runs in one rank process started by the launcher the tests
use (run_on_ranks: its own rendezvous store on port 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however it is started

from gemm_checks import check_gemms, check_tpo  # noqa: E402
from sink_checks import check_sinks, report_sinks  # noqa: E402

DEFAULTS = {"cuda": ("gpt3-350m", "dgx-h100", 1, 4), "cpu": ("tiny", "local-cpu", 2, 2)}  # model, topo, mb, micro
LOSS_TOL, MEM_TOL, GEMM_RANGE = 1e-5, 0.10, (0.5, 1.5)


def _batches(spec: Any, mb: int, n: int, device: Any, seed: int) -> list:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen).to(device),
             torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen).to(device)) for _ in range(n)]


def check_equivalence(spec: Any, cfg: dict, device: Any) -> dict[str, Any]:
    """1: serial vs the 1-rank plan, fp32: losses per step and recorded vs predicted collectives."""
    import torch

    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.traffic import stage_events
    from paracube.executor import Mesh, build_model, serial_reference, train_step
    from paracube.executor.data_parallel.optim import build_optimizer
    from paracube.layout_parse import parse_layout
    from paracube.modes.buckets import BUCKET_BYTES
    from paracube.workload import TrainingSpec

    layout = parse_layout(f"dp=1,mb={cfg['mb']}")
    mesh = Mesh(layout, 0)
    model = build_model(spec, mesh, seed=7).to(device)
    ref = serial_reference(spec, seed=7).to(device)
    adamw = {"lr": 1e-4, "weight_decay": 0.1}
    opt, ref_opt = (build_optimizer(m, m.mesh, 0, BUCKET_BYTES, **adamw) for m in (model, ref))
    micro = _batches(spec, cfg["mb"], cfg["micro"], device, seed=1)
    tokens = cfg["mb"] * cfg["micro"] * spec.seq_len
    losses, events = [], []
    for step in range(cfg["steps"]):
        mesh.recorder.reset()
        got = train_step(model, opt, mesh, micro, tokens, 1.0)
        want = train_step(ref, ref_opt, ref.mesh, micro, tokens, 1.0)
        losses.append((got.loss, want.loss))
        if step == 0:
            events = [e.key() for e in mesh.recorder.events]
    d = dims_of(spec, TrainingSpec(global_batch=cfg["mb"] * cfg["micro"], dtype="fp32"))
    predicted = [e.key() for e in stage_events(layout, d, cfg["mb"], "first")]
    p, r = Counter(map(tuple, predicted)), Counter(map(tuple, events))
    diff = {str(k): (p[k], r[k]) for k in p | r if p[k] != r[k]}
    worst = max(abs(a - b) / abs(b) for a, b in losses)
    del model, ref, opt, ref_opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"losses": losses, "loss_rel_diff": worst, "collectives": len(events), "predicted": len(predicted),
            "traffic_difference": diff,
            "passed": worst <= LOSS_TOL and not diff}


def check_memory(spec: Any, cfg: dict, device: Any) -> dict[str, Any]:
    """3: a bf16 step's memory against the model's (CUDA peak; CPU: saved activations of one micro-batch)."""
    import torch

    from paracube.cost_models.analytic import estimate
    from paracube.executor import Mesh, build_model, train_step
    from paracube.executor.data_parallel.optim import build_optimizer
    from paracube.layout_parse import parse_layout
    from paracube.modes.buckets import BUCKET_BYTES
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    layout = parse_layout(f"dp=1,mb={cfg['mb']}")
    training = TrainingSpec(global_batch=cfg["mb"] * cfg["micro"], dtype="bf16")
    mem = estimate(spec, training, layout, load_topology(cfg["topology"], gpus=1), with_events=False).memory
    mesh = Mesh(layout, 0)
    model = build_model(spec, mesh, seed=7, dtype=torch.bfloat16).to(device)
    opt = build_optimizer(model, mesh, 0, BUCKET_BYTES, lr=1e-4)
    micro = _batches(spec, cfg["mb"], cfg["micro"], device, seed=2)
    tokens = cfg["mb"] * cfg["micro"] * spec.seq_len
    out: dict[str, Any] = {"predicted": mem.to_dict()}
    if device.type == "cuda":
        train_step(model, opt, mesh, micro, tokens, 1.0)  # the optimizer's state exists from here on
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        train_step(model, opt, mesh, micro, tokens, 1.0)
        torch.cuda.synchronize(device)
        out.update(measured=float(torch.cuda.max_memory_allocated(device)), of="total")
    else:
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                saved[ptr] = max(saved.get(ptr, 0), t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(*micro[0])
        out.update(measured=float(sum(saved.values())), of="activations")
    want = out["predicted"][out["of"]]
    out["ratio"] = out["measured"] / want if want else float("nan")
    out["within"] = abs(out["ratio"] - 1.0) <= MEM_TOL
    return out


def run_checks(rank: int, world: int, device: Any, cfg: dict) -> dict[str, Any]:
    """On the rank process: every check, in order (run_on_ranks has set up the process group)."""
    import torch

    from paracube.model_presets import resolve_model

    torch.backends.cuda.matmul.allow_tf32 = False  # check 1 compares fp32 against fp32
    torch.backends.cudnn.allow_tf32 = False
    spec = replace(resolve_model(cfg["model"]), dropout=0.0, attention_dropout=0.0, embedding_dropout=0.0)
    t0 = time.perf_counter()
    out = {"equivalence": check_equivalence(spec, cfg, device)}
    out["gemms"] = check_gemms(spec, cfg, device)
    out["memory"] = check_memory(spec, cfg, device)
    out["tpo"] = check_tpo(spec, cfg, device)
    out["sinks"] = check_sinks(device, seq=1024 if device.type == "cuda" else 256)
    out["seconds"] = time.perf_counter() - t0
    out["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return out


def report(res: dict[str, Any], cfg: dict) -> list[str]:
    eq, mem = res["equivalence"], res["memory"]
    lines = [f"gpu_check on {res['device']}: model {cfg['model']}, mb={cfg['mb']} x {cfg['micro']} micro-batches, "
             f"topology {cfg['topology']}, {res['seconds']:.1f} s",
             f"1. serial vs 1-rank plan ({cfg['backend']}): loss rel diff {eq['loss_rel_diff']:.2e} (<= {LOSS_TOL}), "
             f"{eq['collectives']} collectives recorded, {eq['predicted']} predicted, "
             f"difference {eq['traffic_difference'] or 'none'}: "
             f"{'PASS' if eq['passed'] else 'FAIL'}",
             "2. bf16 GEMM (m, n, k): measured TFLOP/s vs model"]
    for r in res["gemms"]:
        flag = "" if GEMM_RANGE[0] <= r["ratio"] <= GEMM_RANGE[1] else "   <- outside 0.5-1.5"
        lines.append(f"   {r['gemm']:5s} ({r['m']}, {r['n']}, {r['k']}): {r['tflops']:9.4g} vs "
                     f"{r['predicted_tflops']:9.4g}  measured/model {r['ratio']:.2f}{flag}")
    lines.append(f"3. memory ({mem['of']}): measured {mem['measured'] / 2**20:,.1f} MiB vs model "
                 f"{mem['predicted'][mem['of']] / 2**20:,.1f} MiB, ratio {mem['ratio']:.3f}"
                 f"{'' if mem['within'] else f'   <- outside {MEM_TOL:.0%}'}")
    lines.append("4. tpo: bf16 forward GEMM whole vs in ring chunks (no communication), chunked / whole")
    for r in res["tpo"]:
        lines.append(f"   {r['mode']:11s} {r['gemm']:5s} ({r['m']}, {r['n']}, {r['k']}) x{r['chunks']}: "
                     f"{r['whole_us']:9.1f} us vs {r['chunked_us']:9.1f} us  ratio {r['ratio']:.2f}")
    return lines + report_sinks(res["sinks"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--model", default=None)
    p.add_argument("--topology", default=None)
    p.add_argument("--mb", type=int, default=None)
    p.add_argument("--micro", type=int, default=None)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    import torch

    from paracube.executor.launch.local_ranks import RanksFailed, run_on_ranks

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --device cpu for the CPU dry run", file=sys.stderr)
        return 2
    model, topo, mb, micro = DEFAULTS[args.device]
    cfg = {"model": args.model or model, "topology": args.topology or topo, "mb": args.mb or mb,
           "micro": args.micro or micro, "steps": args.steps, "backend": "nccl" if args.device == "cuda" else "gloo"}
    try:
        res = run_on_ranks(run_checks, 1, (cfg,), cfg["backend"], timeout_s=600.0, what="gpu_check")[0]
    except RanksFailed as exc:
        print(f"gpu_check: {exc}\n{exc.details}", file=sys.stderr)
        return 1
    print("\n".join(report(res, cfg)))
    if args.json:
        Path(args.json).write_text(json.dumps({"config": cfg, **res}, indent=1, default=str))
    return 0 if res["equivalence"]["passed"] and all(r["passed"] for r in res["sinks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
