"""The distributed optimizer (zero=1, Megatron's distributed optimizer / ZeRO-1: DistributedAdamW) and its
zero=2 / zero=3 form (ShardedAdamW): AdamW on fp32 master shards. build_optimizer (optim.py) picks it.

Each gradient bucket (grad_sync.py; padded to a multiple of n) is reduce-scattered over the mode's grad_axes,
the group of n ranks holding replicas of the same weights (dp; 2.5D: dp x depth, n = dp d); the rank with
index k in it owns elements [k S, (k+1) S) of it (S = padded length / n). The optimizer keeps, per bucket, an
fp32 master copy of those elements and AdamW's two moments on them: 4 + 8 = 12 bytes per element, so 12 x
padded / n bytes per rank (cost_models/memory.py prices the same). After the step the updated master shard is
all-gathered over the same group in fp32 (one all_gather per bucket, as cost_models/traffic.py prices it),
then copied into the parameters (cast to their compute dtype). Per parameter: compute copy c, fp32 gradient
bucket 4 (the reduce-scatter is in place: a rank's shard is its chunk of the bucket) and 12 / n.
2.5D shards over (dp, dep), not dp only: the depth replicas' gradients are summed anyway, so the reduce-
scatter costs what the all_reduce did, and each replica then needs 1/d of the state (Tesseract treats depth
as data parallelism for the weights). AdamW is elementwise, so
updating shards of the flat buckets gives the same parameters as updating whole tensors
(tests/test_grad_sync.py holds it to the serial model).

Checkpoints: `checkpoint_view()` all-gathers the moments over the shard group and presents them per parameter, as
torch.optim.AdamW holds them (`state[param] = {step, exp_avg, exp_avg_sq}` of the parameter's tensor
shard), so checkpoint/store.py saves the same files for zero=1 as for zero=0 and either loads into the other; with
a 16-bit compute dtype the view carries the fp32 masters too (`master`, saved next to the moments).
`load_view(view)` takes this rank's elements back (the fp32 masters from the view's, else from the loaded
parameters).

The global gradient norm (for clipping) is summed over each rank's reduced shard, counting a tensor-
replicated parameter on its replica leader only (replication over a sharded axis, 2.5D's dep, needs no
leader: each element is in exactly one shard of the group), and all-reduced over ("dp", *tensor axes) (with pp > 1:
("pp", "dp", *tensor axes); each stage's optimizer holds only its own stage's buckets).

zero=2 / zero=3 (ShardedAdamW over data_parallel/sharded.py's units: the same element ranges as the gradient
shards, 12 bytes per shard element): zero=2 all-gathers the updated fp32 shard into the parameters after the
step, as zero=1; zero=3 casts it into the rank's compute-dtype parameter shard (fsdp.ParamUnits) and gathers
nothing (the next forward's per-unit gathers bring the new values). Its checkpoints gather the parameters for a
save or a load (not a step's traffic) and present DistributedAdamW's view per parameter, so zero=3 files load
at zero=0/1/2 and in other modes; after a load each rank takes its shards back.

Built on torch.optim.AdamW (its update, state_dict and param_groups); what is ours is the sharding and
the collectives, which torch's ZeroRedundancyOptimizer cannot do: it shards whole parameters per rank
and broadcasts them, not bucketed reduce-scatter / all-gather recorded as CommEvents.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from paracube.executor.comm import all_reduce
from paracube.executor.data_parallel.fsdp import ParamUnits
from paracube.executor.data_parallel.grad_sync import Bucket, GradSync
from paracube.executor.data_parallel.param_gather import ParamGather, copy_into_params, finish_gather, start_gather
from paracube.executor.data_parallel.sharded import ShardedSync, Unit
from paracube.executor.layers.shards import ShardSpec


class DistributedAdamW(torch.optim.AdamW):
    """AdamW over the fp32 master shards of `sync`'s buckets (zero >= 1; zero=2/3: ShardedAdamW)."""

    def __init__(self, sync: GradSync, specs: dict[Tensor, ShardSpec], uncounted: tuple[Tensor, ...] = (),
                 **adamw: Any) -> None:
        """`uncounted`: parameters left out of the global norm (the last stage's copy of a tied embedding,
        counted on the first stage)."""
        assert sync.zero >= 1
        self.sync = sync
        self.masters: list[Tensor] = []
        self.masks: list[Tensor] = []  # 1 where this rank counts the element in the global norm
        for b in sync.buckets:  # each bucket sharded over its own group (b.axes: dense data axes; experts edp)
            lo, hi = self._k(b) * b.shard_numel, (self._k(b) + 1) * b.shard_numel
            flat = torch.zeros(b.length, dtype=torch.float32, device=b.shard.device)
            mask = torch.zeros(b.length, dtype=torch.float32, device=b.shard.device)
            for i, p in enumerate(b.params):
                o = b.offsets[i]
                flat[o:o + p.numel()] = p.detach().reshape(-1).float()
                spec = specs[p]
                leader = all(sync.mesh.coord(a) == 0 for a in spec.replicated_axes if a not in self._axes(b))
                mask[o:o + p.numel()] = float(leader and not any(p is u for u in uncounted))
            self.masters.append(flat[lo:hi].clone())
            self.masks.append(mask[lo:hi].clone())
        super().__init__(self.masters, **adamw)
        self.prefetch: ParamGather | None = None  # zero=1 with the gathers overlapped (overlap_gathers)
        self.overlapped = False

    def _k(self, b: Any) -> int:
        """This rank's shard index in bucket b's group: its own (GradSync buckets; MoE experts: over edp), else
        the sync's (zero=2/3 units)."""
        return int(b.k) if hasattr(b, "k") else self.sync.shard_index()

    def _axes(self, b: Any) -> tuple[str, ...]:
        return getattr(b, "axes", None) or self.sync.axes

    def grad_norm_sq(self) -> Tensor:
        """This rank's share of the squared global gradient norm (before the all_reduce)."""
        sq = torch.zeros(1, dtype=torch.float32, device=self.masters[0].device)
        for b, m in zip(self.sync.buckets, self.masks, strict=True):
            sq += (b.shard * b.shard * m).sum()
        return sq

    @torch.no_grad()
    def reduce_over(self, params: list[Tensor], axes: tuple[str, ...], label: str) -> None:
        """Sum the reduced gradients of `params` over `axes` where this rank's shards hold them: one fp32
        all_reduce of all of them (elements outside the shards travel as zeros). 1D + sp: the parameters used
        on sequence shards, summed over tp after the dp reduce-scatter, as Megatron's finalize_model_grads
        does (the two sums commute; the tp ranks of a dp index hold the same buckets, so the same shards)."""
        if not params:
            return
        where = self.sync.where
        flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32, device=self.masters[0].device)
        pieces: list[tuple[Tensor, int, int]] = []  # (bucket shard slice, flat start, flat end)
        start = 0
        for p in params:
            b, i = where[p]
            o, lo = b.offsets[i], self._k(b) * b.shard_numel
            a, c = max(lo, o), min(lo + b.shard_numel, o + p.numel())
            if a < c:
                piece = b.shard[a - lo:c - lo]
                flat[start + a - o:start + c - o] = piece
                pieces.append((piece, start + a - o, start + c - o))
            start += p.numel()
        flat = all_reduce(flat, self.sync.mesh, axes, label=label)
        for piece, a, c in pieces:
            piece.copy_(flat[a:c])

    def scale_grads(self, coef: float) -> None:
        for b in self.sync.buckets:
            b.shard.mul_(coef)

    def overlap_gathers(self, model: torch.nn.Module | None) -> None:
        """zero=1: the next steps issue their parameter all-gathers asynchronously, finished by forward pre-hooks
        of `model`'s modules (param_gather.py; hooks registered once); None: gathered in the step, as before."""
        if model is not None and self.prefetch is None:
            self.prefetch = ParamGather(model, self.sync.buckets, self.sync.mesh, self.sync.axes)
        self.overlapped = model is not None

    def wait_params(self) -> None:
        """Every parameter holds the last step's update (pending overlapped gathers finished)."""
        if self.prefetch is not None:
            self.prefetch.wait_all()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.wait_params()  # a bucket whose modules did not run since the last step
        for master, b in zip(self.masters, self.sync.buckets, strict=True):
            master.grad = b.shard
        super().step()
        for j, (master, b) in enumerate(zip(self.masters, self.sync.buckets, strict=True)):
            master.grad = None
            if self.overlapped and self.prefetch is not None:
                self.prefetch.issue(j, master)
            else:
                self._gather(master, b)
        return None

    def _gather(self, master: Tensor, b: Bucket) -> None:
        """All-gather the updated fp32 shard over the shard group into the bucket's parameters (cast to their
        dtype)."""
        axes = self._axes(b)
        full = finish_gather(*start_gather(master, self.sync.mesh, axes, "params"), self.sync.mesh, axes)
        copy_into_params(b, full)

    # --- checkpoints ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def checkpoint_view(self) -> SimpleNamespace:
        """The moments per parameter (full tensor shards, gathered over the shard group), in torch AdamW's layout."""
        self.wait_params()  # the save reads the parameters too
        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for master, b in zip(self.masters, self.sync.buckets, strict=True):
            s = self.state.get(master)
            if not s:
                continue
            names = ("exp_avg", "exp_avg_sq")
            full = {m: self._all_gather(s[m], self._axes(b)) for m in names}
            if b.params[0].dtype != torch.float32:  # the fp32 masters are not the parameters: save them too
                full["master"] = self._all_gather(master, self._axes(b))
            for i, p in enumerate(b.params):
                o = b.offsets[i]
                state[p] = {"step": s["step"].clone(),
                            **{m: v[o:o + p.numel()].view_as(p).clone() for m, v in full.items()}}
        return SimpleNamespace(state=state)

    def empty_view(self) -> SimpleNamespace:
        self.wait_params()  # no pending gather may overwrite the loaded parameters
        return SimpleNamespace(state=defaultdict(dict))

    @torch.no_grad()
    def load_view(self, view: SimpleNamespace) -> None:
        """This rank's shard of the moments in `view` (filled by checkpoint.load_checkpoint) and the fp32
        masters from the (already loaded) parameters."""
        for master, b in zip(self.masters, self.sync.buckets, strict=True):
            lo, hi = self._k(b) * b.shard_numel, (self._k(b) + 1) * b.shard_numel
            flat = {m: torch.zeros(b.length, dtype=torch.float32, device=master.device)
                    for m in ("param", "exp_avg", "exp_avg_sq")}
            step = None
            for i, p in enumerate(b.params):
                o = b.offsets[i]
                s = view.state.get(p) or {}
                flat["param"][o:o + p.numel()] = s["master"].reshape(-1) if "master" in s else p.detach().reshape(-1)
                for m in ("exp_avg", "exp_avg_sq"):
                    if m in s:
                        flat[m][o:o + p.numel()] = s[m].reshape(-1).float()
                step = s.get("step", step)
            master.copy_(flat["param"][lo:hi])
            if step is not None:
                self.state[master] = {"step": torch.as_tensor(step, dtype=torch.float32).clone(),
                                      "exp_avg": flat["exp_avg"][lo:hi].clone(),
                                      "exp_avg_sq": flat["exp_avg_sq"][lo:hi].clone()}

    def _all_gather(self, shard: Tensor, axes: tuple[str, ...]) -> Tensor:  # not a step's traffic: unrecorded
        return finish_gather(*start_gather(shard, self.sync.mesh, axes, None), self.sync.mesh, axes)


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


__all__ = ["DistributedAdamW", "ShardedAdamW"]
