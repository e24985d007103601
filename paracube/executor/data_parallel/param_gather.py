"""zero=1's parameter all-gather overlapped with the next forward (Megatron-core's --overlap-param-gather).

Without overlap the distributed optimizer (optim.DistributedAdamW) all-gathers each bucket's updated fp32 master
shard over the shard group right after the AdamW step and copies it into the bucket's parameters. With it, the
step issues the same all_gathers (same group, same buffers, same bucket order, so the recorded collectives and
the bytes are the same) asynchronously and returns; a forward pre-hook on every module that reads a parameter of
the bucket waits for that bucket's gather and copies the gathered values into the parameters the first time the
next step's forward reaches the module. The values copied are the same either way, so overlap on and off give
bit-identical parameters, losses and gradients. Megatron-core registers the same hook
(distributed_data_parallel.py `_make_forward_pre_hook`: `finish_param_sync` of the module's bucket group).

"Reads": the module's own and its submodules' parameters, and a tied head's embedding table (held in a tuple
`_embedding`, not a submodule, so its weight is registered once: layers/serial.TiedHead, three_d.BlockTiedHead).
The model's root is not hooked: its forward would wait for every bucket before the first one is used; the
pipeline schedule calls `chunk_forward`, which reaches every parameter through the modules anyway.

Whatever reads the parameters outside a forward (a checkpoint save, the non-finite undo of training/loop.py, the
end of training, a test comparing parameters) calls `wait_all()` first; the next optimizer step also waits for
any gather still pending before it issues new ones (a bucket whose modules did not run).

Priced by cost_models/analytic.py and event_program.py (`param_overlap`: the gathers hidden under the stage's
first forward of the step); the paracube runtime declares param_gather_overlap (runtimes/paracube.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from paracube.executor.mesh import Mesh


class ParamGather:
    """Pending per-bucket parameter all-gathers of one model and the forward pre-hooks that finish them."""

    def __init__(self, model: nn.Module, buckets: list[Any], mesh: Mesh, axes: tuple[str, ...]) -> None:
        self.buckets, self.mesh, self.axes = buckets, mesh, axes
        self.pending: list[tuple[dist.Work | None, list[Tensor]] | None] = [None] * len(buckets)
        self.waited_in_forward = 0  # buckets finished by a forward pre-hook (tests: the overlap happened)
        self.waited_outside = 0  # buckets finished by wait_all()
        where = {p: j for j, b in enumerate(buckets) for p in b.params}
        for module in model.modules():
            if module is model:
                continue
            reads = list(module.parameters())
            for emb in getattr(module, "_embedding", ()):
                reads += list(emb.parameters())
            idx = sorted({where[p] for p in reads if p in where})
            if idx:
                module.register_forward_pre_hook(self._hook(tuple(idx)))

    def _hook(self, idx: tuple[int, ...]) -> Any:
        def pre_forward(module: nn.Module, args: Any) -> None:
            for j in idx:
                if self.pending[j] is not None:
                    self._finish(j)
                    self.waited_in_forward += 1
        return pre_forward

    def issue(self, j: int, shard: Tensor) -> None:
        """Start bucket j's all_gather of the updated master `shard` (kept unchanged until it is waited for:
        the masters change only in the next step, which waits first)."""
        assert self.pending[j] is None, f"bucket {j}: a parameter gather is already pending"
        self.pending[j] = start_gather(shard, self.mesh, self._axes(j), "params", async_op=True)

    @torch.no_grad()
    def _finish(self, j: int) -> None:
        work, parts = self.pending[j]  # type: ignore[misc]
        self.pending[j] = None
        full = finish_gather(work, parts, self.mesh, self._axes(j))
        copy_into_params(self.buckets[j], full)

    def _axes(self, j: int) -> tuple[str, ...]:
        """Bucket j's shard group (its own: MoE experts shard over edp, grad_sync.py), else the sync's."""
        return getattr(self.buckets[j], "axes", None) or self.axes

    def wait_all(self) -> None:
        """Finish every pending gather (in bucket order, the order they were issued)."""
        for j in range(len(self.pending)):
            if self.pending[j] is not None:
                self._finish(j)
                self.waited_outside += 1

    @property
    def any_pending(self) -> bool:
        return any(x is not None for x in self.pending)


def start_gather(shard: Tensor, mesh: Mesh, axes: tuple[str, ...], label: str | None,
                 async_op: bool = False) -> tuple[dist.Work | None, list[Tensor]]:
    """All-gather a bucket's fp32 shard over the shard group (recorded as `label`; None: not a step's traffic,
    e.g. a checkpoint's moments). Returns the work handle (None when done or n = 1) and the parts."""
    n = mesh.size(axes)
    if n == 1:
        return None, [shard]
    parts = [torch.empty_like(shard) for _ in range(n)]
    group = mesh.group(axes)
    if label is None:
        return dist.all_gather(parts, shard.contiguous(), group=group, async_op=async_op), parts
    with mesh.recorder.issue("all_gather", axes, n, shard, shard.numel() * n, False, label):
        return dist.all_gather(parts, shard, group=group, async_op=async_op), parts


def finish_gather(work: dist.Work | None, parts: list[Tensor], mesh: Mesh, axes: tuple[str, ...]) -> Tensor:
    """The whole bucket from start_gather's parts, in shard order (index k lives on group rank order[k])."""
    if work is not None:
        work.wait()
    if len(parts) == 1:
        return parts[0]
    order = mesh.order(axes)
    return torch.cat([parts[order[k]] for k in range(len(parts))])


@torch.no_grad()
def copy_into_params(b: Any, full: Tensor) -> None:
    """The gathered fp32 bucket into its parameters (cast to their dtype)."""
    for i, p in enumerate(b.params):
        o = b.offsets[i]
        p.copy_(full[o:o + p.numel()].view_as(p))


__all__ = ["ParamGather", "copy_into_params", "finish_gather", "start_gather"]
