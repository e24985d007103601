"""Which block of a full tensor a rank holds (ShardSpec), and slicing/gathering by it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.executor.mesh import Mesh


@dataclass(frozen=True)
class ShardSpec:
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]  # a rectangular block of the full tensor
    replica_leader: bool  # False where another rank holds the same copy and counts it (norms, saving)
    replicated_axes: tuple[str, ...]  # tensor axes over which this shard is replicated

    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes, strict=True))

    def take(self, full: Tensor) -> Tensor:
        """This shard's block of the full tensor."""
        return full[self.slices()]


def block(total: int, mesh: Mesh, axes: tuple[str, ...]) -> tuple[int, int]:
    """(offset, size) of this rank's chunk when `total` is split evenly over `axes` (first axis major)."""
    n = mesh.size(axes)
    size = total // n
    return mesh.index(axes) * size, size


def make_spec(mesh: Mesh, shape: tuple[int, ...], splits: dict[int, tuple[int, int]],
              replicated_axes: tuple[str, ...] = ()) -> ShardSpec:
    """`splits`: dim -> (offset, size); other dims whole. Leader: index 0 along replicated axes, dp and cp."""
    offsets = tuple(splits.get(d, (0, n))[0] for d, n in enumerate(shape))
    sizes = tuple(splits.get(d, (0, n))[1] for d, n in enumerate(shape))
    leader = all(mesh.coord(a) == 0 for a in (*replicated_axes, "dp", "cp"))
    return ShardSpec(tuple(shape), offsets, sizes, leader, tuple(replicated_axes))


def gather_full(local: Tensor, spec: ShardSpec, mesh: Mesh) -> Tensor:
    """The full tensor on every rank of the tensor group, from every rank's shard (not recorded)."""
    axes = mesh.tensor_axes
    group = mesh.group(axes) if axes else None
    if group is None:
        return local.detach().clone()
    n = mesh.size(axes)
    shard = local.detach().contiguous()
    parts = [torch.empty_like(shard) for _ in range(n)]
    dist.all_gather(parts, shard, group=group)
    offsets = torch.tensor(spec.offsets, dtype=torch.long, device=local.device)  # NCCL: device tensors only
    all_offsets = [torch.empty_like(offsets) for _ in range(n)]
    dist.all_gather(all_offsets, offsets, group=group)
    full = torch.empty(spec.global_shape, dtype=local.dtype, device=local.device)
    for part, offs in zip(parts, all_offsets, strict=True):
        full[tuple(slice(o, o + s) for o, s in zip(offs.tolist(), spec.sizes, strict=True))] = part
    return full


__all__ = ["ShardSpec", "block", "gather_full", "make_spec"]
