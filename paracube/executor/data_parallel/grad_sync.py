"""Bucketed data-parallel gradient reduction, optionally overlapped with the backward (DDP's approach).

Buckets follow the shared rule (paracube/modes/buckets.py): local parameters in reverse registration order,
fp32, at most `bucket_bytes` each, a parameter never split. A post-accumulate-grad hook on every parameter
adds its gradient (in the parameter's compute dtype) into its bucket's fp32 buffer (so micro-batch
accumulation happens in fp32 there, Megatron's main_grad, and `p.grad` is released) and, with `overlap`,
issues the bucket's collective asynchronously as soon as every parameter of the bucket has its step's last
gradient -- buckets are issued strictly in bucket order, as DDP does, so every rank issues the same
collectives in the same order. A parameter's gradient is final in the backward after `last_micro_batch()`
(pp = 1), or, with `start(overlap, micro_batches=n)` (pipelines), at its n-th accumulation of the step: the
last backward of its model chunk (every chunk runs each micro-batch's backward once; Megatron-core enables
grad sync for each chunk's last micro-batch likewise), so under 1F1B a stage's buckets are reduced during
its own last backward and, interleaved, the later chunk's buckets (the first in bucket order) while the
earlier chunks still run theirs. `finish()` issues what is left (every bucket without overlap) and waits
for all of them before the optimizer runs.
- zero=0: one all_reduce (sum) of the bucket over Layout.data_axes (the mode's grad_axes: dp; 2.5D: dp and depth;
  with context parallelism cp after dp, its ranks holding replicas of every parameter).
- zero=1: one reduce_scatter over the same grad_axes (dp; 2.5D: dp and depth, whose ranks hold replicas of
  the same weights) of the bucket padded to a multiple of that group's size n, in place: the rank with index
  k in the group (mesh.index, dp major) keeps shard k, its chunk of the bucket (data_parallel/distributed_adamw.py
  updates it and all-gathers the parameters back over the same group).
  Tied embeddings with pp > 1 (ParallelGPT.tied_embedding: the first stage's word embedding and the last
  stage's copy): the two copies sit in differently laid-out buckets on their stages, so their reduce-scattered
  shards do not hold the same elements. Their gradients are summed BEFORE the reduce-scatter instead: the
  copy's fp32 gradient (its view of the bucket) is all-reduced over Megatron's embedding group (first + last
  stage, Mesh.embedding_group; label "embedding_grads", the bytes zero=0 sends after its all-reduce), then the
  bucket is reduce-scattered over dp, so each element is the sum over both stages and every replica exactly
  once. That bucket is issued in `finish()` only (a blocking exchange with the other stage must not run inside
  a stage's backward). zero=0 sums the copies after its all-reduce (pipeline/schedule.py); same bytes.
- parameters with `grad_axes` (MoE experts: `edp`, executor/model/moe.py) sit in their own buckets, after the
  dense ones, all-reduced over that group (zero=0) or reduce-scattered over it (zero=1: each bucket's shard
  index k and group are its own, Bucket.k / Bucket.axes; the optimizer gathers it back over the same group).
Overlap on and off issue the same collectives on the same buffers, so their results are bit-identical.

Why not torch's DDP / ZeroRedundancyOptimizer: DDP wraps the module and reduces over one process group
with its own bucketing (not recorded as CommEvents, no reduce_scatter), and ZeroRedundancyOptimizer
shards whole parameters per rank and broadcasts them, which is not the bucketed reduce-scatter /
all-gather that the cost model prices (cost_models/traffic.py).
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import torch
import torch.distributed as dist
from torch import Tensor, nn

from paracube.executor.mesh import Mesh
from paracube.modes.buckets import BUCKET_BYTES, padded_numel, plan_buckets


class Bucket:
    """One bucket: its parameters (reverse registration order), their offsets and its fp32 buffer."""

    def __init__(self, params: list[nn.Parameter], shards: int, zero: int, device: torch.device, k: int = 0) -> None:
        self.params = params
        self.offsets: list[int] = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.numel = n
        self.length = padded_numel(n, shards) if zero == 1 else n
        self.buffer = torch.zeros(self.length, dtype=torch.float32, device=device)
        self.shard_numel = self.length // shards if zero == 1 else self.length
        # zero=1: this rank's chunk k of the bucket, where the in-place reduce-scatter leaves its sum
        self.shard = self.buffer[k * self.shard_numel:(k + 1) * self.shard_numel]
        self.k, self.shards = k, shards if zero == 1 else 1  # this rank's index in the shard group, its size
        self.pending = 0  # parameters whose gradient has not arrived in this backward
        self.work: dist.Work | None = None
        self.issued = False
        self.axes: tuple[str, ...] = ()  # the group it is reduced over (GradSync)

    def view(self, i: int) -> Tensor:
        p = self.params[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + p.numel()].view_as(p)


class GradSync:
    """The buckets of one model on one rank and their data-parallel collectives."""

    def __init__(self, model: nn.Module, mesh: Mesh, zero: int = 0, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.mesh, self.zero, self.bucket_bytes = mesh, zero, bucket_bytes
        layout = mesh.layout
        # Layout.data_axes: the mode's grad_axes, with cp after dp (cp ranks hold replicas); zero=1 shards over it
        self.axes = tuple(layout.data_axes)
        self.group_size = mesh.size(self.axes)
        params = [p for p in model.parameters() if p.requires_grad and not hasattr(p, "grad_axes")]
        device = next(model.parameters()).device
        self.buckets = [Bucket([params[i] for i in idx], self.group_size, zero, device, self.shard_index())
                        for idx in plan_buckets([p.numel() for p in params], bucket_bytes)]
        for b in self.buckets:
            b.axes = self.axes
        # Parameters reduced over another group (`p.grad_axes`: MoE experts over edp, executor/model/moe.py): their
        # own buckets after the dense ones; zero=1 shards them over that group (Megatron's distributed optimizer
        # shards the experts over the expert-data-parallel group likewise).
        for axes in dict.fromkeys(p.grad_axes for p in model.parameters() if hasattr(p, "grad_axes")):
            own = [p for p in model.parameters() if getattr(p, "grad_axes", None) == axes]
            n, k = (mesh.size(axes), mesh.index(axes)) if zero == 1 else (1, 0)
            for idx in plan_buckets([p.numel() for p in own], bucket_bytes):
                self.buckets.append(Bucket([own[i] for i in idx], n, zero, device, k))
                self.buckets[-1].axes = axes
        self.where: dict[nn.Parameter, tuple[Bucket, int]] = {}
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self.where[p] = (b, i)
                p.register_post_accumulate_grad_hook(self._on_grad)
        # zero=1, pp > 1, tied embeddings: the word embedding summed over the embedding group before its bucket's
        # reduce-scatter (module docstring); None elsewhere (zero=0 sums it after the all-reduce).
        tied = getattr(model, "tied_embedding", None) if zero == 1 else None
        self.tied: tuple[Bucket, int] | None = self.where[tied] if tied is not None else None
        self.overlap = True
        self.final = False  # the current backward is the step's last: its gradients may be reduced
        self.micro_batches = 0  # > 0: a parameter's gradient is final at its micro_batches-th accumulation
        self.seen: dict[Tensor, int] = {}
        self.next = 0  # the next bucket to issue (buckets are issued in order)
        self.active = False

    # --- per step ------------------------------------------------------------------------------------
    def start(self, overlap: bool, micro_batches: int = 0) -> None:
        """Before the step's first backward: empty buffers, nothing issued. `micro_batches` (pipelines: the
        schedule interleaves the micro-batches' backwards): each parameter's gradient is final at its
        micro_batches-th accumulation instead of after `last_micro_batch()`."""
        self.overlap, self.active, self.next, self.final = overlap, True, 0, False
        self.micro_batches, self.seen = micro_batches, {}
        for b in self.buckets:
            b.buffer.zero_()
            b.pending, b.work, b.issued = len(b.params), None, False

    def last_micro_batch(self) -> None:
        """The next backward is the step's last: buckets become ready as it produces their gradients."""
        self.final = True

    def _on_grad(self, p: Tensor) -> None:
        if not self.active or p.grad is None:
            return  # a backward outside train_step (tests, tools) keeps torch's own p.grad
        b, i = self.where[p]  # type: ignore[index]
        b.view(i).add_(p.grad)
        p.grad = None
        if self.micro_batches:
            self.seen[p] = self.seen.get(p, 0) + 1
        if self.final or self.seen.get(p) == self.micro_batches:
            b.pending -= 1
            if self.overlap:
                self._issue_ready()

    def _issue_ready(self) -> None:
        while self.next < len(self.buckets) and self.buckets[self.next].pending == 0:
            if self.tied is not None and self.buckets[self.next] is self.tied[0]:
                return  # summed with the other stage's copy first: in finish()
            self._issue(self.buckets[self.next])
            self.next += 1

    def _issue(self, b: Bucket) -> None:
        b.issued = True
        if self.tied is not None and b is self.tied[0]:
            self._sum_tied_copies(b, self.tied[1])
        n = self.mesh.size(b.axes)
        if n == 1:
            return
        rec, group = self.mesh.recorder, self.mesh.group(b.axes)
        with rec.phase("grad_sync"):
            if self.zero == 1:  # over the bucket's own group (dense: data axes; experts: edp)
                order = self.mesh.order(b.axes)  # index k lives on group rank order[k]
                chunks = list(b.buffer.chunk(n))
                by_rank = [chunks[0]] * n
                for k in range(n):
                    by_rank[order[k]] = chunks[k]
                with rec.issue("reduce_scatter", b.axes, n, b.buffer, b.length, False, "grads"):
                    b.work = dist.reduce_scatter(b.shard, by_rank, group=group, async_op=True)
            else:
                with rec.issue("all_reduce", b.axes, n, b.buffer, b.length, False, "grads"):
                    b.work = dist.all_reduce(b.buffer, group=group, async_op=True)

    def _sum_tied_copies(self, b: Bucket, i: int) -> None:
        """The tied word embedding's local fp32 gradient summed with the other stage's copy (in its bucket view,
        before the bucket's reduce-scatter; one all_reduce over the embedding group, as zero=0 sends)."""
        g = b.view(i)
        with self.mesh.recorder.phase("grad_sync"), self.mesh.recorder.issue(
                "all_reduce", ("pp",), 2, g, g.numel(), False, "embedding_grads"):
            dist.all_reduce(g, group=self.mesh.embedding_group)

    def finish(self) -> None:
        """After the last backward: issue what is left, in bucket order, and wait for every bucket."""
        for b in self.buckets[self.next:]:
            self._issue(b)
        self.next = len(self.buckets)
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
                b.work = None
        self.active = False

    def set_param_grads(self) -> None:
        """zero=0: every parameter's `main_grad` is its reduced fp32 gradient (a view of the bucket); for fp32
        parameters .grad is that same view (16-bit ones keep no .grad: the optimizer steps fp32 masters)."""
        for b in self.buckets:
            for i, p in enumerate(b.params):
                g = b.view(i)
                p.main_grad = g  # type: ignore[attr-defined]
                if p.dtype == torch.float32:
                    p.grad = g

    def shard_index(self) -> int:
        return self.mesh.index(self.axes) if self.zero == 1 else 0


_SYNCS: WeakKeyDictionary[nn.Module, GradSync] = WeakKeyDictionary()


def grad_sync_for(model: nn.Module, mesh: Mesh, bucket_bytes: int = BUCKET_BYTES) -> GradSync:
    """The zero=0 GradSync of `model` (made once: its hooks stay on the parameters)."""
    sync = _SYNCS.get(model)
    if sync is None:
        sync = _SYNCS[model] = GradSync(model, mesh, 0, bucket_bytes)
    elif sync.bucket_bytes != bucket_bytes:  # its hooks are already on the parameters
        raise ValueError(f"bucket_bytes={bucket_bytes}: this model's buckets hold {sync.bucket_bytes} bytes")
    return sync


__all__ = ["Bucket", "GradSync", "grad_sync_for"]
