"""Today's published runs (issue #23 item 4): the rows file, what prices them as they ran (Megatron-core's
gradient bucket, flash attention's memory and its fitted kernel efficiency), and the shipped Hopper fit on the
held-out H100 rows (benchmarks/published_runs.py prints every row)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paracube.calibration.from_runs import (
    GRAD_BYTES,
    MCORE_BUCKET_MIN,
    MCORE_BUCKET_PER_DP,
    predict,
    preset_topology,
    read_runs,
)
from paracube.cost_models.analytic import estimate
from paracube.cost_models.compute import FLASH_BWD, FLASH_CAUSAL, GemmModel, attention_core_time
from paracube.cost_models.dims import dims_of, with_pins
from paracube.cost_models.memory import stage_memory
from paracube.cost_models.validity import layout_arrays
from paracube.errors import ParacubeError
from paracube.layout import parse_layout
from paracube.topologies.presets import PRESETS
from paracube.workload import ModelSpec, TrainingSpec

TODAY = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs_today.csv"


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    return {r.name: r for r in read_runs(TODAY, tuple(PRESETS))}


def test_today_rows_parse_with_their_buckets(runs: dict) -> None:
    """Every row parses; Megatron-core rows carry max(40M, 1M x dp x cp) fp32 elements per bucket, torchtitan's
    DDP's default (None)."""
    assert len(runs) >= 70
    r = runs["n4-15B-bf16-2048"]  # dp = 512: 512M elements
    assert r.bucket_bytes == GRAD_BYTES * MCORE_BUCKET_PER_DP * 512
    assert runs["n4-15B-bf16-16"].bucket_bytes == GRAD_BYTES * MCORE_BUCKET_MIN  # dp = 4: the 40M floor
    assert runs["l31-8B-bf16-128"].bucket_bytes == GRAD_BYTES * MCORE_BUCKET_PER_DP * 64 * 2  # dp x cp
    assert runs["h200-l31-8B-32"].bucket_bytes is None and runs["h200-l31-8B-32"].runtime == "torchtitan"


def test_bucket_changes_latency_not_bytes(runs: dict) -> None:
    """Megatron-core's larger buckets at dp = 512 send the same bytes in fewer calls, so only the ring's (n - 1)
    latency steps per call shrink: the step is faster, the bytes a rank sends equal up to the padding of each
    bucket to a multiple of dp (< dp elements per bucket: < 1e-4 of the gradients here)."""
    r = runs["n4-15B-bf16-2048"]
    topo = preset_topology(r)
    lay = parse_layout("dp=512,tp=1d:4,mb=4,sp,zero=1,overlap,tpo")
    small = estimate(r.model, r.training, lay, topo, with_events=False)
    big = estimate(r.model, r.training, lay, topo, with_events=False, bucket_bytes=r.bucket_bytes)
    assert big.comm_bytes_per_gpu == pytest.approx(small.comm_bytes_per_gpu, rel=1e-4)
    assert big.comm_time_by_axis["dp"] < 0.5 * small.comm_time_by_axis["dp"]
    assert big.step_time_s < small.step_time_s


def test_context_parallel_rows_wait_for_cp(runs: dict) -> None:
    """A cp > 1 row is planned with its cp or refused in one line; never priced as another layout."""
    r = runs["l31-8B-bf16-8"]
    try:
        lay, _ = predict(r, preset_topology(r), "megatron")
    except ParacubeError as exc:
        assert "cp=2" in str(exc) and "\n" not in str(exc)
    else:
        assert lay.cp == 2


def test_megatron_activations_with_flash_keep_no_scores(runs: dict) -> None:
    """Megatron's count (Korthikanti et al.) with flash attention (Transformer Engine's fused kernel, fa=1)
    drops the 5 a s^2 b / t bytes of the unfused softmax and dropout: the two differ by exactly that per block
    (bf16: scale c / 2 = 1), for the Nemotron-4 15B recipe (1D, t = 4, sp, mb = 4; no pipeline: one
    micro-batch of every block in flight)."""
    r = runs["n4-15B-bf16-16"]
    assert r.training.activations == "megatron"
    d = dims_of(r.model, r.training)
    flash, unfused = (stage_memory(with_pins(d, parse_layout(f"dp=4,tp=1d:4,sp,fa={fa}")), "1d",
                                   layout_arrays(parse_layout("dp=4,tp=1d:4,sp"), 4), True, True)["activations"][0]
                      for fa in (1, 0))
    s, a, L = r.model.seq_len, r.model.heads, r.model.layers
    assert unfused - flash == pytest.approx(L * 5 * a * s * s * 4 / 4, rel=1e-12)


def test_flash_attention_efficiency_closed_form() -> None:
    """With a fitted flash_eff the fused kernel's GEMM FLOPs (2 per score and head dim, Q K^T and P V) run at
    peak x flash_eff: forward FLASH_CAUSAL x that plus its q, k, v, output traffic; backward FLASH_BWD x."""
    model = ModelSpec("m", layers=4, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000, seq_len=8192,
                      family="llama")
    d = dims_of(model, TrainingSpec(global_batch=8, dtype="bf16"))
    g = GemmModel(peak=989e12, mem_bw=3.35e12, eff_max=0.86, m0=332, n0=332, k0=332, mem_eff=0.9, flash_eff=0.3)
    mb, t = np.array([2.0]), np.array([2.0])
    fwd, bwd = attention_core_time(d, mb, t, g)
    hd, s = d.h // d.heads, d.s
    gemms = 2 * d.heads / 2 * 2 * (2.0 * s * s * hd) / (989e12 * 0.3)
    io = d.c * 4.0 * 2 * s * d.h / 2 / (3.35e12 * 0.9)
    assert fwd[0] == pytest.approx(FLASH_CAUSAL * gemms + io, rel=1e-12)
    assert bwd[0] == pytest.approx(FLASH_CAUSAL * FLASH_BWD * gemms + 2 * io, rel=1e-12)
    # without the figure: the GEMM curve, as before
    plain = attention_core_time(d, mb, t, replace(g, flash_eff=0.0))
    curve = 2 * d.heads / 2 * (g.gemm_time(s, s, hd) + g.gemm_time(s, hd, s))
    assert plain[0][0] == pytest.approx(FLASH_CAUSAL * curve + io, rel=1e-12)


def test_shipped_hopper_fit_on_held_out_h100_rows(runs: dict) -> None:
    """The issue's acceptance on the rows the Hopper figures were not fitted on (topologies/efficiency.py):
    mean |error| <= 5%, max <= 10% over every held-out H100 row the model plans (cp rows wait for cp)."""
    errs = []
    for r in runs.values():
        if r.cluster != "dgx-h100" or r.split != "held_out" or r.layout.cp > 1:
            continue
        try:
            _, pred = predict(r, preset_topology(r), "megatron")
        except ParacubeError:
            continue  # refused in one line (memory, micro-batch divisibility): printed by the benchmark
        errs.append(abs(pred / r.measured_s - 1))
    assert len(errs) >= 12
    assert np.mean(errs) <= 0.05 and max(errs) <= 0.10, (np.mean(errs), max(errs))
