"""One training step: micro-batches, data-parallel gradient sum, global-norm clipping, AdamW step, metrics.
Collectives: docs/algorithms.md "Per-step collectives common to all modes". With pp > 1 the micro-batches
run through the pipeline schedule (executor/pipeline.py), the grad norm is summed over (pp, *tensor axes)
and the metrics over every rank (the loss is on the last stage), as cost_models/traffic.py declares."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from paracube.executor.comm import all_reduce
from paracube.executor.gpt import ParallelGPT
from paracube.executor.mesh import Mesh
from paracube.executor.pipeline import run_pipeline
from paracube.executor.sizes import check_divisibility


@dataclass(frozen=True)
class StepResult:
    loss: float  # mean token loss over the global batch
    grad_norm: float  # global gradient norm before clipping


def train_step(model: ParallelGPT, optimizer: torch.optim.Optimizer, mesh: Mesh,
               micro_batches: list[tuple[Tensor, Tensor]], tokens_per_step: int,
               max_grad_norm: float | None = 1.0, autocast_dtype: torch.dtype | None = None) -> StepResult:
    rec = mesh.recorder
    params = list(model.parameters())
    device = params[0].device
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    count = torch.zeros((), dtype=torch.float32, device=device)
    pipelined = mesh.layout.pp > 1
    if pipelined:  # executor/pipeline.py: 1F1B / interleaved schedule over the pp axis
        loss_sum, count = run_pipeline(model, mesh, micro_batches, tokens_per_step, autocast_dtype)
    for ids, labels in micro_batches if not pipelined else []:
        amp = (torch.autocast(ids.device.type, dtype=autocast_dtype) if autocast_dtype is not None
               else nullcontext())
        with rec.phase("fwd"), amp:
            local_sum, local_count = model(ids, labels)
        with rec.phase("bwd"):
            (local_sum / tokens_per_step).backward()
        loss_sum += local_sum.detach().float()
        count += local_count

    with rec.phase("grad_sync"):
        model.reduce_sequence_parallel_grads()  # 1D + sp: norms, row biases, pos_emb summed over tp
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    grad_axes = mesh.layout.tensor_mode.grad_axes  # the mode's declaration: ("dp",); 2.5D ("dp", "dep")
    if mesh.size(grad_axes) > 1:
        # One flat fp32 buffer: one collective instead of one per parameter.
        with rec.phase("grad_sync"):
            flat = all_reduce(torch.cat([g.reshape(-1).float() for g in grads]), mesh, grad_axes, label="grads")
        offset = 0
        for p, g in zip(params, grads, strict=True):
            p.grad = flat[offset:offset + g.numel()].view_as(p).to(p.dtype)
            offset += g.numel()
        grads = [p.grad for p in params]

    # Global norm: replicated parameters count once (on their replica leader inside the tensor group).
    specs = [model.shard_specs[n] for n, _ in model.named_parameters()]
    sq = torch.zeros(1, dtype=torch.float32, device=device)
    for g, spec in zip(grads, specs, strict=True):
        if all(mesh.coord(a) == 0 for a in spec.replicated_axes):
            sq += g.float().pow(2).sum()
    tensor_axes = mesh.layout.tensor_axes
    norm_axes = (("pp",) if pipelined else ()) + tensor_axes  # stages hold disjoint parameters
    with rec.phase("optimizer"):
        if norm_axes:
            sq = all_reduce(sq, mesh, norm_axes, label="grad_norm")
        norm = math.sqrt(float(sq.item()))
        if max_grad_norm is not None:
            coef = max_grad_norm / (norm + 1e-6)
            if coef < 1.0:
                for g in grads:
                    g.mul_(coef)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    with rec.phase("metrics"):
        metrics = torch.stack([loss_sum, count]).float()
        # With pp > 1 the loss lives on the last stage: the metrics sum runs over every rank.
        metric_axes = ("pp", "dp", *tensor_axes) if pipelined else ("dp", *tensor_axes)
        metrics = all_reduce(metrics, mesh, metric_axes, label="metrics")
    return StepResult(loss=float(metrics[0] / metrics[1]), grad_norm=norm)


__all__ = ["StepResult", "check_divisibility", "train_step"]
