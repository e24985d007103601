"""Llama 4 (Scout, Maverick): HF llama4 / llama4_text configs read as transformers builds them (hf_llama4.py), the
presets against their published sizes and a count of modeling_llama4's own modules, sequences beyond one attention
chunk refused in one line, the executor's refusal, the plan of Scout on 64 H100s, and both engines alike."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from paracube.cli.main import main
from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.errors import ParacubeError
from paracube.executor import check_divisibility
from paracube.export import export_plan
from paracube.hf_config import from_hf_config
from paracube.hf_llama4 import vision_parameters
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.plan import LaunchSpec, Plan
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

# meta-llama/Llama-4-Scout-17B-16E's and Llama-4-Maverick-17B-128E's vision_config (the same tower in both)
VISION = {"model_type": "llama4_vision_model", "hidden_size": 1408, "image_size": 336, "intermediate_size": 5632,
          "num_attention_heads": 16, "num_hidden_layers": 34, "patch_size": 14, "pixel_shuffle_ratio": 0.5,
          "projector_input_dim": 4096, "projector_output_dim": 4096, "vision_output_dim": 4096, "norm_eps": 1e-05}
SCOUT_TEXT = {"model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128, "hidden_act": "silu",
              "hidden_size": 5120, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760, "num_attention_heads": 40,
              "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
              "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
              "use_qk_norm": True, "vocab_size": 202048}
SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": SCOUT_TEXT,
         "vision_config": VISION, "tie_word_embeddings": False}
MAVERICK_TEXT = {**SCOUT_TEXT, "interleave_moe_layer_step": 2, "num_local_experts": 128, "use_qk_norm": False,
                 "max_position_embeddings": 1048576, "rope_scaling": None,
                 "moe_layers": list(range(1, 48, 2)), "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)]}
MAVERICK = {**SCOUT, "text_config": MAVERICK_TEXT}
TRAIN = TrainingSpec(global_batch=32, dtype="bf16", recompute="selective")


def _config(tmp_path: Path, data: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _hf_text_parameters(c: dict[str, Any]) -> int:
    """The reference: modeling_llama4's Llama4ForCausalLM parameter shapes, module by module (transformers 4.57):
    embed_tokens, per block two RMSNorms, q / k / v / o (no biases), Llama4TextMoe (experts gate_up_proj [E, h, 2f]
    and down_proj [E, f, h], Llama4Router = Linear(h, E, bias=False), shared_expert MLP of f) at moe_layers, else
    Llama4TextMLP of intermediate_size_mlp; the final norm and the untied lm_head."""
    h, f, hd, e, n = (c["hidden_size"], c["intermediate_size"], c["head_dim"], c["num_local_experts"],
                      c["num_hidden_layers"])
    step = c["interleave_moe_layer_step"]
    moe_layers = c.get("moe_layers") or list(range(step - 1, n, step))
    attention = h * c["num_attention_heads"] * hd * 2 + h * c["num_key_value_heads"] * hd * 2
    moe = e * h * 2 * f + e * f * h + h * e + 3 * h * f
    dense = 3 * h * c["intermediate_size_mlp"]
    blocks = sum(2 * h + attention + (moe if i in moe_layers else dense) for i in range(n))
    return c["vocab_size"] * h * 2 + h + blocks


def test_the_published_configs_read_as_the_presets(tmp_path: Path) -> None:
    """Scout's llama4 config (text_config), Maverick's, a bare llama4_text config and an empty llama4 config
    (Llama4TextConfig's defaults, which are Scout's) read as the presets, but for the name."""
    cases = [(SCOUT, "llama4-scout"), (MAVERICK, "llama4-maverick"), (SCOUT_TEXT, "llama4-scout"),
             ({"model_type": "llama4"}, "llama4-scout"), ({"model_type": "llama4_text"}, "llama4-scout")]
    for data, preset in cases:
        read = from_hf_config(_config(tmp_path, data))
        assert replace(read, name=preset) == PRESETS[preset], (data.get("model_type"), preset)


@pytest.mark.parametrize("data", [SCOUT, MAVERICK])
def test_parameters_are_modeling_llama4s_count(tmp_path: Path, data: dict[str, Any]) -> None:
    """Equal to the module-by-module count but for the sigmoid router's score-correction bias MoESpec counts
    (experts per MoE block; Llama4Router has none: hf_llama4.py), an exact integer identity."""
    model = from_hf_config(_config(tmp_path, data))
    assert model.moe is not None
    bias = model.moe.experts * model.moe.moe_layers(model.layers)
    assert model.num_parameters() - bias == _hf_text_parameters(data["text_config"])


# Published (Meta's Llama 4 model cards): 109B total with the vision tower, 17B active; 400B total, 17B active. The
# figures are rounded: the bound is half a unit of the last printed digit for 109B and 17B (0.5B), and 0.5% for
# 400B (printed to one significant figure; 401.6B counted with the tower).
@pytest.mark.parametrize(("data", "preset", "total", "total_bound"), [(SCOUT, "llama4-scout", 109e9, 0.5e9),
                                                                      (MAVERICK, "llama4-maverick", 400e9, 2e9)])
def test_presets_have_the_published_sizes(data: dict[str, Any], preset: str, total: float,
                                          total_bound: float) -> None:
    model = PRESETS[preset]
    vision = vision_parameters(data, model.hidden)
    assert vision == 871_932_416  # the size hf_llama4.py states, from Llama4VisionModel's and the projector's shapes
    assert abs(model.num_parameters() + vision - total) <= total_bound
    assert abs(model.active_parameters() - 17e9) <= 0.5e9


@pytest.mark.parametrize(("data", "message"), [
    ({"model_type": "llama4", "text_config": [1]}, "field 'text_config' must be a JSON object"),
    ({"model_type": "llama4", "text_config": {"model_type": "llama"}}, "text_config has model_type 'llama'"),
    ({**SCOUT_TEXT, "moe_layers": [0, 5]}, "field 'moe_layers'=[0, 5] is not supported; valid: null or every k-th"),
    ({**SCOUT_TEXT, "no_rope_layers": [1, 0]}, "field 'no_rope_layers'=[1, 0] must be a list of 1 (rope) / 0"),
    ({**SCOUT_TEXT, "layer_types": ["full_attention"] * 48}, "field 'layer_types' other than no_rope_layers'"),
    ({**SCOUT_TEXT, "interleave_moe_layer_step": 0}, "field 'interleave_moe_layer_step'=0 must be a positive"),
    ({**SCOUT_TEXT, "attention_chunk_size": 0}, "field 'attention_chunk_size'=0 must be a positive"),
    ({"model_type": "llama4_text", "no_rope_layer_interval": 0}, "field 'no_rope_layer_interval'=0 must be"),
    ({"model_type": "llama4_text", "num_attention_heads": 0}, "field 'num_attention_heads'=0 must be a positive"),
    ({"model_type": "llama4_text", "use_qk_norm": 1}, "field 'use_qk_norm' must be true or false, got 1"),
])
def test_bad_configs_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any],
                                        message: str) -> None:
    path = _config(tmp_path, data)
    with pytest.raises(ParacubeError, match=None) as refused:
        from_hf_config(path)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    code = main(["plan", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_plan_scout_on_64_h100s_says_why_its_ep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "llama4-scout", "--cluster", "dgx-h100", "--gpus", "64",
                 "-o", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert code == 0 and plan["model"]["attention_chunk"] == 8192 and plan["model"]["rope_pattern"] == "RRRN"
    assert ModelSpec.from_dict(plan["model"]) == PRESETS["llama4-scout"]
    ep = parse_layout(plan["layout"]).ep
    assert ep > 1 and f"ep={ep} chosen" in out  # the why line of expert parallelism


# The existing bound (tests/test_moe_cost.py): the same closed forms, the event engine's link sharing and
# pipeline schedule differ, hence 2%.
@pytest.mark.parametrize(("name", "text"), [("llama4-scout", "dp=4,ep=4,tp=1d:4,sp,mb=1,zero=1"),
                                             ("llama4-maverick", "dp=4,pp=2,ep=4,tp=1d:2,sp,mb=1,zero=1")])
def test_engines_agree_within_2_percent(name: str, text: str) -> None:
    topo, model, layout = load_topology("dgx-h100", gpus=16), PRESETS[name], parse_layout(text)
    a = estimate(model, TRAIN, layout, topo, with_events=False)
    e = estimate_event(model, TRAIN, layout, topo, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


@pytest.mark.parametrize("change", [{"rope_pattern": "RN"}, {"qk_l2_norm": True}, {"attention_chunk": 32},
                                    {"moe": replace(PRESETS["tiny-moe"].moe, probs_on_input=True)}])
def test_the_executor_builds_each_llama4_feature(change: dict[str, Any]) -> None:
    """tiny-moe with one Llama 4 feature passes the executor's checks before launch (tests/test_sliding_window_run.py
    runs them against the serial model)."""
    check_divisibility(replace(PRESETS["tiny-moe"], **change), parse_layout("dp=2,ep=2,tp=none,mb=1"), 1, 8, 64)


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_pattern": "RN"}, "rope_pattern='RN', qk_l2_norm=False need family llama without mla"),
    ({"qk_l2_norm": True}, "need family llama without mla (rotary grouped-query attention), got family 'gpt'"),
    ({"attention_chunk": 0}, "attention_chunk=0 must be a positive integer"),
    ({"attention_chunk": 16, "sliding_window": 8}, "attention_chunk=16 with sliding_window=8: one mask per block")])
def test_llama4_fields_a_model_cannot_have_are_refused_in_one_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ParacubeError, match=None) as refused:
        replace(PRESETS["tiny"], **change)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_megatron_refuses_scores_on_the_input_beyond_top_1() -> None:
    """megatron-core's experts assert moe_router_topk == 1 for moe_apply_probs_on_input: top-2 refused in one line."""
    scout = PRESETS["llama4-scout"]
    assert scout.moe is not None
    model = replace(scout, moe=replace(scout.moe, top_k=2))
    lay = parse_layout("dp=8,ep=8,tp=none,mb=1")
    plan = Plan(model, TRAIN, lay, "dgx-h100", 8, LaunchSpec(nproc_per_node=8, nnodes=1), runtime="megatron")
    with pytest.raises(ParacubeError, match=None) as refused:
        export_plan(plan, "megatron")
    assert "top-1 routing only (moe_apply_probs_on_input); top_k=2" in str(refused.value)
    assert "\n" not in str(refused.value)
