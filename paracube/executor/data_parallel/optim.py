"""The optimizer for a layout (build_optimizer): AdamW on fp32 master weights (MasterAdamW, zero=0 with a 16-bit
compute dtype), torch's AdamW (fp32, zero=0), or the distributed optimizer (zero >= 1: distributed_adamw.py's
DistributedAdamW, Megatron's distributed optimizer / ZeRO-1, and ShardedAdamW, zero=2 / zero=3).

Mixed precision (functional.py, "Precision"; Megatron's Float16OptimizerWithFloat16Params): the model's
parameters are the compute copy; MasterAdamW keeps an fp32 master of each (4 bytes) and AdamW's two fp32
moments on it (8 bytes), steps the masters with the fp32 reduced gradients (`p.main_grad`, the buckets of
grad_sync.py) and writes the updated compute-dtype copy back: 2 + 4 + 12 = 18 bytes per bf16 parameter
(cost_models/memory.py). fp32 parameters need no master: build_optimizer gives them torch's AdamW, as before.
Masters start from the compute copy (`p.float()`), as Megatron's do.

Checkpoints: MasterAdamW and the distributed optimizers present `checkpoint_view()` / `empty_view()` /
`load_view(view)` (training/loop.py hands the views to checkpoint/store.py): their state per parameter as
torch.optim.AdamW holds it (torch's own AdamW is saved as it is), with the fp32 masters as `master`, so every
zero level saves the same files and loads the others'.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from paracube.executor.data_parallel.distributed_adamw import DistributedAdamW, ShardedAdamW
from paracube.executor.data_parallel.grad_sync import GradSync
from paracube.executor.data_parallel.sharded import ShardedSync
from paracube.executor.layers.functional import main_grad


class MasterAdamW(torch.optim.AdamW):
    """AdamW over fp32 masters of 16-bit parameters (zero=0): steps the masters with the parameters' fp32
    `main_grad` and copies them back into the parameters."""

    def __init__(self, params: list[Tensor], **adamw: Any) -> None:
        self.params = params
        self.masters = [p.detach().float().clone() for p in params]
        super().__init__(self.masters, **adamw)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        for p, master in zip(self.params, self.masters, strict=True):
            master.grad = main_grad(p)
        super().step()
        for p, master in zip(self.params, self.masters, strict=True):
            master.grad = None
            p.copy_(master)
        return None

    # --- checkpoints (the same files as torch AdamW's, plus the masters) ------------------------------------
    def checkpoint_view(self) -> SimpleNamespace:
        """State per parameter, as torch AdamW holds it, with the fp32 master as `master`."""
        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for p, master in zip(self.params, self.masters, strict=True):
            if self.state.get(master):
                state[p] = {**self.state[master], "master": master}
        return SimpleNamespace(state=state)

    def empty_view(self) -> SimpleNamespace:
        return SimpleNamespace(state=defaultdict(dict))

    @torch.no_grad()
    def load_view(self, view: SimpleNamespace) -> None:
        """The moments and masters from `view` (a master missing there: from the loaded parameter)."""
        for p, master in zip(self.params, self.masters, strict=True):
            s = view.state.get(p) or {}
            master.copy_(s.get("master", p))
            if "exp_avg" in s:
                self.state[master] = {"step": torch.as_tensor(s["step"], dtype=torch.float32).clone(),
                                      "exp_avg": s["exp_avg"].float(), "exp_avg_sq": s["exp_avg_sq"].float()}


def build_optimizer(model: torch.nn.Module, mesh: Any, zero: int, bucket_bytes: int,
                    **adamw: Any) -> torch.optim.Optimizer:
    """AdamW for a layout: DistributedAdamW over the model's buckets (zero=1), ShardedAdamW over its units
    (zero=2/3), MasterAdamW for 16-bit parameters, or torch's AdamW (fp32)."""
    if zero >= 2:
        specs = {p: model.shard_specs[n] for n, p in model.named_parameters()}  # type: ignore[union-attr, index]
        return ShardedAdamW(ShardedSync(model, mesh, zero), specs, **adamw)
    if zero != 1:
        params = list(model.parameters())
        if params[0].dtype != torch.float32:
            return MasterAdamW(params, **adamw)
        return torch.optim.AdamW(params, **adamw)
    specs = {p: model.shard_specs[n] for n, p in model.named_parameters()}  # type: ignore[union-attr, index]
    copy = (model.tok_emb.weight,) if getattr(model, "tied_copy", False) else ()  # type: ignore[union-attr]
    return DistributedAdamW(GradSync(model, mesh, 1, bucket_bytes), specs, copy, **adamw)


__all__ = ["MasterAdamW", "build_optimizer"]
