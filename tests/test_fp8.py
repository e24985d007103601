"""FP8 (`--dtype fp8`, cost_models/fp8.py): priced alike by both engines, the casts and the FP8 copies by closed
form, and refused on devices without FP8 tensor cores (one line, exit 2).

Closed forms are derived in each test from fp8.py's constants and the local GEMM shapes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paracube.cli.main import main
from paracube.cost_models import fp8
from paracube.cost_models.analytic import estimate
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event
from paracube.errors import ParacubeError
from paracube.executor.sizes import check_dtype
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

SMALL = ModelSpec("small", layers=2, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)
FP8, BF16 = TrainingSpec(global_batch=16, dtype="fp8"), TrainingSpec(global_batch=16, dtype="bf16")


def test_engines_price_fp8_alike() -> None:
    """Two DGX H100 nodes, groups as in test_event_engine's no-contention cases (every tensor group inside a node,
    dp over per-GPU rails), several micro-batches per step (the weights' casts are priced once per step by both):
    the same compute to rounding, step times within 2%. The pipeline layout's engines differ by their bubble
    models (about 1.4% here, bf16 alike): FP8 changes that gap by less than 0.1 point."""
    topo = load_topology("dgx-h100", gpus=16)
    for text in ("dp=2,tp=1d:8,mb=2", "dp=4,tp=2d:2x2,mb=1", "dp=2,tp=3d:2x2x2,mb=2", "dp=2,pp=2,tp=1d:4,mb=1"):
        layout = parse_layout(text)
        an, ev = estimate(SMALL, FP8, layout, topo), estimate_event(SMALL, FP8, layout, topo)
        assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.02), text
        assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6), text
        assert ev.memory == an.memory, text
        gap16 = estimate_event(SMALL, BF16, layout, topo).step_time_s / estimate(SMALL, BF16, layout, topo).step_time_s
        assert ev.step_time_s / an.step_time_s == pytest.approx(gap16, abs=1e-3), text


def test_fp8_compute_closed_form() -> None:
    """One H100, tp=none, N micro-batches of T tokens: fp8 - bf16 compute = N L sum over the block linears of
    (their three GEMMs at the FP8 model - at the bf16 model + (x T h_in + y T h_out) / bw), (x, y) the linear's
    delayed-scaling cast bytes as Transformer Engine fuses them (fp8.TE_CASTS: qkv (2, 4), proj (4, 4), fc (2, 0),
    fc2 (2, 4)), plus, with the optimizer step (in compute_time_s), the weights' casts once:
    L sum(h_in h_out) DELAYED_CAST_BYTES / bw. Attention and the head are bf16 in both."""
    topo = load_topology("dgx-h100", gpus=1)
    layout = parse_layout("dp=1,mb=4")
    an8, an16 = estimate(SMALL, FP8, layout, topo), estimate(SMALL, BF16, layout, topo)
    g8, g16 = gemm_model(topo, "fp8"), gemm_model(topo, "bf16")
    assert g8.linear is not None and g8.linear.peak == 1979e12 and g16.linear is None
    T, N, L = 4 * 128, 16 // 4, SMALL.layers
    bw = g16.mem_bw * g16.mem_eff
    linears = [(256, 768), (256, 256), (256, 1024), (1024, 256)]  # gpt: qkv, proj, fc, fc2
    casts = [(2.0, 4.0), (4.0, 4.0), (2.0, 0.0), (2.0, 4.0)]  # (X, dY) bytes per element, written out
    delta = gemms = 0.0
    for (h_in, h_out), (x, y) in zip(linears, casts, strict=True):
        fast = sum(float(v) for v in g8.linear.gemms(T, h_out, h_in))
        slow = sum(float(v) for v in g16.gemms(T, h_out, h_in))
        gemms += fast - slow
        delta += fast - slow + (x * T * h_in + y * T * h_out) / bw
    weights = L * sum(i * o for i, o in linears) * fp8.DELAYED_CAST_BYTES / bw
    # compute_time_s includes the optimizer step (one GPU: no communication, the step is all compute)
    assert an8.compute_time_s - an16.compute_time_s == pytest.approx(N * L * delta + weights, rel=1e-9)
    # the FP8 GEMMs are faster than their bf16 copies (the curves share m0); at this toy width the casts may eat it
    assert an8.step_time_s == an8.compute_time_s and weights > 0 and gemms < 0


def test_fp8_memory_closed_form() -> None:
    """tp=1d:8 on one DGX H100: the FP8 copies are 2 bytes per local weight element (weight + transpose) of the
    block linears, sum(h_in h_out) / 8 per block, plus 3 tensors x SCALE_BYTES (scale, inverse, an amax history
    of 16: 72 bytes) per linear; parameters,
    gradients and optimizer stay the bf16 ones (bf16 parameters, fp32 masters: 2 + 4 + 12 bytes)."""
    topo = load_topology("dgx-h100", gpus=8)
    layout = parse_layout("dp=1,tp=1d:8,mb=4")
    m8, m16 = estimate(SMALL, FP8, layout, topo).memory, estimate(SMALL, BF16, layout, topo).memory
    per_block = (256 * 768 + 256 * 256 + 256 * 1024 + 1024 * 256) / 8
    assert fp8.SCALE_BYTES == 4 * (2 + 16)
    copies = SMALL.layers * (2 * per_block + 4 * 3 * fp8.SCALE_BYTES)
    assert m8.temporaries - m16.temporaries == pytest.approx(copies)
    assert (m8.parameters, m8.gradients, m8.optimizer, m8.activations) == (
        m16.parameters, m16.gradients, m16.optimizer, m16.activations)
    assert m8.optimizer == 12 * m8.parameters / 2  # fp32 master + two moments per bf16 parameter


def test_fp8_curve_of_its_own_from_the_calibration() -> None:
    """A calibration's gemm.fp8_eff_max / fp8_m0 set the FP8 curve only; the bf16 model keeps its own."""
    topo = load_topology("dgx-h100", gpus=8)
    cal = topo.calibration
    topo.calibration = replace(cal, gemm=replace(cal.gemm, fp8_eff_max=0.6, fp8_m0=500.0))
    g = gemm_model(topo, "fp8")
    assert (g.linear.eff_max, g.linear.m0, g.linear.k0) == (0.6, 500.0, 500.0)
    assert (g.eff_max, g.m0) == (cal.gemm.eff_max, cal.gemm.m0)
    m = np.array([4096.0])
    assert float(g.linear.gemm_time(m, m, m)[0]) == pytest.approx(
        2 * 4096.0**3 / (1979e12 * 0.6 * (4096 / 4596) ** 3))


@pytest.mark.parametrize("cluster,device", [("dgx-a100", "A100-SXM-80GB"), ("dgx2-v100", "V100-SXM3-32GB"),
                                            ("longhorn", "V100-SXM2-16GB")])
def test_fp8_refused_without_fp8_tensor_cores(cluster: str, device: str, capsys: pytest.CaptureFixture) -> None:
    # megatron trains in fp8 (so does paracube's executor, in none and 1D: tests/test_fp8_run.py)
    rc = main(["plan", "--model", "tiny", "--cluster", cluster, "--gpus", "4", "--dtype", "fp8",
               "--runtime", "megatron"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"--dtype fp8: device {device} has no fp8 peak" in err and "valid there: fp32, fp16, bf16" in err
    with pytest.raises(ParacubeError, match="no fp8 peak"):
        gemm_model(load_topology(cluster, gpus=4), "fp8")


def test_fp8_priced_on_local_cpu_and_run_by_the_executor_in_none_and_1d() -> None:
    """local-cpu emulates FP8 (its fp8 peak = bf16's): priced; paracube's executor runs it in none and 1D
    (executor/layers/fp8.py) and refuses it in the other modes before any rank starts."""
    topo = load_topology("local-cpu", gpus=2)
    assert estimate(SMALL, FP8, parse_layout("dp=2"), topo).step_time_s > 0
    check_dtype("fp8", parse_layout("dp=2"))
    check_dtype("fp8", parse_layout("tp=1d:2,sp"))
    with pytest.raises(ParacubeError, match="dtype fp8 is not run by paracube's executor with tensor mode 3d"):
        check_dtype("fp8", parse_layout("tp=3d:2x2x2"))
    check_dtype("bf16", parse_layout("tp=3d:2x2x2"))
