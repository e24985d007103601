"""A 2D / 2.5D / 3D linear's weight collectives under tpo: the gathered weight (kept under kw=1) and dA's ring.

Without tpo a linear gathers its weight block with kept.kept_gather (all_gather forward, reduce_scatter of the
gathered-form gradient backward; kw=1: once per step). Under tpo the linear's ring Function (collective_matmul_2d.py,
collective_matmul_3d.py) gathers the weight itself, as one more ring of its forward loop, and reduce-scatters dA as
a ring whose chunks are dA's row blocks (the GEMM X_k^T dY on the gathered weight's row block k). This module keeps
kept.py's contract for those Functions: the same KeptWeights entries (key (id(owner), label), one gathered tensor
per step, gradients summed in fp32 until the step's last backward, which reduce-scatters the sum), so `end_step`
checks them as it checks kept_gather's. Same collectives, same keys: `f"{linear}.A"` forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from paracube.executor.layers.kept import KeptWeights, _Kept
from paracube.executor.layers.ring import ring_reduce_scatter
from paracube.executor.mesh import Mesh
from paracube.executor.recorder import Axes

Key = tuple[int, str]


def active(kept: KeptWeights | None) -> KeptWeights | None:
    """The kept weights when kw=1 inside a train step, else None (gather and reduce-scatter on every call)."""
    return kept if kept is not None and kept.active else None


def kept_weight(kept: KeptWeights | None, key: Key) -> Tensor | None:
    """The gathered weight kept earlier in this step (another micro-batch, or full recomputation), if any."""
    entry = kept.entries.get(key) if kept is not None else None
    return None if entry is None else entry.gathered


def keep_weight(kept: KeptWeights | None, key: Key, gathered: Tensor) -> None:
    if kept is not None:
        kept.entries[key] = _Kept(gathered)


def weight_grad_ring(chunk: Callable[[int], Tensor], n_blocks: int, block_numel: int, mesh: Mesh, axes: Axes,
                     label: str, kept: KeptWeights | None, key: Key, dtype: torch.dtype) -> Tensor | None:
    """dA's reduce-scatter over `axes` as a ring: `chunk(k)` is row block k of this micro-batch's gathered-form
    dA (its GEMM runs while the previous block's partial travels). kw=1 (kept active): before the step's last
    backward the chunks are summed into the kept fp32 gradient and None returned (as kept.py); the last adds
    that sum to its chunks and reduce-scatters them. Returns this rank's block (index(axes))."""
    if kept is None:
        return ring_reduce_scatter(chunk, mesh, axes, block_numel, dtype, backward=True, label=label)
    entry = kept.entries[key]
    entry.backwards += 1
    if entry.backwards < kept.micro_batches:
        full = torch.cat([chunk(k) for k in range(n_blocks)], dim=0).to(torch.float32)
        entry.grad = full if entry.grad is None else entry.grad.add_(full)
        return None
    total, entry.grad = entry.grad, None
    if total is None:
        return ring_reduce_scatter(chunk, mesh, axes, block_numel, dtype, backward=True, label=label)
    rows = total.shape[0] // n_blocks

    def summed(k: int) -> Tensor:
        return (total[k * rows:(k + 1) * rows] + chunk(k)).to(dtype)

    return ring_reduce_scatter(summed, mesh, axes, block_numel, dtype, backward=True, label=label)


__all__ = ["active", "keep_weight", "kept_weight", "weight_grad_ring"]
