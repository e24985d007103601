"""What is trained: the model's shape (ModelSpec) and how it is trained (TrainingSpec).

Presets: GPT-2 (Radford et al. 2019; tied head, as HF GPT2LMHeadModel), the GPT-3 family (Brown et al. 2020,
Table 2.1), LLaMA-2 (Touvron et al. 2023), and `tiny`, the embedded default that trains in seconds on CPU ranks.
A Hugging Face `config.json` of model_type gpt2, llama or mistral loads as well, read as transformers
reads it: a field the file omits takes the default of that model_type's config class (`HF_DEFAULTS`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from paracube.errors import ParacubeError, check, unknown
from paracube.hf_moe import MOE_HF_DEFAULTS, moe_fields
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
        for attr in ("rms_eps", "rope_theta"):
            value = getattr(self, attr)
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
                  f"model {self.name!r}: {attr}={value!r} must be a positive number")
        for attr in ("dropout", "attention_dropout", "embedding_dropout"):
            value = getattr(self, attr)
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1,
                  f"model {self.name!r}: {attr}={value!r} must be a probability in [0, 1)")

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
        return 2 * h * q + 2 * h * kv + (2 * self.head_dim if self.qk_norm else 0)

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
        for key, default in (("head_size", None), ("qk_norm", False), ("moe", None), ("mla", None)):
            if data[key] == default:
                del data[key]
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


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 50257,
         tied: bool = False) -> ModelSpec:
    # Dropout 0.1 everywhere: Megatron-LM's GPT default (hidden_dropout = attention_dropout = 0.1), and GPT-2's.
    return ModelSpec(name, layers, hidden, heads, 4 * hidden, vocab, seq, tied_embeddings=tied, dropout=0.1,
                     attention_dropout=0.1, embedding_dropout=0.1)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, ffn, 32000, 4096, family="llama", kv_heads=kv)


def _moe(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, moe: MoESpec,
         **kw: Any) -> ModelSpec:
    # Sequence 4096: the pretraining length of DeepSeek-V3 (arXiv 2412.19437 Section 4.2) and Qwen3's first
    # stage; Mixtral's is not published, 4096 is Megatron-core's MoE examples'.
    return ModelSpec(name, layers, hidden, heads, ffn, vocab, 4096, family="llama", kv_heads=kv, moe=moe,
                     rope_theta=kw.pop("rope_theta", 1e6), **kw)


# HF config.json of each (mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1, Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B,
# deepseek-ai/DeepSeek-V3); tests/test_moe_workload.py checks the published parameter counts.
MOE_PRESETS = [
    _moe("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, MoESpec(8, 2, 14336, aux_loss=0.02), rms_eps=1e-5),
    _moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, MoESpec(8, 2, 16384, aux_loss=0.001), rms_eps=1e-5),
    _moe("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, MoESpec(128, 8, 768, aux_loss=0.001), head_size=128,
         qk_norm=True),
    _moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, MoESpec(128, 8, 1536, aux_loss=0.001), head_size=128,
         qk_norm=True),
    _moe("deepseek-v3", 61, 7168, 128, 128, 18432, 129280,
         MoESpec(256, 8, 2048, shared_ffn=2048, router="sigmoid", first_dense=3, aux_loss=0.0001), rope_theta=10000.0,
         mla=MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536)),
    # For tests and the local machine: top-2 of 8 small experts and one shared expert; tiny-mla: MLA, block 0 dense.
    ModelSpec("tiny-moe", layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=256, seq_len=64, family="llama",
              moe=MoESpec(8, 2, 32, shared_ffn=32, aux_loss=0.01)),
    ModelSpec("tiny-mla", layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=256, seq_len=64, family="llama",
              moe=MoESpec(8, 2, 32, shared_ffn=32, router="sigmoid", first_dense=1),
              mla=MLASpec(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, q_lora_rank=32)),
]

PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    # The embedded default: trains in seconds on 8 CPU ranks in any layout up to a 2x2x2 cube.
    ModelSpec("tiny", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=256, seq_len=64),
    ModelSpec("small", layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128),
    _gpt("gpt2-small", 12, 768, 12, seq=1024, tied=True),
    _gpt("gpt2-medium", 24, 1024, 16, seq=1024, tied=True),
    _gpt("gpt2-large", 36, 1280, 20, seq=1024, tied=True),
    _gpt("gpt2-xl", 48, 1600, 25, seq=1024, tied=True),
    _gpt("gpt3-125m", 12, 768, 12),
    _gpt("gpt3-350m", 24, 1024, 16),
    _gpt("gpt3-760m", 24, 1536, 16),
    # Table 2.1 lists 24 heads of 128 for 1.3B (24 x 128 != 2048); 16 heads of 128 keep d_head and d_model.
    _gpt("gpt3-1.3b", 24, 2048, 16),
    _gpt("gpt3-2.7b", 32, 2560, 32),
    _gpt("gpt3-6.7b", 32, 4096, 32),
    # Table 2.1 prints d_model=5140 for 13B; 5120 (= 40 x 128) is the value that divides its 40 heads.
    _gpt("gpt3-13b", 40, 5120, 40),
    _gpt("gpt3-175b", 96, 12288, 96),
    _llama("llama2-7b", 32, 4096, 32, 32, 11008),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672),
    *MOE_PRESETS,
]}

DEFAULT_MODEL = "tiny"


def config_name(path: Path, name_or_path: object = None) -> str:
    """The name a config.json model shows in headers: its `_name_or_path` (last part), else the file's
    name (`llama-7b.json` -> llama-7b; `.../llama-7b/config.json` -> llama-7b)."""
    if isinstance(name_or_path, str) and name_or_path.strip().strip("/"):
        return name_or_path.strip().rstrip("/").split("/")[-1]
    if path.name == "config.json":
        parent = path.resolve().parent.name
        return parent or "config"
    return path.stem


# What transformers fills in for a field a config.json omits: the defaults of each model_type's config
# class (transformers 4.x: models/gpt2/configuration_gpt2.py GPT2Config, models/llama/configuration_llama.py
# LlamaConfig, models/mistral/configuration_mistral.py MistralConfig). None: derived (n_inner -> 4 n_embd,
# num_key_value_heads -> num_attention_heads).
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "n_positions": 1024,
             "vocab_size": 50257, "tie_word_embeddings": True, "resid_pdrop": 0.1, "attn_pdrop": 0.1,
             "embd_pdrop": 0.1},
    "llama": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": None, "max_position_embeddings": 2048, "vocab_size": 32000,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "attention_dropout": 0.0},
    "mistral": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "max_position_embeddings": 131072, "vocab_size": 32000,
                "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 4096,
                "attention_dropout": 0.0},
    **MOE_HF_DEFAULTS,  # mixtral, qwen3_moe, deepseek_v3 (hf_moe.py)
}
# model_type of each `architectures` name, for configs that omit model_type.
_ARCHITECTURES = {"GPT2LMHeadModel": "gpt2", "GPT2Model": "gpt2", "LlamaForCausalLM": "llama",
                  "LlamaModel": "llama", "MistralForCausalLM": "mistral", "MistralModel": "mistral",
                  "MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3_moe",
                  "DeepseekV3ForCausalLM": "deepseek_v3"}
# Decoder configs that look alike but are other models (why they are not the gpt or llama family).
_OTHER_MODELS = {"qwen2": "its q/k/v projections have biases",
                 "qwen2_moe": "its q/k/v projections have biases", "gpt_neox": "parallel attention, partial rotary",
                 "opt": "ReLU MLP, offset learned positions"}
# Keys of llama/mistral configs that would make a different model than the llama family (value allowed).
_LLAMA_MUST = {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "rope_scaling": None}


def _hf_model_type(data: dict[str, Any], path: Path) -> str:
    model_type = data.get("model_type")
    if model_type is None:
        archs = data.get("architectures") or []
        check(isinstance(archs, list) and all(isinstance(a, str) for a in archs),
              f"{path}: field 'architectures' must be a list of names, got {archs!r}")
        model_type = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
        check(model_type is not None, f"{path}: no model_type and no known architectures ({archs}); "
              f"supported model_type: {', '.join(HF_DEFAULTS)}")
    why = f" ({_OTHER_MODELS[model_type]})" if model_type in _OTHER_MODELS else ""
    check(model_type in HF_DEFAULTS, f"{path}: model_type {model_type!r} is not supported{why}; "
          f"supported: {', '.join(HF_DEFAULTS)}")
    return str(model_type)


def from_hf_config(path: Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json`, omitted fields taking HF_DEFAULTS of its model_type."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ParacubeError(f"cannot read model config {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ParacubeError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    check(isinstance(data, dict), f"{path}: expected a JSON object with model hyper-parameters")
    model_type = _hf_model_type(data, path)
    defaults = HF_DEFAULTS[model_type]

    def get(key: str, kind: type | tuple[type, ...] = int, nullable: bool = False) -> Any:
        """The file's value, else the class default; null only where transformers derives the value."""
        value = data[key] if key in data else defaults.get(key)
        ok = isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool)
        check(ok or (value is None and (nullable or defaults.get(key, 0) is None)),
              f"{path}: field {key!r} must be {_KIND_NAMES[kind]}, got {value!r}")
        return value

    name = config_name(path, data.get("_name_or_path"))
    if model_type == "gpt2":
        hidden = get("n_embd")
        return ModelSpec(name=str(name), layers=get("n_layer"), hidden=hidden, heads=get("n_head"),
                         ffn_hidden=get("n_inner") or 4 * hidden, vocab=get("vocab_size"),
                         seq_len=get("n_positions"), family="gpt", tied_embeddings=get("tie_word_embeddings", bool),
                         dropout=float(get("resid_pdrop", (int, float))),
                         attention_dropout=float(get("attn_pdrop", (int, float))),
                         embedding_dropout=float(get("embd_pdrop", (int, float))))
    for key, allowed in _LLAMA_MUST.items():
        check(data.get(key, allowed) == allowed, f"{path}: field {key!r}={data.get(key)!r} is not supported "
              f"by the llama family (valid: {allowed!r})")
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    extra = moe_fields(model_type, data, get, path) if model_type in MOE_HF_DEFAULTS else {}
    check(data.get("head_dim") in (None, hidden // max(heads or 1, 1)) or "head_size" in extra,
          f"{path}: field 'head_dim'={data.get('head_dim')!r} must be hidden_size / num_attention_heads")
    seq_len = get("max_position_embeddings")
    if "sliding_window" in defaults and data.get("use_sliding_window") is not False:
        window = get("sliding_window", nullable=True)
        check(window is None or window >= seq_len, f"{path}: field 'sliding_window'={window} < "
              f"max_position_embeddings={seq_len}: sliding-window attention is not the llama family's (use null)")
    return ModelSpec(name=str(name), layers=get("num_hidden_layers"), hidden=hidden, heads=heads,
                     ffn_hidden=get("intermediate_size"), vocab=get("vocab_size"), seq_len=seq_len,
                     family="llama", kv_heads=get("num_key_value_heads") or heads,
                     tied_embeddings=get("tie_word_embeddings", bool), rms_eps=float(get("rms_norm_eps", (int, float))),
                     rope_theta=float(get("rope_theta", (int, float))),
                     attention_dropout=float(get("attention_dropout", (int, float))), **extra)


_KIND_NAMES: dict[Any, str] = {int: "an integer", bool: "true or false", (int, float): "a number"}


def resolve_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a Hugging Face config.json by path."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        check(path.exists(), f"model config file {str(path)!r} does not exist")
        return from_hf_config(path)
    raise unknown("model", name_or_path, PRESETS, " (or a path to a Hugging Face config.json)")


def with_seq_len(model: ModelSpec, seq_len: int | None) -> ModelSpec:
    return model if seq_len is None else replace(model, seq_len=seq_len)


__all__ = ["DEFAULT_MODEL", "DTYPE_BYTES", "FP8_RECIPE", "HF_DEFAULTS", "PRESETS", "Fp8Recipe", "ModelSpec",
           "TrainingSpec", "check_dtype_on", "from_hf_config", "resolve_model", "with_seq_len"]
