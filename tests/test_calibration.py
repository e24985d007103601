"""Calibration: fits recover known parameters, the topology file round-trips, bad files are refused."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

from paracube.calibration.calibrate import (
    add_costs,
    build_calibration,
    calibrated_topology,
    check_calibration,
    layout_gemm_shapes,
    machine_info,
    probe_spread,
    timing_basis,
    write_topology,
)
from paracube.calibration.fit import fit_alpha_beta, fit_elementwise, fit_gemm, gemm_time
from paracube.calibration.host_overheads import fit_host_overheads, probe_layouts
from paracube.calibration.microbench import (
    PROBE_MICRO_BATCH,
    PROBE_MODEL,
    PROBE_SEQS,
    BenchConfig,
    BenchResult,
    pattern_groups,
    probe_model,
    run_benchmarks,
    run_probes,
)
from paracube.cost_models import estimate
from paracube.cost_models.collective import collective_time as _time
from paracube.cost_models.dims import dims_of
from paracube.cost_models.step_ops import ops_per_step
from paracube.cost_models.validity import layout_arrays
from paracube.errors import ParacubeError
from paracube.executor.launch import affinity
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes import MODES
from paracube.topologies import load_topology
from paracube.topologies.calibration_sections import Probe
from paracube.workload import TrainingSpec

SIZES = (256, 4096, 65536, 1 << 20)


def collective_time(kind: str, n: int, payload: float, latency: float, bandwidth: float) -> float:
    """Seconds of one call (collective.py's ring formula)."""
    return float(_time(kind, n, 1, payload, bandwidth, latency))
WALL = {"basis": "wall", "ranks_per_core": 1.0, "cores": 8}


def test_fit_recovers_alpha_beta_exactly() -> None:
    # Synthetic ring times with alpha = 30 us, B = 2 GB/s: all-reduce n=4, 1 MiB is 6a + 1.5 MiB / B.
    alpha, bw = 30e-6, 2e9
    pts = [(k, n, p, collective_time(k, n, p, alpha, bw)) for k in ("all_reduce", "all_gather")
           for n in (2, 4, 8) for p in SIZES]
    assert pts[-1][3] == pytest.approx(7 * 30e-6 + 7 / 8 * (1 << 20) / 2e9)
    fit = fit_alpha_beta(pts)
    assert fit.params["latency"] == pytest.approx(alpha, rel=1e-6)
    assert fit.params["bandwidth"] == pytest.approx(bw, rel=1e-6)
    assert fit.rms < 1e-6


def test_fit_alpha_beta_with_noise_and_residuals() -> None:
    rng = np.random.default_rng(0)
    alpha, bw = 1e-3, 5e8
    pts = [("reduce_scatter", 4, p, collective_time("reduce_scatter", 4, p, alpha, bw) * (1 + rng.normal(0, 0.02)))
           for p in SIZES for _ in range(3)]
    fit = fit_alpha_beta(pts)
    assert fit.params["latency"] == pytest.approx(alpha, rel=0.05)
    assert fit.params["bandwidth"] == pytest.approx(bw, rel=0.1)
    assert len(fit.rel_err) == len(pts) and 0.005 < fit.rms < 0.05


def test_fit_gemm_and_elementwise_recover_parameters() -> None:
    peak, m0, n0, k0 = 40e9, 20.0, 30.0, 10.0
    shapes = [(m, n, k) for m in (16, 64, 256) for n in (32, 128, 512) for k in (16, 64, 256)]
    pts = [(m, n, k, float(gemm_time(np.array(m), np.array(n), np.array(k), peak, m0, n0, k0))) for m, n, k in shapes]
    fit = fit_gemm(pts)
    for key, want in (("peak_flops", peak), ("m0", m0), ("n0", n0), ("k0", k0)):
        assert fit.params[key] == pytest.approx(want, rel=1e-3)
    elem = fit_elementwise([(b, 5e-6 + b / 10e9) for b in SIZES])
    assert elem.params["op_overhead_s"] == pytest.approx(5e-6, rel=1e-6)
    assert elem.params["bandwidth"] == pytest.approx(10e9, rel=1e-6)


def test_fit_needs_enough_points() -> None:
    with pytest.raises(ParacubeError, match="at least 2"):
        fit_alpha_beta([("all_reduce", 2, 256, 1e-5)])


def test_pattern_groups_tile_the_ranks() -> None:
    assert pattern_groups(8, 2, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pattern_groups(8, 2, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert pattern_groups(8, 4, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(ParacubeError, match="does not tile"):
        pattern_groups(8, 3, 1)


def test_layout_gemm_shapes_of_the_3d_cube() -> None:
    # tiny: h=64, f=256, V=256, s=64; mb=4 -> T=256; 3D q=2: X [T/q, h_in/q] x A [h_in/q, h_out/q].
    shapes = layout_gemm_shapes(PRESETS["tiny"], "tp=3d:2x2x2,mb=4")
    assert (128, 96, 32) in shapes  # qkv forward: [128, 32] x [32, 96]
    assert (128, 32, 96) in shapes  # qkv dX
    assert (32, 96, 128) in shapes  # qkv dA
    assert (128, 32, 128) in shapes  # fc2 forward: [128, 128] x [128, 32]


def _synthetic_result(cpu_fraction: float = 1.0) -> BenchResult:
    """Points with wall times of known parameters; CPU seconds = cpu_fraction x wall."""
    alpha, bw = 200e-6, 1e9
    res = BenchResult()
    res.gemm = [{"m": m, "n": n, "k": k, "time_s": float(gemm_time(np.array(m), np.array(n), np.array(k),
                                                                   30e9, 16, 16, 16))}
                for m, n, k in [(32, 32, 32), (64, 128, 32), (128, 128, 128), (256, 64, 512), (512, 512, 512)]]
    res.elementwise = [{"bytes": b, "time_s": 10e-6 + b / 5e9} for b in SIZES]
    res.collective = [{"kind": k, "n": n, "stride": 1, "bytes": p, "time_s": collective_time(k, n, p, alpha, bw)}
                      for k in ("all_reduce", "all_gather", "reduce_scatter") for n in (2, 4) for p in SIZES]
    for p in res.gemm + res.elementwise + res.collective:
        p["cpu_s"] = cpu_fraction * p["time_s"]
    return add_costs(res, WALL)


def test_calibration_file_round_trip(tmp_path) -> None:
    cal = build_calibration(_synthetic_result(), machine_info(4, "gloo"))
    assert cal["comm"]["all_gather"]["4"]["latency"] == pytest.approx(200e-6, rel=1e-6)
    assert cal["link"]["bandwidth"] == pytest.approx(1e9, rel=1e-6)
    topo = calibrated_topology("local-cpu", 4, cal)
    path = write_topology(topo, tmp_path / "cluster.yaml")
    back = load_topology(str(path), gpus=4)
    assert back == topo
    assert back.calibration.gemm.peak_flops == pytest.approx(30e9, rel=1e-3)
    assert back.device.peak_flops["fp32"] == pytest.approx(30e9, rel=1e-3)
    # The graph carries the joint fit: a ring hop crosses two hub links of latency alpha/2.
    link = back.group_link([0, 1, 2, 3])
    assert link.latency == pytest.approx(200e-6, rel=1e-6)
    assert link.bandwidth == pytest.approx(1e9, rel=1e-6)
    assert check_calibration(back, str(path), world=4) == back.calibration.to_dict() == cal


def test_calibration_from_another_machine_or_incomplete_is_refused(tmp_path) -> None:
    cal = build_calibration(_synthetic_result(), machine_info(4, "gloo"))
    other = copy.deepcopy(cal)
    other["machine"]["hostname"] = "some-other-host"
    topo = calibrated_topology("local-cpu", 4, other)
    with pytest.raises(ParacubeError, match="hostname='some-other-host'"):
        check_calibration(topo, "c.yaml")
    partial = {k: v for k, v in cal.items() if k != "comm"}
    with pytest.raises(ParacubeError, match="calibration lacks comm"):
        check_calibration(SimpleNamespace(calibration=partial), "c.yaml")
    with pytest.raises(ParacubeError, match="nproc=4 ranks but the plan runs 8"):
        check_calibration(calibrated_topology("local-cpu", 4, cal), "c.yaml", world=8)
    with pytest.raises(ParacubeError, match="no calibration section"):
        check_calibration(load_topology("local-cpu", gpus=4), "local-cpu")


@pytest.mark.slow
def test_microbenchmarks_run_on_two_ranks() -> None:
    cfg = BenchConfig(nproc=2, gemm_shapes=((32, 32, 32), (64, 64, 64)), elementwise_bytes=(256, 4096),
                      comm_bytes=(256, 4096), patterns=((2, 1),), reps=2, warmup=1, min_time_s=0.005,
                      timeout_s=120)
    res = run_benchmarks(cfg)
    res.probe = run_probes(probe_layouts(2), ("fp32", "bf16"), 2, 2, timeout_s=120, seqs=(16,))  # fresh ranks
    assert [(p["m"], p["n"], p["k"]) for p in res.gemm] == [(32, 32, 32), (64, 64, 64)]
    assert len(res.collective) == 3 * 2  # 3 kinds x 2 sizes
    assert {p["bytes"] for p in res.collective} == {256, 4096}
    points = res.gemm + res.elementwise + res.collective + res.probe
    assert all(p["time_s"] > 0 and p["cpu_s"] > 0 for p in points)
    assert {p["stride"] for p in res.collective} == {"1"}
    # Step probes: the serial GPT and 1D on both ranks; their dispatch counts are the cost model's, plus at
    # most one mul per parameter tensor (29 here) when the gradient norm is clipped, which the formula omits.
    assert [(p["layout"], p["dtype"], p["seq_len"]) for p in res.probe] == [
        ("dp=1", "fp32", 16), ("dp=1", "bf16", 16), ("dp=1,tp=1d:2", "fp32", 16), ("dp=1,tp=1d:2", "bf16", 16)]
    assert all(bf["ops"] > fp["ops"] for fp, bf in zip(res.probe[::2], res.probe[1::2], strict=True))  # casts
    for p in res.probe[::2]:
        layout = parse_layout(p["layout"]).with_(micro_batch=PROBE_MICRO_BATCH)
        d = dims_of(PROBE_MODEL, TrainingSpec(global_batch=PROBE_MICRO_BATCH))
        one = np.ones(1, dtype=np.int64)
        predicted = ops_per_step(d, layout.mode, layout_arrays(layout, PROBE_MICRO_BATCH), one, one)[0]
        assert predicted - 4 <= p["ops"] <= predicted + 29 + 4, (p, predicted)


def test_cpu_ranks_sharing_cores_are_priced_by_cpu_time(monkeypatch) -> None:
    """8 gloo ranks on 2 cores: a point costs 4 x its CPU seconds (the step is CPU-throughput bound);
    with a core per rank, or on GPUs, its wall time."""
    monkeypatch.setattr(affinity, "available_cores", lambda: [0, 1])
    shared = timing_basis(8, "gloo")
    assert shared == {"basis": "cpu", "ranks_per_core": 4.0, "cores": 2}
    assert timing_basis(2, "gloo")["basis"] == "wall"
    assert timing_basis(8, "nccl")["basis"] == "wall"
    res = add_costs(_synthetic_result(cpu_fraction=0.2), shared)
    assert all(p["cost_s"] == pytest.approx(0.8 * p["time_s"]) for p in res.gemm + res.collective)
    cal = build_calibration(res, machine_info(8, "gloo"), shared)
    assert cal["timing"] == shared
    assert cal["comm"]["all_gather"]["4"]["latency"] == pytest.approx(0.8 * 200e-6, rel=1e-6)


@pytest.mark.parametrize("wait, call", [(0.5e-3, 0.0), (0.1e-3, 0.9e-3)])
def test_host_overheads_recover_the_per_op_cost_and_the_waits_the_probes_were_made_with(wait: float,
                                                                                        call: float) -> None:
    """Probes priced by the calibrated model with 30 us per dispatched op (the serial probe), `wait` per
    collective message and `call` per collective call (the parallel ones) give back those figures, the per-op
    one for every tensor mode (tolerance 1e-6: scipy's nnls on exact data); a serial probe faster than the
    model's GEMMs alone gives 0 per op (never negative); priced with the fitted figures, each probe's step is
    the one it was made from."""
    cal = build_calibration(_synthetic_result(), machine_info(8, "gloo"))
    topo = calibrated_topology("local-cpu", 8, cal)
    per_op = 30e-6
    made = copy.deepcopy(cal)
    made["elementwise"]["op_overhead_by_mode"] = {"fp32": {m: per_op for m in MODES}}
    made["elementwise"]["step_wait_s"] = wait
    made["elementwise"]["call_wait_s"] = call
    truth = calibrated_topology("local-cpu", 8, made)

    def step(text: str, on: object) -> float:
        layout = parse_layout(text).with_(micro_batch=PROBE_MICRO_BATCH)
        tr = TrainingSpec(global_batch=PROBE_MICRO_BATCH * layout.dp)
        return estimate(PROBE_MODEL, tr, layout, on, with_events=False).step_time_s

    texts = ("dp=1", "dp=2,tp=1d:4", "dp=2,tp=2d:2x2", "tp=3d:2x2x2")
    probes = [{"layout": t, "dtype": "fp32", "time_s": step(t, truth)} for t in texts]
    by_mode, fitted, fitted_call, eff = fit_host_overheads(topo, probes)
    assert set(by_mode) == {"fp32"} and set(by_mode["fp32"]) == set(MODES)
    assert all(v == pytest.approx(per_op, rel=1e-9) for v in by_mode["fp32"].values())
    assert fitted == pytest.approx(wait, rel=1e-6)
    assert fitted_call == pytest.approx(call, rel=1e-6, abs=1e-12)
    assert eff == 1.0  # one sequence length: the microbenchmarks' rates as they are
    assert topo.calibration.elementwise.op_overhead_by_mode == {}  # the probe fit leaves no trace
    assert topo.calibration.elementwise.step_wait_s is None
    for text, probe in zip(texts, probes, strict=True):
        assert step(text, truth) == pytest.approx(probe["time_s"], rel=1e-12)
    fast = [{"layout": "dp=1", "dtype": "fp32", "time_s": 1e-9}]  # faster than its GEMMs alone
    assert fit_host_overheads(topo, fast) == ({"fp32": {m: 0.0 for m in MODES}}, 0.0, 0.0, 1.0)


def test_probes_at_two_sequence_lengths_recover_the_compute_efficiency_as_well() -> None:
    """Probes priced with 20 us per op (fp32), 35 us (bf16), a training step's GEMMs and elementwise ops at
    0.4 of the microbenchmarks' rates and 0.3 ms per collective message, at both PROBE_SEQS, give back those
    four figures. Tolerance 1e-4: the serial fit is scipy's bounded least squares (its default 1e-8 tolerances
    on the cost), exact data; the wait is then closed form."""
    cal = build_calibration(_synthetic_result(), machine_info(8, "gloo"))
    topo = calibrated_topology("local-cpu", 8, cal)
    per_op, wait, eff = {"fp32": 20e-6, "bf16": 35e-6}, 0.3e-3, 0.4
    made = copy.deepcopy(cal)
    made["elementwise"]["op_overhead_by_mode"] = {d: {m: c for m in MODES} for d, c in per_op.items()}
    made["elementwise"]["step_wait_s"] = wait
    made["gemm"]["eff_max"] = made["gemm"]["mem_eff"] = eff
    truth = calibrated_topology("local-cpu", 8, made)
    probes = []
    for text in ("dp=1", "dp=2,tp=1d:4", "dp=2,tp=2d:2x2"):
        layout = parse_layout(text).with_(micro_batch=PROBE_MICRO_BATCH)
        for seq in PROBE_SEQS:
            for dtype in per_op:
                tr = TrainingSpec(global_batch=PROBE_MICRO_BATCH * layout.dp, dtype=dtype)
                t = estimate(probe_model(seq), tr, layout, truth, with_events=False).step_time_s
                probes.append({"layout": text, "dtype": dtype, "seq_len": seq, "time_s": t})
    by_mode, fitted, _, fitted_eff = fit_host_overheads(topo, probes)
    assert fitted_eff == pytest.approx(eff, rel=1e-4)
    for dtype, c in per_op.items():
        assert all(v == pytest.approx(c, rel=1e-4) for v in by_mode[dtype].values())
    assert fitted == pytest.approx(wait, rel=1e-4)


def test_probe_sequence_length_round_trips_and_a_bad_one_is_refused() -> None:
    good = {"layout": "dp=1", "dtype": "fp32", "ops": 10, "time_s": 0.01, "cpu_s": 0.01, "seq_len": 64}
    assert Probe.parse("probes[0]", good).to_dict()["seq_len"] == 64
    assert Probe.parse("probes[0]", {k: v for k, v in good.items() if k != "seq_len"}).seq_len == PROBE_MODEL.seq_len
    with pytest.raises(ParacubeError, match=r"probes\[0\]\.seq_len.*positive integer"):
        Probe.parse("probes[0]", {**good, "seq_len": 0})


def test_calibration_with_other_cpu_binding_is_refused(monkeypatch) -> None:
    cal = build_calibration(_synthetic_result(), machine_info(4, "gloo"))
    monkeypatch.setenv(affinity.ENV, "none")
    with pytest.raises(ParacubeError, match="calibrated with PARACUBE_CPU_BIND=spread but this run uses "
                                            "PARACUBE_CPU_BIND=none"):
        check_calibration(calibrated_topology("local-cpu", 4, cal), "c.yaml")


def test_bench_config_cycles_every_mesh_axis_of_each_group_size() -> None:
    # 8 ranks: groups of 2 exist at strides 1, 2, 4 (the x, y, z axes of a 2x2x2 cube; tp/dp of 1D dp=2),
    # groups of 4 at strides 1, 2, groups of 8 at stride 1; each size's strides are cycled in one loop.
    from paracube.calibration.calibrate import bench_config

    assert bench_config(8, quick=True).patterns == ((2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1))
    assert bench_config(4, quick=True).patterns == ((2, 1), (2, 2), (4, 1))


def test_op_overhead_is_read_per_dtype_and_mode() -> None:
    """fp16 dispatches like bf16 (the same autocast casts), 2.5D like 2D; unprobed modes and dtypes fall back
    to the elementwise fit's op_overhead_s."""
    from paracube.cost_models.device_model import gemm_model

    cal = build_calibration(_synthetic_result(), machine_info(8, "gloo"))
    cal["elementwise"]["op_overhead_by_mode"] = {"fp32": {"1d": 1e-5, "2d": 2e-5}, "bf16": {"1d": 3e-5}}
    topo = calibrated_topology("local-cpu", 8, cal)
    base = cal["elementwise"]["op_overhead_s"]
    assert gemm_model(topo, "fp32").op_cost("1d") == 1e-5
    assert gemm_model(topo, "fp32").op_cost("2.5d") == 2e-5
    assert gemm_model(topo, "fp32").op_cost("3d") == base
    assert gemm_model(topo, "fp16").op_cost("1d") == gemm_model(topo, "bf16").op_cost("1d") == 3e-5
    assert gemm_model(topo, "bf16").op_cost("2d") == base


def test_probe_spread_is_the_rms_relative_std_over_rounds() -> None:
    # Rounds 90, 100, 110 ms: std 10 ms, 10%; rounds 2, 2 s: 0; a single round carries no spread.
    probes = [{"round_times_s": [0.09, 0.1, 0.11]}, {"round_times_s": [2.0, 2.0]}, {"round_times_s": [1.0]}]
    assert probe_spread(probes) == pytest.approx((0.1**2 / 2) ** 0.5)
    assert probe_spread([]) == 0.0
