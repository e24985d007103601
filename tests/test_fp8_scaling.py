"""FP8 scaling as each runtime declares it (Runtime.fp8_scaling, workload.FP8_SCALINGS; cost_models/fp8.py):
"delayed" (Transformer Engine, Megatron-core, paracube's executor) and "dynamic" (torchao's Float8Linear, as
torchtitan 0.3.0 runs it), priced by both engines.

Dynamic scaling against delayed, closed forms derived here from fp8.py's constants and the local GEMM shapes: no
amax all_reduce (its bytes leave the step), no FP8 weight copies or scales held (temporaries lower by exactly
fp8.copy_bytes), and the block weights cast in every micro-batch's forward (and again in a full recompute) instead
of once per step. Both engines agree on every one (step within 2%, compute to rounding, memory equal).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.cost_models import fp8
from paracube.cost_models.analytic import estimate
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event, estimate_with
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.runtimes import get_runtime
from paracube.topologies import load_topology
from paracube.workload import FP8_SCALINGS, ModelSpec, TrainingSpec

SMALL = ModelSpec("small", layers=2, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)
LINEARS = [(256, 768), (256, 256), (256, 1024), (1024, 256)]  # gpt: qkv, proj, fc, fc2 (h_in, h_out)


def _fp8(recompute: str = "none") -> TrainingSpec:
    return TrainingSpec(global_batch=16, dtype="fp8", recompute=recompute)


def test_runtimes_declare_their_scaling() -> None:
    """torchtitan scales dynamically, the Transformer Engine stacks and paracube's executor by delayed scaling; the
    engines read it from engine_options; a bad value is refused in one line naming the valid ones."""
    assert FP8_SCALINGS == ("delayed", "dynamic")
    declared = {name: get_runtime(name).fp8_scaling for name in ("paracube", "megatron", "torchtitan")}
    assert declared == {"paracube": "delayed", "megatron": "delayed", "torchtitan": "dynamic"}
    assert get_runtime("torchtitan").engine_options().fp8_scaling == "dynamic"
    assert "fp8" in get_runtime("torchtitan").dtypes
    with pytest.raises(ValueError) as err:
        replace(get_runtime("torchtitan"), fp8_scaling="tensorwise")
    assert "\n" not in str(err.value) and "'tensorwise'" in str(err.value) and "delayed, dynamic" in str(err.value)
    topo = load_topology("dgx-h100", gpus=8)
    with pytest.raises(ParacubeError, match=r"^fp8 scaling 'rowwise'; valid: delayed, dynamic$"):
        estimate(SMALL, _fp8(), parse_layout("dp=1,tp=1d:8,mb=4"), topo, fp8_scaling="rowwise")


@pytest.mark.parametrize("text", ["dp=2,tp=1d:8,mb=2", "dp=4,tp=2d:2x2,mb=1", "dp=2,tp=3d:2x2x2,mb=2",
                                  "dp=2,pp=2,tp=1d:4,mb=1", "dp=2,cp=2,tp=1d:4,sp,mb=1"])
def test_engines_agree_under_dynamic_scaling(text: str) -> None:
    """Two DGX H100 nodes (as tests/test_fp8.py): with torchtitan's options (Runtime.engine_options) both engines
    give the same compute, the same memory and the same bytes, steps within 2%; and each engine moves from delayed
    to dynamic by the same compute and bytes."""
    topo = load_topology("dgx-h100", gpus=16)
    layout = parse_layout(text)
    options = get_runtime("torchtitan").engine_options()
    an, ev = (estimate_with(e, SMALL, _fp8(), layout, topo, options=options) for e in ("analytic", "event"))
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.02), text
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6), text
    assert ev.memory == an.memory and ev.comm_bytes_per_gpu == an.comm_bytes_per_gpu, text
    an_d, ev_d = estimate(SMALL, _fp8(), layout, topo), estimate_event(SMALL, _fp8(), layout, topo)
    assert (ev.compute_time_s - ev_d.compute_time_s) == pytest.approx(an.compute_time_s - an_d.compute_time_s,
                                                                      rel=1e-6), text
    assert ev_d.comm_bytes_per_gpu - ev.comm_bytes_per_gpu == an_d.comm_bytes_per_gpu - an.comm_bytes_per_gpu


def test_dynamic_scaling_has_no_amax_reduction_and_holds_no_copies() -> None:
    """tp=1d:8 x dp=2 on two DGX H100: delayed scaling all-reduces L x 4 linears x 3 tensors x 4 bytes of amaxes
    over (dp, tp) once per step, dynamic nothing: the step's bytes differ by exactly that ring all_reduce's
    2 (n - 1) / n of them. Memory: delayed holds the FP8 weight + transpose (2 bytes per local weight element,
    sum(h_in h_out) / 8 per block) and 3 x SCALE_BYTES per linear; dynamic none of it; all else equal."""
    topo = load_topology("dgx-h100", gpus=16)
    layout = parse_layout("dp=2,tp=1d:8,mb=4")
    delayed, dynamic = (estimate(SMALL, _fp8(), layout, topo, fp8_scaling=s) for s in ("delayed", "dynamic"))
    amax = [e for e in delayed.events if e.label == "fp8_amax"]
    assert [(e.kind, e.axes, e.payload_bytes, e.group_size) for e in amax] == [
        ("all_reduce", ("dp", "tp"), SMALL.layers * 4 * 3 * 4, 16)]
    assert not [e for e in dynamic.events if e.label == "fp8_amax"]
    n = 16
    assert delayed.comm_bytes_per_gpu - dynamic.comm_bytes_per_gpu == pytest.approx(
        2 * (n - 1) / n * SMALL.layers * 4 * 3 * 4)
    per_block = sum(i * o for i, o in LINEARS) / 8
    held = SMALL.layers * (2 * per_block + 4 * 3 * fp8.SCALE_BYTES)
    assert delayed.memory.temporaries - dynamic.memory.temporaries == pytest.approx(held)
    assert (delayed.memory.parameters, delayed.memory.gradients, delayed.memory.optimizer,
            delayed.memory.activations) == (dynamic.memory.parameters, dynamic.memory.gradients,
                                            dynamic.memory.optimizer, dynamic.memory.activations)


@pytest.mark.parametrize(("recompute", "forwards"), [("none", 1), ("full", 2)])
def test_dynamic_scaling_casts_the_weights_every_micro_batch(recompute: str, forwards: int) -> None:
    """One H100, N = 4 micro-batches of T tokens: delayed casts the block weights once per step (with the optimizer
    step, DELAYED_CAST_BYTES each), dynamic in every forward (twice per micro-batch under full recomputation, which
    re-runs it) at CAST_BYTES; dynamic casts X (every forward) and dY at CAST_BYTES where delayed casts them at
    the linear's fused (x, y) bytes (fp8.TE_CASTS). compute(dynamic) - compute(delayed) =
    N L sum [forwards (CAST_BYTES W + (CAST_BYTES - x) T h_in) + (CAST_BYTES - y) T h_out] / bw
    - L sum W DELAYED_CAST_BYTES / bw (W = h_in h_out), in both engines."""
    topo = load_topology("dgx-h100", gpus=1)
    layout = parse_layout("dp=1,mb=4")
    g = gemm_model(topo, "bf16")
    bw, c, L, N, T = g.mem_bw * g.mem_eff, fp8.CAST_BYTES, SMALL.layers, 16 // 4, 4 * 128
    casts = [(2.0, 4.0), (4.0, 4.0), (2.0, 0.0), (2.0, 4.0)]  # gpt: qkv, proj, fc, fc2 (X, dY), written out
    per_micro = sum(forwards * (c * i * o + (c - x) * T * i) + (c - y) * T * o
                    for (i, o), (x, y) in zip(LINEARS, casts, strict=True))
    expected = (N * L * per_micro - L * sum(i * o for i, o in LINEARS) * fp8.DELAYED_CAST_BYTES) / bw
    for engine in ("analytic", "event"):
        delayed, dynamic = (estimate_with(engine, SMALL, _fp8(recompute), layout, topo, fp8_scaling=s)
                            for s in ("delayed", "dynamic"))
        assert dynamic.compute_time_s - delayed.compute_time_s == pytest.approx(expected, rel=1e-6), engine
