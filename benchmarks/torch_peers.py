"""PyTorch's own parallelism on a plain GPT, the peers of benchmarks/executor_step.py's rows, and the bytes
their collectives send.

`torch_tp`: 1D (Megatron) tensor parallelism with DTensor, `parallelize_module` with ColwiseParallel on qkv/fc and
RowwiseParallel on proj/fc2 of a plain GPT (embeddings, LayerNorms and head replicated), global-norm clipping as
ours does it (`_clip`). `torch_fsdp`: FSDP2's `fully_shard` as torchtitan's apply_fsdp wraps (the embeddings,
every block, [final norm, head] with reshard_after_forward=False, the root), fp32. Both: AdamW, one step over
the given micro-batches, timed by step_timing.time_step. Bytes: DTensor's from the c10d functional collectives it
dispatches (`_Traffic`), FSDP2's from the c10d collectives (_allgather_base_ output, _reduce_scatter_base_ input,
allreduce_ tensor; the grad norm's functional all_reduce: `_C10dTraffic`), as CommEvents priced by the same ring
factors as ours.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from step_timing import time_step
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from paracube.estimate import CommEvent
from paracube.workload import ModelSpec

C10D = {"_allgather_base_": ("all_gather", 0), "_reduce_scatter_base_": ("reduce_scatter", 1),
        "allreduce_": ("all_reduce", 0)}  # op -> (kind, index of the tensor whose size is the payload)
KINDS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


class _Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h = spec.hidden
        self.heads = spec.heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc, self.fc2 = nn.Linear(h, spec.ffn_hidden), nn.Linear(spec.ffn_hidden, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x))  # local heads after ColwiseParallel: [b, s, heads_local * 3 * d]
        d = x.shape[-1] // self.heads
        q, k, v = qkv.view(b, s, -1, 3, d).permute(3, 0, 2, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class _PlainGPT(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tok, self.pos = nn.Embedding(spec.vocab, spec.hidden), nn.Embedding(spec.seq_len, spec.hidden)
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.layers))
        self.ln_f, self.head = nn.LayerNorm(spec.hidden), nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class _Traffic(TorchDispatchMode):
    """Collects the c10d functional collectives DTensor dispatches, as CommEvents."""

    def __init__(self, world: int):
        super().__init__()
        self.world, self.events = world, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func._overloadpacket.__name__
        if func.namespace == "_c10d_functional" and name in KINDS:
            t = args[0]
            payload = t.numel() * t.element_size() * (self.world if KINDS[name] == "all_gather" else 1)
            self.events.append(CommEvent(KINDS[name], ("tp",), self.world, payload))
        return func(*args, **(kwargs or {}))


class _C10dTraffic(TorchDispatchMode):
    """Collects the c10d collectives FSDP2 dispatches (process-group ops, not functional ones), as CommEvents."""

    def __init__(self, world: int):
        super().__init__()
        self.world, self.events = world, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func._overloadpacket.__name__
        if func.namespace == "c10d" and name in C10D:
            kind, i = C10D[name]
            t = args[i][0] if isinstance(args[i], (list, tuple)) else args[i]
            self.events.append(CommEvent(kind, ("dp",), self.world, t.numel() * t.element_size()))
        elif func.namespace == "_c10d_functional" and name == "all_reduce":  # clip_grad_norm_'s on DTensors
            self.events.append(CommEvent("all_reduce", ("dp",), self.world, args[0].numel() * args[0].element_size()))
        return func(*args, **(kwargs or {}))


def torch_fsdp(rank: int, world: int, spec: ModelSpec, batches: list, steps: int, warmup: int) -> tuple:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _PlainGPT(spec)
    mesh = init_device_mesh("cpu", (world,))
    # torchtitan's apply_fsdp: the embeddings, each block, [final norm, head] kept gathered for the backward
    # that follows at once (reshard_after_forward=False), then the root: the units ours has.
    fully_shard([model.tok, model.pos], mesh=mesh)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard([model.ln_f, model.head], mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = sum(ids.numel() for ids, _ in batches) * world

    def step() -> None:
        for ids, labels in batches:
            logits = model(ids)
            (F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return time_step(step, steps, warmup, lambda: _C10dTraffic(world))


def _clip(model: nn.Module, mesh: object, max_norm: float) -> None:
    """Global-norm clipping as ours does it: sharded squares summed by one [1] all-reduce, replicated
    parameters counted once. (clip_grad_norm_ refuses a mix of DTensor and plain gradients.)"""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.tensor import DTensor, Shard

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    sharded = torch.zeros(1)
    replicated = torch.zeros(1)
    for g in grads:
        if isinstance(g, DTensor) and any(isinstance(pl, Shard) for pl in g.placements):
            sharded += g.to_local().float().pow(2).sum()
        else:
            replicated += (g.to_local() if isinstance(g, DTensor) else g).float().pow(2).sum()
    total = funcol.all_reduce(sharded, "sum", mesh.get_group())  # type: ignore[attr-defined]
    coef = max_norm / (math.sqrt(float(total + replicated)) + 1e-6)
    if coef < 1.0:
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef)


def torch_tp(rank: int, world: int, spec: ModelSpec, batches: list, steps: int, warmup: int) -> tuple:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = _PlainGPT(spec)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        parallelize_module(block, mesh, {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                                         "fc": ColwiseParallel(), "fc2": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = sum(ids.numel() for ids, _ in batches)

    def step() -> None:
        for ids, labels in batches:
            logits = model(ids)
            (F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / tokens).backward()
        _clip(model, mesh, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return time_step(step, steps, warmup, lambda: _Traffic(world))
