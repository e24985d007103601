"""2.5D (Tesseract; Wang et al. 2021) over axes `dep` (k), `row` (i), `col` (j): q x q grids stacked d deep.

Each depth layer k runs the 2D layers of two_d.py unchanged on its own tokens: the replica's micro-batch's
b x s tokens (flat layout, executor/layers/tokens.py) are split over (dep major, row), so rank (k, i, j) holds
tokens block k*q + i (T/(dq) of them) and hidden block j. Every parameter is stored once per q x q grid, as
in 2D, and replicated over `dep` (ShardSpec.replicated_axes = ("dep",): counted once in the gradient norm,
saved once by the depth-0 grid, loaded by every layer). Each depth layer's weight gradients cover only its
tokens; the step's gradient all_reduce over the mode's `grad_axes` ("dp", "dep") sums them (step.py). Traffic: the 2D
collectives with T/d tokens, and no collective over `dep` inside a micro-batch (docs/algorithms.md "2.5D").
"""

from __future__ import annotations

from torch import Tensor

from paracube.executor.layers.serial import ShardedModule
from paracube.executor.layers.shards import block, make_spec
from paracube.executor.layers.two_d import Mode2D, TokenEmbedding2D
from paracube.executor.mesh import Mesh
from paracube.workload import ModelSpec

DEP = ("dep",)


def over_depth(module: ShardedModule, mesh: Mesh) -> ShardedModule:
    """Mark every parameter of a 2D module as replicated over `dep` (same block on every depth layer)."""
    for name, spec in module.shard_specs.items():
        splits = dict(enumerate(zip(spec.offsets, spec.sizes, strict=True)))
        module.shard_specs[name] = make_spec(mesh, spec.global_shape, splits, replicated_axes=DEP)
    return module


def depth_slice(t: Tensor, mesh: Mesh) -> Tensor:
    """This depth layer's tokens (block k of the flat ids)."""
    start, size = block(t.shape[0], mesh, DEP)
    return t[start:start + size]


class TokenEmbedding25D(TokenEmbedding2D):
    """The 2D embedding of this depth layer's sequences only (the 2D lookup then reduce-scatters over row)."""

    def forward(self, ids: Tensor) -> Tensor:
        return super().forward(depth_slice(ids, self.mesh))


class Mode25D(Mode2D):
    name = "2.5d"

    def __init__(self, spec: ModelSpec, mesh: Mesh):
        super().__init__(spec, mesh)
        self.depth = mesh.size(DEP)
        self.token_split = self.q * self.depth

    def token_embedding(self) -> ShardedModule:
        return over_depth(TokenEmbedding25D(self.mesh, self.spec.vocab, self.spec.hidden), self.mesh)

    def position_embedding(self) -> ShardedModule:
        return over_depth(super().position_embedding(), self.mesh)

    def layer_norm(self) -> ShardedModule:
        return over_depth(super().layer_norm(), self.mesh)

    def linear(self, kind: str, h_in: int, h_out: int, bias: bool) -> ShardedModule:
        return over_depth(super().linear(kind, h_in, h_out, bias), self.mesh)
