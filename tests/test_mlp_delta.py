"""Each block's MLP at its own width (cost_models/mlp_delta.py) against the dense engines' own pricing: a block's
correction equals what compute.stage_compute_time adds when the dense part's MLP takes that block's width (reference),
for DeepSeek-V3's shared expert and dense blocks, in bf16 and FP8, under each recomputation; a block without a shared
expert takes the stand-in's MLP out; both engines read it alike."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate, prepare
from paracube.cost_models.compute import stage_compute_time
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event
from paracube.cost_models.mlp_delta import mlp_delta, true_width
from paracube.cost_models.validity import layout_arrays
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


def dense_growth(d: object, layout: object, mb: int, g: object, f: int) -> float:
    """Seconds per block and micro-batch the dense engines' stage adds when its MLP is f wide instead of d.f."""
    b = layout_arrays(layout, mb)  # type: ignore[arg-type]
    zero = np.zeros(1, dtype=int)
    runs = [float(stage_compute_time(x, layout.mode, b, zero, g)[0])  # type: ignore[attr-defined]
            for x in (replace(d, f=f), d)]  # type: ignore[type-var]
    n = d.global_batch // (layout.dp * mb) * d.L  # type: ignore[attr-defined]
    return (runs[0] - runs[1]) / n


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("block", [0, 3])  # a dense block (18432 wide), a MoE block (its 2048-wide shared expert)
def test_a_blocks_correction_is_the_dense_engines_growth(h100: object, dtype: str, recompute: str,
                                                          block: int) -> None:
    model, layout = PRESETS["deepseek-v3"], parse_layout("dp=8,ep=8,tp=1d:2,sp,mb=1,zero=1")
    d, mb, _ = prepare(model, TrainingSpec(global_batch=16, dtype=dtype, recompute=recompute), layout)
    g = gemm_model(h100, dtype)  # type: ignore[arg-type]
    want = dense_growth(d, layout, mb, g, true_width(model, block))
    assert mlp_delta(model, d, layout, mb, g, [block]) == pytest.approx(want, rel=1e-9)


def test_unshared_blocks_drop_the_stand_in(h100: object) -> None:
    """Qwen3-MoE has no shared expert: each block's correction takes out the whole stand-in MLP, here (tp none, bf16)
    the closed form: fc [T, h] x [h, 2 f] and fc2 [T, f] x [f, h], each backward its two GEMMs, the SwiGLU's
    4 c T f bytes forward and twice that backward, f the stand-in's width."""
    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout("dp=8,ep=8,tp=none,mb=1,zero=1")
    d, mb, _ = prepare(model, TrainingSpec(global_batch=16, dtype="bf16", recompute="none"), layout)
    g = gemm_model(h100, "bf16")  # type: ignore[arg-type]
    assert true_width(model, 0) == 0
    T, f, h = mb * d.s, d.f, d.h
    gemms = sum(float(np.sum([np.ravel(x)[0] for x in g.gemms(T, n, k)])) for n, k in ((2 * f, h), (h, f)))
    elem = 3 * d.c * 4 * T * f / (g.mem_bw * g.mem_eff)
    assert mlp_delta(model, d, layout, mb, g, [0]) == pytest.approx(-(gemms + elem), rel=1e-9)


@pytest.mark.parametrize(("text", "layers"), [("dp=2,pp=4,ep=2,tp=1d:2,sp,mb=1,zero=1", 61),
                                             ("dp=4,pp=2,v=2,ep=4,tp=none,mb=1,zero=1", 8)])
def test_engines_agree_on_deepseek_stages(h100: object, text: str, layers: int) -> None:
    """The analytic engine adds each stage's corrections to its work, the event engine to each block's largest
    compute op (moe_program.py): within 2%, as tests/test_moe_cost.py (64 and 32 micro-batches: with a handful the
    engines' bubbles differ by more, with or without the correction). 8 layers: 3 dense blocks, then 5 MoE ones, so
    the stages differ."""
    model, layout = replace(PRESETS["deepseek-v3"], layers=layers), parse_layout(text)
    train = TrainingSpec(global_batch=128, dtype="bf16", recompute="full")
    a = estimate(model, train, layout, h100, with_events=False)
    e = estimate_event(model, train, layout, h100, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
