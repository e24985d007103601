"""Pipeline parallelism over the `pp` mesh axis: 1F1B and interleaved 1F1B (Narayanan et al. 2021).

Each rank runs its stage's model chunks (ParallelGPT.chunks; the split rule is modes/stages.py, the one the
cost models price) in the order `modes.stages.schedule` gives, the same order the event engine simulates:
warm-up forwards, one forward / one backward, cool-down backwards. Virtual stage j = chunk c * pp + stage s
receives its input from j - 1 (stage s - 1, cyclic) and its output gradient from j + 1.

What crosses stages (traffic.stage_events, kind "send" over ("pp",), phase "pipeline"): per micro-batch and
virtual-stage boundary, the rank's LOCAL block-layout activation shard [T, h] / act_split in the compute
dtype ("activations") and, in backward, its gradient ("activation_grads"). Nothing else: shapes are known
on both sides (`activation_shape`), so no metadata travels. Sends and receives are torch.distributed P2POps
issued with batch_isend_irecv: a send is posted together with the rank's next receive (or at the end of the
step), so a rank only ever blocks on a receive whose matching send its peer has already posted or will
post before blocking itself (the schedule is deadlock-free under these asynchronous-send semantics). Each
message has its own tag (kind, virtual stage, micro-batch), so two messages between the same pair of ranks
cannot be confused (gloo matches tags; NCCL ignores them but then matches by order, which is the same on
both sides because both follow the same schedule).

Why not torch.distributed.pipelining: its PipelineStage exchanges shape / dtype metadata between stages at
start-up and issues its own P2P inside the schedule, which the CommRecorder cannot observe per message, so
recorded traffic could not equal the model's; our parallel modules also need the tensor-parallel recorder
context around every chunk. This file is the small explicit schedule instead.

Tied embeddings (Megatron, Narayanan et al. 2021): the first stage owns the word embedding, the last stage a
copy of it for the head (ParallelGPT.tied_copy, initialized alike); once per step, after the data-parallel
sum, `reduce_tied_embedding_grads` all-reduces the local block's fp32 gradient over the embedding group (the
first and last stage's ranks with the same other coordinates: Mesh.embedding_group), so both copies take
the serial gradient and stay identical (traffic.stage_events: all_reduce over ("pp",), group size 2, label
"embedding_grads"); the grad norm counts the copy once (on the first stage).

zero=2/3 (data_parallel/sharded.py, fsdp.py): the stage's units accumulate gradients unsharded and reduce-scatter
them in their last micro-batch's backward; the units (`units`, ShardedSync) are told where each chunk's forward or
backward starts and where it ends (ChunkHooks), so that zero=3's gathers and reshards follow the schedule (every
unit gathered before each micro-batch's forward and backward) and a chunk's last reduce-scatter is waited for at
the end of its backward.

The loss lives on the last stage: `local_sum / tokens_per_step` (fp16: times the loss scale) starts
backward there, exactly as train_step does without pipelining, so gradients are the serial model's. The
residual stream, and so what crosses stages, is in the model's compute dtype (its parameters' dtype).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.executor.layers.functional import main_grad
from paracube.executor.mesh import Mesh
from paracube.executor.model.gpt import ParallelGPT
from paracube.modes import MODES
from paracube.modes.stages import schedule

ACT, GRAD = 0, 1


class ChunkHooks(Protocol):
    """What the schedule tells zero=2/3's units (data_parallel/sharded.ShardedSync, zero=3's fsdp.ParamUnits)."""

    def begin_chunk(self) -> None: ...

    def end_chunk_forward(self, chunk: int) -> None: ...

    def end_chunk_backward(self, chunk: int) -> None: ...


def activation_shape(model: ParallelGPT, ids: Tensor) -> tuple[int, ...]:
    """Shape of the local block-layout activations of a micro-batch `ids` [b, s] on this rank."""
    layout = model.mesh.layout
    # [b, s] ([b, s / cp] with context parallelism), or the flat layout's [T / n] (executor/layers/tokens.py)
    tokens = model.mode.split_tokens(model.context_tokens(ids)).shape
    if layout.sequence_parallel:  # 1D + sp: sequence shards [b, s / tp, h] (executor/layers/one_d.py SEQ)
        return (tokens[0], tokens[1] // layout.tensor_size, model.spec.hidden)
    act_split = int(MODES[layout.mode].act_split(layout.tensor_size, 0))
    return (*tokens, model.spec.hidden * model.mode.token_split // act_split)


class _P2P:
    """Sends posted lazily with the next receive (one batch_isend_irecv), each recorded as a CommEvent."""

    def __init__(self, mesh: Mesh, n_tags: int) -> None:
        self.mesh, self.n_tags = mesh, n_tags
        self.pending: list[dist.P2POp] = []
        self.inflight: list[tuple[object, Tensor]] = []  # requests and the buffers they use

    def tag(self, kind: int, vstage: int, micro: int) -> int:
        return (micro * self.n_tags + vstage) * 2 + kind

    def send(self, t: Tensor, peer: int, tag: int, label: str) -> None:
        t = t.detach().contiguous()
        rec = self.mesh.recorder
        with rec.phase("pipeline"), rec.issue("send", ("pp",), self.mesh.layout.pp, t, t.numel(), False, label):
            self.pending.append(dist.P2POp(dist.isend, t, peer, tag=tag))

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, peer: int, tag: int) -> Tensor:
        buf = torch.empty(shape, dtype=dtype, device=device)
        ops = [*self.pending, dist.P2POp(dist.irecv, buf, peer, tag=tag)]
        reqs = dist.batch_isend_irecv(ops)
        self.inflight += [(r, op.tensor) for r, op in zip(reqs[:-1], self.pending, strict=True)]
        self.pending = []
        reqs[-1].wait()
        return buf

    def flush(self) -> None:
        if self.pending:
            reqs = dist.batch_isend_irecv(self.pending)
            self.inflight += [(r, op.tensor) for r, op in zip(reqs, self.pending, strict=True)]
            self.pending = []
        for req, _ in self.inflight:
            req.wait()  # type: ignore[attr-defined]
        self.inflight = []


def run_pipeline(model: ParallelGPT, mesh: Mesh, micro_batches: list[tuple[Tensor, Tensor]], tokens_per_step: int,
                 loss_scale: float = 1.0, units: ChunkHooks | None = None) -> tuple[Tensor, Tensor]:
    """Forward and backward of every micro-batch through the pipeline; gradients accumulate in the stage's
    parameters (their buckets). `loss_scale`: fp16's dynamic loss scale (loss_scale.py), applied on the last
    stage; `units`: zero=2/3's units (module docstring). Returns this rank's (loss sum, token count):
    zeros except on the last stage."""
    layout, rec = mesh.layout, mesh.recorder
    pp, v, n = layout.pp, layout.interleave, len(micro_batches)
    stage = mesh.coord("pp")
    last_v = pp * v - 1
    prev, nxt = mesh.pp_peer(-1), mesh.pp_peer(1)
    p2p = _P2P(mesh, pp * v)
    device = next(model.parameters()).device
    dtype = model.dtype
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    count = torch.zeros((), dtype=torch.float32, device=device)
    saved: dict[tuple[int, int], tuple[Tensor | None, Tensor]] = {}  # (chunk, micro) -> (input, output)

    for op, c, m in schedule(pp, v, n, stage):
        j = c * pp + stage
        ids, labels = micro_batches[m]
        if op == "F":
            x = None
            if j > 0:
                x = p2p.recv(activation_shape(model, ids), dtype, device, prev, p2p.tag(ACT, j - 1, m))
                x = x.requires_grad_()
            if units is not None:
                units.begin_chunk()
            with rec.phase("fwd"):
                out = model.chunk_forward(c, x, ids, labels)
            if units is not None:
                units.end_chunk_forward(c)
            if j == last_v:
                local_sum, local_count = out  # type: ignore[misc]
                loss_sum += local_sum.detach().float()
                count += local_count
                loss = local_sum / tokens_per_step
                saved[c, m] = (x, loss if loss_scale == 1.0 else loss * loss_scale)
            else:
                p2p.send(out, nxt, p2p.tag(ACT, j, m), "activations")  # type: ignore[union-attr]
                saved[c, m] = (x, out)  # type: ignore[assignment]
        else:
            x, out = saved.pop((c, m))
            if units is not None:
                units.begin_chunk()
            with rec.phase("bwd"):
                if j == last_v:
                    out.backward()
                else:
                    grad = p2p.recv(tuple(out.shape), dtype, device, nxt, p2p.tag(GRAD, j + 1, m))
                    torch.autograd.backward(out, grad)
            if units is not None:
                units.end_chunk_backward(c)
            if x is not None:
                p2p.send(x.grad, prev, p2p.tag(GRAD, j, m), "activation_grads")  # type: ignore[union-attr]
    p2p.flush()
    return loss_sum, count


def reduce_tied_embedding_grads(model: ParallelGPT, mesh: Mesh) -> None:
    """Sum the tied word embedding's gradient over the embedding group (first and last stage, pp > 1): one
    fp32 all_reduce of the local block; a no-op on middle stages and without tied embeddings."""
    if mesh.layout.pp == 1 or not model.spec.tied_embeddings or mesh.embedding_group is None:
        return
    p = model.tok_emb.weight
    g = main_grad(p) if main_grad(p) is not None else torch.zeros_like(p)
    out = g.detach().float().contiguous().clone()
    with mesh.recorder.issue("all_reduce", ("pp",), 2, out, out.numel(), False, "embedding_grads"):
        dist.all_reduce(out, group=mesh.embedding_group)
    if getattr(p, "main_grad", None) is not None:
        p.main_grad.copy_(out)  # type: ignore[attr-defined]  # fp32 (and p.grad, for fp32 parameters)
    else:
        p.grad = out.to(p.dtype)


__all__ = ["ChunkHooks", "activation_shape", "reduce_tied_embedding_grads", "run_pipeline"]
