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
    moe_probs: str = "none"  # where it sends the routing weights by their own all_to_all (Runtime.moe_probs)
    selective: str = "attention"  # what rc=selective recomputes (Runtime.selective; cost_models/recompute.py)
    # rc=selective by module (Layout.recompute_modules, `rcm=`; cost_models/recompute_modules_cost.py); None: the rule
    recompute_modules: tuple[str, ...] | None = None
    fused_norms: bool = False  # dense norms inside the next linear (Runtime.fused_norms; recompute_modules_cost.py)
    cp_core_recompute: bool = False  # under cp, selective re-runs the core + exchange (Runtime.cp_core_recompute)
    moe_host_sync: bool = False  # dropless MoE forwards wait on the host (Runtime.moe_host_sync; host_sync.py)
    moe_capacity: str = "pad"  # what a capacity factor does (Runtime.moe_capacity; MoESpec.load, host_sync.py)
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
    # zero=2/3: the FSDP units' gathers prefetched (EngineOptions.fsdp_prefetch; moe_fsdp.py reads it, the dense units'
    # recursion takes it as an argument)
    fsdp_prefetch: bool = False
    window_pattern: str = ""
    chunked: bool = False
    attention_bias: bool = False  # ModelSpec.attention_bias (GPT-OSS): qkv and proj with biases
    sinks: bool = False  # ModelSpec.attention_sinks (GPT-OSS): `heads` logits per block (sink_params)

    def __hash__(self) -> int:  # computed once (frozen_hash.py): a key of the inner loops' caches and dicts
        return frozen_hash(self)

    def __getstate__(self) -> dict:
        return frozen_state(self)

    @property
    def backward_share(self) -> float:
        """The backward's part of a micro-batch's compute: 2/3 (backward = 2 x forward), 3/4 under full recomputation
        (the forward runs again before it)."""
        return 0.75 if self.recompute == "full" else 2.0 / 3.0

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
    def kv_exchanged(self) -> int:
        """Keys' and values' width per token that cp exchanges (modes/context.kv_bytes): 2 kv; MLA its core's k, v:
        H (d_n + d_r) + H d_v (executor/layers/mla.py)."""
        return 2 * self.kv if self.mla is None else self.heads * (self.mla.qk_head_dim + self.mla.v_head_dim)

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
                   moe_probs=o.moe_probs, selective=o.selective, moe_host_sync=o.moe_host_sync,
                   moe_capacity=o.moe_capacity, moe_host_ops=o.moe_host_ops, offload_overlap=o.offload_overlap,
                   fused_norms=o.fused_norms, cp_core_recompute=o.cp_core_recompute, fsdp_prefetch=o.fsdp_prefetch)


def with_pins(d: Dims, layout: object) -> Dims:
    """`d` with the layout's pinned recomputation (Layout.recompute, `rc=`; `rcm=`: selective by module), offloaded
    blocks (`off=`, in [0, L]) and attention kernel (`fa=`)."""
    rc, rcm = getattr(layout, "recompute", None), getattr(layout, "recompute_modules", None)
    if rcm:
        d = replace(d, recompute="selective", recompute_modules=tuple(rcm))
    d = d if rc is None or rc == d.recompute else replace(d, recompute=rc)
    off = getattr(layout, "offload", None)
    if off:
        check(off <= d.L, f"off={off} offloads more blocks than the model's {d.L}; valid: off=N with N in [0, {d.L}]")
        d = replace(d, offload_frac=off / d.L)
    fa = getattr(layout, "flash", None)
    return d if fa is None or bool(fa) == d.flash else replace(d, flash=bool(fa))


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
