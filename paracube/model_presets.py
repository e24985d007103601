"""The named models (`--model NAME`) and how a name or a config.json path resolves to a ModelSpec.

Presets: GPT-2 (Radford et al. 2019; tied head, as HF GPT2LMHeadModel), the GPT-3 family (Brown et al. 2020,
Table 2.1), LLaMA-2 (Touvron et al. 2023), Llama 3 (Dubey et al. 2024), the MoE models of their HF configs (GPT-OSS
with sliding-window attention, Llama 4 Scout and Maverick), and
`tiny`, the embedded default that trains in seconds on CPU ranks. Anything else that names an existing path is
read as a Hugging Face `config.json` (hf_config.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paracube.errors import check, unknown
from paracube.gpt_oss_spec import SWIGLU_LIMIT
from paracube.hf_config import from_hf_config
from paracube.moe_spec import MLASpec, MoESpec
from paracube.workload import ModelSpec


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 50257,
         tied: bool = False) -> ModelSpec:
    # Dropout 0.1 everywhere: Megatron-LM's GPT default (hidden_dropout = attention_dropout = 0.1), and GPT-2's.
    return ModelSpec(name, layers, hidden, heads, 4 * hidden, vocab, seq, tied_embeddings=tied, dropout=0.1,
                     attention_dropout=0.1, embedding_dropout=0.1)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int = 32000,
           seq: int = 4096, **kw: Any) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, ffn, vocab, seq, family="llama", kv_heads=kv, **kw)


def _llama3(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    # Llama 3 / 3.1 (Dubey et al. 2024, Table 3; HF meta-llama/Llama-3.1-*/config.json): 8 KV heads, vocabulary
    # 128,256, rotary base 500,000, RMSNorm eps 1e-5, untied; pretrained at 8,192 tokens (3.1's 128K context is a
    # later stage: --seq to plan it).
    return _llama(name, layers, hidden, heads, 8, ffn, vocab=128256, seq=8192, rope_theta=500000.0, rms_eps=1e-5)


def _moe(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, moe: MoESpec,
         **kw: Any) -> ModelSpec:
    # Sequence 4096: the pretraining length of DeepSeek-V3 (arXiv 2412.19437 Section 4.2) and Qwen3's first
    # stage; Mixtral's is not published, 4096 is Megatron-core's MoE examples'.
    return ModelSpec(name, layers, hidden, heads, ffn, vocab, kw.pop("seq_len", 4096), family="llama", kv_heads=kv,
                     moe=moe, rope_theta=kw.pop("rope_theta", 1e6), **kw)


# HF config.json of each (mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1, Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B,
# deepseek-ai/DeepSeek-V3, openai/gpt-oss-120b, gpt-oss-20b); tests/test_moe_workload.py (test_sliding_window.py:
# GPT-OSS) checks the published parameter counts.
MOE_PRESETS = [
    _moe("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, MoESpec(8, 2, 14336, aux_loss=0.02), rms_eps=1e-5),
    _moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, MoESpec(8, 2, 16384, aux_loss=0.001), rms_eps=1e-5),
    _moe("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, MoESpec(128, 8, 768, aux_loss=0.001), head_size=128,
         qk_norm=True),
    _moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, MoESpec(128, 8, 1536, aux_loss=0.001), head_size=128,
         qk_norm=True),
    _moe("deepseek-v3", 61, 7168, 128, 128, 18432, 129280,
         MoESpec(256, 8, 2048, shared_ffn=2048, router="sigmoid", first_dense=3, aux_loss=0.0001,
                 groups=8, group_topk=4), rope_theta=10000.0,
         mla=MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536)),
    # openai/gpt-oss-120b and gpt-oss-20b (HF config.json; gpt_oss_spec.py: attention sinks, q / k / v / o biases,
    # router and expert biases, the SwiGLU clamped at 7.0; hf_moe.py: YaRN is not modelled): head_dim 64 (not
    # 2880 / 64), softmax over the top-4 router logits, alternating sliding-window (128 keys) and full attention from
    # block 0; 4096: their initial_context_length.
    *(_moe(name, layers, 2880, 64, 8, 2880, 201088,
           MoESpec(experts, 4, 2880, aux_loss=0.9, expert_bias=True, swiglu_limit=SWIGLU_LIMIT), head_size=64,
           rope_theta=150000.0, rms_eps=1e-5, sliding_window=128, window_pattern="WF", attention_sinks=True,
           attention_bias=True)
      for name, layers, experts in (("gpt-oss-120b", 36, 128), ("gpt-oss-20b", 24, 32))),
    # meta-llama/Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E (HF config.json text_config; hf_llama4.py says
    # what is not modelled: the vision tower, 871.9M parameters, the L2 q / k norm, NoPE's skipped rotary, attention
    # temperature tuning): top-1 sigmoid routing scaling the expert's input, one shared expert of 8192, dense blocks
    # of 16384 between Maverick's MoE blocks (1, 3, 5, ...), NoPE every 4th block, attention within chunks of 8192
    # tokens (8192: the longest sequence priced, where chunked attention is plain causal attention). Text model
    # 107.77B / 400.71B parameters (109B / 400B published with the vision tower: tests/test_llama4.py), 17.2B active.
    *(_moe(name, 48, 5120, 40, 8, 16384, 202048, MoESpec(experts, 1, 8192, shared_ffn=8192, router="sigmoid",
                                                          sparse_step=step, aux_loss=0.001, probs_on_input=True),
           rope_theta=500000.0, rms_eps=1e-5, seq_len=8192, attention_chunk=8192, rope_pattern="RRRN",
           qk_l2_norm=l2)
      for name, experts, step, l2 in (("llama4-scout", 16, 1, True), ("llama4-maverick", 128, 2, False))),
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
    _llama3("llama3-8b", 32, 4096, 32, 14336),
    _llama3("llama3-70b", 80, 8192, 64, 28672),
    _llama3("llama3-405b", 126, 16384, 128, 53248),
    *MOE_PRESETS,
]}

DEFAULT_MODEL = "tiny"


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


__all__ = ["DEFAULT_MODEL", "MOE_PRESETS", "PRESETS", "resolve_model"]
