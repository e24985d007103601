"""What the published MoE rows need priced (benchmarks/published_runs.py): the experts' FP8 GEMMs where the runtime
runs them (Runtime.fp8_experts, read by both engines through Dims), the memory-bound permute / sort / unpermute
passes, and the run's gradient element in the expert gradients."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of
from paracube.cost_models.event import estimate_event
from paracube.cost_models.moe import block_cost, grad_event, pass_bytes
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.runtimes import get_runtime
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

FP8 = TrainingSpec(global_batch=32, dtype="fp8", recompute="selective")


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


def test_runtimes_declare_whether_expert_gemms_run_fp8() -> None:
    assert get_runtime("megatron").engine_options().fp8_experts is True
    assert get_runtime("paracube").engine_options().fp8_experts is False  # its executor's experts: bf16 matmuls


def test_fp8_experts_are_faster_and_both_engines_read_the_declaration(h100: object) -> None:
    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout("dp=16,ep=16,tp=none,mb=1,zero=1")
    a = {f: estimate(model, FP8, layout, h100, with_events=False, fp8_experts=f) for f in (False, True)}
    e = {f: estimate_event(model, FP8, layout, h100, with_events=False, fp8_experts=f) for f in (False, True)}
    assert a[True].step_time_s != a[False].step_time_s
    for f in (False, True):
        assert abs(e[f].step_time_s / a[f].step_time_s - 1) < 0.02
    # the block's GEMMs at the fp8 model: the declaration changes the experts' compute, nothing in bf16; beside them
    # the FP8 quantization padding's copies (moe_passes.fp8_padded: 4 R h each way, dropless), which for Qwen3-30B's
    # 768-wide experts take back more than the FP8 GEMMs save
    g = gemm_model(h100, "fp8")  # type: ignore[arg-type]
    d = dims_of(model, FP8)
    slow, fast = (block_cost(model, replace(d, fp8_experts=f), layout, 1, g) for f in (False, True))
    pad = d.c * 4 * fast.received * d.h / (g.mem_bw * g.mem_eff)
    assert fast.fwd - pad < slow.fwd and fast.bwd - pad < slow.bwd and fast.events_fwd == slow.events_fwd
    bf16 = TrainingSpec(global_batch=32, dtype="bf16", recompute="selective")
    assert estimate(model, bf16, layout, h100, with_events=False, fp8_experts=True).step_time_s == \
        estimate(model, bf16, layout, h100, with_events=False).step_time_s


def test_permute_sort_unpermute_are_memory_bound_passes(h100: object) -> None:
    """Forward bytes: permute 2 R h, sort and back 4 R h (several local experts), unpermute 2 R h + T h, SwiGLU
    3 R f_e, in the compute dtype; a single local expert needs no sort."""
    model = PRESETS["qwen3-30b-a3b"]
    d = dims_of(model, replace(FP8, dtype="bf16"))
    moe = model.moe
    assert moe is not None
    T, R = 4096, 4096 * moe.top_k
    f, b = pass_bytes(d, parse_layout("dp=16,ep=16,tp=none"), moe.expert_ffn, moe.experts // 16, T, R)
    h, c = d.h, d.c
    assert f == c * (8 * R * h + T * h + 3 * R * moe.expert_ffn)
    assert b == f + c * 3 * R * moe.expert_ffn
    one, _ = pass_bytes(d, parse_layout("dp=16,ep=16,tp=none"), moe.expert_ffn, 1, T, R)
    assert f - one == c * 4 * R * h


def test_expert_gradients_in_the_runtimes_element() -> None:
    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout("dp=16,ep=8,tp=none,mb=1")
    d = dims_of(model, replace(FP8, dtype="bf16"))
    full, half = grad_event(model, layout, 0, d), grad_event(model, layout, 0, replace(d, grad_bytes=2))
    assert full is not None and half is not None
    assert (full.dtype, half.dtype) == ("float32", "bfloat16") and full.payload_bytes == 2 * half.payload_bytes


def test_the_middle_stage_priced_is_the_one_with_most_moe_blocks() -> None:
    """DeepSeek-V3 as published (61 blocks on pp 8 x v 4, the first three dense): stage 1 holds two dense blocks, so
    the analytic engine's middle stage is stage 2 with eight MoE blocks (the event engine simulates every stage)."""
    from paracube.cost_models.moe import moe_layers_of
    from paracube.cost_models.moe_step import stage_index

    model, layout = PRESETS["deepseek-v3"], parse_layout("dp=64,pp=8,ep=64,tp=1d:2,mb=1,v=4,sp,zero=1")
    blocks = [moe_layers_of(model, layout, s) for s in range(8)]
    mid = stage_index("middle", 8, model, layout)
    assert blocks[1] == 6 and blocks[mid] == max(blocks[1:-1]) == 8 and mid == 2
    assert stage_index("middle", 8) == 1  # without the model: stage 1, as the dense engine's middle


def test_fp8_experts_pay_the_quantization_padding_copies(h100: object) -> None:
    """TE's Fp8Padding / Fp8Unpadding (Megatron-core TEGroupedMLP with fp8): dropless routing copies 4 R h each way
    beyond the bf16 block's passes; a capacity whose per-expert count is a multiple of 16 copies nothing; bf16 and
    bf16 experts (fp8_experts off) never; the event engine prices the same (within the engines' 2%)."""
    from paracube.cost_models.moe_passes import FP8_ALIGN, fp8_padded

    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout("dp=16,ep=16,tp=none,mb=1,zero=1")
    moe = model.moe
    assert moe is not None
    d = replace(dims_of(model, FP8), fp8_experts=True)  # as the megatron runtime declares (Runtime.fp8_experts)
    T, R = 4096, 4096 * moe.top_k
    assert fp8_padded(d, layout, moe, T) and not fp8_padded(replace(d, fp8_experts=False), layout, moe, T)
    assert not fp8_padded(replace(dims_of(model, replace(FP8, dtype="bf16")), fp8_experts=True), layout, moe, T)
    # capacity 1.0: ceil(4096 x 8 / 128) = 256 per source rank x ep 16 = 4096 per expert, a multiple of 16
    assert not fp8_padded(d, layout, replace(moe, capacity_factor=1.0), T)
    odd = replace(moe, capacity_factor=1.01)  # ceil(258.56) = 259 x 16 = 4144 = 16 x 259: still aligned by ep 16
    assert (259 * 16) % FP8_ALIGN == 0 and not fp8_padded(d, layout, odd, T)
    assert fp8_padded(d, parse_layout("dp=16,ep=8,tp=none"), odd, T) is ((259 * 8) % FP8_ALIGN != 0)
    f0, b0 = pass_bytes(d, layout, moe.expert_ffn, moe.experts // 16, T, R)
    f1, b1 = pass_bytes(d, layout, moe.expert_ffn, moe.experts // 16, T, R, padded=True)
    assert f1 - f0 == b1 - b0 == d.c * 4 * R * d.h
    padded_a = estimate(model, FP8, layout, h100, with_events=False, fp8_experts=True)
    padded_e = estimate_event(model, FP8, layout, h100, with_events=False, fp8_experts=True)
    assert abs(padded_e.step_time_s / padded_a.step_time_s - 1) < 0.02


def test_passes_follow_the_dispatcher(h100: object) -> None:
    """Megatron-core's token moves by dispatcher (moe_passes.py): alltoall permutes at the source, sorts by local
    expert and back, unpermutes (8 R h + T h); DeepEP permutes the U tokens that arrived into R copies and back
    (4 R h + U h, U = ep p(ep) T); HybridEP's kernels do both, and pad to the FP8 multiple (no copies); DeepEP with
    a capacity factor runs as alltoall. Engines agree on each (2%)."""
    from paracube.cost_models.moe_dispatch import dispatch_of
    from paracube.cost_models.moe_passes import fp8_padded

    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout("dp=16,ep=16,tp=none,mb=1,zero=1")
    moe = model.moe
    assert moe is not None
    T, R, local = 4096, 4096 * moe.top_k, moe.experts // 16
    base = replace(dims_of(model, replace(FP8, dtype="bf16")), fp8_experts=True)
    h, c, act = base.h, base.c, base.c * 3 * R * moe.expert_ffn

    def moves(dispatcher: str, spec: object = moe) -> float:
        f, _ = pass_bytes(replace(base, moe_dispatch=dispatcher), layout, moe.expert_ffn, local, T, R, moe=spec)
        return f - act

    U = 16 * dispatch_of(moe, "deepep").hit(16) * T
    assert 0 < U < R
    assert moves("alltoall") == c * (8 * R * h + T * h)
    assert moves("deepep") == pytest.approx(c * (4 * R * h + U * h), rel=1e-12)
    assert moves("hybridep") == 0.0
    assert moves("deepep", replace(moe, capacity_factor=1.0)) == moves("alltoall")
    fp8 = replace(dims_of(model, FP8), fp8_experts=True)
    assert fp8_padded(replace(fp8, moe_dispatch="deepep"), layout, moe, T)
    assert not fp8_padded(replace(fp8, moe_dispatch="hybridep"), layout, moe, T)
    for name in ("alltoall", "deepep", "hybridep"):
        a = estimate(model, FP8, layout, h100, with_events=False, fp8_experts=True, moe_dispatch=name)
        e = estimate_event(model, FP8, layout, h100, with_events=False, fp8_experts=True, moe_dispatch=name)
        assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


def test_the_qwen3_30b_tokendrop_row_fits_with_its_recipes_bf16_gradients() -> None:
    """qwen3-30b-16 (benchmarks/data/published_runs_moe.csv; Megatron-Bridge 0.1.0rc4's recipe sets
    grad_reduce_in_fp32=False): reference its memory with fp32 gradients, candidate with the row's bf16 ones: the
    gradients exactly half (dense and expert buckets alike, Dims.grad_bytes), every other part equal; and the
    planner matches the row's own layout, not refusing it for memory (predict raises where nothing fits)."""
    from pathlib import Path

    from paracube.calibration.run_prediction import predict, preset_topology, run_estimate
    from paracube.calibration.runs_csv import read_runs

    csv = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs_moe.csv"
    run = next(r for r in read_runs(csv, ("dgx-h100", "dgx-b200", "gb200-nvl72")) if r.name == "qwen3-30b-16")
    assert run.grad_bytes == 2
    topo = preset_topology(run)
    half, full = (run_estimate(r, run.layout, topo).memory for r in (run, replace(run, grad_bytes=4)))
    assert half.gradients == pytest.approx(full.gradients / 2, rel=1e-12)
    for part in ("parameters", "optimizer", "activations", "temporaries"):
        assert getattr(half, part) == pytest.approx(getattr(full, part), rel=1e-12)
    layout, _ = predict(run, topo)
    assert (layout.pp, layout.interleave, layout.ep, layout.micro_batch) == (2, 24, 8, 2)
