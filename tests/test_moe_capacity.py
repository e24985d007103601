"""Routing imbalance and capacity factor as a user sets them (`--moe-imbalance`, `--capacity-factor`: cli/options.py)
and as each runtime runs a capacity factor (Runtime.moe_capacity: "pad" Megatron-core / DeepSpeed-MoE, "drop"
paracube's executor, "none" torchtitan), priced alike by both engines through MoESpec.load and host_sync.py.

References: MoESpec.load's closed form; equalities between two steps that must price the same work (a capacity factor
above the imbalance under "drop" is the dropless step; "pad" is the dropless step at imbalance = capacity factor
without the host wait), exact up to float summation order (1e-12 relative)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import run_cli

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.host_sync import waits_per_forward
from paracube.engine_options import EngineOptions
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.runtimes import get_runtime
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

TRAIN = TrainingSpec(global_batch=64, dtype="bf16", recompute="selective")
LAYOUT = parse_layout("dp=16,ep=8,tp=none,mb=1,zero=1")  # ep over two DGX nodes: the all_to_alls cross the NICs
ENGINES = (estimate, estimate_event)
# the plain all_to_all (a capacity factor makes Megatron's DeepEP fall back to it: moe_dispatch.effective), the
# host waits on: the steps below differ only by what the capacity rule changes
BASE = EngineOptions(moe_dispatch="alltoall", moe_host_sync=True)


def routed(imbalance: float = 1.0, capacity: float | None = None) -> ModelSpec:
    model = PRESETS["mixtral-8x7b"]
    assert model.moe is not None
    return replace(model, moe=replace(model.moe, imbalance=imbalance, capacity_factor=capacity))


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


def rule(options: EngineOptions) -> SimpleNamespace:
    """What host_sync.waits_per_forward reads of Dims (cost_models/dims.with_options copies it from the options)."""
    return SimpleNamespace(moe_host_sync=options.moe_host_sync, moe_capacity=options.moe_capacity)


def step(engine: object, model: ModelSpec, topo: object, options: EngineOptions) -> float:
    return engine(model, TRAIN, LAYOUT, topo, with_events=False, options=options).step_time_s  # type: ignore[operator]


def test_load_is_the_imbalance_capped_or_padded_to_the_capacity() -> None:
    assert routed(1.5).moe.load("pad") == routed(1.5).moe.load("drop") == 1.5  # dropless: the imbalance
    assert routed(1.5, 1.25).moe.load("drop") == 1.25  # the copies beyond the capacity dropped
    assert routed(1.0, 1.25).moe.load("drop") == 1.0  # below the capacity: nothing dropped, nothing padded
    assert routed(1.0, 1.25).moe.load("pad") == 1.25  # every expert padded to its capacity
    assert routed(1.5, 1.25).moe.load("pad") == 1.25
    assert routed(1.5, 1.25).moe.expert_tokens(1024, "drop") == 1024 * 2 / 8 * 1.25


@pytest.mark.parametrize("engine", ENGINES, ids=["analytic", "event"])
def test_drop_below_the_capacity_is_the_dropless_step(h100: object, engine: object) -> None:
    """"drop" (paracube's executor) keeps every copy under the capacity and still reads its counts on the host: a
    capacity factor above the imbalance prices as dropless; one below it as dropless at that imbalance."""
    drop = BASE.with_(moe_capacity="drop")
    assert step(engine, routed(1.0, 1.25), h100, drop) == pytest.approx(step(engine, routed(1.0), h100, drop),
                                                                       rel=1e-12)
    assert step(engine, routed(2.0, 1.25), h100, drop) == pytest.approx(step(engine, routed(1.25), h100, drop),
                                                                       rel=1e-12)
    assert waits_per_forward(routed(1.0, 1.25).moe, rule(drop)) == 1


@pytest.mark.parametrize("engine", ENGINES, ids=["analytic", "event"])
def test_pad_prices_the_capacity_without_the_host_wait(h100: object, engine: object) -> None:
    """"pad" (Megatron-core's drop_and_pad): every expert holds exactly its capacity, the buffers sized from it, so
    the dropless step at imbalance = capacity factor without the host wait; padding costs where the routing is
    balanced."""
    pad = BASE.with_(moe_capacity="pad")
    padded = step(engine, routed(1.0, 1.25), h100, pad)
    assert padded == pytest.approx(step(engine, routed(1.25), h100, pad.with_(moe_host_sync=False)), rel=1e-12)
    assert padded > step(engine, routed(1.0), h100, pad.with_(moe_host_sync=False))
    assert step(engine, routed(3.0, 1.25), h100, pad) == pytest.approx(padded, rel=1e-12)  # beyond it: dropped
    assert waits_per_forward(routed(1.0, 1.25).moe, rule(pad)) == 0


def test_engines_agree_on_a_token_drop_step(h100: object) -> None:
    """Both engines price the same capacity rule (the suite's engine bound, tests/test_event_engine.py: 2%)."""
    for rule in ("pad", "drop"):
        options = BASE.with_(moe_capacity=rule)
        analytic, event = (step(e, routed(1.5, 1.25), h100, options) for e in ENGINES)
        assert abs(event / analytic - 1) < 0.02, rule


def test_each_runtime_declares_its_rule() -> None:
    assert {name: get_runtime(name).moe_capacity for name in ("megatron", "deepspeed", "paracube", "torchtitan")} == {
        "megatron": "pad", "deepspeed": "pad", "paracube": "drop", "torchtitan": "none"}


def test_the_flags_set_the_model_the_plan_records(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    code, out, err = run_cli(capsys, "plan", "--model", "tiny-moe", "--gpus", "4", "--moe-imbalance", "1.5",
                             "--capacity-factor", "1.25", "-o", str(plan))
    assert code == 0, err
    moe = json.loads(plan.read_text())["model"]["moe"]
    assert (moe["imbalance"], moe["capacity_factor"]) == (1.5, 1.25)
    # simulate reads them from the plan and takes the flags over them; the estimate's note says which it priced
    code, out, err = run_cli(capsys, "simulate", str(plan), "--json")
    assert code == 0, err
    assert "imbalance 1.5, capacity factor 1.25" in out
    code, out, err = run_cli(capsys, "simulate", str(plan), "--capacity-factor", "dropless", "--json")
    assert code == 0, err
    assert "imbalance 1.5, dropless" in out


@pytest.mark.parametrize(("argv", "message"), [
    (("--model", "tiny", "--moe-imbalance", "1.2"),
     "--moe-imbalance: model 'tiny' has no routed experts; valid: a MoE model"),
    (("--model", "tiny-moe", "--moe-imbalance", "0.5"), "--moe-imbalance 0.5: valid: 1.0 (balanced) to 8"),
    (("--model", "tiny-moe", "--moe-imbalance", "nan"), "--moe-imbalance nan: valid: 1.0 (balanced) to 8"),
    (("--model", "tiny-moe", "--capacity-factor", "0"), "--capacity-factor '0': valid: a positive number"),
    (("--model", "tiny-moe", "--capacity-factor", "lots"), "--capacity-factor 'lots': valid: a positive number"),
    (("--model", "tiny-moe", "--capacity-factor", "1.0", "--runtime", "torchtitan"),
     "runtime torchtitan (FSDP2 + DTensor TP) runs its MoE blocks dropless only, without a capacity factor (tiny-moe: "
     "capacity_factor=1; --capacity-factor dropless drops it); valid: --runtime"),
])
def test_bad_routing_flags_exit_2_in_one_line(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                              message: str) -> None:
    code, out, err = run_cli(capsys, "plan", "--gpus", "4", *argv)
    assert code == 2
    line = err.strip()
    assert "\n" not in line and message in line, line
