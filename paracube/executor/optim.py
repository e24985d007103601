"""Distributed optimizer (zero=1, Megatron's distributed optimizer / ZeRO-1): AdamW on fp32 master shards.

Each gradient bucket (grad_sync.py; padded to a multiple of dp) is reduce-scattered over dp; the rank with
dp index k owns elements [k S, (k+1) S) of it (S = padded length / dp). The optimizer keeps, per bucket,
an fp32 master copy of those elements and AdamW's two moments on them: 4 + 8 = 12 bytes per element, so
12 x padded / dp bytes per rank (cost_models/memory.py prices the same). After the step the updated
master shard is cast to the parameters' dtype and all-gathered over dp (one all_gather per bucket), then
copied into the parameters. AdamW is elementwise, so updating shards of the flat buckets gives the same
parameters as updating whole tensors (tests/test_grad_sync.py holds it to the serial model).

The global gradient norm (for clipping) is summed over each rank's reduced shard, counting a tensor-
replicated parameter on its replica leader only, and all-reduced over ("dp", *tensor axes).

Built on torch.optim.AdamW (its update, state_dict and param_groups); what is ours is the sharding and
the collectives, which torch's ZeroRedundancyOptimizer cannot do: it shards whole parameters per rank
and broadcasts them, not bucketed reduce-scatter / all-gather recorded as CommEvents.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from paracube.executor.grad_sync import Bucket, GradSync
from paracube.executor.shards import ShardSpec


class DistributedAdamW(torch.optim.AdamW):
    """AdamW over the fp32 master shards of `sync`'s buckets (sync.zero must be 1)."""

    def __init__(self, sync: GradSync, specs: dict[Tensor, ShardSpec], **adamw: Any) -> None:
        assert sync.zero == 1
        self.sync = sync
        k = sync.shard_index()
        self.masters: list[Tensor] = []
        self.masks: list[Tensor] = []  # 1 where this rank counts the element in the global norm
        for b in sync.buckets:
            lo, hi = k * b.shard_numel, (k + 1) * b.shard_numel
            flat = torch.zeros(b.length, dtype=torch.float32, device=b.buffer.device)
            mask = torch.zeros(b.length, dtype=torch.float32, device=b.buffer.device)
            for i, p in enumerate(b.params):
                o = b.offsets[i]
                flat[o:o + p.numel()] = p.detach().reshape(-1).float()
                spec = specs[p]
                leader = all(sync.mesh.coord(a) == 0 for a in spec.replicated_axes)
                mask[o:o + p.numel()] = float(leader)
            self.masters.append(flat[lo:hi].clone())
            self.masks.append(mask[lo:hi].clone())
        super().__init__(self.masters, **adamw)

    def grad_norm_sq(self) -> Tensor:
        """This rank's share of the squared global gradient norm (before the all_reduce)."""
        sq = torch.zeros(1, dtype=torch.float32, device=self.masters[0].device)
        for b, m in zip(self.sync.buckets, self.masks, strict=True):
            sq += (b.shard * b.shard * m).sum()
        return sq

    def scale_grads(self, coef: float) -> None:
        for b in self.sync.buckets:
            b.shard.mul_(coef)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for master, b in zip(self.masters, self.sync.buckets, strict=True):
            master.grad = b.shard
        super().step()
        for master, b in zip(self.masters, self.sync.buckets, strict=True):
            master.grad = None
            self._gather(master, b)
        return None

    def _gather(self, master: Tensor, b: Bucket) -> None:
        """All-gather the updated shard over dp (in the parameters' dtype) into the bucket's parameters."""
        sync, dtype = self.sync, b.params[0].dtype
        shard = master.to(dtype)
        n = sync.group_size
        if n > 1:
            parts = [torch.empty_like(shard) for _ in range(n)]
            rec = sync.mesh.recorder
            with rec.issue("all_gather", ("dp",), n, shard, shard.numel() * n, False, "params"):
                dist.all_gather(parts, shard, group=sync.mesh.group(("dp",)))
            order = sync.mesh.order(("dp",))
            full = torch.cat([parts[order[k]] for k in range(n)])
        else:
            full = shard
        for i, p in enumerate(b.params):
            o = b.offsets[i]
            p.copy_(full[o:o + p.numel()].view_as(p))


__all__ = ["DistributedAdamW"]
