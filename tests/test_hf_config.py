"""Hugging Face config.json read as transformers reads it: omitted fields take the defaults of the
model_type's config class (hf_config.HF_DEFAULTS, from transformers' GPT2Config / LlamaConfig /
MistralConfig), tie_word_embeddings is honoured by the counts, and configs of another model are refused
with one line naming the field or the model_type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paracube.cli.main import main
from paracube.cost_models.dims import dims_of, local_params
from paracube.cost_models.local_parameters import local_parameter_count
from paracube.errors import ParacubeError
from paracube.hf_config import from_hf_config
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import TrainingSpec


def _config(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_empty_llama_config_is_llama_7b_as_transformers_builds_it(tmp_path: Path) -> None:
    # LlamaConfig(): hidden 4096, ffn 11008, 32 layers, 32 heads, kv = heads, 2048 positions, vocab 32000, untied.
    spec = from_hf_config(_config(tmp_path, {"model_type": "llama"}))
    assert (spec.hidden, spec.ffn_hidden, spec.layers, spec.heads, spec.num_kv_heads, spec.seq_len, spec.vocab) == (
        4096, 11008, 32, 32, 32, 2048, 32000)
    assert spec.family == "llama" and not spec.tied_embeddings and spec.rms_eps == 1e-6
    assert spec.num_parameters() == 6_738_415_616  # LLaMA-7B as published (Touvron et al. 2023, HF model card)


def test_empty_gpt2_config_is_gpt2_small_tied(tmp_path: Path) -> None:
    # GPT2Config(): n_embd 768, 12 layers, 12 heads, n_inner None -> 3072, 1024 positions, vocab 50257, tied.
    spec = from_hf_config(_config(tmp_path, {"architectures": ["GPT2LMHeadModel"]}))
    assert (spec.hidden, spec.ffn_hidden, spec.layers, spec.heads, spec.seq_len, spec.vocab) == (
        768, 3072, 12, 12, 1024, 50257)
    assert spec.tied_embeddings and spec.num_parameters() == 124_439_808  # GPT-2 small, tied head
    assert spec.num_parameters() == PRESETS["gpt2-small"].num_parameters()  # the preset is tied too
    untied = from_hf_config(_config(tmp_path, {"model_type": "gpt2", "tie_word_embeddings": False}))
    assert untied.num_parameters() == spec.num_parameters() + spec.vocab * spec.hidden


def test_tied_embeddings_are_counted_alike_by_every_count(tmp_path: Path) -> None:
    spec = from_hf_config(_config(tmp_path, {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                                             "vocab_size": 256, "n_positions": 64}))
    d = dims_of(spec, TrainingSpec())
    for text in ("dp=1", "dp=1,tp=1d:4"):
        layout = parse_layout(text)
        closed = local_params(d, layout.mode, layout.tensor_size, layout.q, d.L, True, True)
        assert closed == local_parameter_count(layout, d)
    assert local_parameter_count(parse_layout("dp=1"), d) == spec.num_parameters()


def test_mistral_maps_to_llama_when_its_fields_match(tmp_path: Path) -> None:
    spec = from_hf_config(_config(tmp_path, {"model_type": "mistral", "sliding_window": None}))
    assert spec.family == "llama" and spec.num_kv_heads == 8 and spec.ffn_hidden == 14336
    assert spec.num_parameters() == 7_241_732_096  # Mistral-7B (HF model card)


@pytest.mark.parametrize(("data", "message"), [
    ({"model_type": "qwen2"}, r"model_type 'qwen2' is not supported \(its q/k/v projections have biases\); "
                              "supported: gpt2, llama, mistral, mixtral, qwen3_moe, deepseek_v3, gpt_oss"),
    ({"model_type": "gpt_neox"}, "model_type 'gpt_neox' is not supported"),
    ({"architectures": ["OPTForCausalLM"]}, "no model_type and no known architectures"),
    ({"model_type": "mistral", "sliding_window": 0}, "field 'sliding_window'=0 must be a positive integer"),
    ({"model_type": "llama", "attention_bias": True}, "field 'attention_bias'=True is not supported"),
    ({"model_type": "llama", "hidden_act": "gelu"}, "field 'hidden_act'='gelu' is not supported"),
    ({"model_type": "llama", "num_key_value_heads": 5}, "heads=32 is not divisible by kv_heads=5"),
    ({"model_type": "llama", "hidden_size": None}, "field 'hidden_size' must be an integer, got None"),
    ({"model_type": "gpt2", "tie_word_embeddings": "yes"}, "field 'tie_word_embeddings' must be true or false"),
])
def test_configs_of_other_models_are_refused_in_one_line(tmp_path: Path, data: dict, message: str) -> None:
    with pytest.raises(ParacubeError, match=message):
        from_hf_config(_config(tmp_path, data))


def test_cli_refuses_a_bad_config_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 3,
                              "hidden_size": 64})
    code = main(["plan", "--model", str(path), "--cluster", "local-cpu", "--gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "heads=8 is not divisible by kv_heads=3" in err and len(err.strip().splitlines()) == 1
