"""The serial reference (tensor mode "none"): plain torch ops only, same parameter names as every mode.

Also the Mode interface the parallel modes implement; gpt.py assembles a GPT (family gpt or llama) from
any Mode. `layer_norm()` is the family's norm (LayerNorm; llama: RMSNorm); `tied_head(embedding)` the
output head that reuses the token embedding (modes whose head layout is the embedding's transpose).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paracube.errors import ParacubeError
from paracube.executor.layers.functional import upcast
from paracube.executor.layers.gemm import PLAIN, PlainGemm
from paracube.executor.layers.rms_norm import rms_norm
from paracube.executor.layers.shards import ShardSpec, block, make_spec
from paracube.executor.layers.tokens import SequenceSplit, local_positions
from paracube.executor.mesh import Mesh
from paracube.modes import MODES as TENSOR_MODES
from paracube.workload import ModelSpec


class ShardedModule(nn.Module):
    """A module whose parameters are blocks of full tensors: `shard_specs[param name]`."""

    def __init__(self) -> None:
        super().__init__()
        self.shard_specs: dict[str, ShardSpec] = {}

    def add_param(self, name: str, spec: ShardSpec) -> None:
        self.shard_specs[name] = spec
        self.register_parameter(name, nn.Parameter(torch.empty(spec.sizes)))


class SerialLinear(ShardedModule):
    gemm: PlainGemm = PLAIN  # fp8.attach gives the block linears an Fp8Gemm

    def __init__(self, mesh: Mesh, h_in: int, h_out: int, bias: bool):
        super().__init__()
        self.add_param("weight", make_spec(mesh, (h_in, h_out), {}))
        if bias:
            self.add_param("bias", make_spec(mesh, (h_out,), {}))
        self.has_bias = bias

    def forward(self, x: Tensor) -> Tensor:
        y = self.gemm(x, self.weight)
        return y + self.bias.to(y.dtype) if self.has_bias else y  # the output stays in the compute dtype


class SerialLayerNorm(ShardedModule):
    def __init__(self, mesh: Mesh, hidden: int):
        super().__init__()
        self.add_param("weight", make_spec(mesh, (hidden,), {}))
        self.add_param("bias", make_spec(mesh, (hidden,), {}))

    def forward(self, x: Tensor) -> Tensor:
        # Input kept in the compute dtype (statistics in fp32 inside the kernel), as Megatron's LayerNorm.
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, eps=1e-5)


class SerialRMSNorm(ShardedModule):
    """x / sqrt(mean(x^2) + eps) * gamma in fp32 (executor/layers/rms_norm.py)."""

    def __init__(self, mesh: Mesh, hidden: int, eps: float):
        super().__init__()
        self.mesh, self.eps = mesh, eps
        self.add_param("weight", make_spec(mesh, (hidden,), {}))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.mesh, (), self.weight.shape[0], self.eps)


class TiedHead(nn.Module):
    """logits = before(x) @ E^T, E the token embedding's (local rows of its) table; no parameter of its own."""

    def __init__(self, embedding: ShardedModule, before: Callable[[Tensor], Tensor] | None = None):
        super().__init__()
        self.shard_specs: dict[str, ShardSpec] = {}
        self._embedding = (embedding,)  # a tuple: not a submodule, so its weight is registered once
        self.before = before

    def forward(self, x: Tensor) -> Tensor:
        x = self.before(x) if self.before is not None else x
        return x @ self._embedding[0].weight.to(x.dtype).t()


class SerialTokenEmbedding(ShardedModule):
    def __init__(self, mesh: Mesh, vocab: int, hidden: int):
        super().__init__()
        self.add_param("weight", make_spec(mesh, (vocab, hidden), {}))

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight)


class SerialPositionEmbedding(ShardedModule):
    def __init__(self, mesh: Mesh, seq_len: int, hidden: int):
        super().__init__()
        self.add_param("weight", make_spec(mesh, (seq_len, hidden), {}))

    def forward(self, s: int, positions: Tensor | None = None) -> Tensor:
        """Rows 0..s-1, or those of `positions` (context parallelism: a rank's chunks' global positions)."""
        return self.weight[:s] if positions is None else self.weight[positions]


class Mode:
    """How one tensor mode builds the GPT's layers; "none" (serial) is this base class.

    Modes whose declaration (paracube/modes) has `token_axes` (2D, 2.5D, 3D) run the flat token layout of
    tokens.py: activations [T / n, h / ...] of the micro-batch's flattened tokens; the others keep
    [b, s, h]."""

    name = "none"
    token_split = 1

    def __init__(self, spec: ModelSpec, mesh: Mesh):
        self.spec, self.mesh = spec, mesh
        declared = TENSOR_MODES[self.name]
        self.token_axes, self.attention_axes = declared.token_axes, declared.attention_token_axes
        # Where the head's logits split the tokens (the labels' layout): the tied head's own in 2D / 2.5D / 3D.
        self.loss_axes = declared.loss_token_axes(spec.tied_embeddings)

    @property
    def flat(self) -> bool:
        """Tokens flattened (b x s) and split over token_axes: the flat token layout (tokens.py)."""
        return bool(self.token_axes)

    @property
    def heads_local(self) -> int:
        return self.spec.heads

    def split_tokens(self, t: Tensor) -> Tensor:
        """This rank's tokens of the replica's micro-batch [b, s], in the loss (head output) layout: [b, s]
        whole, or (flat layout) its block of the flattened tokens over the attention / head axes."""
        if not self.flat:
            return t
        start, size = block(t.numel(), self.mesh, self.loss_axes)
        return t.reshape(-1)[start:start + size]

    def block_positions(self, ids: Tensor) -> Tensor:
        """Positions in their sequences of this rank's block-layout tokens (flat layout), or 0..s-1."""
        b, s = ids.shape
        if not self.flat:
            return torch.arange(s, device=ids.device)
        return local_positions(self.mesh, self.token_axes, b * s, s, ids.device)

    def sequence_split(self, qkv: Tensor, s: int) -> SequenceSplit | None:
        """How the attention's local tokens (flat layout: qkv output [T / n, w]) meet their sequences of s tokens;
        None for activations already in sequences [b, s, w] (modes without the flat layout, or a block run on
        them directly)."""
        return SequenceSplit.of(self.mesh, self.attention_axes, qkv.shape[0], s) if qkv.dim() == 2 else None

    def token_embedding(self) -> ShardedModule:
        return SerialTokenEmbedding(self.mesh, self.spec.vocab, self.spec.hidden)

    def position_embedding(self) -> ShardedModule:
        return SerialPositionEmbedding(self.mesh, self.spec.seq_len, self.spec.hidden)

    def layer_norm(self) -> ShardedModule:
        if self.spec.family == "llama":
            return SerialRMSNorm(self.mesh, self.spec.hidden, self.spec.rms_eps)
        return SerialLayerNorm(self.mesh, self.spec.hidden)

    def tied_head(self, embedding: ShardedModule) -> nn.Module:
        """The head as the embedding's transpose (here: serial; 1D: the head's column split = the embedding's
        rows; 2D / 2.5D / 3D: executor/layers/tied.py)."""
        if self.name != "none":
            raise ParacubeError(f"tied embeddings are not supported in tensor mode {self.name} (the head's layout "
                                "is not the embedding's); untie them (tie_word_embeddings: false) or use 1d")
        return TiedHead(embedding)

    def linear(self, kind: str, h_in: int, h_out: int, bias: bool) -> ShardedModule:
        """kind: qkv | proj | fc | fc2 | head (the role decides the split)."""
        return SerialLinear(self.mesh, h_in, h_out, bias)

    def token_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Per-token cross-entropy (fp32) of the local logits against the local labels."""
        flat = upcast(logits).reshape(-1, logits.shape[-1])
        return F.cross_entropy(flat, labels.reshape(-1), reduction="none").view(labels.shape)
