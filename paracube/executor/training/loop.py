"""The training loop one rank runs: model, AdamW, LR schedule, metrics, checkpoints, resume.

`train(plan, rank, world, steps, ..., hooks=TrainHooks(...))` is what every rank calls (the worker of
`paracube run`, validation, tests). Step k (1-based) trains on the batch of step k (data.py: a function of
(seed, k)) with the parameters after k-1 updates; the checkpoint `step_N` holds the state after N updates,
so resuming from it continues at N+1 with bit-identical losses (same layout, fp32). Metrics are JSON lines
written by rank 0. Whatever watches or perturbs the run comes in through `hooks` (hooks.py).
"""

from __future__ import annotations

import json
import math
import resource
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

from paracube.errors import ParacubeError, check
from paracube.executor.checkpoint import store as ckpt
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.executor.layers.functional import COMPUTE_DTYPES
from paracube.executor.mesh import Mesh
from paracube.executor.model.gpt import build_model
from paracube.executor.recorder import CommRecorder
from paracube.executor.sizes import check_divisibility, check_dtype
from paracube.executor.training.config import LRSchedule, TrainConfig, TrainingDiverged, TrainResult
from paracube.executor.training.data import DataSource, parse_source, replica_micro_batches
from paracube.executor.training.hooks import NO_HOOKS, StepFn, TrainHooks
from paracube.executor.training.loss_scale import LossScaler
from paracube.executor.training.progress import Progress
from paracube.executor.training.step import train_step
from paracube.plan import Plan
from paracube.workload import ModelSpec, with_seq_len


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def backend_of(plan: Plan) -> str:
    if plan.launch.backend != "auto":
        return plan.launch.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def _wait_params(opt: torch.optim.Optimizer) -> None:
    """zero=1 with the parameter gathers overlapped (param_gather.py): the parameters hold the last update."""
    if hasattr(opt, "wait_params"):
        opt.wait_params()


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[list[torch.Tensor], dict[Any, Any]]:
    """Copies of parameters and optimizer state, to undo a step whose loss was not finite."""
    _wait_params(opt)
    params = [p.detach().clone() for p in [*model.parameters(), *getattr(opt, "masters", [])]]
    state = {p: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for p, s in opt.state.items()}
    return params, state


def _restore(model: torch.nn.Module, opt: torch.optim.Optimizer, snap: tuple[list[torch.Tensor], dict]) -> None:
    _wait_params(opt)  # a pending gather of the undone step must not land after the restore
    with torch.no_grad():
        for p, saved in zip([*model.parameters(), *getattr(opt, "masters", [])], snap[0], strict=True):
            p.copy_(saved)
    opt.state.clear()
    opt.state.update(snap[1])


def _truncate_metrics(path: Path, last_step: int) -> None:
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by the crash
    path.write_text("".join(x + "\n" for x in keep))


@dataclass
class _Run:
    """What one rank's loop works with, built once by _setup."""

    plan: Plan
    config: TrainConfig
    device: torch.device
    recorder: CommRecorder
    mesh: Mesh
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    source: DataSource
    step_fn: StepFn
    dp_index: int
    schedule: LRSchedule
    hooks: TrainHooks
    start: int = 0
    scaler: LossScaler | None = None  # fp16: dynamic loss scaling


def _check_request(plan: Plan, world: int, steps: int, checkpoint_dir: str | Path | None, save_every: int,
                   resume: bool, config: TrainConfig) -> ModelSpec:
    """Every refusal before the process group exists (a rank started by torchrun directly checks too)."""
    layout = plan.layout
    check(world == layout.world_size, f"world size {world} != the {layout.world_size} ranks layout {layout} needs")
    check(steps >= 0, f"steps={steps} must be >= 0")
    check(save_every >= 0, f"save_every={save_every} must be >= 0")
    check(not (resume or save_every) or checkpoint_dir is not None, "--resume and --save-every need --checkpoint-dir")
    check(config.on_nonfinite in ("stop", "skip"), f"on_nonfinite={config.on_nonfinite!r}; valid: stop, skip")
    check(config.bucket_bytes > 0, f"bucket_bytes={config.bucket_bytes} must be > 0")
    check(not (config.on_nonfinite == "skip" and layout.zero == 3), "on_nonfinite=skip with zero=3: the step's "
          "undo copies whole parameters, which zero=3 holds only as shards; use on_nonfinite=stop")
    spec = with_seq_len(plan.model, plan.seq_len)
    check_dtype(plan.training.dtype, layout)
    check_divisibility(spec, layout, plan.micro_batch, plan.training.global_batch, plan.seq_len)
    if checkpoint_dir is not None and not resume and ckpt.has_checkpoint(Path(checkpoint_dir)):
        raise ParacubeError(f"checkpoint directory {str(checkpoint_dir)!r} already holds checkpoints; pass "
                            "--resume to continue them or choose another directory")
    return spec


def _device(backend: str, rank: int, local_rank: int | None) -> torch.device:
    if backend != "nccl":
        return torch.device("cpu")
    have = torch.cuda.device_count()
    index = local_rank if local_rank is not None else rank % max(1, have)
    check(index < have, f"backend nccl: local rank {index} needs GPU {index}, but this node sees {have} GPU(s); "
          "run at most that many ranks per node or use backend gloo")
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def _setup(plan: Plan, spec: ModelSpec, source: DataSource, rank: int, device: torch.device, steps: int,
           config: TrainConfig, hooks: TrainHooks) -> _Run:
    recorder = CommRecorder(hooks.observe_collective)
    mesh = Mesh(plan.layout, rank, recorder=recorder)
    fp8 = plan.training.dtype == "fp8"  # bf16 with FP8 GEMMs in the blocks (executor/layers/fp8.py)
    model = build_model(spec, mesh, seed=config.seed, recompute=plan.training.recompute,
                        dtype=COMPUTE_DTYPES["bf16" if fp8 else plan.training.dtype], fp8=fp8).to(device)
    opt = build_optimizer(model, mesh, plan.layout.zero, config.bucket_bytes, lr=config.lr, betas=config.betas,
                          weight_decay=config.weight_decay)
    step_fn = hooks.wrap_step(train_step) if hooks.wrap_step is not None else train_step
    dp_index = mesh.coord("dp") if plan.layout.dp > 1 else 0
    return _Run(plan, config, device, recorder, mesh, model, opt, source, step_fn, dp_index, config.schedule(steps),
                hooks, scaler=LossScaler(config.loss_scale) if plan.training.dtype == "fp16" else None)


def _resume(run: _Run, checkpoint_dir: str | Path, result: TrainResult) -> None:
    """Load the latest checkpoint into the run: its step, its LR schedule (the run continues on it)."""
    config = run.config
    found = ckpt.find_checkpoint(checkpoint_dir)
    saved = ckpt.read_meta(found)
    check(saved.get("data", {}).get("source") == config.data and saved["data"].get("seed") == config.seed,
          f"checkpoint was trained on data {saved.get('data')}; resume with the same --data and --seed")
    if hasattr(run.opt, "load_view"):  # zero=1 / fp32 masters: the moments (and masters) per parameter
        view = run.opt.empty_view()
        meta = ckpt.load_checkpoint(checkpoint_dir, run.model, view, run.mesh)  # type: ignore[arg-type]
        run.opt.load_view(view)
    else:
        meta = ckpt.load_checkpoint(checkpoint_dir, run.model, run.opt, run.mesh)
    run.start = meta["step"]
    run.schedule = LRSchedule(**meta["schedule"])
    result.last_checkpoint = str(found)


def _one_step(run: _Run, step: int) -> dict[str, Any]:
    """Train step `step`; its metrics row. A non-finite loss stops (TrainingDiverged) or, with
    on_nonfinite=skip, restores the parameters and optimizer state from before the step."""
    plan, tr, device = run.plan, run.plan.training, run.device
    lr = run.schedule(step)
    for group in run.opt.param_groups:
        group["lr"] = lr
    micro = [(ids.to(device), labels.to(device)) for ids, labels in
             replica_micro_batches(run.source, step, tr.global_batch, plan.layout.dp, run.dp_index, plan.micro_batch)]
    snap = _snapshot(run.model, run.opt) if run.config.on_nonfinite == "skip" else None
    tokens_per_step = tr.global_batch * plan.seq_len
    run.recorder.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = run.step_fn(run.model, run.opt, run.mesh, micro, tokens_per_step, max_grad_norm=run.config.max_grad_norm,
                      overlap=run.config.overlap and run.plan.layout.overlap,
                      param_overlap=run.config.overlap,  # zero=1: priced from the runtime, not the layout
                      bucket_bytes=run.config.bucket_bytes, **({"scaler": run.scaler} if run.scaler else {}))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    loss, gnorm = float(out.loss), float(out.grad_norm)
    fp8 = getattr(run.model, "fp8", None)
    # fp16: overflowing gradients were skipped by the scaler; fp8: an overflowing amax skipped the step (its
    # loss may be inf too), the scales kept
    finite = (math.isfinite(loss) and (math.isfinite(gnorm) or out.overflow)) or (fp8 is not None and out.overflow)
    if not finite and snap is not None:
        _restore(run.model, run.opt, snap)
    row = {"step": step, "loss": loss, "lr": lr, "step_time_s": dt, "tokens_per_s": tokens_per_step / dt,
           "bytes_sent_per_rank": sum(e.sent_bytes() for e in run.recorder.events),
           "peak_memory_bytes": _peak_memory_bytes(device), "grad_norm": gnorm}
    if not finite:
        row["skipped"] = True
    if fp8 is not None and out.overflow:
        row["overflow"] = True
        if fp8.exhausted:
            raise TrainingDiverged(f"fp8 amaxes overflowed in {fp8.skips} steps in a row at step {step}; stopped: "
                                   "use bf16")
    if run.scaler is not None:
        row["loss_scale"] = run.scaler.scale
        if out.overflow:
            row["overflow"] = True
            if run.scaler.exhausted:
                raise TrainingDiverged(f"fp16 gradients overflowed in {run.scaler.skips} steps in a row (loss scale "
                                       f"backed off to {run.scaler.scale:g}) at step {step}; stopped: use bf16")
    return row


def _save(run: _Run, checkpoint_dir: str | Path, step: int) -> str:
    config = run.config
    meta = {"schedule": asdict(run.schedule), "data": {"source": config.data, "seed": config.seed,
                                                       "next_step": step + 1},
            "plan": run.plan.to_dict(), "layout": str(run.plan.layout)}
    opt = run.opt.checkpoint_view() if hasattr(run.opt, "checkpoint_view") else run.opt
    return str(ckpt.save_checkpoint(checkpoint_dir, step, run.model, opt, meta,  # type: ignore[arg-type]
                                    after_shard_written=run.hooks.after_shard_written))


def _open_metrics(stack: ExitStack, path: str | Path | None, rank: int, resume: bool, start: int) -> IO[str] | None:
    if not path or rank != 0:
        return None
    if resume:  # continue the interrupted run's metrics, minus rows past the checkpoint
        _truncate_metrics(Path(path), start)
    return stack.enter_context(open(path, "a" if resume else "w"))  # noqa: SIM115


def _loop(run: _Run, steps: int, result: TrainResult, metrics_file: IO[str] | None, bar: Progress,
          checkpoint_dir: str | Path | None, save_every: int, hooks: TrainHooks) -> None:
    for step in range(run.start + 1, steps + 1):
        if hooks.before_step is not None:
            hooks.before_step(step)
        row = _one_step(run, step)
        if "skipped" in row and run.config.on_nonfinite == "stop":
            raise TrainingDiverged(f"loss is {row['loss']} (grad norm {row['grad_norm']}) at step {step}; stopped. "
                                   f"Last good checkpoint: {result.last_checkpoint or 'none'}")
        result.metrics.append(row)
        if metrics_file is not None:
            metrics_file.write(json.dumps(row) + "\n")
            metrics_file.flush()
        bar.update(row["loss"], row["step_time_s"], skipped="skipped" in row)
        if checkpoint_dir is not None and save_every and (step % save_every == 0 or step == steps):
            result.last_checkpoint = _save(run, checkpoint_dir, step)
        if hooks.after_step is not None:
            hooks.after_step(row, result.last_checkpoint)
    _wait_params(run.opt)  # the run ends with every parameter updated


def train(plan: Plan, rank: int, world: int, steps: int, metrics_path: str | Path | None = None,
          checkpoint_dir: str | Path | None = None, save_every: int = 0, resume: bool = False,
          config: TrainConfig | None = None, progress: bool = False, local_rank: int | None = None,
          hooks: TrainHooks = NO_HOOKS) -> TrainResult:
    """Train `plan` on this rank up to step `steps` (from 0, or from the checkpoint with `resume`).
    Initializes torch.distributed from the environment (MASTER_ADDR/PORT) if it is not yet."""
    config = config or TrainConfig()
    spec = _check_request(plan, world, steps, checkpoint_dir, save_every, resume, config)
    source = parse_source(config.data, spec.vocab, plan.seq_len, config.seed)  # refused before the group too
    owns_pg = not dist.is_initialized()
    # The device follows the process group's backend (an existing group's, else the plan's); set_device
    # comes before init_process_group so that NCCL binds this rank's GPU.
    backend = backend_of(plan) if owns_pg else str(dist.get_backend())
    device = _device(backend, rank, local_rank)
    if owns_pg:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=config.comm_timeout_s))
    result = TrainResult()
    try:
        run = _setup(plan, spec, source, rank, device, steps, config, hooks)
        if resume:
            _resume(run, checkpoint_dir, result)  # type: ignore[arg-type]
        with ExitStack() as stack:
            metrics_file = _open_metrics(stack, metrics_path, rank, resume, run.start)
            bar = Progress(progress and rank == 0, steps, min(run.start, steps))
            stack.callback(bar.close)
            _loop(run, steps, result, metrics_file, bar, checkpoint_dir, save_every, hooks)
    finally:
        if owns_pg and dist.is_initialized():
            dist.destroy_process_group()
    return result


__all__ = ["LRSchedule", "TrainConfig", "TrainHooks", "TrainResult", "TrainingDiverged", "train"]
