"""The optimizer of zero=2 / zero=3 (data_parallel/sharded.py): DistributedAdamW's fp32 master shards and Adam
moments over the units' shards (the same element ranges as the gradient shards), 12 bytes per shard element.

zero=2 all-gathers the updated fp32 shard into the parameters after the step (as zero=1); zero=3 casts it into
the rank's compute-dtype parameter shard (fsdp.ParamUnits) and gathers nothing: the next forward's per-unit
gathers bring the new values. Checkpoints: the parameters are gathered for a save or a load (not a step's
traffic) and the view per parameter is DistributedAdamW's, so zero=3 files load at zero=0/1/2 and in other
modes (checkpoint/store.py reshards by ShardSpec); after a load each rank takes its shards back.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from paracube.executor.data_parallel.fsdp import ParamUnits
from paracube.executor.data_parallel.optim import DistributedAdamW
from paracube.executor.data_parallel.sharded import ShardedSync, Unit
from paracube.executor.mesh import Mesh


class ShardedAdamW(DistributedAdamW):
    """DistributedAdamW over ShardedSync's units; zero=3 shards the parameters once the masters are taken."""

    def __init__(self, sync: ShardedSync, specs: dict[Tensor, Any], **adamw: Any) -> None:
        super().__init__(sync, specs, **adamw)  # type: ignore[arg-type]  # masters from the whole parameters
        self.units: ParamUnits | None = None
        if sync.zero == 3:
            self.units = sync.params = ParamUnits(sync, sync.model)

    def _gather(self, master: Tensor, b: Unit) -> None:  # type: ignore[override]
        if self.units is None:
            super()._gather(master, b)  # type: ignore[arg-type]
            return
        self.units.shards[self.units.index[b.name]].copy_(master)

    def checkpoint_view(self) -> SimpleNamespace:
        if self.units is not None:
            self.units.gather_all()
        return super().checkpoint_view()

    def empty_view(self) -> SimpleNamespace:
        if self.units is not None:
            self.units.gather_all()  # a load lands in the whole parameters
        return super().empty_view()

    @torch.no_grad()
    def load_view(self, view: SimpleNamespace) -> None:
        super().load_view(view)
        if self.units is not None:
            self.units.shards_from_params()


def sharded_optimizer(model: nn.Module, mesh: Mesh, zero: int, **adamw: Any) -> ShardedAdamW:
    specs = {p: model.shard_specs[n] for n, p in model.named_parameters()}  # type: ignore[index]
    return ShardedAdamW(ShardedSync(model, mesh, zero), specs, **adamw)


__all__ = ["ShardedAdamW", "sharded_optimizer"]
