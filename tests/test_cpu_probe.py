"""The local-cpu preset's probe of this machine (topologies/cpu_probe.py) and its cache, without timing
asserts: the cache is written once and read back, a corrupt or stale cache is re-probed, the disable switch
gives the fixed figures, and the preset prices a plan with the cached figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from paracube.cost_models import estimate
from paracube.plan import default_plan
from paracube.topologies import load_topology
from paracube.topologies.cpu_probe import (
    CACHE_FILE,
    ENV_CACHE_DIR,
    ENV_NO_PROBE,
    GEMM_SHAPES,
    CpuFigures,
    cache_key,
    cache_path,
    cpu_figures,
    read_cache,
    write_cache,
)
from paracube.topologies.local_cpu import (
    CPU_GEMM_HALF_DIM,
    CPU_OP_S,
    CPU_PEAK_FP32,
    CPU_STEP_WAIT_S,
    MODEL_EFF_MAX,
    host_cores,
    local_cpu_device,
)


@pytest.fixture
def probing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Probing enabled, the cache in a fresh temporary directory (conftest disables it everywhere else)."""
    monkeypatch.delenv(ENV_NO_PROBE, raising=False)
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path))
    return tmp_path / CACHE_FILE


def curve_figures(peak: float, op_s: float) -> CpuFigures:
    """Figures of a core whose GEMMs run exactly on the priced curve at `peak`."""
    def rate(m: int, n: int, k: int) -> float:
        h = CPU_GEMM_HALF_DIM
        return peak * MODEL_EFF_MAX * m / (m + h) * n / (n + h) * k / (k + h)
    return CpuFigures({f"{m},{n},{k}": rate(m, n, k) for m, n, k in GEMM_SHAPES}, op_s)


def test_cache_lives_under_the_override_else_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path / "a"))
    assert cache_path() == tmp_path / "a" / CACHE_FILE
    monkeypatch.delenv(ENV_CACHE_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "paracube" / CACHE_FILE


def test_probe_runs_once_writes_the_cache_and_reads_it_back(probing: Path) -> None:
    probing.write_text("{not json")  # corrupt: ignored, re-probed, overwritten
    first = cpu_figures(host_cores())
    assert first is not None and first.op_s > 0
    assert sorted(first.gemm_flops) == sorted(f"{m},{n},{k}" for m, n, k in GEMM_SHAPES)
    assert all(rate > 0 for rate in first.gemm_flops.values())
    data = json.loads(probing.read_text())
    assert data["key"] == cache_key(host_cores())
    assert cpu_figures(host_cores()) == first  # read back, not measured again (a new probe would differ)


def test_cache_round_trip_and_what_invalidates_it(tmp_path: Path) -> None:
    path, key = tmp_path / "sub" / CACHE_FILE, cache_key(2)
    figs = curve_figures(120e9, 5e-6)
    write_cache(path, key, figs)
    assert read_cache(path, key) == figs
    for other in (cache_key(3), {**key, "torch": "0.0"}, {**key, "cpu": "another CPU"}, {**key, "version": -1}):
        assert read_cache(path, other) is None  # stale: re-probed by cpu_figures
    data = json.loads(path.read_text())
    for bad in ({**data["figures"], "op_s": -1.0}, {**data["figures"], "gemm_flops": {"x": 1.0}},
                {"gemm_flops": data["figures"]["gemm_flops"]}, [1, 2]):
        path.write_text(json.dumps({"key": key, "figures": bad}))
        assert read_cache(path, key) is None
    path.write_text("")
    assert read_cache(path, key) is None
    assert read_cache(tmp_path / "missing.json", key) is None


def test_disable_switch_gives_the_fixed_figures(probing: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_cache(probing, cache_key(host_cores()), curve_figures(300e9, 50e-6))
    monkeypatch.setenv(ENV_NO_PROBE, "1")
    assert cpu_figures(host_cores()) is None
    dev = local_cpu_device(8, cores=2)
    assert dev.peak_flops["fp32"] == CPU_PEAK_FP32 / 4
    assert dev.op_overhead_s == CPU_OP_S * 4 and dev.call_overhead_s == 0
    assert dev.ring_wait_s == pytest.approx(CPU_STEP_WAIT_S * 3)


def test_device_from_given_figures_reproduces_the_priced_curve() -> None:
    dev = local_cpu_device(8, cores=2, figures=curve_figures(160e9, 5e-6))
    assert dev.peak_flops["fp32"] == pytest.approx(160e9 / 4, rel=1e-12)
    assert dev.peak_flops["bf16"] == pytest.approx(160e9 / 16, rel=1e-12)
    assert dev.op_overhead_s == pytest.approx(5e-6 * 4, rel=1e-12)
    assert dev.ring_wait_s == pytest.approx(CPU_STEP_WAIT_S * 3, rel=1e-12)  # r = 4: 3 others on the core
    own = local_cpu_device(2, cores=2, figures=curve_figures(160e9, 5e-6))
    assert own.call_overhead_s == 0 and own.ring_wait_s == 0  # a core per rank: nobody waits to be scheduled
    assert own.op_overhead_s == pytest.approx(5e-6, rel=1e-12)


def test_preset_prices_with_the_cached_figures(probing: Path) -> None:
    write_cache(probing, cache_key(host_cores()), curve_figures(200e9, 8e-6))
    r = max(1.0, 8 / host_cores())
    dev = load_topology("local-cpu", gpus=8).device
    assert dev.peak_flops["fp32"] == pytest.approx(200e9 / r, rel=1e-9)
    assert dev.op_overhead_s == pytest.approx(8e-6 * r, rel=1e-12)
    assert dev.ring_wait_s == pytest.approx(CPU_STEP_WAIT_S * (r - 1), rel=1e-12)
    plan = default_plan()
    layout = plan.layout.with_(micro_batch=plan.micro_batch)

    def step_time() -> float:
        topo = load_topology("local-cpu", gpus=layout.world_size)
        return estimate(plan.model, plan.training, layout, topo, with_events=False).step_time_s

    slow = step_time()
    write_cache(probing, cache_key(host_cores()), curve_figures(400e9, 4e-6))  # twice the speed
    fast = step_time()
    assert fast < slow and math.isfinite(fast)
