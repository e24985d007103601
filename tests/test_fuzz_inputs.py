"""Fuzzing the loaders and the CLI (hypothesis): layout strings, plan files, topology YAML, model config.json
and command lines. Every generated input either loads, or is refused with a ParacubeError, which the CLI
prints as one line with exit status 2 -- never a traceback. The tests count what they generated (>= 1000)."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from paracube.cli.main import main
from paracube.errors import ParacubeError
from paracube.hf_config import from_hf_config
from paracube.layout_parse import parse_layout
from paracube.plan import default_plan, plan_from_dict
from paracube.topologies.loader import topology_from_dict

OUTCOMES: Counter[str] = Counter()
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


def _outcome(kind: str, fn, *args) -> None:  # noqa: ANN001
    try:
        fn(*args)
        OUTCOMES[f"{kind}: loaded"] += 1
    except ParacubeError as exc:
        assert "\n" not in str(exc).strip(), str(exc)
        OUTCOMES[f"{kind}: refused"] += 1


layout_tokens = st.sampled_from(["dp", "pp", "tp", "mb", "v", "sp", "place", "=", ",", ":", "x", ".", "1d", "2d",
                                 "2.5d", "3d", "none", "0", "1", "2", "3", "4", "8", "-1", "z", "y", "row", "col",
                                 "tp=3d:2x2x2", "dp=2", " ", "9" * 30, "cp", "cpc", "p2p", "ag", "ep", "etp",
                                 "zero", "shard", "tpo", "overlap", "tp=1d:2,sp", "cp=2", "ep=4", "summa"])


@FUZZ
@given(st.one_of(st.text(max_size=40), st.lists(layout_tokens, max_size=12).map("".join)))
def test_fuzz_layout_strings(text: str) -> None:
    _outcome("layout", parse_layout, text)


def _mutate(base: dict, path: list[str], value: object, delete: bool) -> dict:
    data = copy.deepcopy(base)
    node = data
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            return data
        node = node[key]
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return data


PLAN = default_plan().to_dict()
PLAN_PATHS = [[k] for k in PLAN] + [["model", k] for k in PLAN["model"]] + [["training", k] for k in PLAN["training"]] \
    + [["launch", k] for k in PLAN["launch"]]


@FUZZ
@given(st.sampled_from(PLAN_PATHS), json_values, st.booleans())
def test_fuzz_plan_files(path: list[str], value: object, delete: bool) -> None:
    _outcome("plan", plan_from_dict, _mutate(PLAN, path, value, delete), "fuzz.json")


TOPOLOGY = {"name": "fuzz", "device": "A100-SXM-80GB", "nodes": 2, "devices_per_node": 4,
            "intra_node": {"bandwidth": 300e9, "latency": 2e-6},
            "inter_node": {"bandwidth": 25e9, "latency": 5e-6, "nics_per_node": 4}}
TOPO_PATHS = [[k] for k in TOPOLOGY] + [["intra_node", k] for k in ("bandwidth", "latency")] \
    + [["inter_node", k] for k in ("bandwidth", "latency", "nics_per_node")]


@FUZZ
@given(st.sampled_from(TOPO_PATHS), json_values, st.booleans())
@example(["device"], {"\n": 0}, False)  # a key with a line break: named quoted, the message stays one line
def test_fuzz_topology_yaml(path: list[str], value: object, delete: bool) -> None:
    _outcome("topology", topology_from_dict, _mutate(TOPOLOGY, path, value, delete), "fuzz.yaml")


HF = {"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
      "n_positions": 64}


@FUZZ
@given(st.sampled_from([[k] for k in HF]), json_values, st.booleans())
def test_fuzz_model_config(tmp_path_factory: pytest.TempPathFactory, path: list[str], value: object,
                           delete: bool) -> None:
    target = tmp_path_factory.mktemp("hf") / "config.json"
    target.write_text(json.dumps(_mutate(HF, path, value, delete)))
    _outcome("config.json", from_hf_config, target)


BAD_ARGS = st.lists(st.sampled_from(["--model", "--cluster", "--gpus", "--layout", "--global-batch", "--seq",
                                     "--dtype", "--micro-batch", "--top", "-1", "0", "abc", "tp=3d:3x3x3",
                                     "gpt9", "dgx-z", "1e9", "fp8", "tp=2d:2x3", "--recompute", "sometimes",
                                     "--runtime", "megatron", "torchtitan", "deepspeed", "all", "titan",
                                     "cp=3", "dp=2,cp=2,tp=1d:2,sp,cpc=ag", "ep=3", "etp=2", "tp=1d:2,tpo",
                                     "zero=3,shard=3", "tiny-moe", "qwen3-30b-a3b"]),
                    min_size=1, max_size=6)


@FUZZ
@given(st.sampled_from(["plan", "compare", "simulate", "sweep"]), BAD_ARGS)
def test_fuzz_cli_arguments(capsys: pytest.CaptureFixture[str], command: str, args: list[str]) -> None:
    try:
        code = main([command, *args, "--gpus", "-3"])  # always invalid: nothing runs for long
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    assert code == 2, (command, args)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    OUTCOMES["cli: refused"] += 1


NEW_ARGS = st.lists(st.sampled_from(["--tokens", "--price-per-gpu-hour", "--memory-headroom", "--force", "2T",
                                     "300B", "2e12", "2X", "-1", "0", "0.1", "10%", "100%", "nan", "inf", "abc",
                                     "1.5", "T", "--layout", "mb=3", "dp=3", "dp=2,mb=3", "--micro-batch", "3",
                                     "--global-batch", "6"]), min_size=1, max_size=6)


@FUZZ
@given(st.sampled_from(["plan", "compare", "sweep"]), NEW_ARGS)
def test_fuzz_new_planning_options(capsys: pytest.CaptureFixture[str], command: str, args: list[str]) -> None:
    """--tokens, --price-per-gpu-hour, --memory-headroom, --force, mb/dp pins: refused in one line, exit 2."""
    try:
        code = main([command, *args, "--gpus", "-3"])  # always invalid: nothing runs for long
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    assert code == 2, (command, args)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    OUTCOMES["cli new options: refused"] += 1


TOPOLOGY_ARGS = st.lists(st.sampled_from(["dgx-h100", "dgxh100", "DGX-H100", "local-cpu", "longhorn", "nope.yaml",
                                          "examples/h100-rail-32x8.yaml", "examples/pcie-2x8-100gbe.yaml", "/tmp",
                                          "--gpus", "12", "16", "-3", "0", "abc", "1e9", "100000000", "--json"]),
                         max_size=5)


@FUZZ
@given(TOPOLOGY_ARGS)
def test_fuzz_topologies_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                 args: list[str]) -> None:
    """`paracube topologies [NAME|FILE] [--gpus N]`: a listing (exit 0) or one line (exit 2), never a traceback."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the examples/ paths
    try:
        code = main(["topologies", *args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code in (0, 2), (args, code)
    assert "Traceback" not in err and (code == 0 or len(err.strip().splitlines()) == 1), err
    OUTCOMES[f"topologies: {'listed' if code == 0 else 'refused'}"] += 1


@FUZZ
@given(st.one_of(st.text(max_size=16), st.sampled_from(["2T", "300B", "2e12", "1.5t", "20k", "1e400", "0.5"])))
def test_fuzz_token_counts(text: str) -> None:
    import argparse

    from paracube.cli.train_terms import parse_tokens

    try:
        value = parse_tokens(text)
        assert value >= 1 and value < float("inf")
        OUTCOMES["tokens: parsed"] += 1
    except argparse.ArgumentTypeError as exc:
        assert "\n" not in str(exc)
        OUTCOMES["tokens: refused"] += 1


@FUZZ
@given(st.text(max_size=20))
def test_fuzz_unknown_names_get_one_line(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Unknown schema / model names through the CLI, with did-you-mean where close: one line, exit 2."""
    if name.startswith("-") or name in ("plan", "estimate", "validate"):
        return
    code = main(["schema", name])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    OUTCOMES["unknown names: refused"] += 1


def test_fuzz_files_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad files reach users through the CLI: each one line, exit 2."""
    bad_plan = tmp_path / "plan.json"
    bad_topo = tmp_path / "topo.yaml"
    cases = [(bad_plan, "{", ["simulate", str(bad_plan)]), (bad_plan, "[]", ["simulate", str(bad_plan)]),
             (bad_topo, "name: [", ["plan", "--cluster", str(bad_topo)]),
             (bad_topo, yaml.safe_dump({**TOPOLOGY, "nodes": 0}), ["plan", "--cluster", str(bad_topo)]),
             # A typo'd size must be refused, not built (8 x 10^8 GPUs would exhaust memory).
             (bad_topo, "", ["plan", "--cluster", "dgx-a100", "--gpus", str(8 * 10**8)])]
    for path, text, argv in cases:
        path.write_text(text)
        assert main(argv) == 2
        _, err = capsys.readouterr()
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        OUTCOMES["cli files: refused"] += 1


def test_huge_topology_is_refused_not_built() -> None:
    with pytest.raises(ParacubeError, match="at most"):
        topology_from_dict({**TOPOLOGY, "nodes": 10**9}, "huge.yaml")


def test_zz_fuzz_count() -> None:
    """Runs last in this file: the fuzzers above generated at least 1000 inputs."""
    total = sum(OUTCOMES.values())
    print("fuzz outcomes:", dict(OUTCOMES), "total", total)
    if total:  # when run alone (pytest -k), the counter is empty
        assert total >= 1000


@pytest.mark.parametrize("text", ["dp=" + "9" * 30 + ",zero=1,shard=2", "dp=" + "9" * 30 + ",ep=2",
                                  "dp=" + "9" * 13 + ",zero=1,shard=2"])
def test_a_huge_size_is_refused_without_listing_its_divisors(text: str) -> None:
    """The fuzzer's find: a message listing the valid values of a 30-digit dp by trying every number below it
    never finished (errors.divisors lists them up to 10**7, by trial division to sqrt(n))."""
    with pytest.raises(ParacubeError, match="a divisor of 9+"):
        parse_layout(text)
