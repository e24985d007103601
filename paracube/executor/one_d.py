"""1D (Megatron) tensor parallelism over axis `tp`: column/row-parallel linears with f/g, vocab-parallel
embedding, head and cross-entropy. Traffic: docs/algorithms.md "1D"."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from paracube.executor.comm import copy_to_group, reduce_from_group
from paracube.executor.functional import compute_dtype, vocab_parallel_ce
from paracube.executor.mesh import Mesh
from paracube.executor.serial import Mode, SerialPositionEmbedding, ShardedModule, TiedHead
from paracube.executor.shards import block, make_spec
from paracube.workload import ModelSpec

TP = ("tp",)


class ColumnLinear(ShardedModule):
    """Y[:, cols of this rank] = f(X) @ A[:, cols] + b[cols]; f all-reduces dX in backward."""

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, bias: bool, label: str):
        super().__init__()
        self.mesh, self.label, self.has_bias = mesh, label, bias
        cols = block(h_out, mesh, TP)
        self.add_param("weight", make_spec(mesh, (h_in, h_out), {1: cols}))
        if bias:
            self.add_param("bias", make_spec(mesh, (h_out,), {0: cols}))

    def forward(self, x: Tensor) -> Tensor:
        c = compute_dtype(x)
        # Cast before f so that its backward all-reduce runs in the compute dtype.
        x = copy_to_group(x.to(c), self.mesh, TP, label=f"{self.label}.f")
        y = x @ self.weight.to(c)
        return y + self.bias if self.has_bias else y


class RowLinear(ShardedModule):
    """Y = g(X[:, rows] @ A[rows, :]) + b; g all-reduces the partial sums in forward. Bias replicated."""

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, bias: bool, label: str):
        super().__init__()
        self.mesh, self.label, self.has_bias = mesh, label, bias
        self.add_param("weight", make_spec(mesh, (h_in, h_out), {0: block(h_in, mesh, TP)}))
        if bias:
            self.add_param("bias", make_spec(mesh, (h_out,), {}, replicated_axes=TP))

    def forward(self, x: Tensor) -> Tensor:
        c = compute_dtype(x)
        y = reduce_from_group(x.to(c) @ self.weight.to(c), self.mesh, TP, label=f"{self.label}.g")
        return y + self.bias if self.has_bias else y


class VocabParallelEmbedding(ShardedModule):
    """Rows V/p of the table; masked lookup, partial embeddings summed over tp (fp32)."""

    def __init__(self, mesh: Mesh, vocab: int, hidden: int):
        super().__init__()
        self.mesh = mesh
        self.v0, self.vl = block(vocab, mesh, TP)
        self.add_param("weight", make_spec(mesh, (vocab, hidden), {0: (self.v0, self.vl)}))

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.v0
        inside = (local >= 0) & (local < self.vl)
        emb = F.embedding(local.clamp(0, self.vl - 1), self.weight) * inside.unsqueeze(-1)
        return reduce_from_group(emb, self.mesh, TP, label="tok_emb")


class Mode1D(Mode):
    name = "1d"

    def __init__(self, spec: ModelSpec, mesh: Mesh):
        super().__init__(spec, mesh)
        self.p = mesh.size(TP)

    @property
    def heads_local(self) -> int:
        return self.spec.heads // self.p

    def token_embedding(self) -> ShardedModule:
        return VocabParallelEmbedding(self.mesh, self.spec.vocab, self.spec.hidden)

    def position_embedding(self) -> ShardedModule:
        return _replicated(SerialPositionEmbedding(self.mesh, self.spec.seq_len, self.spec.hidden), self.mesh)

    def layer_norm(self) -> ShardedModule:
        return _replicated(super().layer_norm(), self.mesh)  # LayerNorm, or RMSNorm (llama)

    def tied_head(self, embedding: ShardedModule) -> nn.Module:
        """The head's column block is the vocab-parallel embedding's row block: f, then X @ E_local^T."""
        return TiedHead(embedding, lambda x: copy_to_group(x.to(compute_dtype(x)), self.mesh, TP, label="head.f"))

    def linear(self, kind: str, h_in: int, h_out: int, bias: bool) -> ShardedModule:
        cls = RowLinear if kind in ("proj", "fc2") else ColumnLinear
        return cls(self.mesh, h_in, h_out, bias, kind)

    def token_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        v0, _ = block(self.spec.vocab, self.mesh, TP)
        return vocab_parallel_ce(logits, labels, v0, self.mesh, TP)


def _replicated(module: ShardedModule, mesh: Mesh) -> ShardedModule:
    """Mark every parameter of `module` as replicated over tp (counted once, on tp rank 0)."""
    for name, spec in module.shard_specs.items():
        module.shard_specs[name] = make_spec(mesh, spec.global_shape, {}, replicated_axes=TP)
    return module
