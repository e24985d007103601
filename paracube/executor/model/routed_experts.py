"""The routed experts of an MoE block (executor/model/moe.py's MoEMLP runs them between dispatch and combine): this
rank's E / ep SwiGLU experts, their parameters split along E over ep and replicated over the expert-data-parallel
group (edp), whose gradients data_parallel/grad_sync.py reduces over the axes each parameter names (`grad_axes`).
Routing weights (`probs`, one per copy; None with MoESpec.probs_on_input, applied to the input before the dispatch):
multiplied inside the activation, act(fc1 out) * p (executor/layers/weighted_glu.py, megatron-core 0.16.1 experts.py
l.680-746), fc2 then runs on that, and fc2's bias (GPT-OSS) is added weighted, y + b2 p (experts.py l.609-626
_apply_bias): the combine then sums the outputs unweighted and nothing of fc2's output is kept for the weights'
gradient. With etp > 1 (executor/layers/expert_tensor.py) fc2's bias is whole on every etp rank and added by etp
index 0 only, before the reduce-scatter (once per copy, as megatron-core's RowParallelLinear adds its bias once,
after the reduction: tensor_parallel/layers.py l.1296; megatron-core itself refuses expert biases with etp > 1,
transformer_config.py l.1588-1591); the other etp ranks compute its gradient all the same (_one).
`discard_act` (rcm=moe_act, recompute_modules.py): each expert's weighted activation output is
Megatron-core's output-discarding checkpoint (experts.py l.100-275; executor/layers/discard.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from paracube.executor.layers.discard import Discard
from paracube.executor.layers.expert_tensor import ETP
from paracube.executor.layers.experts import EP
from paracube.executor.layers.llama import swiglu
from paracube.executor.layers.serial import ShardedModule
from paracube.executor.layers.shards import ShardSpec
from paracube.executor.layers.weighted_glu import weighted_act
from paracube.executor.mesh import Mesh

EDP = ("edp",)


class Experts(ShardedModule):
    """This rank's E / ep routed experts: w1 [E, h, 2 f_e] (gate, up interleaved), w2 [E, f_e, h] (GPT-OSS: biases b1
    [E, 2 f_e], b2 [E, h]; the clamped SwiGLU), split along E over ep (rank r: experts r E/ep ..), w1's columns and
    w2's rows split over etp (index t: hidden units t f_e/etp ..; the partial outputs summed by expert_tensor.py's
    reduce_scatter), replicated over edp (its index 0 the leader)."""

    def __init__(self, mesh: Mesh, experts: int, h: int, f: int, moe: Any = None, discard_act: bool = False):
        super().__init__()
        self.discard_act = discard_act  # moe_act: each expert's activation output discarded (_one)
        ep, r = mesh.size(EP), mesh.coord("ep") if mesh.size(EP) > 1 else 0
        etp, t = mesh.size(ETP), mesh.coord("etp") if mesh.size(ETP) > 1 else 0
        self.local = experts // ep
        # Reduced over edp (folded: Mesh's expert groups); ep = etp = 1: every rank of the stage holds them all
        axes = EDP if ep * etp > 1 else tuple(dict.fromkeys((*mesh.layout.data_axes, *mesh.tensor_axes)))
        leader = all(mesh.coord(a) == 0 for a in axes if mesh.size((a,)) > 1)
        self.bias = moe is not None and moe.expert_bias
        self.limit, self.alpha = (moe.swiglu_limit, moe.swiglu_alpha) if moe is not None else (None, 1.0)
        # etp: fc1's columns (gate, up pairs: a block of 2 f / etp interleaved columns holds f / etp matching pairs,
        # the pairing megatron-core's GLU fc1 shards keep, mlp.py l.276-316 apply_swiglu_sharded_factory) and fc2's
        # rows; every shard a distinct block (ShardSpec: saved by its edp leader, counted once in norms)
        params: list[tuple[str, tuple[int, ...], int | None]] = [("w1", (experts, h, 2 * f), 2),
                                                                 ("w2", (experts, f, h), 1)]
        if self.bias:  # b2 whole on every etp rank, added by index 0 only (_one)
            params += [("b1", (experts, 2 * f), 1), ("b2", (experts, h), None)]
        self.adds_b2 = t == 0
        for name, shape, dim in params:
            offsets, sizes = [r * self.local] + [0] * (len(shape) - 1), [self.local, *shape[1:]]
            if dim is not None:
                sizes[dim] = shape[dim] // etp
                offsets[dim] = t * sizes[dim]
            replicas = ETP if dim is None and etp > 1 else ()  # saved and counted in norms on etp index 0
            self.add_param(name, ShardSpec(shape, tuple(offsets), tuple(sizes), leader and (t == 0 or not replicas),
                                           replicas))
            getattr(self, name).grad_axes = axes  # data_parallel/grad_sync.py reduces it over them

    def forward(self, x: Tensor, counts: list[int], probs: Tensor | None = None) -> Tensor:
        """x [n, h] sorted by local expert, `counts[j]` rows for expert j; probs [n, 1] their routing weights (None:
        unweighted, the weights applied to x already)."""
        ps = probs.split(counts) if probs is not None else [None] * len(counts)
        outs = [self._one(j, part, p) for j, (part, p) in enumerate(zip(x.split(counts), ps, strict=True))]
        return torch.cat(outs) if outs else x

    def _one(self, j: int, x: Tensor, p: Tensor | None) -> Tensor:
        h = x @ self.w1[j] + self.b1[j] if self.bias else x @ self.w1[j]
        args = (h,) if p is None else (h, p)
        if self.discard_act and torch.is_grad_enabled():
            # moe_act (megatron-core experts.py l.100-275, CheckpointWithoutOutput of the weighted activation): its
            # output [n_j, f_e] freed once w2's GEMM used it, made again from h and p right before that GEMM's backward
            ckpt = Discard(self._act)
            y = ckpt(*args) @ self.w2[j]
            ckpt.discard(y)
        else:
            y = self._act(*args) @ self.w2[j]
        if not self.bias:
            return y
        if self.adds_b2:
            return y + self.b2[j] if p is None else (y + self.b2[j] * p).to(y.dtype)  # Megatron's _apply_bias
        # etp index > 0: adds nothing (index 0 adds b2 p before the reduce-scatter, so each copy gets it once), but
        # gets b2's whole gradient, sum of dY p over the gathered copies (every etp rank holds their dY after the
        # reduce-scatter's backward gather), so the etp replicas of b2 stay equal with no collective of their own;
        # p's gradient through b2 is index 0's alone
        b = self.b2[j] if p is None else self.b2[j] * p.detach()
        return y + (b - b.detach()).to(y.dtype)

    def _act(self, h: Tensor, p: Tensor | None = None) -> Tensor:
        return self._glu(h) if p is None else weighted_act(h, p, self._glu)

    def _glu(self, h: Tensor) -> Tensor:
        return swiglu(h, self.limit, self.alpha)


__all__ = ["EDP", "Experts"]
