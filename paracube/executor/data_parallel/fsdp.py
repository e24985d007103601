"""zero=3's parameter units: compute-dtype shards, gathered per unit before use, resharded after
(data_parallel/sharded.py has the rules and sources; cost_models/traffic.py prices the same gathers).

Mechanism (FSDP2's): every parameter of a unit is a view of the unit's flat buffer (bucket layout); resharding
resizes the buffer's storage to 0 bytes, gathering resizes it back and all-gathers the shards into it, so the
tensors autograd saved (the parameters, views of them) see the gathered values again in backward. Gathers are
written through the buffer, never through the parameters, so autograd's version counters stay unchanged.
Hooks (explicit, on the model's modules; nothing is patched):
- forward pre-hook on a unit's first module: reshard the previous unit (its forward is over; resharding at the
  next unit's start, not in the unit's own forward hook, because an output may alias a parameter: the position
  table's slice), gather this one (waiting for its prefetch), then prefetch the next unit;
- forward hooks on its modules: wrap the outputs in `_PreBackward`, whose backward gathers the unit before
  its backward runs and prefetches the unit before it;
- ShardedSync.done_backward: once a unit's gradients are issued, reshard it.
A forward that runs inside backward (full recomputation) finds its unit gathered and neither reshards nor
prefetches. At most two units are gathered at a time: a prefetch waits until a unit is resharded.
Tied embeddings (the embedding and the head on this rank): the head reads the embedding's table, so the
embedding unit is held gathered from its forward to its backward (not resharded by the next unit's forward,
not gathered again before its backward; torchtitan / FSDP2 put a tied table in one unit with its user likewise)
and not counted in the two: it is gathered once per micro-batch, and its gradient (head + lookup) reaches the
table once, summed by autograd, before the unit is reduce-scattered (sharded.py). Priced alike: traffic.py
(no backward gather of the embedding), fsdp_units.unit_totals (gathered at once: the embedding plus a pair).
MoE blocks (sharded.py): a block's experts are a unit of their own over edp, in the block's slot: gathered,
waited for and resharded with the block's dense unit at the forward hooks (two collectives, each over its group; a
slot counts once in the two gathered), resharded alone once its gradients are issued (before the block's attention
backward ends); torchtitan's per-parameter meshes in one fully_shard do the same (distributed/fsdp.py l.209-275).
Pipelines (pp > 1, executor/pipeline/schedule.py): a stage's units are split into segments, one per model chunk
(the embedding with chunk 0, the final unit with the last chunk). A chunk's forward or backward of one micro-batch
is one pass over its segment; the schedule calls `begin_chunk` before and `end_chunk_forward` after each chunk
forward. Prefetch stays within the segment (the next op of the schedule may be another chunk or micro-batch), the
segment's last unit is resharded when its forward ends, and no unit is held from forward to backward (other
micro-batches' forwards run in between under 1F1B): every unit is gathered before each micro-batch's forward and
again before its backward, 2 N gathers per unit per step (traffic.py prices the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from paracube.executor.data_parallel.sharded import EXPERTS, ShardedSync, Unit

MAX_GATHERED = 2


class _PreBackward(torch.autograd.Function):
    """Identity whose backward gathers unit `k` (forward order) before the unit's own backward."""

    @staticmethod
    def forward(ctx: Any, units: ParamUnits, k: int, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.units, ctx.k = units, k
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[None, None, Tensor]:  # type: ignore[override]
        ctx.units.before_backward(ctx.k)
        return None, None, g


class ParamUnits:
    """The parameter shards of a ShardedSync's units (forward order: embedding, blocks, final), gathered and
    resharded by slot: a slot is a module's units (an MoE block's dense unit and its experts' unit, each over its
    own group: sharded.py), the hooks' index k; done_backward reshards one unit."""

    def __init__(self, sync: ShardedSync, model: nn.Module) -> None:
        self.sync, self.mesh = sync, sync.mesh
        self.units: list[Unit] = list(reversed(sync.buckets))
        self.index = {u.name: j for j, u in enumerate(self.units)}  # a unit's position in self.units
        self.slots: list[list[int]] = []  # slot k: its units (an expert unit joins its block's slot)
        for j, u in enumerate(self.units):
            if u.name.endswith(EXPERTS) and self.slots:
                self.slots[-1].append(j)
            else:
                self.slots.append([j])
        self.slot = {self.units[s[0]].name: k for k, s in enumerate(self.slots)}
        self.state = ["full"] * len(self.units)  # per unit: full | sharded | gathering | gathered
        self.work: list[dist.Work | None] = [None] * len(self.units)
        self.want: int | None = None  # a slot's prefetch waiting for room
        self.in_backward = False
        self.live_bytes = self.peak_bytes = 0
        spec = getattr(model, "spec", None)
        tied = bool(spec is not None and spec.tied_embeddings and "embedding" in self.slot and "final" in self.slot)
        self.held = {self.slot["embedding"]} if tied else set()  # slots gathered from forward to backward
        # pp > 1: each slot's model chunk (module docstring); pp = 1: one segment
        chunks = getattr(model, "chunks", [[]])
        self.pipelined = sync.mesh.layout.pp > 1
        chunk_of = {f"blocks.{i}": c for c, idx in enumerate(chunks) for i in idx}
        names = [self.units[s[0]].name for s in self.slots]
        self.segment = [chunk_of.get(n, 0 if n == "embedding" else len(chunks) - 1) if self.pipelined else 0
                        for n in names]
        self.flats: list[Tensor] = []
        self.shards: list[Tensor] = []
        with torch.no_grad():
            for u in self.units:
                p0 = u.params[0]
                flat = torch.zeros(u.length, dtype=p0.dtype, device=p0.device)
                for i, p in enumerate(u.params):
                    flat[u.offsets[i]:u.offsets[i] + p.numel()] = p.detach().reshape(-1)
                    p.data = flat[u.offsets[i]:u.offsets[i] + p.numel()].view_as(p)
                self.flats.append(flat)
                self.shards.append(flat[u.k * u.shard_numel:(u.k + 1) * u.shard_numel].clone())
        for k in range(len(self.slots)):
            self._reshard(k)
        self._hook(model)

    def _hook(self, model: nn.Module) -> None:
        mods = dict(model.named_modules())
        blocks = [n for n in self.slot if n.startswith("blocks.")]
        edge_first = ["tok_emb", "pos_emb"] if "pos_emb" in mods and mods["pos_emb"] is not None else ["tok_emb"]
        plan: list[tuple[str, list[str]]] = [("embedding", edge_first)] + [(b, [b]) for b in blocks]
        plan.append(("final", ["ln_f", "head"]))
        for unit, names in [(u, n) for u, n in plan if u in self.slot]:  # pp > 1: the stage's units only
            k = self.slot[unit]
            mods[names[0]].register_forward_pre_hook(lambda m, a, k=k: self.before_forward(k))
            for name in names:
                mods[name].register_forward_hook(lambda m, a, out, k=k: self.after_forward(k, out))

    # --- hooks ---------------------------------------------------------------------------------------------
    def _same(self, k: int, j: int) -> bool:
        """Slot j is in slot k's segment (pp > 1: its model chunk) and exists."""
        return 0 <= j < len(self.slots) and self.segment[j] == self.segment[k]

    def before_forward(self, k: int) -> None:
        if k == 0 and not self.pipelined:  # a micro-batch's forward starts (the embedding is never recomputed)
            self.in_backward = False
        if not self.in_backward and self._same(k, k - 1) and k - 1 not in self.held:
            self._reshard(k - 1)  # the previous unit's forward is over (its output may alias it: pos_emb)
        self._gather(k)
        self._wait(k)
        if not self.in_backward and self._same(k, k + 1):
            self._prefetch(k + 1)

    def begin_chunk(self) -> None:
        """pp > 1: a chunk's forward or backward starts (the schedule's op; a forward is not a recomputation)."""
        self.in_backward = False

    def end_chunk_forward(self, chunk: int) -> None:
        """pp > 1: chunk `chunk`'s forward is over: its last unit resharded (the others were at the next one's)."""
        last = [k for k, c in enumerate(self.segment) if c == chunk]
        if last:
            self._reshard(last[-1])

    def after_forward(self, k: int, out: Tensor) -> Tensor:
        if self.in_backward:
            return out
        if torch.is_grad_enabled() and isinstance(out, Tensor) and out.requires_grad:
            return _PreBackward.apply(self, k, out)
        return out

    def before_backward(self, k: int) -> None:
        self.in_backward = True
        self._gather(k)
        self._wait(k)
        if self._same(k, k - 1):
            self._prefetch(k - 1)

    def done_backward(self, u: Unit) -> None:
        self._reshard_unit(self.index[u.name])
        self._try_prefetch()

    # --- gather / reshard ----------------------------------------------------------------------------------
    def _prefetch(self, k: int) -> None:
        self.want = k
        self._try_prefetch()

    def _try_prefetch(self) -> None:
        k = self.want
        if k is None:
            return
        if any(self.state[j] != "sharded" for j in self.slots[k]):
            self.want = None
            return
        live = sum(any(self.state[j] in ("gathering", "gathered") for j in s)
                   for i, s in enumerate(self.slots) if i not in self.held)
        if live < MAX_GATHERED:
            self.want = None
            self._gather(k)

    def _gather(self, k: int) -> None:
        for j in self.slots[k]:
            self._gather_unit(j)

    def _gather_unit(self, k: int) -> None:
        if self.state[k] != "sharded":
            return
        u, flat, shard = self.units[k], self.flats[k], self.shards[k]
        flat.untyped_storage().resize_(u.length * flat.element_size())
        self.live_bytes += u.length * flat.element_size()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        n = self.mesh.size(u.axes)
        with torch.no_grad():
            if n == 1:
                flat.copy_(shard)
            else:
                order = self.mesh.order(u.axes)
                chunks = list(flat.chunk(n))
                by_rank = [chunks[0]] * n
                for j in range(n):
                    by_rank[order[j]] = chunks[j]
                rec = self.mesh.recorder
                with rec.issue("all_gather", u.axes, n, shard, u.length, False, "params"):
                    self.work[k] = dist.all_gather(by_rank, shard, group=self.mesh.group(u.axes), async_op=True)
        self.state[k] = "gathering"

    def _wait(self, k: int) -> None:
        for j in self.slots[k]:
            self._wait_unit(j)

    def _wait_unit(self, k: int) -> None:
        work, self.work[k] = self.work[k], None
        if work is not None:
            work.wait()
        if self.state[k] == "gathering":
            self.state[k] = "gathered"

    def _reshard(self, k: int) -> None:
        for j in self.slots[k]:
            self._reshard_unit(j)
        self._try_prefetch()

    def _reshard_unit(self, k: int) -> None:
        if self.state[k] == "sharded":
            return
        self._wait_unit(k)
        flat = self.flats[k]
        if self.state[k] != "full":
            self.live_bytes -= flat.numel() * flat.element_size()
        flat.untyped_storage().resize_(0)
        self.state[k] = "sharded"

    # --- outside the step ----------------------------------------------------------------------------------
    def start(self) -> None:
        """A step starts with every unit sharded (a checkpoint or an evaluation may have left some gathered)."""
        self.want, self.in_backward = None, False
        for k in range(len(self.slots)):
            self._reshard(k)

    def gather_all(self) -> None:
        """Every unit gathered (checkpoints, full state dicts; not a step's traffic, not recorded)."""
        for k, u in enumerate(self.units):
            n = self.mesh.size(u.axes)
            if self.state[k] == "sharded":
                flat = self.flats[k]
                flat.untyped_storage().resize_(u.length * flat.element_size())
                self.live_bytes += u.length * flat.element_size()
                if n == 1:
                    flat.copy_(self.shards[k])
                else:
                    parts = [torch.empty_like(self.shards[k]) for _ in range(n)]
                    dist.all_gather(parts, self.shards[k], group=self.mesh.group(u.axes))
                    order = self.mesh.order(u.axes)
                    flat.copy_(torch.cat([parts[order[j]] for j in range(n)]))
                self.state[k] = "gathered"
            else:
                self._wait_unit(k)

    @torch.no_grad()
    def shards_from_params(self) -> None:
        """After a load into the gathered parameters: this rank's shards taken from them."""
        self.gather_all()
        for k, u in enumerate(self.units):
            self.shards[k].copy_(self.flats[k][u.k * u.shard_numel:(u.k + 1) * u.shard_numel])

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Parameters whole inside the block (tests, export), sharded again after."""
        self.gather_all()
        try:
            yield
        finally:
            self.start()

    def shard_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.shards)


__all__ = ["ParamUnits"]
