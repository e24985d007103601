"""Selective recomputation's two checkpoints (paracube/recompute_modules.py: Megatron-core's "discard" and "region").

`region(fn, *args)`: megatron-core 0.16.1 tensor_parallel.checkpoint (transformer_layer.py ~l.719 `mlp`,
moe_layer.py l.432-450 `moe`, shared_experts) as torch.utils.checkpoint (non-reentrant, early stop): fn keeps only
its inputs, everything inside is made again in backward. Its forward collectives before its last saved tensor run
again (recorded in phase "recompute": a 1D + sp MLP's all_gather, the MoE layer's dispatch and combine); those after
it do not (early stop: a row-parallel output's all_reduce is not repeated). Dropout masks come from explicit seeds
(dropout.py), so no RNG state is kept.

`Discard(fn)`: megatron-core 0.16.1 tensor_parallel.CheckpointWithoutOutput (random.py l.579-740; layernorm:
transformer_layer.py l.576-614, 797-800; moe_act: experts.py l.100-275; mla_up_proj: multi_latent_attention.py
l.344, 838), the same mechanism: fn runs without a graph; its inputs are saved; `discard(hook)` frees its outputs'
storages once the consumer ran (hook: the consumer's output) and, in a pre-hook of hook's grad_fn, runs fn again with
a graph and copies the outputs back into those storages, so whatever the consumer saved (the tensor itself, a view)
reads the same values; the consumer's GEMM is not re-run. Its backward then runs backward through the recomputed
graph (parameters used inside fn get their gradients there).
Why not torch.utils.checkpoint's selective policy (create_selective_checkpoint_contexts) over [norm -> consumer
linear], MUST_SAVE the GEMM outputs: the consumer saves the norm's output itself, so the region must contain the
consumer, and its forward collectives (1D + sp's all_gather, SUMMA's broadcasts) would run again in backward; here
only fn re-runs. Why not saved_tensors_hooks: the innermost hooks win, so they would bypass the executor's own
(off=N's save_on_cpu) for everything else the consumer saves. Values: fn re-runs the same ops on the same inputs, so
the recomputed outputs are the forward's bit for bit (tests/test_recompute_modules.py).
Caller's contract (Megatron's): the outputs are used by nothing after the consumer in forward, and every backward
node reading them runs after hook's grad_fn (the consumer's output is downstream of every use). The hooks sit on
nodes inside a block, so under zero=3 (data_parallel/fsdp.py: the unit gathered by the block output's backward) the
recomputation reads gathered parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def region(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) keeping only args for backward (module docstring); plain fn(*args) where no graph is recorded."""
    if not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)


class _Discarded(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, owner: Discard, *args: Tensor) -> Any:
        with torch.no_grad():
            outputs = owner.run(*args)
        ctx.save_for_backward(*args)
        ctx.owner = owner
        owner.ctx = ctx
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        owner: Discard = ctx.owner
        if owner.recomputed is None:  # discard() not called (or its hook not reached): recompute now
            owner.recompute()
        inputs, outputs = owner.recomputed  # type: ignore[misc]
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None and o.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        owner.recomputed, owner.ctx, ctx.owner = None, None, None
        return (None, *(i.grad if i.requires_grad else None for i in inputs))


class Discard:
    """One output-discarding checkpoint of `run` (tensors in, a tensor or a tuple of tensors out); module docstring.
    Use: `out = d(*inputs)`, the consumer, then `d.discard(consumer_output)`."""

    def __init__(self, run: Callable[..., Any]):
        self.run = run
        self.ctx: Any = None
        self.outputs: tuple[Tensor, ...] = ()
        self.recomputed: tuple[tuple[Tensor, ...], tuple[Tensor, ...]] | None = None

    def __call__(self, *args: Tensor) -> Any:
        if not torch.is_grad_enabled():
            return self.run(*args)
        out = _Discarded.apply(self, *args)
        self.outputs = (out,) if isinstance(out, Tensor) else tuple(out)
        return out

    def discard(self, hook: Tensor) -> None:
        """Free the outputs' storages; they are made again right before hook's grad_fn runs."""
        if self.ctx is None or hook.grad_fn is None:
            return
        for out in self.outputs:
            out.untyped_storage().resize_(0)
        hook.grad_fn.register_prehook(lambda _grads: self.recompute())

    def recompute(self) -> None:
        """Run `run` again with a graph, copy its outputs into the (freed) forward outputs' storages."""
        if self.ctx is None or self.recomputed is not None:
            return
        inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in self.ctx.saved_tensors)
        with torch.enable_grad():
            out = self.run(*inputs)
        outputs = (out,) if isinstance(out, Tensor) else tuple(out)
        with torch.no_grad():
            for kept, new in zip(self.outputs, outputs, strict=True):
                storage = kept.untyped_storage()
                if storage.nbytes() != new.untyped_storage().nbytes():
                    storage.resize_(new.untyped_storage().nbytes())
                    storage.copy_(new.untyped_storage())
        self.outputs = ()
        self.recomputed = inputs, outputs


__all__ = ["Discard", "region"]
