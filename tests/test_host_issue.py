"""The host's issue time of a dropless MoE block (cost_models/host_issue.py): reference closed forms against both
engines. A host-bound block grows the step by the host's extra seconds exactly (doubling the declared ops adds micro-
batches x blocks x the ops' seconds); a block whose GPU work exceeds its host's time, a block padded to a capacity, a
runtime without waits and a dense model are unchanged; the engines agree; a bad declaration is refused in one line."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.engine_options import MoEHostOps
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.runtimes import get_runtime
from paracube.topologies import load_topology
from paracube.topologies.calibration import as_calibration
from paracube.topologies.devices import HOST_BWD_OP_S, HOST_ISSUE_SCALE, HOST_OP_S
from paracube.workload import TrainingSpec

TRAIN = TrainingSpec(global_batch=32, dtype="fp8", recompute="none")
MEGATRON = get_runtime("megatron").engine_options()
NONE = MEGATRON.with_(moe_host_ops=None)
BIG = MoEHostOps(fwd=2000, fwd_expert=100, bwd=1000, bwd_expert=50)  # host-bound on any block below
BIGGER = MoEHostOps(fwd=4000, fwd_expert=200, bwd=2000, bwd_expert=100)
LAYOUT = "dp=16,ep=16,tp=none,mb=1,zero=1"  # qwen3-30b-16-fp8's: one stage, every block on the critical path
ENGINES = (estimate, estimate_event)


@pytest.fixture(scope="module")
def h100() -> object:
    """The preset without Hopper's replica jitter: its wait (cost_models/stragglers.py) grows with the step too, so the
    step's growth would not be the host's alone."""
    topo = load_topology("dgx-h100", gpus=16)
    cal = as_calibration(topo.calibration)
    topo.calibration = replace(cal, gemm=replace(cal.gemm, straggler=0.0))
    return topo


def step(engine: object, model: object, training: TrainingSpec, layout: str, topo: object, options: object) -> float:
    return engine(model, training, parse_layout(layout), topo, with_events=False, options=options).step_time_s


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_host_bound_block_grows_by_its_host_seconds(h100: object, engine: object, recompute: str) -> None:
    """Host-bound (ops x 1000 s of GPU work): each micro-batch's MoE blocks take their host's time, so doubling the
    ops adds micro-batches x blocks x (forward ops x HOST_OP_S + backward ops x HOST_BWD_OP_S) x HOST_ISSUE_SCALE
    (the GPU host's factor); under full
    recomputation the recomputed forward's ops once more. Float sums of ~1e-2 s terms: 1e-6 relative (the event
    engine's schedule is unchanged between the two: the extra is one op per pass)."""
    model = PRESETS["qwen3-30b-a3b"]
    training = replace(TRAIN, recompute=recompute)
    local = model.moe.experts // 16  # type: ignore[union-attr]
    fwd = (BIGGER.fwd - BIG.fwd + (BIGGER.fwd_expert - BIG.fwd_expert) * local) * HOST_OP_S * HOST_ISSUE_SCALE
    bwd = (BIGGER.bwd - BIG.bwd + (BIGGER.bwd_expert - BIG.bwd_expert) * local) * HOST_BWD_OP_S * HOST_ISSUE_SCALE
    per_block = fwd * (2 if recompute == "full" else 1) + bwd
    blocks = model.moe.moe_layers(model.layers)  # type: ignore[union-attr]
    micro = TRAIN.global_batch // 16
    grown = (step(engine, model, training, LAYOUT, h100, MEGATRON.with_(moe_host_ops=BIGGER))
             - step(engine, model, training, LAYOUT, h100, MEGATRON.with_(moe_host_ops=BIG)))
    assert grown == pytest.approx(micro * blocks * per_block, rel=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_host_factor_is_the_presets_figure(h100: object, engine: object) -> None:
    """The host's factor is a figure of the preset's calibration (gemm.host_scale: efficiency.HOST_ISSUE, a refit's
    Fit), not module state: a topology whose calibration doubles it doubles a host-bound block's growth (1e-6
    relative, as above), and the shipped preset carries devices.HOST_ISSUE_SCALE."""
    cal = as_calibration(h100.calibration)  # type: ignore[attr-defined]
    assert cal.gemm.host_scale == HOST_ISSUE_SCALE
    doubled = load_topology("dgx-h100", gpus=16)
    doubled.calibration = replace(cal, gemm=replace(cal.gemm, host_scale=2 * HOST_ISSUE_SCALE))
    model = PRESETS["qwen3-30b-a3b"]

    def grown(topo: object) -> float:
        return (step(engine, model, TRAIN, LAYOUT, topo, MEGATRON.with_(moe_host_ops=BIGGER))
                - step(engine, model, TRAIN, LAYOUT, topo, MEGATRON.with_(moe_host_ops=BIG)))

    assert grown(doubled) == pytest.approx(2 * grown(h100), rel=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_experts_with_biases_issue_their_bias_ops(h100: object, engine: object) -> None:
    """Experts with biases (GPT-OSS: TEGroupedMLP._apply_bias) issue MoEHostOps.bias more: on a host-bound block the
    step grows by micro-batches x blocks x those ops' seconds (1e-6 relative, as above); experts without biases
    (Qwen3) issue none of them: the step exactly as without the declaration."""
    biased = replace(BIG, bias=(30, 4, 20, 9))
    gpt_oss, qwen = PRESETS["gpt-oss-120b"], PRESETS["qwen3-30b-a3b"]
    layout = "dp=16,ep=16,tp=none,mb=1,zero=1"
    local = gpt_oss.moe.experts // 16  # type: ignore[union-attr]
    per_block = ((30 + 4 * local) * HOST_OP_S + (20 + 9 * local) * HOST_BWD_OP_S) * HOST_ISSUE_SCALE
    blocks = gpt_oss.moe.moe_layers(gpt_oss.layers)  # type: ignore[union-attr]
    grown = (step(engine, gpt_oss, TRAIN, layout, h100, MEGATRON.with_(moe_host_ops=biased))
             - step(engine, gpt_oss, TRAIN, layout, h100, MEGATRON.with_(moe_host_ops=BIG)))
    assert grown == pytest.approx(TRAIN.global_batch // 16 * blocks * per_block, rel=1e-6)
    assert step(engine, qwen, TRAIN, layout, h100, MEGATRON.with_(moe_host_ops=biased)) == step(
        engine, qwen, TRAIN, layout, h100, MEGATRON.with_(moe_host_ops=BIG))


@pytest.mark.parametrize(("name", "layout", "dtype"), [
    ("mixtral-8x7b", "dp=16,ep=8,tp=none,mb=2,zero=1", "fp8"),  # b200/gb200-mixtral's layout: 1 local expert
    ("mixtral-8x7b", "dp=8,pp=2,v=2,ep=8,tp=none,mb=2,zero=1", "bf16"),  # with pipelines
])
def test_block_with_more_gpu_work_than_host_time_is_unchanged(h100: object, name: str, layout: str,
                                                               dtype: str) -> None:
    """The runtime's declared ops on blocks whose GPU work exceeds their host's issue time: the step exactly as
    without the declaration, in both engines (and these blocks do wait: host-bound ops would grow them)."""
    model, training = PRESETS[name], replace(TRAIN, dtype=dtype)
    for engine in ENGINES:
        none = step(engine, model, training, layout, h100, NONE)
        assert step(engine, model, training, layout, h100, MEGATRON) == none
        assert step(engine, model, training, layout, h100, MEGATRON.with_(moe_host_ops=BIG)) > none


@pytest.mark.parametrize("case", ["capacity", "no waits", "dense"])
def test_no_waits_the_host_runs_ahead(h100: object, case: str) -> None:
    """No host wait (a block padded to a capacity, a runtime that does not wait, a dense model): the host runs ahead
    of the GPU and is hidden, even with host-bound op counts: the step exactly as without them, in both engines."""
    model = PRESETS["qwen3-30b-a3b"]
    options, layout = MEGATRON.with_(moe_host_ops=BIG), LAYOUT
    if case == "capacity":
        model = replace(model, moe=replace(model.moe, capacity_factor=1.0))
    elif case == "no waits":
        options = options.with_(moe_host_sync=False)
    else:
        model, layout = PRESETS["llama3-8b"], "dp=16,tp=none,mb=1,zero=1"
    for engine in ENGINES:
        assert step(engine, model, TRAIN, layout, h100, options) == step(engine, model, TRAIN, layout, h100,
                                                                        options.with_(moe_host_ops=None))


@pytest.mark.parametrize(("text", "recompute"), [
    (LAYOUT, "none"),
    ("dp=8,pp=2,v=2,ep=8,tp=none,mb=1,zero=1", "full"),
    ("dp=8,pp=2,v=2,ep=8,tp=none,mb=1,zero=1,a2ao", "selective"),
])
def test_engines_agree_host_bound(h100: object, text: str, recompute: str) -> None:
    """Host-bound blocks with pipelines, full recomputation and `a2ao` (the host's extra outside the overlapped
    compute): the engines within 2% (as tests/test_moe_cost.py), each step longer than without the declaration."""
    model = PRESETS["qwen3-30b-a3b"]
    training = replace(TRAIN, recompute=recompute, dtype="bf16")
    options = MEGATRON.with_(moe_host_ops=BIG)
    sa, se = (step(e, model, training, text, h100, options) for e in ENGINES)
    assert abs(se / sa - 1) < 0.02
    for engine, s in zip(ENGINES, (sa, se), strict=True):
        assert s > step(engine, model, training, text, h100, NONE)


def test_local_cpu_is_its_own_host() -> None:
    """The local CPU (sync_s = 0: its host is the device, its op overhead priced per op already): no host issue."""
    topo = load_topology("local-cpu", gpus=4)
    model = PRESETS["tiny-moe"]
    training = TrainingSpec(global_batch=8, dtype="fp32", recompute="none")
    layout = "dp=4,ep=4,tp=none,mb=1"
    assert step(estimate, model, training, layout, topo, MEGATRON.with_(moe_host_ops=BIG)) == step(
        estimate, model, training, layout, topo, NONE)


@pytest.mark.parametrize(("field", "value"), [("fwd", -1), ("bwd_expert", 1.5), ("bias", (1, 2, 3)),
                                              ("bias", (1, -2, 3, 4))])
def test_bad_declaration_refused(field: str, value: object) -> None:
    ops = {"fwd": 1, "fwd_expert": 1, "bwd": 1, "bwd_expert": 1, field: value}
    valid = "4 integers >= 0" if field == "bias" else "an integer >= 0"
    with pytest.raises(ParacubeError, match=f"{field}={re.escape(repr(value))}; valid: {valid}") as err:
        MoEHostOps(**ops)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)
