"""2D (SUMMA in collective form) over axes `row` (i) and `col` (j), q x q.

Activations [T, h] of the micro-batch's flattened tokens (executor/layers/tokens.py): rank (i, j) holds tokens
block i and hidden block j. Traffic and shard
layouts: docs/algorithms.md "2D".
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from paracube.executor.comm import all_gather, gather_fn, reduce_scatter, scatter_fn
from paracube.executor.layers.collective_matmul import TPO_LINEARS
from paracube.executor.layers.collective_matmul_2d import RingLinear2D
from paracube.executor.layers.functional import (
    compute_dtype,
    fp32,
    split_layer_norm,
    vocab_block_lookup,
    vocab_parallel_ce,
)
from paracube.executor.layers.kept import KeptWeights, kept_gather
from paracube.executor.layers.llama import SplitRMSNorm
from paracube.executor.layers.serial import Mode, ShardedModule
from paracube.executor.layers.shards import block, make_spec
from paracube.executor.layers.three_d import BlockTiedHead
from paracube.executor.mesh import Mesh
from paracube.modes import MODES as TENSOR_MODES
from paracube.workload import ModelSpec

ROW, COL = ("row",), ("col",)


class _Linear2D(torch.autograd.Function):
    """Y = allgather_col(X) @ ag, ag the weight gathered over row (kept.kept_gather, which reduce-scatters
    dA over row); backward reduce-scatters dX over col and returns dA in gathered form."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ag: Tensor, mesh: Mesh, label: str) -> Tensor:
        c = ag.dtype  # the compute dtype: X is cast before gathering, as A was
        xg = all_gather(x.to(c), mesh, COL, dim=-1, label=f"{label}.X")
        ctx.save_for_backward(xg, ag)
        ctx.args = (mesh, label, c, x.dtype)
        return xg @ ag

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        xg, ag = ctx.saved_tensors
        mesh, label, c, x_dtype = ctx.args
        dy = dy.to(c)
        dx = reduce_scatter(dy @ ag.t(), mesh, COL, dim=-1, backward=True, label=f"{label}.dX")
        da = xg.reshape(-1, xg.shape[-1]).t() @ dy.reshape(-1, dy.shape[-1])
        return dx.to(x_dtype), da, None, None


class Linear2D(ShardedModule):
    """Weight block (i, j) = A[rows block i, cols block j]; bias: cols block j split over row. tpo: X's and A's
    gathers and dX's and dA's reduce-scatters as rings overlapped with the GEMM chunks (collective_matmul_2d.py)."""

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, bias: bool, label: str, kept: KeptWeights | None = None,
                 tpo: bool = False):
        super().__init__()
        self.mesh, self.label, self.has_bias, self.kept = mesh, label, bias, kept
        self.tpo = tpo
        self.add_param("weight", make_spec(mesh, (h_in, h_out),
                                           {0: block(h_in, mesh, ROW), 1: block(h_out, mesh, COL)}))
        if bias:
            self.add_param("bias", make_spec(mesh, (h_out,), {0: block(h_out, mesh, ("col", "row"))}))

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight.to(compute_dtype(x))  # cast before gathering: the A collectives run in the compute dtype
        if self.tpo:  # the weight's gather is a ring of the linear's own loop (collective_matmul_2d.py)
            y = RingLinear2D.apply(x, w, self.mesh, self.label, self.kept, (id(self), f"{self.label}.A"))
        else:
            y = _Linear2D.apply(x, kept_gather(w, self.mesh, ROW, 0, f"{self.label}.A", self.kept, self), self.mesh,
                                self.label)
        if self.has_bias:
            # The bias gathered in fp32 (as priced), added in the compute dtype: the output stays lean.
            y = y + kept_gather(fp32(self.bias), self.mesh, ROW, 0, f"{self.label}.b", self.kept, self).to(y.dtype)
        return y


class LayerNorm2D(ShardedModule):
    """Hidden split over col (statistics all-reduced there); gamma/beta: block j split over row."""

    def __init__(self, mesh: Mesh, hidden: int):
        super().__init__()
        self.mesh, self.hidden = mesh, hidden
        for name in ("weight", "bias"):
            self.add_param(name, make_spec(mesh, (hidden,), {0: block(hidden, mesh, ("col", "row"))}))

    def forward(self, x: Tensor) -> Tensor:
        gamma = gather_fn(fp32(self.weight), self.mesh, ROW, 0, label="ln.gamma")
        beta = gather_fn(fp32(self.bias), self.mesh, ROW, 0, label="ln.beta")
        return split_layer_norm(x, gamma, beta, self.mesh, COL, self.hidden)


class TokenEmbedding2D(ShardedModule):
    """Block (i, j): vocab rows block i, hidden block j. Lookup of the micro-batch's flat ids, then
    reduce-scatter over row along the tokens (sums the vocab split, keeps token block i)."""

    def __init__(self, mesh: Mesh, vocab: int, hidden: int):
        super().__init__()
        self.mesh = mesh
        self.v0, self.vl = block(vocab, mesh, ROW)
        self.add_param("weight", make_spec(mesh, (vocab, hidden),
                                           {0: (self.v0, self.vl), 1: block(hidden, mesh, COL)}))

    def forward(self, ids: Tensor) -> Tensor:
        emb = vocab_block_lookup(ids, self.weight, self.v0, self.vl)
        return scatter_fn(fp32(emb), self.mesh, ROW, 0, label="tok_emb")  # summed in fp32, as priced


class PositionEmbedding2D(ShardedModule):
    """Hidden block j, positions split over row; gathered over row in forward (kept under kw=1)."""

    def __init__(self, mesh: Mesh, seq_len: int, hidden: int, kept: KeptWeights | None = None):
        super().__init__()
        self.mesh, self.kept = mesh, kept
        self.add_param("weight", make_spec(mesh, (seq_len, hidden),
                                           {0: block(seq_len, mesh, ROW), 1: block(hidden, mesh, COL)}))

    def forward(self, s: int) -> Tensor:
        return kept_gather(fp32(self.weight), self.mesh, ROW, 0, "pos_emb", self.kept, self)[:s]


class Mode2D(Mode):
    name = "2d"

    def __init__(self, spec: ModelSpec, mesh: Mesh):
        super().__init__(spec, mesh)
        self.q = mesh.size(ROW)
        self.token_split = self.q
        self.kept = KeptWeights(bool(mesh.layout.keep_weights))
        # The cross-entropy's vocabulary axis: the head's columns (col), tied: the embedding's rows (row).
        self.vocab_axes = TENSOR_MODES[self.name].tied_vocab_axes if spec.tied_embeddings else COL

    @property
    def heads_local(self) -> int:
        return self.spec.heads // self.q

    def tied_head(self, embedding: ShardedModule) -> nn.Module:
        """X gathered over row, E_local^T in place, logits reduce-scattered over col (modes/two_d.py)."""
        return BlockTiedHead(embedding, self.mesh, TENSOR_MODES[self.name].tied_head_roles, self.kept)

    def token_embedding(self) -> ShardedModule:
        return TokenEmbedding2D(self.mesh, self.spec.vocab, self.spec.hidden)

    def position_embedding(self) -> ShardedModule:
        return PositionEmbedding2D(self.mesh, self.spec.seq_len, self.spec.hidden, self.kept)

    def layer_norm(self) -> ShardedModule:
        if self.spec.family == "llama":
            return SplitRMSNorm(self.mesh, self.spec.hidden, self.spec.rms_eps, ("col", "row"), ROW, COL)
        return LayerNorm2D(self.mesh, self.spec.hidden)

    def linear(self, kind: str, h_in: int, h_out: int, bias: bool) -> ShardedModule:
        return Linear2D(self.mesh, h_in, h_out, bias, kind, self.kept,
                        bool(self.mesh.layout.tpo) and kind in TPO_LINEARS)

    def token_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        v0, _ = block(self.spec.vocab, self.mesh, self.vocab_axes)
        return vocab_parallel_ce(logits, labels, v0, self.mesh, self.vocab_axes)
