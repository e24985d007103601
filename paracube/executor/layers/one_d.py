"""1D (Megatron) tensor parallelism over axis `tp`: column/row-parallel linears with f/g, vocab-parallel
embedding, head and cross-entropy. Traffic: docs/algorithms.md "1D".

Sequence parallelism (layout `sp`, Korthikanti et al. 2022): between the linears the activations
[b, s/p, h] are sequence shards (LayerNorm and residuals run on them); the column linears (and the head)
all-gather the sequence first (backward reduce-scatter), the row linears reduce-scatter their partial
sums (backward all-gather), the token embedding reduce-scatters its partial lookup. The column linears keep
only their input shard and all-gather it again in backward (Megatron's choice: activations / p). Parameters used on
sequence shards (LayerNorms, row-parallel biases, pos_emb) collect partial gradients: they are summed over
tp once per step (`reduce_sequence_parallel_grads`, one fused fp32 all-reduce).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from paracube.executor.comm import all_gather, all_reduce, copy_to_group, reduce_from_group, reduce_scatter, scatter_fn
from paracube.executor.layers.collective_matmul import TPO_LINEARS, RingGatherLinear, RingLinearScatter
from paracube.executor.layers.functional import compute_dtype, fp32, main_grad, vocab_block_lookup, vocab_parallel_ce
from paracube.executor.layers.gemm import PLAIN, PlainGemm
from paracube.executor.layers.serial import Mode, SerialPositionEmbedding, ShardedModule, TiedHead
from paracube.executor.layers.shards import block, make_spec
from paracube.executor.mesh import Mesh
from paracube.workload import ModelSpec

TP = ("tp",)
SEQ = 1  # the sequence dimension of [b, s, h] activations


class _GatherLinear(torch.autograd.Function):
    """Sequence-parallel column linear: Y = all_gather(X shard) @ A. Like Megatron it keeps only the input
    shard for backward and all-gathers it again there (`.in.regather`), so saved activations stay / p.
    `gemm` multiplies (gemm.py: plain, or FP8)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, a: Tensor, mesh: Mesh, label: str, gemm: PlainGemm) -> Tensor:
        ctx.save_for_backward(x, a)
        ctx.args = (mesh, label, gemm)
        return gemm.forward(all_gather(x, mesh, TP, SEQ, label=f"{label}.in"), a)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, a = ctx.saved_tensors
        mesh, label, gemm = ctx.args
        dy = dy.to(a.dtype)
        xg = all_gather(x, mesh, TP, SEQ, backward=True, label=f"{label}.in.regather")
        dx, da = gemm.backward(xg, a, dy)
        dx = reduce_scatter(dx, mesh, TP, SEQ, backward=True, label=f"{label}.in")
        return dx.to(x.dtype), da, None, None, None


class ColumnLinear(ShardedModule):
    """Y[:, cols of this rank] = f(X) @ A[:, cols] + b[cols]; f all-reduces dX in backward. With sp, f is
    an all-gather of the sequence shards (backward reduce-scatter); with tpo too, both rings overlapped with the
    GEMM chunks (collective_matmul.py)."""

    gemm: PlainGemm = PLAIN  # fp8.attach gives the block linears an Fp8Gemm (with tpo: the rings' chunk GEMMs)

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, bias: bool, label: str, sp: bool = False,
                 tpo: bool = False):
        super().__init__()
        self.mesh, self.label, self.has_bias, self.sp = mesh, label, bias, sp
        self.gather_linear = RingGatherLinear if tpo and sp else _GatherLinear
        cols = block(h_out, mesh, TP)
        self.add_param("weight", make_spec(mesh, (h_in, h_out), {1: cols}))
        if bias:
            self.add_param("bias", make_spec(mesh, (h_out,), {0: cols}))

    def forward(self, x: Tensor) -> Tensor:
        c = compute_dtype(x)
        # Cast before f so that its collectives run in the compute dtype; the bias too, so that the output
        # (and what the next op saves) stays in the compute dtype.
        if self.sp:
            if self.gather_linear is RingGatherLinear:
                y = RingGatherLinear.apply(x.to(c), self.weight.to(c), self.mesh, self.label, self.gemm)
            else:
                y = _GatherLinear.apply(x.to(c), self.weight.to(c), self.mesh, self.label, self.gemm)
        else:
            y = self.gemm(copy_to_group(x.to(c), self.mesh, TP, label=f"{self.label}.f"), self.weight.to(c))
        return y + self.bias.to(c) if self.has_bias else y


class SequenceParallelTiedHead(TiedHead):
    """Tied head with sp: logits = all_gather(X shard) @ E_local^T, X regathered in backward (_GatherLinear)."""

    def __init__(self, embedding: ShardedModule, mesh: Mesh):
        super().__init__(embedding)
        self.mesh = mesh

    def forward(self, x: Tensor) -> Tensor:
        c = compute_dtype(x)
        return _GatherLinear.apply(x.to(c), self._embedding[0].weight.to(c).t(), self.mesh, "head", PLAIN)


class RowLinear(ShardedModule):
    """Y = g(X[:, rows] @ A[rows, :]) + b; g all-reduces the partial sums in forward (with sp: reduce-scatters
    them over the sequence; with tpo too, as a ring overlapped with the GEMM chunks). Bias replicated."""

    gemm: PlainGemm = PLAIN  # fp8.attach gives the block linears an Fp8Gemm (with tpo: the rings' chunk GEMMs)

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, bias: bool, label: str, sp: bool = False,
                 tpo: bool = False):
        super().__init__()
        self.mesh, self.label, self.has_bias, self.sp, self.tpo = mesh, label, bias, sp, tpo and sp
        self.add_param("weight", make_spec(mesh, (h_in, h_out), {0: block(h_in, mesh, TP)}))
        if bias:
            self.add_param("bias", make_spec(mesh, (h_out,), {}, replicated_axes=TP))

    def forward(self, x: Tensor) -> Tensor:
        c = compute_dtype(x)
        if self.tpo:
            y = RingLinearScatter.apply(x.to(c), self.weight.to(c), self.mesh, self.label, self.gemm)
            return y + self.bias.to(c) if self.has_bias else y
        y = self.gemm(x.to(c), self.weight.to(c))
        if self.sp:
            y = scatter_fn(y, self.mesh, TP, SEQ, label=f"{self.label}.out")
        else:
            y = reduce_from_group(y, self.mesh, TP, label=f"{self.label}.g")
        return y + self.bias.to(c) if self.has_bias else y


class VocabParallelEmbedding(ShardedModule):
    """Rows V/p of the table; masked lookup, partial embeddings summed over tp (fp32; with sp
    reduce-scattered over the sequence)."""

    def __init__(self, mesh: Mesh, vocab: int, hidden: int, sp: bool = False):
        super().__init__()
        self.mesh, self.sp = mesh, sp
        self.v0, self.vl = block(vocab, mesh, TP)
        self.add_param("weight", make_spec(mesh, (vocab, hidden), {0: (self.v0, self.vl)}))

    def forward(self, ids: Tensor) -> Tensor:
        emb = fp32(vocab_block_lookup(ids, self.weight, self.v0, self.vl))  # as priced
        if self.sp:
            return scatter_fn(emb, self.mesh, TP, SEQ, label="tok_emb")
        return reduce_from_group(emb, self.mesh, TP, label="tok_emb")


class SequenceShardPositions(SerialPositionEmbedding):
    """The replicated position table; with sp each rank adds the rows of its sequence shard."""

    def __init__(self, mesh: Mesh, seq_len: int, hidden: int):
        super().__init__(mesh, seq_len, hidden)
        self.mesh = mesh

    def forward(self, s: int, positions: Tensor | None = None) -> Tensor:
        start, size = block(s if positions is None else positions.numel(), self.mesh, TP)
        if positions is None:
            return self.weight[start:start + size]
        return self.weight[positions[start:start + size]]  # context parallelism: the chunks' positions


class Mode1D(Mode):
    name = "1d"

    def __init__(self, spec: ModelSpec, mesh: Mesh):
        super().__init__(spec, mesh)
        self.p = mesh.size(TP)
        self.sp = bool(mesh.layout.sequence_parallel) and self.p > 1
        self.tpo = self.sp and bool(mesh.layout.tpo)  # collective matmul (collective_matmul.py): sp only
        self.sequence_parallel_params: list[nn.Parameter] = []  # used on sequence shards (sp only)

    @property
    def heads_local(self) -> int:
        return self.spec.heads // self.p

    def _on_shards(self, module: ShardedModule, names: tuple[str, ...]) -> ShardedModule:
        if self.sp:
            self.sequence_parallel_params.extend(getattr(module, n) for n in names)
        return module

    def token_embedding(self) -> ShardedModule:
        return VocabParallelEmbedding(self.mesh, self.spec.vocab, self.spec.hidden, self.sp)

    def position_embedding(self) -> ShardedModule:
        cls = SequenceShardPositions if self.sp else SerialPositionEmbedding
        return self._on_shards(_replicated(cls(self.mesh, self.spec.seq_len, self.spec.hidden), self.mesh),
                               ("weight",))

    def layer_norm(self) -> ShardedModule:
        norm = _replicated(super().layer_norm(), self.mesh)  # LayerNorm, or RMSNorm (llama)
        return self._on_shards(norm, tuple(n for n in ("weight", "bias") if getattr(norm, n, None) is not None))

    def tied_head(self, embedding: ShardedModule) -> nn.Module:
        """The head's column block is the vocab-parallel embedding's row block: f, then X @ E_local^T (with sp:
        the sequence-parallel column linear of E_local^T, as the untied head)."""
        if self.sp:
            return SequenceParallelTiedHead(embedding, self.mesh)
        return TiedHead(embedding, lambda x: copy_to_group(x.to(compute_dtype(x)), self.mesh, TP, label="head.f"))

    def linear(self, kind: str, h_in: int, h_out: int, bias: bool) -> ShardedModule:
        if kind in ("proj", "fc2"):
            row = RowLinear(self.mesh, h_in, h_out, bias, kind, self.sp, self.tpo)
            return self._on_shards(row, ("bias",) if bias else ())
        return ColumnLinear(self.mesh, h_in, h_out, bias, kind, self.sp, self.tpo and kind in TPO_LINEARS)

    def token_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        v0, _ = block(self.spec.vocab, self.mesh, TP)
        return vocab_parallel_ce(logits, labels, v0, self.mesh, TP)

    def reduce_sequence_parallel_grads(self) -> None:
        """Sum the partial gradients of the parameters used on sequence shards over tp: one fp32
        all-reduce of all of them (modes/one_d.py `sequence_parallel_params`)."""
        params = self.sequence_parallel_params
        if not params:
            return
        grads = [main_grad(p) if main_grad(p) is not None else torch.zeros_like(p) for p in params]
        flat = all_reduce(torch.cat([g.reshape(-1).float() for g in grads]), self.mesh, TP,
                          label="sequence_parallel_params")
        offset = 0
        for p, g in zip(params, grads, strict=True):
            summed = flat[offset:offset + g.numel()].view_as(p)
            if getattr(p, "main_grad", None) is not None:
                p.main_grad.copy_(summed)  # type: ignore[attr-defined]  # fp32 (and p.grad, for fp32 params)
            else:
                p.grad = summed.to(p.dtype)
            offset += g.numel()


def _replicated(module: ShardedModule, mesh: Mesh) -> ShardedModule:
    """Mark every parameter of `module` as replicated over tp (counted once, on tp rank 0)."""
    for name, spec in module.shard_specs.items():
        module.shard_specs[name] = make_spec(mesh, spec.global_shape, {}, replicated_axes=TP)
    return module
