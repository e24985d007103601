"""zero=2 and zero=3 (ZeRO stages 2 and 3, Rajbhandari et al. 2020; FSDP, Zhao et al. 2023), and hybrid sharding.

Units (FSDP2's `fully_shard` granularity as torchtitan applies it, modes/buckets.plan_units): the embedding
(token + position tables), each transformer block, the final norm + head. A unit is one flat buffer in the
bucket layout (its parameters in reverse registration order, padded to a multiple of the zero group's n
ranks); the rank with index k in the zero group (Layout.zero_axes: dp, or dp_shard with HSDP) owns elements
[k S, (k+1) S), S = padded / n, of the unit's gradient, optimizer state and (zero=3) parameters alike.
- zero=2: per micro-batch, as backward completes a unit (every parameter's gradient arrived: post-
  accumulate-grad hooks) its fp32 gradient buffer (allocated at the unit's first gradient) is reduce-
  scattered asynchronously over the zero group and the result accumulated into the rank's fp32 shard (4 S
  bytes, kept across micro-batches); the buffer is freed when the collective is waited for, which is when
  the next unit is issued (at most two gradient buffers live: the one in flight and the one filling; the
  micro-batch's last unit is waited for at once). After the optimizer step the parameters are all-gathered
  in fp32 (zero=1's all_gather, data_parallel/distributed_adamw.py). Reduce-scatters run whether or not `overlap` is
  set: a rank never holds the whole gradient (FSDP always reduces in backward).
- zero=3 (data_parallel/fsdp.py): parameters live only as compute-dtype shards; a unit is all-gathered
  (compute dtype) before its forward and resharded after it, all-gathered again before its backward and
  resharded once its gradients are issued; the last unit (final norm + head) is kept gathered from its
  forward to its backward (torchtitan: reshard_after_forward=False for the last module, whose backward comes
  at once). The next unit's gather (forward order, then backward order) is prefetched asynchronously, at
  most two units gathered at a time. The optimizer steps the fp32 master shard and casts it into the
  parameter shard: no all_gather after the step.
- pipelines (pp > 1; torchtitan runs FSDP2 under its pipeline schedules, Megatron-FSDP likewise): each stage shards
  its own units over its zero group. A unit's fp32 gradient buffer is allocated at its first gradient of the step
  and kept, UNSHARDED, across micro-batches (earlier micro-batches' gradients accumulate into it locally); it is
  reduce-scattered once per step, during the unit's LAST micro-batch's backward (its n-th backward: the stage's
  chunk runs each micro-batch's backward once, in 1F1B and interleaved 1F1B alike; units issued in bucket order).
  Chosen as torch.distributed.pipelining runs FSDP2 (set_requires_gradient_sync(False) until the last backward)
  and Megatron accumulates main_grad: one reduce-scatter per unit per step instead of one per micro-batch (n times
  fewer bytes, the n micro-batches interleave with other stages' work), for 4 bytes per stage parameter of
  buffers held from the chunk's first backward to the end of its last (fsdp_units.unit_totals: 1F1B all the stage's
  units, 4 P instead of the pair 4 Q; interleaved, the most chunks live at once under the schedule). zero=3 still
  gathers every unit before each micro-batch's forward and backward (fsdp.py "Pipelines").
- HSDP (`shard=N`, N < dp): the zero group is N consecutive dp ranks (dp_shard); after the last micro-batch
  each gradient shard is all-reduced over dp_replicate (once per step: FSDP2's set_requires_all_reduce(False)
  on the other micro-batches); the shard group's state is replicated across the dp / N groups.
MoE blocks (executor/model/routed_experts.py): a block's routed experts are a unit of their own, blocks.<i>.experts,
sharded over the group their gradients reduce over (`grad_axes`: edp, the folded expert-data-parallel group,
executor/mesh.py; ep = etp = 1: the data and tensor axes), its shard index the rank's in that group; the block's
dense parameters (attention, router, shared expert) stay one unit over the zero group. The expert unit follows its
block's in registration order, so it is issued first in backward, through the same hooks and bucket order; each
unit is reduce-scattered (zero=2: and its updated shard gathered) over its own group (torchtitan 0.3.0
distributed/fsdp.py l.209-275: one fully_shard per MoE block with a per-parameter mesh, experts over edp, the rest
over dp, so FSDP2 issues one collective per mesh for the block; Megatron's distributed optimizer
shards the experts over the expert-data-parallel group). HSDP shards no expert unit over replicas (edp spans them).
Tensor modes: a rank's parameters are its blocks of the mode's layout (1D's column / row shards; 2D / 2.5D / 3D's
weight blocks, which each linear all-gathers over the tensor axes itself, layers/kept.py). The units shard
those blocks as they are, over the mode's grad axes (Layout.zero_axes: dp; 2.5D dp x dep, the ranks holding
replicas of the same blocks): zero=3's gather over dp restores the rank's block, the layer's own gather
then runs unchanged, and its reduce-scatter over the tensor axes leaves the block's gradient, which the
unit reduce-scatters over dp. Kept weights (kw=1) return zero gradients until the last micro-batch (kept.py),
so a unit is still complete in every backward. Tied embeddings: fsdp.py holds the embedding unit gathered
from its forward to its backward (the head reads the table).
Memory per parameter (bf16 compute copy, fp32 gradients and master, Adam), cost_models/memory.py:
zero=2 2 + 16/n, zero=3 18/n, plus the gathered units (zero=3: the largest pair of consecutive units in
the compute dtype) and the fp32 gradient buffers (the largest pair of consecutive units).

Why ours and not torch's FSDP2: the layers are explicit autograd functions whose collectives the recorder
must see (FSDP2's all-gathers and reduce-scatters are not CommEvents), gradients stay the fp32 buckets the
optimizer and the norm read (`main_grad`), and the unit layout is the one cost_models/traffic.py prices;
benchmarks/executor_step.py --zero runs torch's FSDP2 side by side.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from paracube.executor.mesh import Mesh
from paracube.modes.buckets import padded_numel, plan_units

EXPERTS = ".experts"  # an MoE block's expert unit: "blocks.<i>.experts"


def unit_name(param_name: str, experts: bool = False) -> str:
    """The FSDP unit of a parameter: embedding, blocks.<i> (an MoE block's routed experts: blocks.<i>.experts), or
    final."""
    head = param_name.split(".")
    if experts:
        return f"blocks.{head[1]}{EXPERTS}"
    if head[0] in ("tok_emb", "pos_emb"):
        return "embedding"
    if head[0] == "blocks":
        return f"blocks.{head[1]}"
    return "final"


class Unit:
    """One unit's flat layout, its fp32 gradient shard and (per micro-batch) its gradient buffer."""

    def __init__(self, name: str, params: list[nn.Parameter], shards: int, k: int, device: torch.device,
                 axes: tuple[str, ...] = ()) -> None:
        self.name, self.params, self.axes = name, params, axes  # axes: the group it is sharded over
        self.offsets: list[int] = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.numel, self.length = n, padded_numel(n, shards)
        self.shard_numel = self.length // shards
        self.k = k
        self.shard = torch.zeros(self.shard_numel, dtype=torch.float32, device=device)  # accumulated gradient
        self.buffer: Tensor | None = None  # this micro-batch's fp32 gradient (transient)
        self.out: Tensor | None = None  # the reduce-scatter's output
        self.pending = len(params)
        self.backwards = 0  # pp > 1: this step's completed backwards of the unit (it is ready at the n-th)
        self.work: dist.Work | None = None

    def view(self, i: int) -> Tensor:
        p = self.params[i]
        assert self.buffer is not None
        return self.buffer[self.offsets[i]:self.offsets[i] + p.numel()].view_as(p)


class ShardedSync:
    """The units of one model on one rank: gradient reduce-scatter per unit per micro-batch (zero >= 2)."""

    def __init__(self, model: nn.Module, mesh: Mesh, zero: int) -> None:
        assert zero in (2, 3)
        self.mesh, self.zero, self.model = mesh, zero, model
        layout = mesh.layout
        self.axes, self.replicas = layout.zero_axes, layout.replica_axes
        self.group_size = mesh.size(self.axes)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups: dict[str, list[nn.Parameter]] = {}
        axes_of: dict[str, tuple[str, ...]] = {}  # a unit's shard group: the zero group; MoE experts: their grad_axes
        for n, p in named:
            name = unit_name(n, hasattr(p, "grad_axes"))
            groups.setdefault(name, []).append(p)
            axes_of[name] = getattr(p, "grad_axes", self.axes)
        # the flat list in unit order (an expert unit follows its block's dense unit, whose parameters the
        # registration order interleaves with the experts': router, experts, shared expert)
        flat = [p for ps in groups.values() for p in ps]
        order = plan_units([[p.numel() for p in ps] for ps in groups.values()])
        names = list(groups)
        device = flat[0].device
        # Buckets in issue (backward) order; each unit's parameters in reverse registration order.
        self.buckets = []
        for j, idx in enumerate(order):
            name = names[len(names) - 1 - j]
            axes = axes_of[name]
            self.buckets.append(Unit(name, [flat[i] for i in idx], mesh.size(axes), mesh.index(axes), device, axes))
        self.where: dict[nn.Parameter, tuple[Unit, int]] = {}
        for u in self.buckets:
            for i, p in enumerate(u.params):
                self.where[p] = (u, i)
                p.register_post_accumulate_grad_hook(self._on_grad)
        kept = getattr(getattr(model, "mode", None), "kept", None)  # kw=1 (layers/kept.py)
        if kept is not None:  # a unit is issued once all its parameters have a gradient: every micro-batch
            kept.every_backward = True
        self.active, self.next = False, 0
        self.micro_batches = 0  # pp > 1: the step's micro-batches (a unit is reduced at its last backward)
        self.inflight: Unit | None = None
        self.live_grad_bytes = self.peak_grad_bytes = 0
        self.params = None  # zero=3: fsdp.ParamUnits (made by build_optimizer once the masters are taken)

    def shard_index(self) -> int:
        return self.mesh.index(self.axes)

    # --- per step (the GradSync interface train_step uses) -----------------------------------------------
    def start(self, overlap: bool, micro_batches: int = 0) -> None:
        """Before the step's first backward: empty gradient shards, nothing in flight. `overlap` changes
        nothing: units are always reduced as backward completes them. `micro_batches` > 0 (pipelines): a unit's
        gradients accumulate unsharded until its micro_batches-th backward, which reduce-scatters them."""
        self.active, self.next, self.inflight, self.micro_batches = True, 0, None, micro_batches
        for u in self.buckets:
            u.shard.zero_()
            u.pending, u.buffer, u.work, u.backwards = len(u.params), None, None, 0
        if self.params is not None:
            self.params.start()

    def last_micro_batch(self) -> None:
        """zero >= 2 reduces every micro-batch: nothing changes on the last one."""

    def _on_grad(self, p: Tensor) -> None:
        if not self.active or p.grad is None:
            return  # a backward outside train_step keeps torch's own p.grad
        u, i = self.where[p]  # type: ignore[index]
        if u.buffer is None:
            u.buffer = torch.zeros(u.length, dtype=torch.float32, device=u.shard.device)
            self.live_grad_bytes += 4 * u.length
            self.peak_grad_bytes = max(self.peak_grad_bytes, self.live_grad_bytes)
        u.view(i).add_(p.grad)
        p.grad = None
        u.pending -= 1
        if self.micro_batches:
            self._pipelined(u)
            return
        while self.next < len(self.buckets) and self.buckets[self.next].pending == 0:
            self._issue(self.buckets[self.next])
            self.next += 1
        if self.next == len(self.buckets):  # the micro-batch's last unit: wait now, the next backward restarts
            self._wait()
            self.next = 0
            for b in self.buckets:
                b.pending = len(b.params)

    # --- pp > 1: the schedule's chunk boundaries (pipeline/schedule.ChunkHooks) ------------------------------
    def begin_chunk(self) -> None:
        if self.params is not None:
            self.params.begin_chunk()

    def end_chunk_forward(self, chunk: int) -> None:
        if self.params is not None:
            self.params.end_chunk_forward(chunk)

    def end_chunk_backward(self, chunk: int) -> None:
        """A chunk's backward is over: its last reduce-scatter waited for, so a chunk's gradient buffers live from
        its first micro-batch's backward to the end of its last one (memory.py prices that interval)."""
        self._wait()

    def _pipelined(self, u: Unit) -> None:
        """pp > 1: a unit's backward of one micro-batch is complete once all its gradients arrived; zero=3
        reshards it at once; its n-th completes its gradient, reduce-scattered in bucket order."""
        if u.pending:
            return
        u.pending, u.backwards = len(u.params), u.backwards + 1
        if self.params is not None:
            self.params.done_backward(u)
        while self.next < len(self.buckets) and self.buckets[self.next].backwards == self.micro_batches:
            self._issue(self.buckets[self.next])
            self.next += 1

    def _issue(self, u: Unit) -> None:
        self._wait()  # at most one reduce-scatter in flight, so at most two gradient buffers live
        assert u.buffer is not None
        n, rec = self.mesh.size(u.axes), self.mesh.recorder
        if n == 1:
            u.out = u.buffer
        else:
            order = self.mesh.order(u.axes)
            chunks = list(u.buffer.chunk(n))
            by_rank = [chunks[0]] * n
            for j in range(n):
                by_rank[order[j]] = chunks[j]
            u.out = torch.empty(u.shard_numel, dtype=torch.float32, device=u.shard.device)
            with rec.phase("grad_sync"), rec.issue("reduce_scatter", u.axes, n, u.buffer, u.length, False, "grads"):
                u.work = dist.reduce_scatter(u.out, by_rank, group=self.mesh.group(u.axes), async_op=True)
        self.inflight = u
        if self.params is not None and not self.micro_batches:  # zero=3: its backward is done, back to shards
            self.params.done_backward(u)

    def _wait(self) -> None:
        u, self.inflight = self.inflight, None
        if u is None:
            return
        if u.work is not None:
            u.work.wait()
            u.work = None
        assert u.out is not None
        u.shard.add_(u.out)
        u.out = u.buffer = None
        self.live_grad_bytes -= 4 * u.length

    def finish(self) -> None:
        """After the last backward: wait for the last reduce-scatter; HSDP: each shard summed over the replicas."""
        for u in self.buckets[self.next:] if self.micro_batches else []:  # none left: every unit ran n backwards
            self._issue(u)
        self.next = len(self.buckets) if self.micro_batches else self.next
        self._wait()
        if self.replicas and self.mesh.size(self.replicas) > 1:
            rec, n = self.mesh.recorder, self.mesh.size(self.replicas)
            with rec.phase("grad_sync"):
                for u in (u for u in self.buckets if u.axes == self.axes):  # experts: edp spans the replicas
                    with rec.issue("all_reduce", self.replicas, n, u.shard, u.shard_numel, False, "gradients.replicas"):
                        dist.all_reduce(u.shard, group=self.mesh.group(self.replicas))
        self.active = False


__all__ = ["ShardedSync", "Unit", "unit_name"]
