"""MoE and MLA models: presets against their published parameter counts, HF configs read as transformers
reads them (moe_spec.py, hf_moe.py), plan-file round trip, and bad input refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paracube.errors import ParacubeError
from paracube.hf_config import from_hf_config
from paracube.model_presets import PRESETS
from paracube.moe_spec import MoESpec
from paracube.workload import ModelSpec

# (total, active) in billions as the model cards publish them, to the digits they print. DeepSeek-V3's card
# says 671B main-model parameters (685B with the 14B multi-token-prediction module, not counted here).
PUBLISHED = {"mixtral-8x7b": (46.7, 12.9), "mixtral-8x22b": (140.6, 39.2), "qwen3-30b-a3b": (30.5, 3.3),
             "qwen3-235b-a22b": (235.1, 22.2), "deepseek-v3": (671.0, 37.6)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_have_the_published_parameter_counts(name: str) -> None:
    total, active = PUBLISHED[name]
    m = PRESETS[name]
    # within 0.06B: the cards round (12.88 -> 12.9) or cut (Qwen3's 3.35 -> 3.3) to one decimal
    assert abs(m.num_parameters() / 1e9 - total) < 0.06
    assert abs(m.active_parameters() / 1e9 - active) < 0.06


def test_tiny_moe_is_top2_of_8_with_one_shared_expert() -> None:
    moe = PRESETS["tiny-moe"].moe
    assert moe is not None and (moe.experts, moe.top_k, moe.shared_ffn == moe.expert_ffn) == (8, 2, True)
    assert moe.moe_layers(PRESETS["tiny-moe"].layers) == 2


def _config(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_hf_configs_of_moe_models_match_the_presets(tmp_path: Path) -> None:
    mixtral = from_hf_config(_config(tmp_path, {"model_type": "mixtral", "max_position_embeddings": 4096,
                                                "router_aux_loss_coef": 0.02}))
    assert mixtral.num_parameters() == PRESETS["mixtral-8x7b"].num_parameters()
    qwen = from_hf_config(_config(tmp_path, {
        "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 48, "head_dim": 128,
        "max_position_embeddings": 40960, "sliding_window": None, "use_sliding_window": False}))
    assert (qwen.num_parameters(), qwen.head_dim) == (PRESETS["qwen3-30b-a3b"].num_parameters(), 128)
    ds = from_hf_config(_config(tmp_path, {"model_type": "deepseek_v3"}))
    assert ds.num_parameters() == PRESETS["deepseek-v3"].num_parameters()
    assert ds.moe is not None and ds.moe.router == "sigmoid" and ds.mla is not None and ds.mla.kv_per_token() == 576


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-mla", "deepseek-v3"])
def test_moe_models_round_trip_through_the_plan_dict(name: str) -> None:
    m = PRESETS[name]
    assert ModelSpec.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert "moe" not in PRESETS["tiny"].to_dict()  # dense plans read as before


@pytest.mark.parametrize(("data", "message"), [
    ({"model_type": "qwen3_moe", "num_experts": 64, "moe_intermediate_size": None},
     "field 'moe_intermediate_size' must be an integer"),
    ({"model_type": "deepseek_v3", "n_routed_experts": 64, "moe_intermediate_size": 512, "num_experts_per_tok": 128},
     r"top_k=128 > experts=64; valid: 1..64"),
    ({"model_type": "qwen2_moe"}, r"'qwen2_moe' is not supported \(its q/k/v projections have biases\)"),
    ({"model_type": "qwen3_moe", "mlp_only_layers": [3]}, "field 'mlp_only_layers'=\\[3\\] is not supported"),
])
def test_bad_moe_configs_are_refused_in_one_line(tmp_path: Path, data: dict, message: str) -> None:
    with pytest.raises(ParacubeError, match=message):
        from_hf_config(_config(tmp_path, data))


def test_a_routed_expert_config_missing_its_sizes_is_refused(tmp_path: Path) -> None:
    # A real qwen3_moe config.json always writes moe_intermediate_size; one naming experts without it is cut.
    data = {"model_type": "qwen3_moe", "num_experts": 64}
    with pytest.raises(ParacubeError, match="num_experts=64 routed experts but no 'moe_intermediate_size'"):
        from_hf_config(_config(tmp_path, data))
    with pytest.raises(ParacubeError, match=r"moe is missing \['expert_ffn'\]"):
        ModelSpec.from_dict({**PRESETS["tiny-moe"].to_dict(), "moe": {"experts": 8, "top_k": 2}})
    with pytest.raises(ParacubeError, match="moe blocks need family llama"):
        ModelSpec("x", 2, 64, 4, 128, 256, 64, moe=MoESpec(8, 2, 32))
