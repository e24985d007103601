"""The GPT of docs/algorithms.md, assembled from one tensor mode's layers (or the serial reference).
Family llama (spec.family): RMSNorm, rotary positions (no position table), grouped-query attention and
SwiGLU (executor/layers/llama.py); `tied_embeddings`: the head is the token embedding's transpose (mode.tied_head);
with pp > 1 the last stage holds a copy of the embedding (`tied_copy`, Megatron's rule: executor/pipeline/schedule.py).

Parameter names are the serial model's in every mode; `shard_specs[name]` says which block of the full
tensor a rank holds. Every rank draws the full serial initialization from the seed and keeps its block,
so a seed gives the same model in every layout.

Vocabulary padding (as Megatron pads): the token embedding's rows and the head's columns are padded up to
a multiple of 128 x the mode's vocab split (`padded` in paracube/modes, the size the cost model counts), the
padding initialized to zero and its logits set to -inf before the (vocab-parallel) cross-entropy, so they
take no probability and get zero gradients. Full tensors in and out (state dicts) have the true vocabulary.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from paracube.errors import ParacubeError, check
from paracube.executor.layers.context_parallel import chunk_positions, load_balanced
from paracube.executor.layers.dropout import DropoutSeeds, dropout
from paracube.executor.layers.fp8 import FP8_DTYPES, Fp8Scaling
from paracube.executor.layers.fp8 import attach as attach_fp8
from paracube.executor.layers.serial import Mode
from paracube.executor.layers.shards import ShardSpec, gather_full
from paracube.executor.mesh import Mesh
from paracube.executor.model.blocks import Block, StageBlocks, init_tensors
from paracube.executor.model.offload import BlockOffload
from paracube.executor.sizes import check_divisibility, check_offload, check_recompute_modules, recomputed_modules
from paracube.modes import MODES as TENSOR_MODES
from paracube.modes.base import padded, tokens_split_ok
from paracube.modes.stages import stage_chunks
from paracube.workload import ModelSpec


def _implementation(impl: str) -> type[Mode]:
    """The executor's Mode class named by a mode's ExecutorSupport.impl ("module:Class")."""
    module, _, name = impl.partition(":")
    return getattr(importlib.import_module(module), name)


# What the executor runs: every mode whose declaration (paracube/modes) names an implementation.
MODES: dict[str, type[Mode]] = {name: _implementation(m.executor.impl)
                                for name, m in TENSOR_MODES.items() if m.executor is not None}
RECOMPUTE = ("none", "selective", "full")  # selective's modules: the layout's rcm= (executor/sizes.recomputed_modules)
FAMILIES = ("gpt", "llama")  # what the executor builds (a plan of another family is refused, never replaced)
VOCAB_DIMS = {"tok_emb.weight": 0, "head.weight": 1}  # parameters padded along the vocabulary


def _resize(t: Tensor, name: str, vocab: int) -> Tensor:
    """`t` with its vocabulary dimension cut or zero-padded to `vocab` (other parameters unchanged)."""
    dim = VOCAB_DIMS.get(name)
    if dim is None or t.shape[dim] == vocab:
        return t
    if t.shape[dim] > vocab:
        return t.narrow(dim, 0, vocab)
    pad = list(t.shape)
    pad[dim] = vocab - t.shape[dim]
    return torch.cat([t, t.new_zeros(pad)], dim=dim)


class ParallelGPT(nn.Module):
    def __init__(self, spec: ModelSpec, mesh: Mesh, recompute: str = "none", seed: int = 0,
                 vocab: int | None = None, fp8: bool = False):
        super().__init__()
        check(recompute in RECOMPUTE, f"recompute={recompute!r} is not supported; valid: {', '.join(RECOMPUTE)}")
        mode_name = mesh.layout.mode
        check(mode_name in MODES, f"tensor mode {mode_name!r} is not supported by the executor; "
              f"valid: {', '.join(MODES)}")
        check(spec.family in FAMILIES, f"model family {spec.family!r} is not built by the executor; "
              f"valid: {', '.join(FAMILIES)}")
        check_divisibility(spec, mesh.layout, None, 0, spec.seq_len)
        check_offload(spec, mesh.layout, recompute)
        check_recompute_modules(spec, mesh.layout, recompute)
        self.spec, self.mesh, self.recompute = spec, mesh, recompute
        # selective recomputation's modules (layout rcm=, else core_attn under rc=selective): the blocks run them
        self.recompute_modules = recomputed_modules(recompute, mesh.layout)
        layout = mesh.layout
        split = TENSOR_MODES[mode_name].vocab_split(layout.tensor_size, layout.q)
        # `vocab`: another padded size (a multiple of the split), e.g. a serial reference padded as the model it
        # checks; by default Megatron's (modes.base.padded).
        self.vocab = int(padded(spec.vocab, split)) if vocab is None else vocab
        check(self.vocab >= spec.vocab and self.vocab % split == 0,
              f"padded vocabulary {self.vocab} must be >= {spec.vocab} and a multiple of the vocab split {split}")
        self.mode = MODES[mode_name](replace(spec, vocab=self.vocab), mesh)
        # Megatron's RNG rule (executor/layers/dropout.py): replicas of the residual stream (none, 1D without sp)
        # draw the same masks on every tensor rank, shards draw their own.
        replicated = TENSOR_MODES[mode_name].replicates_activations and not layout.sequence_parallel
        self.dropout_seeds = DropoutSeeds(seed, layout, layout.coords(mesh.rank), replicated)
        self.with_dropout = max(spec.dropout, spec.attention_dropout, spec.embedding_dropout) > 0
        # Pipeline stage (modes/stages.py): this stage's model chunks; embedding first, head + loss last.
        stage = mesh.coord("pp") if layout.pp > 1 else 0
        self.chunks = stage_chunks(spec.layers, layout.pp, layout.interleave, stage)
        self.first_stage, self.last_stage = stage == 0, stage == layout.pp - 1
        if self.first_stage:
            self.tok_emb = self.mode.token_embedding()
            self.pos_emb = self.mode.position_embedding() if spec.family == "gpt" else None  # llama: rotary
        self.blocks = StageBlocks(self.mode, [i for chunk in self.chunks for i in chunk], self.recompute_modules)
        # activation offloading (Layout off=N): pinned host copies where CUDA is (save_on_cpu's own test for pinning)
        self.offload = BlockOffload(layout.offload or 0, torch.cuda.is_available())
        # --dtype fp8: the blocks' linears multiply FP8 operands with delayed scaling (executor/layers/fp8.py)
        self.fp8: Fp8Scaling | None = attach_fp8(self.blocks) if fp8 else None
        # Tied embeddings across stages (Megatron): the last stage holds its own copy of the word embedding
        # (same name, same init), its head the copy's transpose; pipeline.reduce_tied_embedding_grads sums the
        # two copies' gradients over the embedding group each step, so they stay identical.
        self.tied_copy = spec.tied_embeddings and self.last_stage and not self.first_stage
        if self.last_stage:
            self.ln_f = self.mode.layer_norm()
            if self.tied_copy:  # registered after ln_f: where the untied head's weight is (bucket order)
                self.tok_emb = self.mode.token_embedding()
                # Checkpoints save the first stage's copy only (identical); a load sets both (checkpoint.py).
                emb = self.tok_emb.shard_specs["weight"]
                self.tok_emb.shard_specs["weight"] = replace(emb, replica_leader=False)
            self.head = (self.mode.tied_head(self.tok_emb) if spec.tied_embeddings
                         else self.mode.linear("head", spec.hidden, self.vocab, False))
        self.shard_specs: dict[str, ShardSpec] = {}
        for prefix, module in self.named_modules():
            for pname, pspec in getattr(module, "shard_specs", {}).items():
                if module is not self:
                    self.shard_specs[f"{prefix}.{pname}"] = pspec
        assert set(self.shard_specs) == {n for n, _ in self.named_parameters()}

    @property
    def tied_embedding(self) -> nn.Parameter | None:
        """The word embedding this stage sums with another stage's copy each step (tied embeddings, pp > 1,
        first or last stage: Megatron's embedding group), else None (pp = 1: autograd sums the head's and the
        lookup's gradients in the one table)."""
        if not self.spec.tied_embeddings or self.mesh.layout.pp == 1 or not (self.first_stage or self.last_stage):
            return None
        return self.tok_emb.weight

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: every parameter's (functional.py, "Precision")."""
        return next(self.parameters()).dtype

    # --- forward ---------------------------------------------------------------------------------------
    def context_tokens(self, t: Tensor) -> Tensor:
        """This cp rank's tokens [b, s / cp] of a micro-batch [b, s] (ids, labels: the load-balanced chunks of
        executor/layers/context_parallel.py); t itself without context parallelism."""
        cp = self.mesh.layout.cp
        return t if cp == 1 else load_balanced(t, cp, self.mesh.coord("cp"))

    def embed(self, ids: Tensor, s: int | None = None) -> Tensor:
        """Block-layout activations of the replica's whole micro-batch ids [b, s] ([b, s, h] split as the mode
        splits it, or the flat token layout's [T / n, h / ...] block: executor/layers/tokens.py); with context
        parallelism ids are the cp rank's chunks [b, s / cp] of sequences of s tokens."""
        x = self.tok_emb(ids.reshape(-1) if self.mode.flat else ids)
        if self.pos_emb is not None:
            cp = self.mesh.layout.cp
            positions = chunk_positions(s, cp, self.mesh.coord("cp"), ids.device) if cp > 1 and s else None
            pos = self.pos_emb(ids.shape[1], positions) if positions is not None else self.pos_emb(ids.shape[1])
            x = x + (pos[self.mode.block_positions(ids)] if self.mode.flat else pos)
        # The residual stream in the compute dtype (the parameters' dtype), as Megatron keeps it (the
        # embedding's reductions ran in fp32, as priced).
        x = x.to(self.dtype)
        if self.training and self.spec.embedding_dropout > 0:
            x = dropout(x, self.spec.embedding_dropout, self.dropout_seeds.embedding())
        return x

    def run_block(self, block: Block, x: Tensor, s: int) -> Tensor:
        # Seeds drawn outside the checkpoint: a recomputed block re-draws the forward's masks.
        seeds = self.dropout_seeds.block() if self.training and self.with_dropout else None
        if self.recompute == "full" and torch.is_grad_enabled():
            # Recompute the whole block (no early stop) so its forward collectives all run again.
            with set_checkpoint_early_stop(False):
                return checkpoint(block, x, seeds, s, use_reentrant=False, preserve_rng_state=False)
        return block(x, seeds, s)

    def begin_step(self, micro_batches: int) -> None:
        """A train step of `micro_batches` starts: kw=1 keeps gathered weights until its last backward
        (executor/layers/kept.py; a no-op in modes and layouts that keep nothing)."""
        kept = getattr(self.mode, "kept", None)
        if kept is not None:
            kept.begin_step(micro_batches)
        if self.fp8 is not None:  # the FP8 weight copies are cast again from the updated weights
            self.fp8.begin_step()

    def end_step(self) -> None:
        """After the step's last backward: the kept weights are released (their gradients reduced)."""
        kept = getattr(self.mode, "kept", None)
        if kept is not None:
            kept.end_step()

    def reduce_sequence_parallel_grads(self) -> None:
        """Once per step, before the data-parallel gradient sum: 1D + sp sums the partial gradients of the
        parameters used on sequence shards over tp (a no-op in every other layout)."""
        reduce = getattr(self.mode, "reduce_sequence_parallel_grads", None)
        if reduce is not None:
            reduce()

    def token_losses(self, x: Tensor, labels: Tensor) -> Tensor:
        """Per-token losses of the local tokens: x in block layout, labels already split."""
        logits = self.head(self.ln_f(x))
        if self.vocab != self.spec.vocab:
            # The local logits are the head weight's column block (every mode), tied: the embedding's row
            # block; mask the padded columns.
            head = self.shard_specs.get("head.weight")
            start, size = ((head.offsets[1], head.sizes[1]) if head is not None else
                           (self.shard_specs["tok_emb.weight"].offsets[0], self.shard_specs["tok_emb.weight"].sizes[0]))
            padding = torch.arange(start, start + size, device=logits.device) >= self.spec.vocab
            logits = logits.masked_fill(padding, float("-inf"))
        return self.mode.token_losses(logits, labels)

    def check_batch(self, ids: Tensor, labels: Tensor) -> None:
        b, s = ids.shape
        split = self.mode.token_split
        cp = self.mesh.layout.cp
        if not tokens_split_ok(b, s, split) or s > self.spec.seq_len or labels.shape != ids.shape or s % (2 * cp):
            raise ParacubeError(f"micro-batch ids {tuple(ids.shape)} / labels {tuple(labels.shape)}: need equal "
                                f"shapes, {b} x {s} tokens divisible by the token split {split}, and seq_len <= "
                                f"{self.spec.seq_len}" + (f", s divisible by 2 x cp = {2 * cp}" if cp > 1 else ""))

    def chunk_forward(self, chunk: int, x: Tensor | None, ids: Tensor,
                      labels: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Model chunk `chunk` of this stage: from the ids (first chunk of the first stage) or the received
        activations `x`, to the activations it passes on or, on the last chunk of the last stage, the local
        (loss sum, token count)."""
        if x is None:
            self.check_batch(ids, labels)
            x = self.embed(self.context_tokens(ids), ids.shape[1])
        for i in self.chunks[chunk]:
            with self.offload.block(i):  # off=N: the first N blocks' saved tensors go to the host (offload.py)
                x = self.run_block(self.blocks[i], x, ids.shape[1])
        if not (self.last_stage and chunk == len(self.chunks) - 1):
            return x
        local_labels = self.mode.split_tokens(self.context_tokens(labels))
        losses = self.token_losses(x, local_labels)
        return losses.sum(), torch.tensor(float(local_labels.numel()), device=losses.device)

    def forward(self, ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        check(self.first_stage and self.last_stage and len(self.chunks) == 1,
              "a pipeline stage runs through executor/pipeline/schedule.py, not forward()")
        return self.chunk_forward(0, None, ids, labels)  # type: ignore[return-value]

    # --- full tensors ----------------------------------------------------------------------------------
    @torch.no_grad()
    def load_full_state_dict(self, full: dict[str, Tensor]) -> None:
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(full))
        check(not missing, f"state dict lacks parameters {missing[:5]}")
        for name, p in params.items():
            spec = self.shard_specs[name]
            tensor = _resize(full[name], name, self.vocab)
            check(tuple(tensor.shape) == spec.global_shape,
                  f"{name}: shape {tuple(full[name].shape)} != model shape {spec.global_shape}")
            p.copy_(spec.take(tensor))

    @torch.no_grad()
    def load_init(self, seed: int) -> None:
        params = dict(self.named_parameters())
        for name, full in init_tensors(self.spec, seed):  # the whole serial draw; keep this stage's tensors
            if name in params:
                params[name].copy_(self.shard_specs[name].take(_resize(full, name, self.vocab)))

    def block_of(self, name: str, full: Tensor) -> Tensor:
        """This rank's block of a full tensor of parameter `name` (true or otherwise padded vocabulary: padded or
        cut to this model's), e.g. the serial reference's parameter or gradient."""
        return self.shard_specs[name].take(_resize(full, name, self.vocab))

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, Tensor]:
        return {n: _resize(gather_full(p, self.shard_specs[n], self.mesh), n, self.spec.vocab)
                for n, p in self.named_parameters()}


def build_model(spec: ModelSpec, mesh: Mesh, seed: int = 0, recompute: str = "none",
                dtype: torch.dtype = torch.float32, vocab: int | None = None, fp8: bool = False) -> ParallelGPT:
    """The GPT for mesh.layout's tensor mode (serial when none), initialized from `seed` (drawn in fp32),
    its parameters then cast to the compute `dtype` (the compute copy; fp32 masters live in the optimizer);
    `vocab`: the padded vocabulary size if not Megatron's; `fp8`: FP8 GEMMs in the blocks (bf16 compute copy;
    fp32 / fp64 for tests; fp16 refused)."""
    check(not fp8 or dtype in FP8_DTYPES, f"fp8 with a {str(dtype).removeprefix('torch.')} compute copy: FP8 "
          "training keeps bf16 parameters (fp16 master state is not offered); valid: bf16 (fp32, fp64 in tests)")
    model = ParallelGPT(spec, mesh, recompute, seed, vocab, fp8)
    model.load_init(seed)
    return model.to(dtype)


def serial_reference(spec: ModelSpec, seed: int = 0, recompute: str = "none",
                     dtype: torch.dtype = torch.float32, vocab: int | None = None, fp8: bool = False) -> ParallelGPT:
    """The same GPT on one process with plain torch ops (the equivalence tests' reference); `vocab`: pad it as
    the model it checks (the same sums over the same sizes: rounding as close as it gets)."""
    return build_model(spec, Mesh.single(), seed, recompute, dtype, vocab, fp8)


