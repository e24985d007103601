"""`paracube validate`: run a plan for N steps on local ranks and compare with the cost model's prediction.

Each rank runs the executor's `train()` (the same loop as `paracube run`) with hooks (executor/training/hooks.py):
a collective observer times every collective the executor issues (wall time, waiting for peers included,
and process CPU time) and a step wrapper marks step boundaries. The communication
part is measured as the calibration prices it: wall time, or for a CPU-basis calibration (ranks sharing
cores) ranks-per-core x CPU time; compute is the rest of the step. Measured memory is the
growth of the rank's peak RSS over its value before the model is built (the interpreter and torch are
not what the cost model predicts). Step 1 (warm-up) is left out of the measured means.
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from paracube.calibration.calibrate import check_calibration
from paracube.errors import check
from paracube.estimate import CommEvent
from paracube.executor.launch.local_ranks import run_on_ranks
from paracube.executor.training.hooks import StepFn, TrainHooks
from paracube.plan import Plan
from paracube.validation.verdict import verdict


@dataclass(frozen=True)
class Comparison:
    name: str
    predicted: float
    measured: float
    band: float = 0.0  # relative uncertainty of the prediction

    @property
    def rel_err(self) -> float:
        """(predicted - measured) / measured."""
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else math.inf
        return (self.predicted - self.measured) / self.measured

    def to_dict(self) -> dict[str, float | str]:
        return {"name": self.name, "predicted": self.predicted, "measured": self.measured,
                "rel_err": self.rel_err, "band": self.band}


class CollectiveTimer:
    """Hooks for train(): the (wall, process CPU) seconds of every collective the executor issues (an observer,
    executor/recorder.py), summed per training step (a step wrapper): `per_step[i]` for the i-th step."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.calls: list[tuple[float, float]] = []
        self.per_step: list[tuple[float, float]] = []
        # CUDA collectives are asynchronous: synchronize before and after one so that its time is its own.
        cuda = device is not None and device.type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    @contextmanager
    def observe(self, event: CommEvent) -> Iterator[None]:
        self.sync()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.sync()
            self.calls.append((time.perf_counter() - t0, time.process_time() - c0))

    def wrap(self, step: StepFn) -> StepFn:
        def marked(*args: Any, **kwargs: Any) -> Any:
            start = len(self.calls)
            out = step(*args, **kwargs)
            mine = self.calls[start:]
            self.per_step.append((sum(c[0] for c in mine), sum(c[1] for c in mine)))
            return out

        return marked

    def hooks(self) -> TrainHooks:
        return TrainHooks(wrap_step=self.wrap, observe_collective=(self.observe,))


def _validate_rank(rank: int, world: int, device: torch.device, plan: Plan, steps: int) -> dict[str, Any]:
    from paracube.executor.training.loop import TrainConfig, train

    timer = CollectiveTimer(device)
    if device.type == "cuda":  # CUDA memory (what the model prices), not the host's RSS
        torch.cuda.reset_peak_memory_stats(device)
        base_rss = int(torch.cuda.memory_allocated(device))
    else:
        base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = train(plan, rank, world, steps, config=TrainConfig(data="synthetic"), local_rank=rank,
                   hooks=timer.hooks())
    rows = [{**m, "comm_time_s": wall, "comm_cpu_s": cpu} for m, (wall, cpu) in zip(result.metrics, timer.per_step,
                                                                                   strict=True)]
    return {"rows": rows, "base_rss": base_rss}


def measure(plan: Plan, steps: int, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Per-rank results of `steps` training steps of `plan` on local ranks."""
    return run_on_ranks(_validate_rank, plan.layout.world_size, (plan, steps), plan.launch.backend, timeout_s,
                        "validate", preload=(__name__,))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def compare(estimate: Any, per_rank: list[dict[str, Any]], calibration: dict[str, Any] | None) -> dict[str, Any]:
    """Predicted vs measured: per-step rows (rank-mean) and the summary over steps 2.. (step 1 is warm-up)."""
    n_steps = len(per_rank[0]["rows"])
    steps = []
    for i in range(n_steps):
        rows = [r["rows"][i] for r in per_rank]
        steps.append({
            "step": rows[0]["step"],
            "step_time_s": _mean([r["step_time_s"] for r in rows]),
            "comm_time_s": _mean([r["comm_time_s"] for r in rows]),
            "comm_cpu_s": _mean([r.get("comm_cpu_s", math.nan) for r in rows]),
            "bytes_sent_per_rank": max(r["bytes_sent_per_rank"] for r in rows),
            "memory_bytes": max(r["peak_memory_bytes"] - p["base_rss"] for r, p in zip(rows, per_rank, strict=True)),
        })
    kept = steps[1:] or steps  # skip warm-up when there is more than one step
    t_meas = _mean([s["step_time_s"] for s in kept])
    timing = (calibration or {}).get("timing", {})
    if timing.get("basis") == "cpu":
        # A CPU-basis calibration prices a call by the CPU it takes times the ranks sharing a core
        # (calibrate.timing_basis); measure the communication part the same way.
        c_meas = float(timing["ranks_per_core"]) * _mean([s["comm_cpu_s"] for s in kept])
    else:
        c_meas = _mean([s["comm_time_s"] for s in kept])
    res = (calibration or {}).get("residuals", {})
    step = max(estimate.step_time_s, 1e-30)
    # Uncertainty: each part's share of the step times its fit's RMS relative error, and the step probes'
    # spread over rounds (the per-op overhead is fitted to them), added in quadrature.
    band = math.hypot(estimate.compute_time_s / step * float(res.get("gemm", 0.0)),
                      estimate.comm_time_s / step * float(res.get("comm", 0.0)), float(res.get("probe", 0.0)))
    comparisons = [
        Comparison("step_time_s", estimate.step_time_s, t_meas, band),
        Comparison("compute_time_s", estimate.compute_time_s, t_meas - c_meas, float(res.get("gemm", 0.0))),
        Comparison("comm_time_s", estimate.comm_time_s, c_meas, float(res.get("comm", 0.0))),
        Comparison("bytes_sent_per_rank", estimate.comm_bytes_per_gpu, kept[-1]["bytes_sent_per_rank"]),
        Comparison("memory_bytes", estimate.memory.total, max(s["memory_bytes"] for s in steps)),
    ]
    return {"layout": estimate.layout, "steps": steps, "measured_steps": [s["step"] for s in kept],
            "comparisons": [c.to_dict() for c in comparisons],
            "bytes_equal": comparisons[3].predicted == comparisons[3].measured}


def validate(plan: Plan, steps: int, topo: Any, source: str) -> dict[str, Any]:
    """Predict with the analytic cost model on `topo`, run, compare. `source` names the cluster in errors."""
    from paracube.cost_models import estimate

    check(steps >= 1, f"--steps {steps} must be >= 1 (2 or more: step 1 is warm-up)")
    calibration = None
    if getattr(topo, "calibration", None) is not None:
        calibration = check_calibration(topo, source, plan.layout.world_size)
    layout = plan.layout.with_(micro_batch=plan.micro_batch)
    # paracube's executor runs the plan: its overlaps (Runtime.engine_options), whatever runtime planned it
    from paracube.runtimes import DEFAULT_RUNTIME, get_runtime

    est = estimate(plan.model, plan.training, layout, topo, with_events=False,
                   options=get_runtime(DEFAULT_RUNTIME).engine_options())
    out = compare(est, measure(plan, steps), calibration)
    out["cluster"] = source
    out["calibrated"] = calibration is not None
    out["within_band"], out["verdict"] = verdict(out["comparisons"], out["bytes_equal"])
    return out


__all__ = ["CollectiveTimer", "Comparison", "compare", "measure", "validate"]
