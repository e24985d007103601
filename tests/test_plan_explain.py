"""Planning-side usability (issue 16): `plan` marks pinned vs chosen parts with the runner-up each choice
beat (recomputed here from the ranked rows), size-1-axis duplicates are listed once, zero=N is pinned
through to the plan file, a plan made with a cluster file is reloaded by simulate / validate without
--cluster, model names get suggestions, headers name config.json models and show small parameter
counts readably, and the JSON Schemas (`paracube schema`) accept what paracube writes."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from paracube.cli.main import main
from paracube.cost_models.analytic import estimate
from paracube.errors import ParacubeError
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS, resolve_model
from paracube.plan import load_plan
from paracube.planner import search
from paracube.planner.explain import PARTS, big_placement, canonical_key, dedupe, explain
from paracube.schemas import EstimateSchema, PlanSchema, ValidateSchema, json_schema
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

FAKE_CLUSTER = """name: fakecal
device: {name: cpu-fake, peak_flops: {fp32: 5.0e10, bf16: 2.5e10, fp16: 2.5e10}, memory_bytes: 3.0e9,
         memory_bandwidth: 1.0e10}
nodes: 1
devices_per_node: 8
intra_node: {bandwidth: 2.0e9, latency: 2.0e-5}
"""


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runner_ups_are_the_best_other_value_of_each_part() -> None:
    topo = load_topology("dgx-a100", gpus=64)
    training = TrainingSpec(global_batch=512, dtype="bf16")
    fixed = parse_layout("tp=1d:4")
    result = search(PRESETS["gpt3-2.7b"], training, topo, 64, fixed=fixed, top_k=60)
    rows = dedupe(result.ranked)
    choices = {c.part: c for c in explain(rows, fixed)}
    best, best_est = rows[0]
    assert choices["tensor"].pinned and choices["tensor"].value == "tp=1d:4"
    for part, (label, _) in PARTS.items():
        if part not in choices or choices[part].pinned:
            continue
        c = choices[part]
        others = [est.step_time_s for lay, est in rows if label(lay) != label(best)
                  and (part != "placement" or canonical_key(lay)[:-1] == canonical_key(best)[:-1])]
        if not others:
            assert c.runner_up is None
            continue
        assert c.runner_up_step_time_s == min(others)
        assert math.isclose(c.margin, min(others) / best_est.step_time_s - 1)
        assert c.margin >= 0 and c.line().startswith(f"{c.value} chosen; best with {c.runner_up}: ")


def test_the_exchange_of_cp_has_no_runner_up_without_cp() -> None:
    """cpc's runner-up is a layout with another exchange, never one without context parallelism (which has none):
    torchtitan, which all-gathers only, was told "cpc=ag chosen; best with cpc=p2p" naming a cp=1 layout."""
    topo, model = load_topology("dgx-h100", gpus=64), PRESETS["llama3-8b"]
    training = TrainingSpec(global_batch=64, dtype="bf16", seq_len=65536)
    rows = [(lay, estimate(model, training, lay, topo)) for lay in
            (parse_layout(t) for t in ("dp=8,cp=8,cpc=ag,tp=none,mb=1,zero=3,overlap",
                                        "dp=8,tp=1d:8,mb=1,sp,zero=3,overlap"))]
    rows.sort(key=lambda r: r[1].step_time_s)
    assert rows[0][0].cp == 8  # cp is the faster here; its exchange then has no other value ranked
    choices = {c.part: c for c in explain(rows)}
    assert choices["cpc"].value == "cpc=ag" and choices["cpc"].runner_up is None
    assert choices["cp"].runner_up == "cp=1"
    p2p = parse_layout("dp=8,cp=8,cpc=p2p,tp=none,mb=1,zero=3,overlap")
    choices = {c.part: c for c in explain([*rows, (p2p, estimate(model, training, p2p, topo))])}
    assert {choices["cpc"].value, choices["cpc"].runner_up} == {"cpc=ag", "cpc=p2p"}  # ranked: the other exchange


def test_size_one_axis_placements_are_one_row() -> None:
    a = Layout(dp=2, mode="1d", shape=(4,), placement=("tp", "dp", "pp"))
    b = Layout(dp=2, mode="1d", shape=(4,), placement=("tp", "pp", "dp"))
    c = Layout(dp=2, mode="1d", shape=(4,), placement=("dp", "tp", "pp"))
    # a and b differ only in where the size-1 axis pp sits: the same rank grid, printed alike
    assert str(a) == str(b) != str(c) and canonical_key(a) == canonical_key(b) != canonical_key(c)
    est = search(PRESETS["tiny"], TrainingSpec(), load_topology("local-cpu", gpus=8), 8, top_k=1).ranked[0][1]
    assert [lay for lay, _ in dedupe([(a, est), (b, est), (c, est)])] == [a, c]


def test_plan_prints_pinned_and_chosen_and_keeps_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    code, text, _ = run_cli(capsys, "plan", "--model", "gpt3-2.7b", "--cluster", "dgx-a100", "--gpus", "32",
                            "--layout", "dp=4,pp=2,tp=1d:4,zero=1", "-o", str(out))
    assert code == 0
    assert "dp=4 pinned" in text and "pp=2 pinned" in text and "tp=1d:4 pinned" in text and "zero=1 pinned" in text
    assert "chosen; best with mb=" in text
    assert load_plan(out).layout.zero == 1
    code, text, _ = run_cli(capsys, "plan", "--json", "-o", str(out), "--force")
    lines = [c["line"] for c in json.loads(text)["choices"]]
    assert any(line.startswith("dp=") for line in lines) and all("pinned" not in line for line in lines)
    ranked = [r["layout"] for r in json.loads(text)["ranked"]]
    assert len({canonical_key(parse_layout(r)) for r in ranked}) == len(ranked)


def test_the_plan_keeps_its_cluster_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "fake.yaml").write_text(FAKE_CLUSTER)
    monkeypatch.chdir(tmp_path / "cal")
    assert run_cli(capsys, "plan", "--cluster", "fake.yaml", "--gpus", "4", "-o", "p4.json")[0] == 0
    assert run_cli(capsys, "plan", "--cluster", "fake.yaml", "--gpus", "8", "-o", "p8.json")[0] == 0
    recorded = str((tmp_path / "cal" / "fake.yaml").resolve())
    assert load_plan("p8.json").cluster == recorded
    monkeypatch.chdir(tmp_path)  # elsewhere: the recorded absolute path still loads
    code, text, _ = run_cli(capsys, "simulate", "cal/p8.json", "--json")
    assert code == 0 and json.loads(text)["step_time_s"] == load_plan("cal/p8.json").prediction["step_time_s"]
    code, text, _ = run_cli(capsys, "simulate", "cal/p8.json")
    assert code == 0 and f"on 8 x {recorded}" in text.replace("\n", "")
    # validate reloads the file without --cluster (before any rank starts: the file has 8 devices, the plan 4)
    code, _, err = run_cli(capsys, "validate", "cal/p4.json")
    assert code == 2 and f"cluster {recorded!r} has 8 devices" in err
    (tmp_path / "cal" / "fake.yaml").unlink()
    for command in ("validate", "simulate"):
        code, _, err = run_cli(capsys, command, "cal/p8.json")
        assert code == 2 and f"cluster file {recorded!r} does not exist" in err and err.count("\n") == 1
    code, text, _ = run_cli(capsys, "simulate", "cal/p8.json", "--cluster", "local-cpu")  # --cluster overrides
    assert code == 0 and "on 8 x local-cpu" in text


def test_model_names_suggest_and_headers_read_well(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ParacubeError, match="unknown model 'gpt3-13'; did you mean gpt3-13b"):
        resolve_model("gpt3-13")
    with pytest.raises(ParacubeError, match="did you mean llama2-7b"):
        resolve_model("Llama2-7B")
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 688, "vocab_size": 1024, "max_position_embeddings": 128}
    (tmp_path / "my-llama").mkdir()
    (tmp_path / "my-llama" / "config.json").write_text(json.dumps(config))
    (tmp_path / "small-llama.json").write_text(json.dumps(config))
    assert resolve_model(str(tmp_path / "my-llama" / "config.json")).name == "my-llama"
    assert resolve_model(str(tmp_path / "my-llama")).name == "my-llama"
    assert resolve_model(str(tmp_path / "small-llama.json")).name == "small-llama"
    code, text, _ = run_cli(capsys, "simulate")
    assert code == 0 and "tiny (0.14M params)" in text


def test_schemas_accept_what_paracube_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert run_cli(capsys, "plan", "--layout", "dp=2,tp=1d:4,zero=1", "-o", str(out))[0] == 0
    plan_json = json.loads(out.read_text())
    PlanSchema.model_validate(plan_json)
    code, text, _ = run_cli(capsys, "schema", "plan")
    jsonschema.validate(plan_json, json.loads(text))
    code, text, _ = run_cli(capsys, "simulate", str(out), "--json", "--events")
    estimate = json.loads(text)
    EstimateSchema.model_validate(estimate)
    jsonschema.validate(estimate, json_schema("estimate"))
    from paracube.validation.validate import compare

    est = search(PRESETS["tiny"], TrainingSpec(), load_topology("local-cpu", gpus=8), 8, top_k=1).ranked[0][1]
    row = {"step": 1, "step_time_s": 0.1, "comm_time_s": 0.01, "comm_cpu_s": 0.01, "bytes_sent_per_rank": 10,
           "peak_memory_bytes": 2000}
    per_rank = [{"rows": [row, {**row, "step": 2}], "base_rss": 1000}] * 2
    validated = {**compare(est, per_rank, None), "cluster": "local-cpu", "calibrated": False}
    ValidateSchema.model_validate(validated)
    jsonschema.validate(json.loads(json.dumps(validated)), json_schema("validate"))
    code, _, err = run_cli(capsys, "schema", "plans")
    assert code == 2 and "unknown schema 'plans'; did you mean plan? valid: plan, estimate, validate" in err


def test_zero_field_parses_prints_and_is_refused_by_the_executor() -> None:
    lay = parse_layout("dp=4,pp=2,tp=1d:2,mb=1,v=2,sp,zero=3")
    assert lay.zero == 3 and str(lay) == "dp=4,pp=2,tp=1d:2,mb=1,v=2,sp,zero=3" and parse_layout(str(lay)) == lay
    assert "zero" not in str(parse_layout("dp=2")) and parse_layout("dp=2").zero == 0
    assert str(parse_layout("dp=2,zero=0")) == "dp=2,tp=none,zero=0"  # an explicit zero=0 is a pin: kept
    assert parse_layout("dp=2,zero=2").zero == 2
    for bad in ("dp=2,zero=4", "dp=2,zero=-1", "dp=2,zero=one"):
        with pytest.raises(ParacubeError, match="zero=.* is not valid; valid: 0, 1, 2, 3"):
            parse_layout(bad)
    with pytest.raises(ParacubeError, match="zero=4 is not valid; valid: 0, 1, 2, 3"):
        Layout(dp=2, zero=4)
    from paracube.executor.sizes import check_divisibility

    tied = replace(PRESETS["tiny"], tied_embeddings=True)
    with pytest.raises(ParacubeError, match="zero=3 with pp=2 and tied embeddings: the executor shards"):
        check_divisibility(tied, parse_layout("dp=4,pp=2,tp=1d:2,mb=1,zero=3"), 1, 8, 64)
    check_divisibility(PRESETS["tiny"], parse_layout("dp=4,pp=2,tp=1d:2,mb=1,zero=3"), 1, 8, 64)  # untied: runs
    check_divisibility(PRESETS["tiny"], parse_layout("dp=2,tp=2d:2x2,zero=3"), 1, 8, 64)  # FSDP units of 2D blocks
    check_divisibility(PRESETS["tiny"], parse_layout("dp=8,zero=3"), 1, 8, 64)  # FSDP runs in mode none
    check_divisibility(PRESETS["tiny"], parse_layout("dp=8,zero=1"), 1, 8, 64)  # the distributed optimizer runs


def test_placements_that_price_alike_are_ranked_once() -> None:
    """A placement whose groups see the same links as a ranked placement of the same configuration is the same
    layout to the cost models: the ranking holds it once (the first, here the default), while a placement that
    changes the links, and so the time, is still ranked beside the default."""
    topo = load_topology("local-cpu", gpus=8)
    fixed = parse_layout("dp=2,tp=2d:2x2")
    ranked = search(PRESETS["tiny"], TrainingSpec(), topo, 8, fixed=fixed, top_k=10).ranked
    seen = [(canonical_key(lay)[:-1], est.step_time_s) for lay, est in ranked]
    assert len(set(seen)) == len(seen) and len(ranked) > 1
    # the twins exist: another placement of the best layout prices exactly as it does, and is not ranked
    best, best_est = ranked[0]
    assert big_placement(best) == big_placement(best.with_(placement=()))  # the default placement is kept
    twins = [p for p in itertools.permutations(big_placement(best)) if p != big_placement(best)
             and estimate(PRESETS["tiny"], TrainingSpec(), best.with_(placement=p), topo).step_time_s
             == best_est.step_time_s]
    assert twins and not any(big_placement(lay) in twins and canonical_key(lay)[:-1] == canonical_key(best)[:-1]
                             for lay, _ in ranked)
    # links that differ: the README's 13B layout, ranked at two placements with two times
    topo = load_topology("dgx-a100", gpus=64)
    training = TrainingSpec(global_batch=512, dtype="bf16", recompute="selective")
    ranked = search(PRESETS["gpt3-13b"], training, topo, 64, top_k=10,
                    fixed=parse_layout("dp=4,pp=4,tp=1d:4,sp,zero=1,overlap")).ranked
    by_config: dict[tuple, set[float]] = {}
    for lay, est in ranked:
        by_config.setdefault(canonical_key(lay)[:-1], set()).add(est.step_time_s)
    assert any(len(times) > 1 for times in by_config.values())


def test_no_part_the_search_does_not_vary_is_called_the_only_valid_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where the ranking is exhaustive (fewer rows than the pool), a part with no other ranked value is the only
    valid one, except the parts the search does not vary (SearchResult.unsearched) or leaves twins of unranked:
    each of these lines gives its reason, and a layout pinning another value of it plans."""
    out = str(tmp_path / "p.json")
    cases = [("tiny", {"cp=1": "cp=2"}),
             ("tiny-moe", {"cp=1": "cp=2", "fa=1": "fa=0", "mb=2": "mb=4"})]
    for model, others in cases:
        code, text, _ = run_cli(capsys, "plan", "--model", model, "--gpus", "8", "-o", out, "--force")
        assert code == 0
        lines = {line.split(" chosen; ")[0].strip(): line for line in text.splitlines() if " chosen; " in line}
        for value, other in others.items():
            assert "the only valid value" not in lines[value] and "(" in lines[value], lines[value]
            assert run_cli(capsys, "plan", "--model", model, "--gpus", "8", "--layout", other, "-o", out,
                           "--force")[0] == 0
    # a claim that holds: pinned dp and tensor shape leave no rank for cp (nor pp), and the ranking is exhaustive
    code, text, _ = run_cli(capsys, "plan", "--gpus", "8", "--layout", "dp=2,tp=2d:2x2", "-o", out, "--force")
    assert code == 0 and "cp=1 chosen; the only valid value" in text and "pp=1 chosen; the only valid value" in text
