"""What is trained: the model's shape (ModelSpec) and how it is trained (TrainingSpec).

The named models are in model_presets.py; a Hugging Face `config.json` is read by hf_config.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from paracube.attention_chunk import Chunk, uses_rope, validate_attention
from paracube.errors import ParacubeError, check
from paracube.gpt_oss_spec import plan_defaults, sink_parameters
from paracube.gpt_oss_spec import validate_attention as validate_oss
from paracube.moe_spec import MLASpec, MoESpec, mla_from_dict, moe_from_dict

Family = Literal["gpt", "llama"]
DType = Literal["fp32", "fp16", "bf16", "fp8"]
Recompute = Literal["none", "selective", "full"]

# fp8 (Transformer Engine style): bf16 parameters and activations, FP8 GEMM inputs (cost_models/fp8.py)
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 2}


@dataclass(frozen=True)
class Fp8Recipe:
    """`--dtype fp8`'s scaling recipe, read by the cost model (cost_models/fp8.py: scale memory, amax reduction)
    and the executor (executor/layers/fp8.py) alike: Transformer Engine's DelayedScaling as its quickstart sets
    it (fp8_format HYBRID: e4m3 forward, e5m2 gradients; amax_history_len 16, amax_compute_algo "max", margin 0)."""

    amax_history_len: int = 16
    amax_compute_algo: Literal["max", "most_recent"] = "max"
    margin: int = 0
    forward_format: str = "e4m3"  # X and W
    backward_format: str = "e5m2"  # dY ("hybrid")


FP8_RECIPE = Fp8Recipe()
# How a training stack scales its FP8 tensors (Runtime.fp8_scaling; cost_models/fp8.py prices each):
# "delayed": FP8_RECIPE, Transformer Engine's (Megatron-core's) and paracube's executor's: scales from an amax
#   history, the amaxes all-reduced once per step, each weight cast once per step into FP8 copies held all step;
# "dynamic": torchao's Float8Linear as torchtitan 0.3.0 runs it (recipe "rowwise"): every tensor scaled from its
#   own amax at each cast, no history, no reduction, the weights cast again at every use (every micro-batch).
FP8_SCALINGS: tuple[str, ...] = ("delayed", "dynamic")
# What a training stack recomputes under `rc=selective` (Runtime.selective; cost_models/recompute.py prices each):
# "attention": Megatron's selective recomputation (Korthikanti et al. 2022), the attention core re-run in backward;
# "op": torchtitan 0.3.0's per-op selective activation checkpointing (SelectiveAC): the outputs of the
#   compute-intensive ops saved (every second bf16 mm recomputed, FP8 _scaled_mm and attention always saved), every
#   other op of the block re-run in backward.
SELECTIVE_RULES: tuple[str, ...] = ("attention", "op")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    `gpt`: learned positions, LayerNorm with bias, GELU MLP with biases (what the executor trains).
    `llama`: rotary positions, RMSNorm, SwiGLU MLP, no biases, grouped-query attention.
    `tied_embeddings`: the output head is the token embedding's transpose (no head parameters), as HF GPT-2
    (GPT2LMHeadModel) and the GPT-2 presets have it; the executor ties them in every tensor mode (2D / 2.5D / 3D:
    the head reads the table's own blocks, executor/layers/three_d.BlockTiedHead), with zero <= 1.
    `rms_eps`, `rope_theta`: the llama family's RMSNorm epsilon and rotary base (HF rms_norm_eps, rope_theta).
    Dropout probabilities (training only; executor/layers/dropout.py): `dropout` on each block's attention and MLP
    outputs before the residual add (HF gpt2 resid_pdrop, Megatron hidden_dropout), `attention_dropout` on the
    attention probabilities (attn_pdrop / attention_dropout), `embedding_dropout` on the embedding output
    (embd_pdrop). The GPT-2/GPT-3 presets use 0.1 for all three (Megatron's GPT default and GPT-2's config);
    llama has none (attention_dropout as its config says, 0 by default); tiny and small use 0 (they are the
    equivalence tests' models: dropout draws masks the serial reference cannot share).
    Sliding-window attention (HF `sliding_window`, Mistral v0.1, Gemma 2/3, GPT-OSS): in a windowed block the
    query at position i sees the keys j with i - sliding_window < j <= i (transformers' sliding-window mask; Megatron
    `--window-size (sliding_window - 1, 0)`). `window_pattern` says which blocks are windowed: a string of "W"
    (windowed) and "F" (full causal attention) repeated over the blocks from block 0 (GPT-OSS "WF", Gemma 3
    "WWWWWF"; HF `layer_types` / Megatron `--window-attn-skip-freq k` = "W" x (k - 1) + "F"); None: every block.
    Llama 4's attention (attention_chunk.py): `attention_chunk` (rope blocks attend within chunks of that many
    tokens), `rope_pattern` ("R" / "N" per block: NoPE blocks), `qk_l2_norm`.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    family: Family = "gpt"
    kv_heads: int | None = None
    tied_embeddings: bool = False
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    dropout: float = 0.0
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0
    head_size: int | None = None  # per-head width when it is not hidden / heads (Qwen3: head_dim 128)
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (Qwen3: q_norm, k_norm)
    moe: MoESpec | None = None  # mixture-of-experts blocks (moe_spec.py); None: dense
    mla: MLASpec | None = None  # multi-head latent attention (moe_spec.py); None: (grouped-query) attention
    sliding_window: int | None = None  # keys a windowed block's query sees, itself included; None: full causal
    window_pattern: str | None = None  # "W" / "F" per block, repeated; None: every block windowed
    attention_chunk: int | None = None  # Llama 4: rope blocks attend within chunks of this many tokens
    rope_pattern: str | None = None  # "R" (rotary) / "N" (NoPE) per block, repeated; None: rotary everywhere
    qk_l2_norm: bool = False  # Llama 4: weightless L2 (RMS) norm of q and k in the rope blocks
    attention_sinks: bool = False  # GPT-OSS: a learned sink logit per head in every softmax row (gpt_oss_spec.py)
    attention_bias: bool = False  # GPT-OSS: q / k / v / o projections with biases

    def __post_init__(self) -> None:
        object.__setattr__(self, "moe", moe_from_dict(self.moe, f"model {self.name!r}"))
        object.__setattr__(self, "mla", mla_from_dict(self.mla, f"model {self.name!r}"))
        for part in (self.moe, self.mla):
            if part is not None:
                part.validate(f"model {self.name!r}")
                check(self.family == "llama", f"model {self.name!r}: {type(part).__name__[:-4].lower()} blocks "
                      f"need family llama (SwiGLU experts, RMSNorm), got {self.family!r}")
        check(self.head_size is None or (isinstance(self.head_size, int) and self.head_size > 0),
              f"model {self.name!r}: head_size={self.head_size!r} must be a positive integer")
        for attr in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len"):
            value = getattr(self, attr)
            check(isinstance(value, int) and value > 0,
                  f"model {self.name!r}: {attr}={value!r} must be a positive integer")
        check(self.family in ("gpt", "llama"), f"model {self.name!r}: family={self.family!r}; valid: gpt, llama")
        check(self.hidden % self.heads == 0 or self.head_size is not None or self.mla is not None,
              f"model {self.name!r}: hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.kv_heads is not None:
            check(isinstance(self.kv_heads, int) and self.kv_heads > 0,
                  f"model {self.name!r}: kv_heads={self.kv_heads!r} must be a positive integer")
            check(self.heads % self.kv_heads == 0,
                  f"model {self.name!r}: heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
            check(self.family == "llama" or self.kv_heads == self.heads,
                  f"model {self.name!r}: kv_heads={self.kv_heads} != heads={self.heads}; grouped-query "
                  "attention needs family llama")
        check(self.sliding_window is None or (isinstance(self.sliding_window, int)
              and not isinstance(self.sliding_window, bool) and self.sliding_window > 0),
              f"model {self.name!r}: sliding_window={self.sliding_window!r} must be a positive integer or null")
        check(self.window_pattern is None or (isinstance(self.window_pattern, str) and self.window_pattern != ""
              and set(self.window_pattern) <= {"W", "F"}),
              f"model {self.name!r}: window_pattern={self.window_pattern!r} must be a non-empty string of W "
              "(windowed block) and F (full attention), or null (every block windowed)")
        check(self.window_pattern is None or self.sliding_window is not None,
              f"model {self.name!r}: window_pattern={self.window_pattern!r} needs sliding_window set")
        validate_attention(self)
        validate_oss(self)
        for attr in ("rms_eps", "rope_theta"):
            value = getattr(self, attr)
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
                  f"model {self.name!r}: {attr}={value!r} must be a positive number")
        for attr in ("dropout", "attention_dropout", "embedding_dropout"):
            value = getattr(self, attr)
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1,
                  f"model {self.name!r}: {attr}={value!r} must be a probability in [0, 1)")

    def attention_window(self, i: int) -> int | None:
        """Block `i`'s mask: keys its query sees (its sliding window, itself included), or its attention chunk
        (attention_chunk.Chunk, a chunked rope block), or None for full causal attention."""
        if self.attention_chunk is not None:
            return Chunk(self.attention_chunk) if uses_rope(self, i) else None
        if self.sliding_window is None:
            return None
        pattern = self.window_pattern or "W"
        return self.sliding_window if pattern[i % len(pattern)] == "W" else None

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    def attention_parameters(self) -> int:
        """The llama family's attention of one block (q, k, v, o; MLA's; q/k norms), norms of the block aside."""
        h = self.hidden
        if self.mla is not None:
            return self.mla.attention_parameters(h, self.heads)
        q, kv = self.heads * self.head_dim, self.num_kv_heads * self.head_dim
        return 2 * h * q + 2 * h * kv + (2 * self.head_dim if self.qk_norm else 0) + sink_parameters(self)

    def layer_parameters(self, i: int | None = None) -> int:
        """Parameters of transformer block `i` (None: a dense block; MoE blocks differ: moe_spec.py)."""
        h, f = self.hidden, self.ffn_hidden
        if self.family == "gpt":
            # ln1 + qkv (w, b) + proj (w, b) + ln2 + fc (w, b) + fc2 (w, b)
            return 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)
        # rms1 + attention + rms2 + MLP (gate, up + down; or the MoE block's)
        mlp = self.moe.mlp_parameters(h) if self.moe and i is not None and self.moe.is_moe_layer(i) else 3 * h * f
        return 2 * h + self.attention_parameters() + mlp

    def active_parameters(self) -> int:
        """Parameters one token's forward multiplies by (the routed experts it is sent to only)."""
        if self.moe is None:
            return self.num_parameters()
        k = self.moe.moe_layers(self.layers)
        h = self.hidden
        return self.num_parameters() - k * (self.moe.mlp_parameters(h) - self.moe.active_mlp_parameters(h))

    def embedding_parameters(self) -> int:
        """Token (and learned position) embeddings, final norm and output head."""
        h = self.hidden
        positions = self.seq_len * h if self.family == "gpt" else 0
        final_norm = 2 * h if self.family == "gpt" else h
        head = 0 if self.tied_embeddings else self.vocab * h
        return self.vocab * h + positions + final_norm + head

    def num_parameters(self) -> int:
        if self.moe is None:
            return self.layers * self.layer_parameters() + self.embedding_parameters()
        return sum(self.layer_parameters(i) for i in range(self.layers)) + self.embedding_parameters()

    def to_dict(self) -> dict[str, Any]:
        # The MoE-era fields only where set: plans of dense models read as they did before them.
        data = asdict(self)
        for key, default in (("head_size", None), ("qk_norm", False), ("moe", None), ("mla", None),
                             ("sliding_window", None), ("window_pattern", None), ("attention_chunk", None),
                             ("rope_pattern", None), ("qk_l2_norm", False), ("attention_sinks", False),
                             ("attention_bias", False)):
            if data[key] == default:
                del data[key]
        if data.get("moe") is not None:
            data["moe"] = plan_defaults(data["moe"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "model") -> ModelSpec:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        check(not unknown, f"{source}: unknown model fields {unknown}; valid: {sorted(known)}")
        required = ("name", "layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len")
        missing = sorted(f for f in required if f not in data)
        check(not missing, f"{source}: missing model fields {missing}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ParacubeError(f"{source}: {exc}") from None


def check_dtype_on(dtype: str, device: str, peak_flops: dict[str, float]) -> None:
    """Refuse a dtype the device has no peak for (fp8 without FP8 tensor cores: V100, A100, ...)."""
    check(dtype in peak_flops, f"--dtype {dtype}: device {device} has no {dtype} peak (no FP8 tensor cores); "
          f"valid there: {', '.join(k for k in DTYPE_BYTES if k in peak_flops)}; fp8 runs on H100, H200, B200 "
          "(dgx-h100, dgx-h200, dgx-b200, gb200-nvl72; local-cpu emulates it)")


@dataclass(frozen=True)
class TrainingSpec:
    """How the model is trained.

    `global_batch` sequences of `seq_len` tokens per optimizer step. `dtype` is the compute dtype: the
    parameters' (fp32, or bf16/fp16 with fp32 master weights in the optimizer), with fp32 gradients and fp32
    AdamW state: 16 bytes per parameter in fp32, 18 in bf16/fp16 (cost_models/memory.py, as the executor
    keeps them). fp8 is bf16 with the block linears' GEMMs on FP8 inputs (e4m3 forward, e5m2 gradients,
    per-tensor scales: cost_models/fp8.py): bf16 parameters, fp32 masters, 18 bytes plus the FP8 weight copies;
    no dtype gives FP8 with fp16 master state. Priced on devices with an fp8 peak only.
    """

    global_batch: int = 8
    seq_len: int | None = None  # None: the model's seq_len
    dtype: DType = "fp32"
    recompute: Recompute = "none"
    optimizer: Literal["adamw"] = "adamw"
    # Which implementation's saved activations the memory model counts: "paracube" (this executor, with the
    # layout's attention kernel `fa` and the model's dropout) or "megatron" (Korthikanti et al. 2022: 16-bit
    # activations, dropout, unfused attention's s x s tensors kept).
    activations: Literal["paracube", "megatron"] = "paracube"

    def __post_init__(self) -> None:
        check(isinstance(self.global_batch, int) and self.global_batch > 0,
              f"global batch {self.global_batch!r} must be a positive integer")
        check(self.seq_len is None or (isinstance(self.seq_len, int) and self.seq_len > 0),
              f"sequence length {self.seq_len!r} must be a positive integer")
        check(self.dtype in DTYPE_BYTES, f"dtype {self.dtype!r} is not valid; valid: {', '.join(DTYPE_BYTES)}")
        check(self.recompute in ("none", "selective", "full"),
              f"recompute {self.recompute!r} is not valid; valid: none, selective, full")
        check(self.activations in ("paracube", "megatron"),
              f"activations {self.activations!r} is not valid; valid: paracube, megatron")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def sequence_length(self, model: ModelSpec) -> int:
        return self.seq_len or model.seq_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "training") -> TrainingSpec:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        check(not unknown, f"{source}: unknown training fields {unknown}; valid: {sorted(known)}")
        return cls(**data)


def with_seq_len(model: ModelSpec, seq_len: int | None) -> ModelSpec:
    return model if seq_len is None else replace(model, seq_len=seq_len)


__all__ = ["DTYPE_BYTES", "FP8_RECIPE", "FP8_SCALINGS", "Fp8Recipe", "ModelSpec", "TrainingSpec", "check_dtype_on",
           "with_seq_len"]
