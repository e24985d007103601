"""Core types: model presets, layouts and their rank grids, the plan file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paracube.errors import ParacubeError
from paracube.estimate import CommEvent, traffic_difference
from paracube.hf_config import from_hf_config
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS, resolve_model
from paracube.plan import default_plan, load_plan, plan_from_dict
from paracube.workload import ModelSpec


def test_gpt_parameter_count_by_hand() -> None:
    """tiny: h=64, f=256, V=256, s=64, L=2, untied.
    block = ln1 2h + qkv (3h^2 + 3h) + proj (h^2 + h) + ln2 2h + fc (hf + f) + fc2 (fh + h)
          = 128 + 12480 + 4160 + 128 + 16640 + 16448 = 49984
    embeddings = tok V h 16384 + pos s h 4096 + ln_f 2h 128 + head h V 16384 = 36992"""
    m = PRESETS["tiny"]
    assert m.layer_parameters() == 49984
    assert m.embedding_parameters() == 36992
    assert m.num_parameters() == 2 * 49984 + 36992


def test_published_sizes() -> None:
    # GPT-2 small with a tied head is the published 124M; LLaMA-2 70B is 68.98B (HF model card: 68,976,648,192).
    gpt2 = PRESETS["gpt2-small"]
    assert gpt2.tied_embeddings and gpt2.num_parameters() == 124_439_808  # HF GPT2LMHeadModel's count
    assert PRESETS["llama2-70b"].num_parameters() == 68_976_648_192
    assert abs(PRESETS["gpt3-175b"].num_parameters() / 1e9 - 175.2) < 0.1
    # Llama 3.1 8B / 70B / 405B: the parameter counts of their HF safetensors (model cards).
    assert PRESETS["llama3-8b"].num_parameters() == 8_030_261_248
    assert PRESETS["llama3-70b"].num_parameters() == 70_553_706_496
    assert PRESETS["llama3-405b"].num_parameters() == 405_853_388_800


def test_hf_config_and_unknown_model(tmp_path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
                               "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
                               "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}))
    spec = from_hf_config(cfg)
    assert spec.family == "llama" and spec.num_parameters() == PRESETS["llama2-7b"].num_parameters()
    with pytest.raises(ParacubeError, match="unknown model 'gpt5'.*tiny"):
        resolve_model("gpt5")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ParacubeError, match="not valid JSON"):
        resolve_model(str(tmp_path / "bad.json"))
    with pytest.raises(ParacubeError, match="hidden=10 is not divisible by heads=3"):
        ModelSpec("m", 1, 10, 3, 40, 100, 8)


def test_layout_parse_roundtrip_and_errors() -> None:
    for text in ["dp=2,pp=4,tp=1d:8", "dp=1,tp=2d:4x4", "dp=1,tp=2.5d:4x4x2", "dp=2,tp=3d:4x4x4,mb=4",
                 "dp=4,pp=2,tp=1d:4,mb=1,v=2,sp", "dp=2,tp=3d:2x2x2,place=dp.x.y.z.pp"]:
        assert str(parse_layout(text)) == text
    assert parse_layout("tp=3d:2x2x2").world_size == 8
    for bad, pattern in [("tp=3d:2x2x4", "cube"), ("tp=2d:2x3", "square"), ("tp=4d:2", "tensor mode '4d'"),
                         ("dp=0", "positive"), ("dp=2,dp=2", "twice"), ("tp=1d:4,dp=2,place=tp", "each of the axes"),
                         ("foo=1", "unknown part"), ("", "empty layout"), ("tp=2d:2x2,sp", "sequence parallelism")]:
        with pytest.raises(ParacubeError, match=pattern):
            parse_layout(bad)


def test_rank_grid_3d_follows_the_paper() -> None:
    """rank = i + q*j + q^2*k with i on axis x, j on y, k on z (default placement: tensor innermost)."""
    lay = parse_layout("dp=2,tp=3d:2x2x2")
    for rank in range(16):
        c = lay.coords(rank)
        assert rank == c["x"] + 2 * c["y"] + 4 * c["z"] + 8 * c["dp"]
    assert lay.groups("x").tolist()[:2] == [[0, 1], [2, 3]]
    assert lay.groups(("x", "y")).tolist()[0] == [0, 2, 1, 3]  # x major within the plane
    assert lay.groups("dp").tolist()[0] == [0, 8]
    # every group partitions the world
    for axes in ["x", "y", "z", "dp", ("x", "y"), ("x", "z"), ("dp", "z", "y", "x")]:
        g = lay.groups(axes)
        assert sorted(g.ravel().tolist()) == list(range(16))


def test_placement_moves_axes_across_nodes() -> None:
    inner_dp = Layout(dp=2, mode="2d", shape=(2, 2), placement=("dp", "col", "row"))
    assert inner_dp.groups("dp").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert np.array_equal(np.sort(inner_dp.rank_grid().ravel()), np.arange(8))


def test_comm_event_ring_bytes() -> None:
    """Ring: all-gather/reduce-scatter send (n-1)/n of the payload, all-reduce twice that."""
    ag = CommEvent("all_gather", ("x",), 4, 1000)
    ar = CommEvent("all_reduce", ("x",), 4, 1000)
    assert ag.sent_bytes() == 750 and ar.sent_bytes() == 1500
    diff = traffic_difference([ag, ar], [ar])
    assert sum(diff["missing_in_executor"].values()) == 1 and not diff["unpredicted"]


def test_plan_file_roundtrip_and_bad_fields(tmp_path) -> None:
    plan = default_plan()
    path = plan.save(tmp_path / "plan.json")
    assert load_plan(path) == plan
    data = json.loads(path.read_text())
    data["layout"] = "tp=3d:2x2x4"
    with pytest.raises(ParacubeError, match="cube"):
        plan_from_dict(data, "p.json")
    data = json.loads(path.read_text())
    data["gpus"] = 4
    with pytest.raises(ParacubeError, match="needs 8 ranks but the plan has gpus=4"):
        plan_from_dict(data, "p.json")
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    with pytest.raises(ParacubeError, match="schema_version=99"):
        plan_from_dict(data, "p.json")
    data = json.loads(path.read_text())
    del data["model"]["hidden"]
    with pytest.raises(ParacubeError, match="missing model fields"):
        plan_from_dict(data, "p.json")
    with pytest.raises(ParacubeError, match="does not exist"):
        load_plan(tmp_path / "nope.json")
