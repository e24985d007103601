"""3D (Bian et al. 2021) over axes x (i), y (j), z (k), q x q x q.

Block-boundary activations [T, h] of the micro-batch's flattened tokens (executor/layers/tokens.py): tokens split
over (x major, y minor), hidden over z. A linear takes roles (I, W, O) = input, weight and output axes.
Traffic and layouts: docs/algorithms.md "3D".

BlockTiedHead, the tied head of the flat token layout (3D, and 2D / 2.5D through two_d.py): logits = X E^T on
the token embedding's own blocks, with the roles the mode declares (paracube/modes: `tied_head_roles`
(I, W, O); two_d.py and three_d.py derive them from the table's block layout): X gathered over I, the local
E^T block gathered over W (3D; kept under kw=1 as any weight; 2D / 2.5D: "" = used in place), the partial
logits reduce-scattered over O along the tokens -- a 3D linear's pattern (`_Linear3D`, reused as is). The
head has no parameter: its gradient reaches the embedding's weight through the transposes and autograd adds
it to the lookup's, so it is summed exactly once (pp = 1; with pp > 1 the last stage's copy is summed with
the first stage's once per step: pipeline/schedule.py, zero=1 data_parallel/grad_sync.py). Logits: tokens
over the mode's `tied_token_axes`, vocabulary (the embedding's rows) over `tied_vocab_axes`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from paracube.executor.comm import all_gather, gather_fn, reduce_scatter, scatter_fn
from paracube.executor.layers.collective_matmul import TPO_LINEARS
from paracube.executor.layers.collective_matmul_3d import RingLinear3D
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
from paracube.executor.layers.shards import ShardSpec, block, make_spec
from paracube.executor.mesh import Mesh
from paracube.modes import MODES as TENSOR_MODES
from paracube.workload import ModelSpec

PLANE = ("x", "y")  # LayerNorm and embedding parameters, embedding output scatter
# qkv, fc and head read the block layout; proj and fc2 bring the layout back (two linears per sub-block).
ROLES: dict[str, tuple[str, str, str]] = {  # llama: fc is the fused gate+up, fc2 the down projection
    "qkv": ("y", "x", "z"), "fc": ("y", "x", "z"), "head": ("y", "x", "z"),
    "proj": ("z", "x", "y"), "fc2": ("z", "x", "y"),
}


class _Linear3D(torch.autograd.Function):
    """Input: tokens over (W major, I minor), hidden over O. Output: tokens over (W, O), hidden over I."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ag: Tensor, mesh: Mesh, roles: tuple[str, str, str], label: str) -> Tensor:
        """ag: the weight gathered over W (kept.kept_gather, which reduce-scatters dA over W)."""
        i_ax, w_ax, o_ax = ((r,) for r in roles)
        c = ag.dtype
        xg = all_gather(x.to(c), mesh, i_ax, dim=0, label=f"{label}.X")
        ctx.save_for_backward(xg, ag)
        ctx.args = (mesh, roles, label, c, x.dtype)
        # X A is partial over the h_in split (held along O): sum there, keep token block o.
        return reduce_scatter(xg @ ag, mesh, o_ax, dim=0, label=f"{label}.Y")

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        xg, ag = ctx.saved_tensors
        mesh, roles, label, c, x_dtype = ctx.args
        i_ax, _, o_ax = ((r,) for r in roles)
        dyg = all_gather(dy.to(c).contiguous(), mesh, o_ax, dim=0, backward=True, label=f"{label}.dY")
        dx = reduce_scatter(dyg @ ag.t(), mesh, i_ax, dim=0, backward=True, label=f"{label}.dX")
        da = xg.reshape(-1, xg.shape[-1]).t() @ dyg.reshape(-1, dyg.shape[-1])  # gathered form
        return dx.to(x_dtype), da, None, None, None


class BlockTiedHead(nn.Module):
    """logits = X E^T with E the token embedding's local block [V / ., h / .], roles (I, W, O)."""

    def __init__(self, embedding: ShardedModule, mesh: Mesh, roles: tuple[str, str, str],
                 kept: KeptWeights | None = None) -> None:
        super().__init__()
        self.shard_specs: dict[str, ShardSpec] = {}
        self._embedding = (embedding,)  # a tuple: not a submodule, so its weight is registered once
        self.mesh, self.roles, self.kept = mesh, roles, kept

    def forward(self, x: Tensor) -> Tensor:
        _, w_ax, _ = self.roles
        et = self._embedding[0].weight.to(compute_dtype(x)).t()  # [h / ., V / .]: a linear's weight block
        if w_ax:
            et = kept_gather(et, self.mesh, (w_ax,), 0, "head.A", self.kept, self)
        return _Linear3D.apply(x, et, self.mesh, self.roles, "head")


class Linear3D(ShardedModule):
    """Weight block: h_in block (o*q + w) of h_in/q^2 rows x h_out block i; bias: h_out block i split
    over the plane (W, O). tpo: X's, A's and dY's gathers and Y's, dX's and dA's reduce-scatters as rings
    overlapped with the GEMM chunks (collective_matmul_3d.py)."""

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, bias: bool, roles: tuple[str, str, str], label: str,
                 kept: KeptWeights | None = None, tpo: bool = False):
        super().__init__()
        self.mesh, self.roles, self.label, self.has_bias, self.kept = mesh, roles, label, bias, kept
        self.tpo = tpo
        i_ax, w_ax, o_ax = roles
        self.add_param("weight", make_spec(mesh, (h_in, h_out),
                                           {0: block(h_in, mesh, (o_ax, w_ax)), 1: block(h_out, mesh, (i_ax,))}))
        if bias:
            self.add_param("bias", make_spec(mesh, (h_out,), {0: block(h_out, mesh, roles)}))

    def forward(self, x: Tensor) -> Tensor:
        _, w_ax, o_ax = self.roles
        w = self.weight.to(compute_dtype(x))
        if self.tpo:  # the weight's gather is a ring of the linear's own loop (collective_matmul_3d.py)
            y = RingLinear3D.apply(x, w, self.mesh, self.roles, self.label, self.kept, (id(self), f"{self.label}.A"))
        else:
            ag = kept_gather(w, self.mesh, (w_ax,), 0, f"{self.label}.A", self.kept, self)
            y = _Linear3D.apply(x, ag, self.mesh, self.roles, self.label)
        if self.has_bias:
            # The bias gathered in fp32 (as priced), added in the compute dtype: the output stays lean.
            b = kept_gather(fp32(self.bias), self.mesh, (w_ax, o_ax), 0, f"{self.label}.b", self.kept, self)
            y = y + b.to(y.dtype)
        return y


class LayerNorm3D(ShardedModule):
    """Hidden over z (statistics all-reduced there); gamma/beta: block k split over the plane (x, y)."""

    def __init__(self, mesh: Mesh, hidden: int):
        super().__init__()
        self.mesh, self.hidden = mesh, hidden
        for name in ("weight", "bias"):
            self.add_param(name, make_spec(mesh, (hidden,), {0: block(hidden, mesh, ("z", *PLANE))}))

    def forward(self, x: Tensor) -> Tensor:
        gamma = gather_fn(fp32(self.weight), self.mesh, PLANE, 0, label="ln.gamma")
        beta = gather_fn(fp32(self.bias), self.mesh, PLANE, 0, label="ln.beta")
        return split_layer_norm(x, gamma, beta, self.mesh, ("z",), self.hidden)


class TokenEmbedding3D(ShardedModule):
    """Vocab block x (V/q rows), hidden block (z major, y minor) of h/q^2 columns. Lookup of the whole
    micro-batch's flat ids in that block, reduce-scatter over x along the tokens (sums the vocab split, keeps
    token block x), all-gather over y along the hidden (hidden block z), keep token block y of it: tokens
    block (x, y), hidden block z (modes/three_d.py: 2 x 4 T h / q^2 bytes instead of 4 T h / q)."""

    def __init__(self, mesh: Mesh, vocab: int, hidden: int):
        super().__init__()
        self.mesh = mesh
        self.v0, self.vl = block(vocab, mesh, ("x",))
        self.add_param("weight", make_spec(mesh, (vocab, hidden),
                                           {0: (self.v0, self.vl), 1: block(hidden, mesh, ("z", "y"))}))

    def forward(self, ids: Tensor) -> Tensor:
        emb = vocab_block_lookup(ids, self.weight, self.v0, self.vl)
        emb = scatter_fn(fp32(emb), self.mesh, ("x",), 0, label="tok_emb")  # summed in fp32, as priced
        emb = gather_fn(emb, self.mesh, ("y",), -1, label="tok_emb.h")
        start, size = block(emb.shape[0], self.mesh, ("y",))
        # A copy, not a view: llama's first RMSNorm saves its input, and a view would keep the whole gathered
        # [T / q, h / q] storage alive, q times the block the model counts (gpt adds the positions: a new tensor).
        return emb[start:start + size].clone()


class PositionEmbedding3D(ShardedModule):
    def __init__(self, mesh: Mesh, seq_len: int, hidden: int, kept: KeptWeights | None = None):
        super().__init__()
        self.mesh, self.kept = mesh, kept
        self.add_param("weight", make_spec(mesh, (seq_len, hidden),
                                           {0: block(seq_len, mesh, PLANE), 1: block(hidden, mesh, ("z",))}))

    def forward(self, s: int) -> Tensor:
        return kept_gather(fp32(self.weight), self.mesh, PLANE, 0, "pos_emb", self.kept, self)[:s]


class Mode3D(Mode):
    name = "3d"

    def __init__(self, spec: ModelSpec, mesh: Mesh):
        super().__init__(spec, mesh)
        self.q = mesh.size(("x",))
        self.token_split = self.q * self.q
        self.kept = KeptWeights(bool(mesh.layout.keep_weights))
        # The cross-entropy's vocabulary axis: the head's columns (y), tied: the embedding's rows (x).
        self.vocab_axes = TENSOR_MODES[self.name].tied_vocab_axes if spec.tied_embeddings else ("y",)

    @property
    def heads_local(self) -> int:
        return self.spec.heads // self.q

    def tied_head(self, embedding: ShardedModule) -> nn.Module:
        """The 3D linear of roles (x, y, z) on the table's own blocks (modes/three_d.py)."""
        return BlockTiedHead(embedding, self.mesh, TENSOR_MODES[self.name].tied_head_roles, self.kept)

    def token_embedding(self) -> ShardedModule:
        return TokenEmbedding3D(self.mesh, self.spec.vocab, self.spec.hidden)

    def position_embedding(self) -> ShardedModule:
        return PositionEmbedding3D(self.mesh, self.spec.seq_len, self.spec.hidden, self.kept)

    def layer_norm(self) -> ShardedModule:
        if self.spec.family == "llama":
            return SplitRMSNorm(self.mesh, self.spec.hidden, self.spec.rms_eps, ("z", *PLANE), PLANE, ("z",))
        return LayerNorm3D(self.mesh, self.spec.hidden)

    def linear(self, kind: str, h_in: int, h_out: int, bias: bool) -> ShardedModule:
        return Linear3D(self.mesh, h_in, h_out, bias, ROLES[kind], kind, self.kept,
                        bool(self.mesh.layout.tpo) and kind in TPO_LINEARS)

    def token_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        v0, _ = block(self.spec.vocab, self.mesh, self.vocab_axes)
        return vocab_parallel_ce(logits, labels, v0, self.mesh, self.vocab_axes)
