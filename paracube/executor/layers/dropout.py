"""Dropout with explicit seeds, and the per-rank seed streams that give Megatron's RNG rule.

Megatron-LM (Shoeybi et al. 2019, section 3; its CudaRNGStatesTracker): a dropout on an activation that every
tensor rank holds whole (1D's residual stream without sequence parallelism) draws the SAME mask on every
tensor rank, so the replicas stay equal; a dropout on a shard (attention probabilities of a rank's heads,
sequence-parallel or 2D/3D activations) draws an independent mask per tensor rank. Here each rank keeps two
generators, seeded from the run's seed and its pipeline stage (`replicated`), plus its tensor coordinates
(`sharded`); dropout itself draws nothing: a block takes its seeds from the streams before it runs
(`DropoutSeeds.block`), so recomputation (selective or full) re-draws exactly the masks of the forward.

`dropout(x, p, seed)` saves only its boolean mask (1 byte per element, as Megatron's fused bias-dropout-add
and torch's dropout save), returns x * mask / (1 - p); p = 0 or seed None is the identity.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from paracube.layout import Layout

SEED_MAX = 2**62


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, seed: int, device: torch.device) -> Tensor:
    """Bernoulli(1 - p) booleans of `shape` drawn from a generator seeded with `seed`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.empty(shape, dtype=torch.bool, device=device).bernoulli_(1.0 - p, generator=gen)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float, seed: int) -> Tensor:
        keep = keep_mask(x.shape, p, seed, x.device)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return x * keep * ctx.scale

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None, None


def dropout(x: Tensor, p: float, seed: int | None) -> Tensor:
    """x with elements zeroed with probability p (mask from `seed`) and the rest scaled by 1 / (1 - p)."""
    if p <= 0.0 or seed is None:
        return x
    return _Dropout.apply(x, p, seed)


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """The global generator of `device` seeded with `seed` inside, restored after (for kernels that draw from
    it, like scaled_dot_product_attention's dropout_p)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(seed)
        yield


class DropoutSeeds:
    """A rank's two seed streams (module docstring), from its coordinates in `layout` (Layout.coords).
    `hidden_replicated`: the block-boundary activations are
    whole on every tensor rank (none, 1D without sp): their dropout draws from the replicated stream."""

    def __init__(self, seed: int, layout: Layout, coords: dict[str, int], hidden_replicated: bool):
        stage = coords.get("pp", 0)
        tensor_rank = 0
        for axis in layout.tensor_axes:  # this rank's index inside its tensor group
            tensor_rank = tensor_rank * layout.axis_size(axis) + coords[axis]
        base = (seed * 1_000_003 + stage * 7919 + 12345) % SEED_MAX
        self.replicated = torch.Generator().manual_seed(base)
        # Megatron offsets its model-parallel seed by 2718 + tp rank.
        self.sharded = torch.Generator().manual_seed((base + 2718 + 1009 * (tensor_rank + 1)) % SEED_MAX)
        self.hidden = self.replicated if hidden_replicated else self.sharded

    @staticmethod
    def _draw(gen: torch.Generator) -> int:
        return int(torch.randint(SEED_MAX, (1,), generator=gen).item())

    def block(self) -> tuple[int, int, int]:
        """Seeds of one block's forward: attention probabilities (sharded), attention output, MLP output."""
        return self._draw(self.sharded), self._draw(self.hidden), self._draw(self.hidden)

    def embedding(self) -> int:
        return self._draw(self.hidden)


__all__ = ["DropoutSeeds", "dropout", "keep_mask", "seeded"]
