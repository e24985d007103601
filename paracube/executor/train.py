"""The training loop one rank runs: model, AdamW, LR schedule, metrics, checkpoints, resume.

`train(plan, rank, world, steps, ...)` is what every rank calls (torchrun worker or test process). Step k
(1-based) trains on the batch of step k (data.py: a function of (seed, k)) with the parameters after k-1
updates; the checkpoint `step_N` holds the state after N updates, so resuming from it continues at N+1
with bit-identical losses (same layout, fp32). Metrics are JSON lines written by rank 0.
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from paracube.errors import ParacubeError, check
from paracube.executor import checkpoint as ckpt
from paracube.executor.data import DataSource, parse_source, replica_micro_batches
from paracube.plan import Plan
from paracube.workload import with_seq_len

AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
KILL_ENV = "PARACUBE_FAULT_KILL"  # "RANK:STEP": that rank kills itself at that step (tests of rank death)


class TrainingDiverged(RuntimeError):
    """The loss (or gradient norm) became NaN/inf."""


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup to `lr` over `warmup` steps, then cosine decay to `min_lr` at step `total`."""

    lr: float
    min_lr: float
    warmup: int
    total: int

    def __call__(self, step: int) -> float:
        if step <= self.warmup:
            return self.lr * step / max(1, self.warmup)
        frac = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * frac))


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer and data settings that the plan does not fix."""

    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None  # None: 10% of the schedule, at least 1
    schedule_steps: int | None = None  # None: the run's `steps` (a resumed run keeps its checkpoint's)
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: float = 1.0
    seed: int = 0
    data: str = "text"  # data.py: synthetic | text | text:PATH
    on_nonfinite: Literal["stop", "skip"] = "stop"
    comm_timeout_s: float = 120.0

    def schedule(self, steps: int) -> LRSchedule:
        total = self.schedule_steps or steps
        warmup = self.warmup_steps if self.warmup_steps is not None else max(1, total // 10)
        return LRSchedule(self.lr, self.lr * self.min_lr_ratio, warmup, total)


@dataclass
class TrainResult:
    metrics: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: str | None = None

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics]


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def backend_of(plan: Plan) -> str:
    if plan.launch.backend != "auto":
        return plan.launch.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[list[torch.Tensor], dict[Any, Any]]:
    """Copies of parameters and optimizer state, to undo a step whose loss was not finite."""
    params = [p.detach().clone() for p in model.parameters()]
    state = {p: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for p, s in opt.state.items()}
    return params, state


def _restore(model: torch.nn.Module, opt: torch.optim.Optimizer, snap: tuple[list[torch.Tensor], dict]) -> None:
    with torch.no_grad():
        for p, saved in zip(model.parameters(), snap[0], strict=True):
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


def _maybe_die(rank: int, step: int) -> None:
    spec = os.environ.get(KILL_ENV, "")
    if spec and spec == f"{rank}:{step}":
        print(f"[paracube] rank {rank}: killed by {KILL_ENV} at step {step}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class _Progress:
    """A rich progress bar on rank 0 (a no-op elsewhere)."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()

    def update(self, info: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def train(plan: Plan, rank: int, world: int, steps: int, metrics_path: str | Path | None = None,
          checkpoint_dir: str | Path | None = None, save_every: int = 0, resume: bool = False,
          config: TrainConfig | None = None, progress: bool = False, local_rank: int | None = None,
          after_shard_written: ckpt.ShardWrittenHook | None = None) -> TrainResult:
    """Train `plan` on this rank up to step `steps` (from 0, or from the checkpoint with `resume`).
    Initializes torch.distributed from the environment (MASTER_ADDR/PORT) if it is not yet.
    `after_shard_written`: passed to every save_checkpoint (fault-injection tests)."""
    from paracube.executor.comm import CommRecorder
    from paracube.executor.gpt import build_model
    from paracube.executor.mesh import Mesh
    from paracube.executor.step import check_divisibility, train_step

    config = config or TrainConfig()
    layout, tr = plan.layout, plan.training
    check(world == layout.world_size, f"world size {world} != the {layout.world_size} ranks layout {layout} needs")
    check(steps >= 0, f"steps={steps} must be >= 0")
    check(save_every >= 0, f"save_every={save_every} must be >= 0")
    check(not (resume or save_every) or checkpoint_dir is not None, "--resume and --save-every need --checkpoint-dir")
    check(config.on_nonfinite in ("stop", "skip"), f"on_nonfinite={config.on_nonfinite!r}; valid: stop, skip")
    seq_len = plan.seq_len
    spec = with_seq_len(plan.model, seq_len)
    check_divisibility(spec, layout, plan.micro_batch, tr.global_batch, seq_len)
    if checkpoint_dir is not None and not resume and ckpt.has_checkpoint(Path(checkpoint_dir)):
        raise ParacubeError(f"checkpoint directory {str(checkpoint_dir)!r} already holds checkpoints; pass "
                            "--resume to continue them or choose another directory")
    source: DataSource = parse_source(config.data, spec.vocab, seq_len, config.seed)

    backend = backend_of(plan)
    owns_pg = not dist.is_initialized()
    if owns_pg:
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=timedelta(seconds=config.comm_timeout_s))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank if local_rank is not None else rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    result = TrainResult()
    bar, metrics_file, stack = None, None, ExitStack()
    try:
        recorder = CommRecorder()
        mesh = Mesh(layout, rank, recorder=recorder)
        model = build_model(spec, mesh, seed=config.seed, recompute=tr.recompute).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas,
                                weight_decay=config.weight_decay)
        schedule, start = config.schedule(steps), 0
        if resume:
            saved = ckpt.read_meta(ckpt.find_checkpoint(checkpoint_dir))  # type: ignore[arg-type]
            check(saved.get("data", {}).get("source") == config.data and saved["data"].get("seed") == config.seed,
                  f"checkpoint was trained on data {saved.get('data')}; resume with the same --data and --seed")
            meta = ckpt.load_checkpoint(checkpoint_dir, model, opt, mesh)  # type: ignore[arg-type]
            start = meta["step"]
            schedule = LRSchedule(**meta["schedule"])  # the run continues on its original schedule
            result.last_checkpoint = str(ckpt.find_checkpoint(checkpoint_dir))  # type: ignore[arg-type]
        dp_index = mesh.coord("dp") if layout.dp > 1 else 0
        tokens_per_step = tr.global_batch * seq_len
        if metrics_path and rank == 0:
            if resume:  # continue the interrupted run's metrics, minus rows past the checkpoint
                _truncate_metrics(Path(metrics_path), start)
            metrics_file = stack.enter_context(open(metrics_path, "a" if resume else "w"))  # noqa: SIM115
        bar = _Progress(progress and rank == 0, steps, min(start, steps))
        for step in range(start + 1, steps + 1):
            _maybe_die(rank, step)
            lr = schedule(step)
            for group in opt.param_groups:
                group["lr"] = lr
            micro = [(ids.to(device), labels.to(device)) for ids, labels in
                     replica_micro_batches(source, step, tr.global_batch, layout.dp, dp_index, plan.micro_batch)]
            snap = _snapshot(model, opt) if config.on_nonfinite == "skip" else None
            recorder.reset()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = train_step(model, opt, mesh, micro, tokens_per_step, max_grad_norm=config.max_grad_norm,
                             autocast_dtype=AUTOCAST[tr.dtype])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            loss, gnorm = float(out.loss), float(out.grad_norm)
            finite = math.isfinite(loss) and math.isfinite(gnorm)
            if not finite and snap is None:
                raise TrainingDiverged(f"loss is {loss} (grad norm {gnorm}) at step {step}; stopped. Last good "
                                       f"checkpoint: {result.last_checkpoint or 'none'}")
            if not finite and snap is not None:
                _restore(model, opt, snap)
            row = {"step": step, "loss": loss, "lr": lr, "step_time_s": dt, "tokens_per_s": tokens_per_step / dt,
                   "bytes_sent_per_rank": sum(e.sent_bytes() for e in recorder.events),
                   "peak_memory_bytes": _peak_memory_bytes(device), "grad_norm": gnorm}
            if not finite:
                row["skipped"] = True
            result.metrics.append(row)
            if metrics_file is not None:
                metrics_file.write(json.dumps(row) + "\n")
                metrics_file.flush()
            bar.update(f"loss {loss:.4f}" + (" (skipped)" if not finite else ""))
            if checkpoint_dir is not None and save_every and (step % save_every == 0 or step == steps):
                meta = {"schedule": asdict(schedule), "data": {"source": config.data, "seed": config.seed,
                                                               "next_step": step + 1},
                        "plan": plan.to_dict(), "layout": str(layout)}
                result.last_checkpoint = str(ckpt.save_checkpoint(checkpoint_dir, step, model, opt, meta,
                                                                  after_shard_written))
    finally:
        stack.close()
        if bar is not None:
            bar.close()
        if owns_pg and dist.is_initialized():
            dist.destroy_process_group()
    return result


__all__ = ["AUTOCAST", "KILL_ENV", "LRSchedule", "TrainConfig", "TrainResult", "TrainingDiverged", "train"]
