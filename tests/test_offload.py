"""Activation offloading (Layout off=N): its pricing in both engines against cost_models/offload.py's formulas, the
search's choice (only where it is what fits; the runtimes that run it), the one-line refusals, and the target's own
check of the count (Megatron-core's TransformerConfig). The executor's equivalence and what its hooks pack:
tests/test_sp_recompute.py (its 4-rank launch).

References are computed apart from the engines: the per-block saved bytes (block_acts.saved_block_bytes, measured
against the executor by tests/test_attention_widths_memory.py and test_sp_recompute.py), a block's compute
(compute.block_compute_time on the dims without offloading) and the device's datasheet host link. Float bounds: the
engines sum the same terms in another order (1e-9 relative); the event engine agrees with the analytic one within
the 2% its other tests hold it to.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest

from paracube.calibration.run_prediction import predict, preset_topology, run_estimate
from paracube.calibration.runs_csv import read_runs
from paracube.cli.main import main
from paracube.cli.train_terms import human_bytes
from paracube.cost_models.analytic import estimate
from paracube.cost_models.block_acts import saved_block_bytes
from paracube.cost_models.compute import block_compute_time
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of, with_options
from paracube.cost_models.event import estimate_event
from paracube.cost_models.validity import layout_arrays
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS as MODELS
from paracube.planner.search import search
from paracube.runtimes import get_runtime
from paracube.runtimes.offload import offload_counts
from paracube.topologies import load_topology
from paracube.topologies.presets import PRESETS
from paracube.workload import TrainingSpec

LLAMA = MODELS["llama2-7b"]  # 32 blocks
TRAIN = TrainingSpec(global_batch=16, seq_len=4096, dtype="bf16", recompute="none")


def _topo() -> object:
    return load_topology("dgx-h100", gpus=8)


def _block(runtime: str, layout_text: str) -> tuple[float, float, float]:
    """(saved bytes, forward s, backward s) of one block without offloading, and the host link's bytes/s."""
    lay = parse_layout(layout_text)
    d = with_options(dims_of(LLAMA, TRAIN), get_runtime(runtime).engine_options())
    b = layout_arrays(lay, lay.micro_batch)
    g = gemm_model(_topo(), TRAIN.dtype)
    fwd, bwd = block_compute_time(d, lay.mode, b, g)
    return float(saved_block_bytes(d, lay.mode, b)[0]), float(fwd[0]), float(bwd[0])


@pytest.mark.parametrize("runtime", ["megatron", "paracube"])
def test_offloaded_blocks_leave_the_device_and_their_copies_cost_what_the_formula_says(runtime: str) -> None:
    """dgx-h100 (PCIe Gen5 x16, 63 GB/s a direction): device activations fall by (n - 2) blocks' bytes (two blocks'
    buffers stay); the step's compute grows by N micro-batches x n blocks x the exposed copies, max(0, B/W - f) +
    max(0, B/W - b) beside compute (megatron: Transformer Engine's own stream) or 2 B/W in line (paracube)."""
    text, n = "dp=8,tp=none,mb=1", 20
    B, f, b = _block(runtime, text)
    W = float(_topo().device.host_bandwidth)  # type: ignore[attr-defined]
    opts = get_runtime(runtime).engine_options()
    base = estimate(LLAMA, TRAIN, parse_layout(text), _topo(), with_events=False, options=opts)
    off = estimate(LLAMA, TRAIN, parse_layout(f"{text},off={n}"), _topo(), with_events=False, options=opts)
    assert base.memory.activations - off.memory.activations == pytest.approx((n - 2) * B, rel=1e-9)
    exposed = (max(0.0, B / W - f) + max(0.0, B / W - b)) if runtime == "megatron" else 2 * B / W
    micro = TRAIN.global_batch // 8
    assert exposed > 0  # a copy (~9 ms) longer than the block's compute: the case where overlap leaves some
    assert off.compute_time_s - base.compute_time_s == pytest.approx(micro * n * exposed, rel=1e-9)


@pytest.mark.parametrize("runtime", ["megatron", "paracube"])
def test_both_engines_price_offloading_alike(runtime: str) -> None:
    """The event engine reads the same block times (compute.block_compute_time): its step and its step's growth
    under offloading within 2% of the analytic engine's (and its compute equal)."""
    opts = get_runtime(runtime).engine_options()
    steps = {}
    for n in (0, 24):
        lay = parse_layout(f"dp=8,tp=none,mb=1,off={n}")
        an = estimate(LLAMA, TRAIN, lay, _topo(), with_events=False, options=opts)
        ev = estimate_event(LLAMA, TRAIN, lay, _topo(), with_events=False, options=opts)
        assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6)
        assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.02)
        steps[n] = (an.step_time_s, ev.step_time_s)
    assert steps[24][1] - steps[0][1] == pytest.approx(steps[24][0] - steps[0][0], rel=0.02)


def test_the_ladder_each_runtime_searches() -> None:
    """k/8 of the blocks rounded up, within what the runtime runs: Megatron-core < layers, paracube <= layers,
    DeepSpeed every block but the last, torchtitan none."""
    assert offload_counts(get_runtime("megatron").offload, 80) == (10, 20, 30, 40, 50, 60, 70, 79)
    assert offload_counts(get_runtime("paracube").offload, 8)[-1] == 8
    assert offload_counts(get_runtime("deepspeed").offload, 32) == (31,)
    assert offload_counts(get_runtime("torchtitan").offload, 32) == ()


def test_megatron_core_refuses_what_the_runtime_declares_it_refuses() -> None:
    """TransformerConfig's own checks (transformer_config.py:1137-1152): N = layers, pp > 1, recomputation."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "cpu_offloading": True,
            "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}
    TransformerConfig(**base, cpu_offloading_num_layers=3)  # N = layers - 1: accepted
    for bad in ({"cpu_offloading_num_layers": 4}, {"cpu_offloading_num_layers": 2, "pipeline_model_parallel_size": 2},
                {"cpu_offloading_num_layers": 2, "recompute_granularity": "full", "recompute_method": "uniform",
                 "recompute_num_layers": 1}):
        with pytest.raises(ValueError):
            TransformerConfig(**base, **bad)
    rt = get_runtime("megatron")
    assert rt.refusal(parse_layout("dp=2,pp=2,off=2")) and rt.offload is not None and rt.offload.keep_last
    assert rt.offload.recomputes == ("none",)


@pytest.fixture(scope="module")
def gb200_row() -> object:
    return {r.name: r for r in read_runs("benchmarks/data/published_runs_today.csv", tuple(PRESETS))}[
        "gb200-l3-70B-fsdp"]


def test_the_search_offloads_the_fewest_blocks_that_fit(gb200_row: object) -> None:
    """Llama 3 70B FSDP on 64 GB200s (held out): nothing fits without offloading; the plan offloads the fewest blocks
    of the ladder that fit (30 of 80), the ladder's rung below (20) does not, nor 25 (between them), and the offloaded
    bytes fit the host."""
    r = gb200_row
    lay, _ = predict(r, preset_topology(r), "megatron")  # type: ignore[arg-type]
    assert lay.offload == 30
    cap = float(preset_topology(r).device.memory_bytes)  # type: ignore[attr-defined, arg-type]
    fits = {n: run_estimate(r, lay.with_(offload=n), preset_topology(r), "megatron").memory.total <= cap  # type: ignore[arg-type]
            for n in (0, 20, 25, 30)}
    assert fits == {0: False, 20: False, 25: False, 30: True}


def test_no_offload_where_the_runtime_has_none_or_a_layout_fits(gb200_row: object) -> None:
    """torchtitan has no activation offloading: whatever it plans for the row offloads nothing; a layout that fits
    is never offloaded (megatron, llama2-7b on 8 H100s: the search's best layouts have no off=)."""
    r = gb200_row
    try:
        ranked = search(r.model, r.training, preset_topology(r), r.gpus, fixed=r.layout.with_(forbid_sp=True),  # type: ignore[attr-defined, arg-type]
                        top_k=3, runtime="torchtitan").ranked
    except ParacubeError as refused:
        assert "memory >" in str(refused)
        ranked = []
    assert all(lay.offload is None for lay, _ in ranked)
    res = search(LLAMA, TRAIN, _topo(), 8, top_k=3, runtime="megatron")
    assert res.ranked and all(lay.offload is None for lay, _ in res.ranked)


def test_host_memory_bounds_the_offloaded_bytes(gb200_row: object) -> None:
    """With a host of less memory than the 30 offloaded blocks take (the device's share set to 20 GB), that
    count is refused for host memory and the search offloads no fewer blocks than fit the device."""
    r = gb200_row
    topo = preset_topology(r)
    small = copy.copy(topo)  # the same cluster, its device's host memory share 20 GB
    small.device = replace(topo.device, host_memory_bytes=20e9)  # type: ignore[attr-defined]
    with pytest.raises(ParacubeError, match="host memory > 19 GiB per device"):
        search(r.model, r.training, small, r.gpus, fixed=r.layout.with_(forbid_sp=True), top_k=1,  # type: ignore[attr-defined]
               runtime="megatron", zeros=[0, 1])


@pytest.mark.parametrize(("argv", "says"), [
    (["--layout", "dp=8,off=4", "--runtime", "torchtitan"], "runtime torchtitan (FSDP2 + DTensor TP) does not "
     "offload activations to the host (off=4); valid: off=0"),
    (["--layout", "dp=4,pp=2,off=4", "--runtime", "megatron"], "offloads activations without pipelines only (off=4 "
     "with pp=2); valid: pp=1 or off=0"),
    (["--layout", "dp=8,off=99", "--runtime", "megatron"], "off=99 offloads more blocks than the model's 32; valid: "
     "off=N with N in [0, 32]"),
    (["--layout", "dp=8,off=32", "--runtime", "megatron"], "offloads at most 31 of 32 blocks, not off=32; valid: "
     "off=N with N in [0, 31]"),
    (["--layout", "dp=8,off=4", "--runtime", "megatron", "--recompute", "full"], "offloads activations with "
     "rc=none only, not rc=full (off=4); valid: rc=none or off=0"),
    (["--layout", "dp=8,off=x"], "off='x' is not valid; valid: off=N, N in [0, layers]"),
])
def test_bad_offloading_is_refused_in_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], says: str
                                               ) -> None:
    code = main(["plan", "--model", "llama2-7b", "--cluster", "dgx-h100", "--gpus", "8", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and says in err, err


def test_local_cpu_has_no_host_link_to_offload_over() -> None:
    """local-cpu's host memory is its device memory: no host link figure, so a pinned off=N is refused there."""
    topo = load_topology("local-cpu", gpus=2)
    assert np.isclose(topo.device.host_bandwidth, 0.0)  # type: ignore[attr-defined]
    with pytest.raises(ParacubeError, match="no host link figure"):
        estimate(MODELS["tiny"], TrainingSpec(global_batch=8), parse_layout("dp=2,mb=1,off=1"), topo)


def test_the_plan_file_carries_the_offload_and_plans_without_it_are_unchanged(tmp_path: object) -> None:
    """A plan's layout string carries off=N through save and load; a layout without offloading writes no off= (the
    text plans had before); a count past the model's blocks is refused in one line when the plan is read."""
    from paracube.plan import LaunchSpec, Plan, load_plan, plan_from_dict

    def plan(text: str) -> Plan:
        return Plan(LLAMA, TRAIN, parse_layout(text), "dgx-h100", 8, LaunchSpec(nproc_per_node=8), runtime="megatron")

    path = plan("dp=8,tp=none,mb=1,off=20").save(tmp_path / "p.json")  # type: ignore[operator]
    assert load_plan(path).layout == parse_layout("dp=8,tp=none,mb=1,off=20")
    assert plan("dp=8,tp=none,mb=1").to_dict()["layout"] == "dp=8,tp=none,mb=1"
    bad = {**plan("dp=8,tp=none,mb=1").to_dict(), "layout": "dp=8,tp=none,mb=1,off=33"}
    with pytest.raises(ParacubeError, match=r"off=33 offloads more blocks than the model's 32; valid: off=N with N "
                                            r"in \[0, 32\]"):
        plan_from_dict(bad, "p.json")


def test_plan_and_simulate_report_the_host_bytes_of_an_offloaded_layout(tmp_path: object,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Where a layout offloads (off=N), `plan` and `simulate` print one line of the bytes a device keeps in host
    memory, N blocks' saved activations of one micro-batch (reference: N x block_acts.saved_block_bytes, pp = 1), and
    plan --json carries them; a layout without off= prints no such line."""
    saved, _, _ = _block("megatron", "dp=8,tp=none,mb=1")
    host_cap = float(_topo().device.host_memory_bytes)  # type: ignore[attr-defined]
    args = ["--model", "llama2-7b", "--cluster", "dgx-h100", "--gpus", "8", "--runtime", "megatron",
            "--global-batch", "16", "--seq", "4096", "--recompute", "none"]
    out = tmp_path / "p.json"  # type: ignore[operator]
    assert main(["simulate", *args, "--layout", "dp=8,tp=none,mb=1,off=20"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("host memory:")]
    assert line == [f"host memory: {human_bytes(20 * saved)} of {human_bytes(host_cap)} per device "
                    f"({20 * saved / host_cap:.1%}), the activations of off=20 of 32 blocks; "
                    f"{human_bytes(host_cap - 20 * saved)} more would fit"]
    assert main(["plan", *args, "--layout", "dp=8,tp=none,mb=1,off=20", "-o", str(out), "--force", "--json"]) == 0
    assert np.isclose(json.loads(capsys.readouterr().out)["host_bytes"], 20 * saved, rtol=1e-12)
    assert main(["plan", *args, "--layout", "dp=8,tp=none,mb=1", "-o", str(out), "--force"]) == 0
    printed = capsys.readouterr().out
    assert "memory:" in printed and "host memory:" not in printed


@pytest.mark.parametrize(("layout", "recompute", "says"), [
    ("dp=2,pp=2,off=1", "none", "offloads activations without pipelines only (off=1 with pp=2)"),
    ("dp=2,off=1", "full", "offloads activations with rc=none/selective only, not rc=full (off=1)"),
    ("dp=2,off=3", "none", "offloads at most 2 of 2 blocks, not off=3"),
])
def test_the_executor_refuses_what_it_cannot_offload_before_any_rank_starts(layout: str, recompute: str, says: str
                                                                            ) -> None:
    from paracube.executor.sizes import check_offload

    with pytest.raises(ParacubeError) as refused:
        check_offload(MODELS["tiny"], parse_layout(layout), recompute)
    assert "\n" not in str(refused.value) and says in str(refused.value)


@pytest.mark.parametrize("model", ["tiny-moe", "tiny-mla"])
def test_offloading_blocks_the_model_does_not_price_is_refused_on_both_sides(
        capsys: pytest.CaptureFixture[str], model: str) -> None:
    """MoE / MLA blocks (and attention wider than hidden / heads) are priced by planner/experts.py, which never
    offloads: a pinned off=N is refused by the planner and the estimate in one line (not dropped), and by the
    executor before any rank starts."""
    from paracube.executor.sizes import check_offload

    layout = "dp=8,ep=2,tp=none,mb=1,off=1" if model == "tiny-moe" else "dp=8,tp=none,mb=1,off=1"
    code = main(["plan", "--model", model, "--cluster", "dgx-h100", "--gpus", "8", "--layout", layout])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "activation offloading is priced for dense blocks" in err, err
    with pytest.raises(ParacubeError, match="activation offloading is priced for dense blocks"):
        estimate(MODELS[model], TrainingSpec(global_batch=8), parse_layout(layout), load_topology("dgx-h100", gpus=8))
    with pytest.raises(ParacubeError) as refused:
        check_offload(MODELS[model], parse_layout(layout), "none")
    assert "\n" not in str(refused.value) and "dense blocks of hidden / heads attention only" in str(refused.value)


def test_offloading_beside_recompute_modules_the_executor_lacks_is_refused_by_the_runtime(
        capsys: pytest.CaptureFixture[str]) -> None:
    """paracube's executor offloads (save_on_cpu) beside rcm=core_attn only (executor/sizes.check_recompute_modules),
    so its runtime refuses the rest before a plan is written: the planner and the executor agree. Megatron refuses
    off=N with any recomputation (its cpu_offloading checks)."""
    runtime = get_runtime("paracube")
    bad = parse_layout("dp=8,tp=none,mb=1,off=4,rcm=layernorm+mlp")
    assert "recompute modules core_attn only, not layernorm, mlp" in str(runtime.refusal(bad, family="llama"))
    assert runtime.refusal(parse_layout("dp=8,tp=none,mb=1,off=4,rcm=core_attn"), family="llama") is None
    assert "rc=none only" in str(get_runtime("megatron").refusal(
        parse_layout("dp=8,tp=none,mb=1,off=4,rcm=core_attn"), family="llama"))
    assert main(["simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--layout",
                 "dp=8,tp=none,mb=1,off=4,rcm=mlp"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "valid: rcm=core_attn or off=0" in err
