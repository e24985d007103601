"""One training step: micro-batches, data-parallel gradient sum, global-norm clipping, AdamW step, metrics.
Collectives: docs/algorithms.md "Per-step collectives common to all modes". With pp > 1 the micro-batches
run through the pipeline schedule (executor/pipeline/schedule.py), the grad norm is summed over (pp, *tensor axes)
(zero=1: (pp, dp, *tensor axes)) and the metrics over every rank (the loss is on the last stage), as
cost_models/traffic.py declares.

Gradients are summed over dp in buckets (grad_sync.py), issued as the last micro-batch's backward produces
them (`overlap=True`; with pp > 1 each stage's buckets during its own last backward, per model chunk when
interleaved: grad_sync.py) or all after it (`overlap=False`); both give bit-identical results. With the
distributed optimizer (distributed_adamw.DistributedAdamW, zero=1) the buckets are reduce-scattered, the norm is summed
over the shards and the updated parameters are all-gathered by the optimizer: at once, or (`param_overlap`)
asynchronously, finished by the next forward's module pre-hooks (param_gather.py), bit-identical either way.

Precision (functional.py): the model runs in its parameters' dtype (no autocast); the reduced fp32
gradients are `p.main_grad` (p.grad too for fp32 parameters), which the norm, clipping and the optimizer
read (MasterAdamW / DistributedAdamW step fp32 masters and write the compute copy back). fp16: the loss is
multiplied by the scaler's scale before backward (on the last stage with pp > 1); the overflow check is the
global norm, all-reduced over every group holding gradients (pp and tensor axes; dp too with zero=1), so
every rank skips the same step (loss_scale.py). fp8 (model.fp8, executor/layers/fp8.py): before the norm, the
step's amaxes are max-reduced over the amax group (data axes + tensor axes) and the scales updated; a non-finite
amax skips the step on every rank alike (StepResult.overflow). `after_backward(model)`: an explicit test hook
called once the step's gradients are reduced, before the norm (tests force an overflow on one rank with it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from paracube.executor.comm import all_reduce
from paracube.executor.data_parallel.distributed_adamw import DistributedAdamW
from paracube.executor.data_parallel.grad_sync import GradSync, grad_sync_for
from paracube.executor.data_parallel.sharded import ShardedSync
from paracube.executor.layers.functional import main_grad
from paracube.executor.mesh import Mesh, metrics_axes
from paracube.executor.model.gpt import ParallelGPT
from paracube.executor.model.moe import expert_norm_sq, is_expert, set_aux_grad_scale
from paracube.executor.pipeline.schedule import reduce_tied_embedding_grads, run_pipeline
from paracube.executor.sizes import check_divisibility
from paracube.executor.training.loss_scale import LossScaler
from paracube.modes.buckets import BUCKET_BYTES


@dataclass(frozen=True)
class StepResult:
    loss: float  # mean token loss over the global batch
    grad_norm: float  # global gradient norm before clipping (inf when fp16 gradients overflowed)
    overflow: bool = False  # fp16: the gradients overflowed, the step was skipped (loss_scale.py)


def train_step(model: ParallelGPT, optimizer: torch.optim.Optimizer, mesh: Mesh,
               micro_batches: list[tuple[Tensor, Tensor]], tokens_per_step: int,
               max_grad_norm: float | None = 1.0, overlap: bool = True, bucket_bytes: int = BUCKET_BYTES,
               scaler: LossScaler | None = None,
               after_backward: Callable[[ParallelGPT], None] | None = None, param_overlap: bool = False) -> StepResult:
    """One step; `scaler` (fp16) scales the loss, skips the step on overflow and updates its scale.
    `param_overlap` (zero=1): the step's parameter all-gathers finish in the next step's forward
    (data_parallel/param_gather.py); the parameters hold the update once `optimizer.wait_params()` ran."""
    rec = mesh.recorder
    params = list(model.parameters())
    device = params[0].device
    sharded = isinstance(optimizer, DistributedAdamW)
    sync: GradSync = optimizer.sync if sharded else grad_sync_for(model, mesh, bucket_bytes)
    if sharded and sync.zero == 1:
        optimizer.overlap_gathers(model if param_overlap else None)  # type: ignore[union-attr]
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    count = torch.zeros((), dtype=torch.float32, device=device)
    pipelined = mesh.layout.pp > 1
    # Pipelines interleave the micro-batches' backwards: a parameter's gradient is final at its n-th
    # accumulation (its chunk's last backward), so each stage reduces its buckets during its own last backward.
    sync.start(overlap, len(micro_batches) if pipelined else 0)
    scale = scaler.scale if scaler is not None else 1.0
    set_aux_grad_scale(model, scale / tokens_per_step)  # MoE aux losses: the loss sum's gradient (model/moe.py)
    model.begin_step(len(micro_batches))  # kw=1: gathered weights kept until the last backward (kept.py)
    if pipelined:  # executor/pipeline/schedule.py: 1F1B / interleaved schedule over the pp axis
        loss_sum, count = run_pipeline(model, mesh, micro_batches, tokens_per_step, scale,
                                       sync if isinstance(sync, ShardedSync) else None)  # zero=2/3
    for k, (ids, labels) in enumerate(micro_batches if not pipelined else []):
        with rec.phase("fwd"):
            local_sum, local_count = model(ids, labels)
        if k == len(micro_batches) - 1:
            sync.last_micro_batch()
        with rec.phase("bwd"):
            loss = local_sum / tokens_per_step
            (loss if scaler is None else loss * scaler.scale).backward()
        loss_sum += local_sum.detach().float()
        count += local_count
    model.end_step()
    sync.finish()
    if not sharded:
        sync.set_param_grads()
    if after_backward is not None:
        after_backward(model)

    tensor_axes = mesh.layout.tensor_axes
    stages = ("pp",) if pipelined else ()  # stages hold disjoint parameters
    if sharded:
        with rec.phase("grad_sync"):  # 1D + sp: the sequence-parallel parameters' shards summed over tp
            optimizer.reduce_over(getattr(model.mode, "sequence_parallel_params", []), tensor_axes,
                                  "sequence_parallel_params")
        sq = optimizer.grad_norm_sq()
        # Summed over the zero group's shards (dp; 2.5D dp, dep; HSDP dp_shard: the replicas hold the same sums)
        norm_axes: tuple[str, ...] = tuple(dict.fromkeys((*stages, *sync.axes, *tensor_axes)))
    else:
        with rec.phase("grad_sync"):
            model.reduce_sequence_parallel_grads()  # 1D + sp: norms, row biases, pos_emb summed over tp
            reduce_tied_embedding_grads(model, mesh)  # pp > 1, tied: both copies get the summed gradient
        sq = _replica_norm_sq(model, mesh, device)
        with rec.phase("optimizer"):  # the norm's collectives (moe_counts.norm_event)
            experts = expert_norm_sq(model, mesh, device)  # MoE experts: summed over ep
        if experts is not None:
            sq = sq + experts
        norm_axes = (*stages, *tensor_axes)
    with rec.phase("optimizer"):
        fp8 = getattr(model, "fp8", None)
        fp8_overflow = fp8 is not None and fp8.reduce_and_update(mesh, (*mesh.layout.data_axes, *tensor_axes))
        if norm_axes:
            sq = all_reduce(sq, mesh, norm_axes, label="grad_norm")
        norm, overflow = _clip_and_step(optimizer, params, math.sqrt(float(sq.item())), max_grad_norm, scaler,
                                        fp8_overflow)
    optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.main_grad = None  # type: ignore[attr-defined]  # a later backward outside a step uses p.grad

    with rec.phase("metrics"):
        metrics = torch.stack([loss_sum, count]).float()
        metrics = all_reduce(metrics, mesh, metrics_axes(mesh.layout, stages), label="metrics")
    return StepResult(loss=float(metrics[0] / metrics[1]), grad_norm=norm,
                      overflow=(scaler is not None and overflow) or fp8_overflow)


def _clip_and_step(optimizer: torch.optim.Optimizer, params: list[Tensor], norm: float,
                   max_grad_norm: float | None, scaler: LossScaler | None,
                   fp8_overflow: bool = False) -> tuple[float, bool]:
    """Unscale (fp16), clip by the global norm and step, unless fp16 gradients overflowed (then skip and back
    off) or an FP8 amax did (then skip; the FP8 scales were kept). The norm and the amaxes were all-reduced
    over every group holding them, so every rank decides alike. Returns the unscaled norm and whether it
    overflowed."""
    unscale = 1.0 / scaler.scale if scaler is not None else 1.0
    norm *= unscale
    if fp8_overflow:
        return norm, True
    overflow = not math.isfinite(norm)
    coef = max_grad_norm / (norm + 1e-6) if max_grad_norm is not None and not overflow else 1.0
    coef = min(coef, 1.0) * unscale
    if coef != 1.0 and not (scaler is not None and overflow):
        if isinstance(optimizer, DistributedAdamW):
            optimizer.scale_grads(coef)
        else:
            for p in params:
                main_grad(p).mul_(coef)
    if scaler is None or not overflow:
        optimizer.step()
    if scaler is not None:
        scaler.update(overflow)
    return norm, overflow


def _replica_norm_sq(model: ParallelGPT, mesh: Mesh, device: torch.device) -> Tensor:
    """Squared norm of the local gradients; replicated parameters count once (on their replica leader
    inside the tensor group), the tied embedding once (on the first stage)."""
    sq = torch.zeros(1, dtype=torch.float32, device=device)
    for name, p in model.named_parameters():
        if (model.tied_copy and name == "tok_emb.weight") or is_expert(p):
            continue  # the last stage's copy of the tied embedding: counted on the first stage; experts: apart
        if all(mesh.coord(a) == 0 for a in model.shard_specs[name].replicated_axes):
            sq += main_grad(p).float().pow(2).sum()
    return sq


__all__ = ["StepResult", "check_divisibility", "train_step"]
