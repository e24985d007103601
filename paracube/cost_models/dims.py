"""Model dimensions the cost formulas need, and the exact parameter count each rank stores.

Linears of one block (h_in, h_out, has_bias), fused as the executor fuses them:
- gpt:   qkv [h, 3h], proj [h, h], fc [h, f], fc2 [f, h], all with biases; 2 LayerNorms (gamma, beta).
- llama: qkv [h, q + 2 kv] (GQA: kv = kv_heads * head width), proj [q, h], gate+up [h, 2f], down [f, h],
  no biases (GPT-OSS's `attention_bias`: qkv and proj with biases); 2 RMSNorms (gamma only); no position
  table (rotary); GPT-OSS's attention sinks (`sinks`): `heads` more per block, whole on every rank
  (modes/sinks.py). The executor trains both families with
  these shapes (executor/layers/llama.py: fused column orders).
q = heads x head width (h but for ModelSpec.head_size, Qwen3; gpt: qkv [h, 3 q]); qk_norm adds per block two
replicated gammas of the head width after qkv (executor/layers/head_norm.py; `qk_norm_params`). The widths flow
from ModelSpec through `dims_of` alone to every consumer (compute, memory, activations, traffic, the modes).
Tied embeddings (`tied`): the head is the embedding's transpose, counted once where one stage holds both
(a last stage that is not also the first keeps its own copy, as Megatron-LM does).
The vocabulary is padded as Megatron pads it, to a multiple of 128 x the vocab split (`padded_vocab`); the
executor pads its embedding and head to the same size (executor/model/gpt.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from paracube.engine_options import EngineOptions, MoEHostOps
from paracube.errors import check
from paracube.frozen_hash import frozen_hash, frozen_state
from paracube.modes import MODES
from paracube.modes.base import padded
from paracube.moe_spec import MLASpec
from paracube.workload import ModelSpec, TrainingSpec

# fp8: bf16 parameters, activations and collectives (FP8 GEMM inputs only: cost_models/fp8.py)
DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "bfloat16"}


@dataclass(frozen=True)
class Dims:
    L: int  # layers
    h: int
    f: int
    V: int
    s: int  # training sequence length (tokens per sequence)
    s_model: int  # positions of the learned position table (gpt)
    heads: int
    kv: int  # kv_heads * head width (== h without GQA): the keys' (and values') width
    family: str
    c: int  # compute dtype bytes
    dtype: str  # torch dtype name of the compute dtype
    recompute: str
    global_batch: int
    activations: str = "paracube"  # TrainingSpec.activations: whose saved tensors memory.py counts
    tied: bool = False  # ModelSpec.tied_embeddings
    flash: bool = True  # flash attention (Layout `fa=1`, the default) or Megatron's unfused core attention
    dropout: float = 0.0  # ModelSpec.dropout (after the attention projection and the MLP)
    attention_dropout: float = 0.0  # on the attention probabilities
    embedding_dropout: float = 0.0  # on the embedding output (first stage)
    fp8: bool = False  # TrainingSpec.dtype "fp8": the block linears' GEMMs on FP8 inputs (cost_models/fp8.py)
    grad_bytes: int = 4  # bytes per gradient element the runtime keeps (Runtime.grad_bytes; memory.py)
    gather_16bit: bool = False  # zero=1 all-gathers the c-byte parameters, not fp32 (Runtime.param_gather_16bit)
    fp8_scaling: str = "delayed"  # how the runtime scales FP8 tensors (Runtime.fp8_scaling; cost_models/fp8.py)
    fp8_experts: bool = False  # with fp8, the routed experts' GEMMs run FP8 (Runtime.fp8_experts; cost_models/moe.py)
    fp8_param_gather: bool = False  # with fp8, block linear weights held / gathered as FP8 (Runtime.fp8_param_gather)
    moe_dispatch: str = "alltoall"  # the MoE dispatcher (Runtime.moe_dispatch; cost_models/moe_dispatch.py)
    selective: str = "attention"  # what rc=selective recomputes (Runtime.selective; cost_models/recompute.py)
    moe_host_sync: bool = False  # dropless MoE forwards wait on the host (Runtime.moe_host_sync; host_sync.py)
    moe_host_ops: MoEHostOps | None = None  # ops issued per MoE block (Runtime.moe_host_ops; host_issue.py)
    # Context parallelism (Layout.cp): > 1 marks the view of one cp rank (`context_local`): `s` is then its
    # s / cp tokens of each sequence, whose queries attend over keys of cp x s positions (compute.py).
    cp: int = 1
    cp_comm: str = "p2p"  # its key / value exchange (Layout.cp_comm; modes/context.py)
    # Multi-head latent attention (ModelSpec.mla): its tensor-parallel collectives and parameters as the executor
    # runs them (executor/layers/mla.py; cost_models/mla.py); its GEMMs are priced by cost_models/moe.py
    mla: MLASpec | None = None
    # A head width other than hidden / heads (ModelSpec.head_size, Qwen3; 0: hidden / heads) and per-head q / k norms
    # (ModelSpec.qk_norm): the linears at their true widths (module docstring; the core's: attention_correction.py)
    head_size: int = 0
    qk_norm: bool = False
    # Sliding-window attention (ModelSpec.sliding_window / window_pattern): `window` keys a windowed block's query
    # sees (0: none), `window_frac` the share of the model's blocks windowed (a share, not a count: the event engine
    # prices one block on dims of L = pp); compute.attention_core_time prices the band (attention_window.py);
    # `window_pattern` which blocks are windowed (ModelSpec.window_pattern; "": every block): a stage's own blocks
    # (cost_models/window_stages.py)
    # Chunked attention (Llama 4, ModelSpec.attention_chunk) in the same fields: `window` the chunk's tokens,
    # `window_frac` the share of rope (chunked) blocks, `window_pattern` W at rope blocks and F at NoPE blocks, and
    # `chunked` True: the mask is chunks, not a sliding band (attention_window.py)
    window: int = 0
    window_frac: float = 0.0
    # Activation offloading (Layout off=N, pp = 1; cost_models/offload.py): the share N / L of the blocks whose saved
    # activations go to the host (a share, as window_frac: the event engine prices one block on dims of L = pp), and
    # whether the runtime copies them beside compute (EngineOptions.offload_overlap) or in line
    offload_frac: float = 0.0
    offload_overlap: bool = False
    window_pattern: str = ""
    chunked: bool = False
    attention_bias: bool = False  # ModelSpec.attention_bias (GPT-OSS): qkv and proj with biases
    sinks: bool = False  # ModelSpec.attention_sinks (GPT-OSS): `heads` logits per block (sink_params)

    def __hash__(self) -> int:  # computed once (frozen_hash.py): a key of the inner loops' caches and dicts
        return frozen_hash(self)

    def __getstate__(self) -> dict:
        return frozen_state(self)

    @property
    def head_width(self) -> int:
        """Width of one attention head: head_size, else h / heads."""
        return self.head_size or self.h // self.heads

    @property
    def q_width(self) -> int:
        """Width of the queries and of the attention output (the projection's input): heads x head width."""
        return self.heads * self.head_size if self.head_size else self.h

    @property
    def kv_heads(self) -> int:
        return self.kv // max(self.head_width, 1)

    @property
    def qk_norm_params(self) -> int:
        """Parameters of one block's q / k norms (the two gammas, replicated over the tensor group); 0 without."""
        return 2 * self.head_width if self.qk_norm else 0

    @property
    def attn_in_width(self) -> int:
        """Width of what enters the attention's tensor group per token: x (h); MLA: its latent (mla.py)."""
        if self.mla is None:
            return self.h
        return (self.mla.q_lora_rank or self.h) + self.mla.kv_lora_rank + self.mla.qk_rope_head_dim

    @property
    def attn_replicated(self) -> int:
        """Parameters of one block's attention replicated over the tensor group: MLA's down projections and their
        norms (with sp they take the sequence-parallel gradient all_reduce); 0 otherwise."""
        m = self.mla
        if m is None:
            return 0
        q = self.h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
        return q + self.h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank

    @property
    def grad_dtype(self) -> str:
        """The gradient buckets' dtype, what the data-parallel reduction sends: fp32 (grad_bytes 4: paracube's
        executor, Megatron's grad_reduce_in_fp32), else the 16-bit compute dtype (DeepSpeed's ZeRO; Megatron
        with grad_reduce_in_fp32=False, as NeMo's FP8 performance recipes run)."""
        return "float32" if self.grad_bytes == 4 else ("bfloat16" if self.c != 2 or self.fp8 else self.dtype)

    @property
    def gather_bytes(self) -> int:
        """Bytes per element of zero=1's parameter all_gather: fp32 masters, or the compute copy (gather_16bit)."""
        return self.c if self.gather_16bit else 4

    def head_count(self, first: Any, last: Any) -> Any:
        """1 where a stage holds its own head [h, V] (last, and not tied to its own embedding), else 0."""
        return last * (1 - int(self.tied) * first)

    @property
    def linears(self) -> tuple[tuple[str, int, int, bool], ...]:
        h, f, q = self.h, self.f, self.q_width
        if self.family == "gpt":
            return (("qkv", h, 3 * q, True), ("proj", q, h, True), ("fc", h, f, True), ("fc2", f, h, True))
        return (
            ("qkv", h, q + 2 * self.kv, self.attention_bias),
            ("proj", q, h, self.attention_bias),
            ("fc", h, 2 * f, False),
            ("fc2", f, h, False),
        )

    @property
    def norm_vectors(self) -> int:
        """Parameter vectors of length h per norm (gamma, beta for LayerNorm; gamma for RMSNorm)."""
        return 2 if self.family == "gpt" else 1

    @property
    def stat_width(self) -> int:
        """Statistics per token a distributed norm reduces (sum, sum of squares; RMSNorm: sum of squares)."""
        return 2 if self.family == "gpt" else 1

    @property
    def pos_params(self) -> int:
        return self.s_model * self.h if self.family == "gpt" else 0

    @property
    def row_bias(self) -> int:
        """Bias elements of the two row-parallel linears (replicated in 1D)."""
        return 2 * self.h if self.family == "gpt" else (self.h if self.attention_bias else 0)

    @property
    def sink_params(self) -> int:
        """Attention sinks of one block, whole on every tensor rank (0 without)."""
        return self.heads if self.sinks else 0

    def sum_hin(self) -> int:
        return sum(li[1] for li in self.linears)

    def sum_hout(self) -> int:
        return sum(li[2] for li in self.linears)

    def sum_w(self) -> int:
        return sum(li[1] * li[2] for li in self.linears)

    def sum_bias(self) -> int:
        return sum(li[2] for li in self.linears if li[3])

    def layer_params(self) -> int:
        """Parameters of one block split with its linears (the q / k norms' replicated gammas apart: `local_params`)."""
        return self.sum_w() + self.sum_bias() + 2 * self.norm_vectors * self.h


@lru_cache(maxsize=256)
def param_dims(d: Dims) -> Dims:
    """`d` with only what sizes the parameters kept (L, h, f, V, s_model, heads, kv, family, tied, mla, head_size,
    qk_norm; the rest at Dims' defaults): the key of the caches of per-stage parameter and bucket sizes
    (local_parameters.parameter_units, comm.py, grad_overlap.py), which read nothing else, so the search's passes
    (recomputations, context parallelism, dtypes) share them. Equal results are one object (`_interned`): those
    caches' lookups then match it by identity instead of comparing its fields (the same keys either way)."""
    return _interned(Dims(L=d.L, h=d.h, f=d.f, V=d.V, s=0, s_model=d.s_model, heads=d.heads, kv=d.kv,
                          family=d.family, c=0, dtype="", recompute="", global_batch=0, tied=d.tied, mla=d.mla,
                          attention_bias=d.attention_bias, sinks=d.sinks, head_size=d.head_size, qk_norm=d.qk_norm))


@lru_cache(maxsize=256)
def _interned(d: Dims) -> Dims:
    """The first Dims equal to `d` this process saw (lru_cache returns the stored result for an equal key)."""
    return d


def dims_of(model: ModelSpec, training: TrainingSpec) -> Dims:
    masks = [model.attention_window(i) for i in range(model.layers)]  # sliding windows or attention chunks
    return Dims(
        L=model.layers,
        h=model.hidden,
        f=model.ffn_hidden,
        V=model.vocab,
        s=training.sequence_length(model),
        s_model=model.seq_len,
        heads=model.heads,
        kv=model.num_kv_heads * model.head_dim,
        family=model.family,
        c=training.dtype_bytes,
        dtype=DTYPE_NAMES[training.dtype],
        recompute=training.recompute,
        global_batch=training.global_batch,
        activations=training.activations,
        tied=model.tied_embeddings,
        dropout=model.dropout,
        attention_dropout=model.attention_dropout,
        embedding_dropout=model.embedding_dropout,
        fp8=training.dtype == "fp8",
        mla=model.mla,
        head_size=model.head_size or 0,
        qk_norm=model.qk_norm,
        window=model.sliding_window or model.attention_chunk or 0,
        window_frac=sum(m is not None for m in masks) / model.layers,
        window_pattern=mask_pattern(model),
        chunked=model.attention_chunk is not None,
        attention_bias=model.attention_bias,
        sinks=model.attention_sinks,
    )


def mask_pattern(model: ModelSpec) -> str:
    """Dims.window_pattern: the model's window_pattern, or its rope_pattern as W (chunked rope block) / F (NoPE);
    "" where every block is masked alike (or none is)."""
    if model.attention_chunk is not None:
        return (model.rope_pattern or "").replace("R", "W").replace("N", "F")
    return (model.window_pattern or "") if model.sliding_window else ""


def with_options(d: Dims, o: EngineOptions) -> Dims:
    """`d` with the runtime's per-element choices (engine_options.py) the closed forms read from Dims."""
    return replace(d, grad_bytes=o.grad_bytes, gather_16bit=o.gather_16bit, fp8_param_gather=o.fp8_param_gather,
                   fp8_scaling=o.fp8_scaling, fp8_experts=o.fp8_experts, moe_dispatch=o.moe_dispatch,
                   selective=o.selective, moe_host_sync=o.moe_host_sync, moe_host_ops=o.moe_host_ops,
                   offload_overlap=o.offload_overlap)


def with_pins(d: Dims, layout: object) -> Dims:
    """`d` with the layout's pinned recomputation (Layout.recompute, `rc=`), offloaded blocks (`off=`, in [0, L]) and
    attention kernel (`fa=`)."""
    rc = getattr(layout, "recompute", None)
    d = d if rc is None or rc == d.recompute else replace(d, recompute=rc)
    off = getattr(layout, "offload", None)
    if off:
        check(off <= d.L, f"off={off} offloads more blocks than the model's {d.L}; valid: off=N with N in [0, {d.L}]")
        d = replace(d, offload_frac=off / d.L)
    fa = getattr(layout, "flash", None)
    return d if fa is None or bool(fa) == d.flash else replace(d, flash=bool(fa))


def context_local(d: Dims, cp: int, cp_comm: str | None = None) -> Dims:
    """The dimensions one rank of a cp-way context-parallel group sees: s / cp tokens of each sequence (its two
    load-balanced chunks, modes/context.py), attention over the cp x s keys of the whole sequence. Everything
    linear in the tokens (GEMMs, activations, tensor-parallel and pipeline traffic) is then the plain model's on
    s / cp; attention's extra factor cp is priced from `cp` (compute.attention_core_time). Idempotent."""
    comm = cp_comm or d.cp_comm
    if cp == 1 or (d.cp == cp and d.cp_comm == comm):
        return d
    if d.cp == cp:
        return replace(d, cp_comm=comm)
    check(d.cp == 1 and d.s % (2 * cp) == 0,
          f"cp={cp} splits each sequence into {2 * cp} chunks: sequence length {d.s * d.cp} is not a multiple "
          f"of {2 * cp}; valid: {', '.join(map(str, valid_cps(d.s)))}")
    return replace(d, s=d.s // cp, cp=cp, cp_comm=comm)


def valid_cps(s: int, most: int = 64) -> list[int]:
    """cp degrees up to `most` that split sequences of s tokens into 2 cp equal chunks (1: no context parallelism)."""
    return [1] + [k for k in range(2, most + 1) if s % (2 * k) == 0]


def full_sequence(d: Dims) -> Dims:
    """The inverse of `context_local`: the whole-sequence dimensions (model FLOPs, reporting)."""
    return d if d.cp == 1 else replace(d, s=d.s * d.cp, cp=1)


def vocab_split(mode: str, t: int, q: int) -> int:
    """Ways the vocabulary (embedding rows, head columns) is split inside the tensor group."""
    return MODES[mode].vocab_split(t, q)


def padded_vocab(V: int, split: int) -> int:
    """The vocabulary as Megatron pads it for a vocab split (modes.base.padded: a multiple of 128 x split)."""
    return int(padded(V, split))


def local_params(d: Dims, mode: str, t: Any, q: Any, layers: Any, first: Any, last: Any) -> Any:
    """Closed form of the parameters one rank stores (one pipeline stage of `layers` blocks): each mode's
    `local_params` (paracube/modes) plus every block's replicated q / k norm gammas (`Dims.qk_norm_params`) and
    GPT-OSS's attention sinks (`Dims.sink_params`, whole on every rank), on ints or on a LayoutBatch's arrays."""
    n = MODES[mode].local_params(d, t, q, layers, first * 1, last * 1) + layers * (d.qk_norm_params + d.sink_params)
    return n if isinstance(n, np.ndarray) else int(n)
