"""The blocks of the GPT (attention, MLP, a transformer block, a stage's blocks) and the serial initialization.

Built from one tensor mode's layers (`Mode`, executor/layers); the assembled model is executor/model/gpt.py.
Selective recomputation by module (`modules`: a frozenset of paracube/recompute_modules.py's names, executor/sizes.
recomputed_modules; checkpoints: executor/layers/discard.py), where megatron-core 0.16.1 puts them
(transformer_layer.py l.379-450, 576-800): core_attn in the attention (region of the core), layernorm the
input and pre-MLP norms (discard: freed after the attention / the MLP ran, made again before their backward),
mlp a dense block's MLP (region); the MoE layer's and latent attention's modules in model/moe.py and layers/mla.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from paracube.executor.layers.context_parallel import context_parallel_attention
from paracube.executor.layers.discard import Discard, region
from paracube.executor.layers.dropout import dropout
from paracube.executor.layers.functional import local_attention
from paracube.executor.layers.llama import LlamaAttention, SwiGLU, llama_init_tensors
from paracube.executor.layers.mla import MLAttention, mla_init_tensors
from paracube.executor.layers.qk_positions import block_positions
from paracube.executor.layers.serial import Mode
from paracube.executor.model.moe import MoEMLP, is_moe_block, moe_init_tensors
from paracube.workload import ModelSpec


class Attention(nn.Module):
    def __init__(self, mode: Mode, modules: frozenset[str] = frozenset(), flash: bool = True,
                 window: int | None = None):
        super().__init__()
        h = mode.spec.hidden
        self.heads, self.flash, self.p = mode.heads_local, flash, mode.spec.attention_dropout
        self.selective = "core_attn" in modules
        self.mode = mode
        self.window = window  # the block's sliding window (ModelSpec.attention_window), None: full causal
        self.qkv = mode.linear("qkv", h, 3 * h, True)
        self.proj = mode.linear("proj", h, h, True)

    def forward(self, x: Tensor, seed: int | None = None, s: int = 0) -> Tensor:
        """x: block-layout activations of sequences of s tokens."""
        qkv = self.qkv(x)
        if self.mode.mesh.layout.cp > 1:  # context parallelism: keys and values exchanged over cp
            return self.proj(context_parallel_attention(qkv, self.heads, s, self.mode.mesh, self.window))
        split = self.mode.sequence_split(qkv, s)
        # A sequence split over ranks gathers its keys and values here, outside the recomputed core.
        kv = split.keys_values(qkv, self.heads, 1, self.mode.mesh) if split is not None else None
        args = (split.queries(qkv) if split is not None else qkv, self.heads, self.flash, self.p, seed, kv,
                split.geometry if split is not None else None, self.window)
        # core_attn (Korthikanti et al.): keep only qkv, redo the attention core in backward (the same dropout
        # mask: it is drawn from `seed`).
        out = region(local_attention, *args) if self.selective else local_attention(*args)
        return self.proj(split.output(out) if split is not None else out)


class MLP(nn.Module):
    def __init__(self, mode: Mode):
        super().__init__()
        h, f = mode.spec.hidden, mode.spec.ffn_hidden
        self.fc = mode.linear("fc", h, f, True)
        self.fc2 = mode.linear("fc2", f, h, True)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """x + dropout(attn(ln1(x))), then + dropout(mlp(ln2(.))); `seeds` (DropoutSeeds.block) or None: no dropout;
    `modules`: what it recomputes (module docstring)."""

    def __init__(self, mode: Mode, modules: frozenset[str] = frozenset(), index: int | None = None):
        super().__init__()
        llama = mode.spec.family == "llama"
        flash = mode.mesh.layout.uses_flash
        self.p = mode.spec.dropout
        self.ln1 = mode.layer_norm()
        # By the block's global index (pipeline stages hold blocks under theirs): its sliding window, attention
        # chunk or None; llama: its rotary / NoPE and L2 norm (qk_positions.py)
        window = mode.spec.attention_window(index) if index is not None else None
        self.attn = (MLAttention(mode, modules, flash, window) if mode.spec.mla is not None  # latent (mla.py)
                     else LlamaAttention(mode, modules, flash, window, block_positions(mode.spec, index)) if llama
                     else Attention(mode, modules, flash, window))
        self.ln2 = mode.layer_norm()
        moe = is_moe_block(mode.spec, index)
        self.mlp = MoEMLP(mode, index, modules) if moe else SwiGLU(mode) if llama else MLP(mode)
        self.discard_norms = "layernorm" in modules
        self.mlp_region = "mlp" in modules and not moe  # Megatron's `mlp`: a dense block's MLP only

    def forward(self, x: Tensor, seeds: tuple[int, int, int] | None = None, s: int = 0) -> Tensor:
        """s: tokens per sequence (the flat token layout's attention needs it)."""
        attn_seed, out_seeds = (seeds[0], seeds[1:]) if seeds is not None else (None, (None, None))
        x = x + dropout(self._normed(self.ln1, x, lambda y: self.attn(y, attn_seed, s)), self.p, out_seeds[0])
        mlp = (lambda y: region(self.mlp, y)) if self.mlp_region else self.mlp
        return x + dropout(self._normed(self.ln2, x, mlp), self.p, out_seeds[1])

    def _normed(self, norm: nn.Module, x: Tensor, consumer: Callable[[Tensor], Tensor]) -> Tensor:
        """consumer(norm(x)); `layernorm`: the norm's output freed once the consumer ran, made again right before
        the consumer's backward (Megatron discards it after the attention / the MLP: transformer_layer.py l.611-614,
        797-800)."""
        if not (self.discard_norms and torch.is_grad_enabled()):
            return consumer(norm(x))
        ckpt = Discard(norm)
        out = consumer(ckpt(x))
        ckpt.discard(out)
        return out


class StageBlocks(nn.Module):
    """The blocks a pipeline stage holds, under their global indices (so parameter names stay the serial
    model's, `blocks.<i>.`); iterates in order like a ModuleList."""

    def __init__(self, mode: Mode, indices: list[int], modules: frozenset[str] = frozenset()):
        super().__init__()
        for i in indices:
            self.add_module(str(i), Block(mode, modules, i))

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i: int) -> nn.Module:
        return self._modules[str(i)]  # type: ignore[return-value]


def init_tensors(spec: ModelSpec, seed: int) -> Iterator[tuple[str, Tensor]]:
    """The serial initialization, one full tensor at a time, in a fixed order (the doc's init); MoE blocks' tensors
    first (model/moe.py, their own generator: the dense stream's unused MLP draws keep the other tensors')."""
    yield from moe_init_tensors(spec, seed)
    if spec.family == "llama":
        yield from (mla_init_tensors if spec.mla is not None else llama_init_tensors)(spec, seed)
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
