"""The GPT of docs/algorithms.md, assembled from one tensor mode's layers (or the serial reference).
Family llama (spec.family): RMSNorm, rotary positions (no position table), grouped-query attention and
SwiGLU (executor/llama.py); `tied_embeddings`: the head is the token embedding's transpose (mode.tied_head).

Parameter names are the serial model's in every mode; `shard_specs[name]` says which block of the full
tensor a rank holds. Every rank draws the full serial initialization from the seed and keeps its block,
so a seed gives the same model in every layout.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from paracube.errors import ParacubeError, check
from paracube.executor.functional import local_attention
from paracube.executor.llama import LlamaAttention, SwiGLU, llama_init_tensors
from paracube.executor.mesh import Mesh
from paracube.executor.serial import Mode
from paracube.executor.shards import ShardSpec, gather_full
from paracube.executor.sizes import check_divisibility
from paracube.modes import MODES as TENSOR_MODES
from paracube.workload import ModelSpec


def _implementation(impl: str) -> type[Mode]:
    """The executor's Mode class named by a mode's ExecutorSupport.impl ("module:Class")."""
    module, _, name = impl.partition(":")
    return getattr(importlib.import_module(module), name)


# What the executor runs: every mode whose declaration (paracube/modes) names an implementation.
MODES: dict[str, type[Mode]] = {name: _implementation(m.executor.impl)
                                for name, m in TENSOR_MODES.items() if m.executor is not None}
RECOMPUTE = ("none", "full")
FAMILIES = ("gpt", "llama")  # what the executor builds (a plan of another family is refused, never replaced)


class Attention(nn.Module):
    def __init__(self, mode: Mode):
        super().__init__()
        h = mode.spec.hidden
        self.heads = mode.heads_local
        self.qkv = mode.linear("qkv", h, 3 * h, True)
        self.proj = mode.linear("proj", h, h, True)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(local_attention(self.qkv(x), self.heads))


class MLP(nn.Module):
    def __init__(self, mode: Mode):
        super().__init__()
        h, f = mode.spec.hidden, mode.spec.ffn_hidden
        self.fc = mode.linear("fc", h, f, True)
        self.fc2 = mode.linear("fc2", f, h, True)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, mode: Mode):
        super().__init__()
        llama = mode.spec.family == "llama"
        self.ln1 = mode.layer_norm()
        self.attn = LlamaAttention(mode) if llama else Attention(mode)
        self.ln2 = mode.layer_norm()
        self.mlp = SwiGLU(mode) if llama else MLP(mode)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def init_tensors(spec: ModelSpec, seed: int) -> Iterator[tuple[str, Tensor]]:
    """The serial initialization, one full tensor at a time, in a fixed order (the doc's init)."""
    if spec.family == "llama":
        yield from llama_init_tensors(spec, seed)
        return
    gen = torch.Generator().manual_seed(seed)
    h, f, V, L = spec.hidden, spec.ffn_hidden, spec.vocab, spec.layers

    def normal(*shape: int, std: float = 0.02) -> Tensor:
        return torch.empty(shape).normal_(0.0, std, generator=gen)

    yield "tok_emb.weight", normal(V, h)
    yield "pos_emb.weight", normal(spec.seq_len, h)
    resid_std = 0.02 / math.sqrt(2 * L)
    for i in range(L):
        p = f"blocks.{i}."
        for ln in ("ln1", "ln2"):
            yield p + ln + ".weight", torch.ones(h)
            yield p + ln + ".bias", torch.zeros(h)
        for name, shape, std in (("attn.qkv", (h, 3 * h), 0.02), ("attn.proj", (h, h), resid_std),
                                 ("mlp.fc", (h, f), 0.02), ("mlp.fc2", (f, h), resid_std)):
            yield p + name + ".weight", normal(*shape, std=std)
            yield p + name + ".bias", torch.zeros(shape[1])
    yield "ln_f.weight", torch.ones(h)
    yield "ln_f.bias", torch.zeros(h)
    if not spec.tied_embeddings:
        yield "head.weight", normal(h, V)


class ParallelGPT(nn.Module):
    def __init__(self, spec: ModelSpec, mesh: Mesh, recompute: str = "none"):
        super().__init__()
        check(recompute in RECOMPUTE, f"recompute={recompute!r} is not supported; valid: {', '.join(RECOMPUTE)}")
        mode_name = mesh.layout.mode
        check(mode_name in MODES, f"tensor mode {mode_name!r} is not supported by the executor; "
              f"valid: {', '.join(MODES)}")
        check(spec.family in FAMILIES, f"model family {spec.family!r} is not built by the executor; "
              f"valid: {', '.join(FAMILIES)}")
        check_divisibility(spec, mesh.layout, None, 0, spec.seq_len)
        self.spec, self.mesh, self.recompute = spec, mesh, recompute
        self.mode = MODES[mode_name](spec, mesh)
        self.tok_emb = self.mode.token_embedding()
        self.pos_emb = self.mode.position_embedding() if spec.family == "gpt" else None  # llama: rotary
        self.blocks = nn.ModuleList(Block(self.mode) for _ in range(spec.layers))
        self.ln_f = self.mode.layer_norm()
        self.head = (self.mode.tied_head(self.tok_emb) if spec.tied_embeddings
                     else self.mode.linear("head", spec.hidden, spec.vocab, False))
        self.shard_specs: dict[str, ShardSpec] = {}
        for prefix, module in self.named_modules():
            for pname, pspec in getattr(module, "shard_specs", {}).items():
                if module is not self:
                    self.shard_specs[f"{prefix}.{pname}"] = pspec
        assert set(self.shard_specs) == {n for n, _ in self.named_parameters()}

    # --- forward ---------------------------------------------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        """Block-layout activations of the replica's whole micro-batch ids [b, s]."""
        x = self.tok_emb(ids)
        return x if self.pos_emb is None else x + self.pos_emb(ids.shape[1])

    def run_block(self, block: Block, x: Tensor) -> Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            # Recompute the whole block (no early stop) so its forward collectives all run again.
            with set_checkpoint_early_stop(False):
                return checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)
        return block(x)

    def token_losses(self, x: Tensor, labels: Tensor) -> Tensor:
        """Per-token losses of the local tokens: x in block layout, labels already split."""
        return self.mode.token_losses(self.head(self.ln_f(x)), labels)

    def forward(self, ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        b, s = ids.shape
        split = self.mode.token_split
        if b % split or s > self.spec.seq_len or labels.shape != ids.shape:
            raise ParacubeError(f"micro-batch ids {tuple(ids.shape)} / labels {tuple(labels.shape)}: need equal "
                                f"shapes, batch divisible by {split} and seq_len <= {self.spec.seq_len}")
        x = self.embed(ids)
        for block in self.blocks:
            x = self.run_block(block, x)
        local_labels = self.mode.split_tokens(labels)
        losses = self.token_losses(x, local_labels)
        return losses.sum(), torch.tensor(float(local_labels.numel()), device=losses.device)

    # --- full tensors ----------------------------------------------------------------------------------
    @torch.no_grad()
    def load_full_state_dict(self, full: dict[str, Tensor]) -> None:
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(full))
        check(not missing, f"state dict lacks parameters {missing[:5]}")
        for name, p in params.items():
            spec = self.shard_specs[name]
            check(tuple(full[name].shape) == spec.global_shape,
                  f"{name}: shape {tuple(full[name].shape)} != model shape {spec.global_shape}")
            p.copy_(spec.take(full[name]))

    @torch.no_grad()
    def load_init(self, seed: int) -> None:
        params = dict(self.named_parameters())
        for name, full in init_tensors(self.spec, seed):
            params[name].copy_(self.shard_specs[name].take(full))

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, Tensor]:
        return {n: gather_full(p, self.shard_specs[n], self.mesh) for n, p in self.named_parameters()}


def build_model(spec: ModelSpec, mesh: Mesh, seed: int = 0, recompute: str = "none") -> ParallelGPT:
    """The GPT for mesh.layout's tensor mode (serial when none), initialized from `seed`."""
    model = ParallelGPT(spec, mesh, recompute)
    model.load_init(seed)
    return model


def serial_reference(spec: ModelSpec, seed: int = 0, recompute: str = "none") -> ParallelGPT:
    """The same GPT on one process with plain torch ops (the equivalence tests' reference)."""
    return build_model(spec, Mesh.single(), seed, recompute)


