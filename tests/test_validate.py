"""Validation: a real short run gives equal bytes and a finite time error; bad inputs exit 2 with one line."""

from __future__ import annotations

import math

import pytest

from paracube.calibration.calibrate import build_calibration, calibrated_topology, machine_info, write_topology
from paracube.cli.main import main
from paracube.plan import default_plan
from paracube.topologies import load_topology
from paracube.validation.validate import Comparison, validate
from tests.test_calibration import _synthetic_result


def test_comparison_relative_error() -> None:
    assert Comparison("t", 1.2, 1.0).rel_err == pytest.approx(0.2)
    assert Comparison("t", 0.5, 1.0).rel_err == pytest.approx(-0.5)
    assert Comparison("b", 0.0, 0.0).rel_err == 0.0
    assert math.isinf(Comparison("b", 1.0, 0.0).rel_err)


@pytest.mark.slow
def test_validate_small_plan_equal_bytes_finite_time_error() -> None:
    # 4 ranks, 2D 2x2, two micro-batches of 4 sequences; 2 steps (the first is warm-up).
    plan = default_plan("tp=2d:2x2,mb=4")
    cal = build_calibration(_synthetic_result(), machine_info(4, "gloo"))
    out = validate(plan, 2, calibrated_topology("local-cpu", 4, cal), "test-cluster")
    by = {c["name"]: c for c in out["comparisons"]}
    assert out["bytes_equal"] and by["bytes_sent_per_rank"]["measured"] > 0
    assert by["bytes_sent_per_rank"]["rel_err"] == 0.0
    assert by["step_time_s"]["measured"] > 0 and math.isfinite(by["step_time_s"]["rel_err"])
    assert by["step_time_s"]["band"] >= 0 and by["memory_bytes"]["measured"] > 0
    assert out["measured_steps"] == [2] and len(out["steps"]) == 2
    assert 0 <= by["comm_time_s"]["measured"] <= by["step_time_s"]["measured"]


def test_validate_refuses_plan_of_another_cluster(tmp_path, capsys) -> None:
    plan = default_plan("tp=2d:2x2")
    plan = type(plan)(**{**plan.__dict__, "cluster": "dgx-h100"})
    path = plan.save(tmp_path / "plan.json")
    assert main(["validate", str(path), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "plan cluster 'dgx-h100' is not this machine" in err


def test_validate_refuses_calibration_of_other_size_or_machine(tmp_path, capsys) -> None:
    plan_path = default_plan("tp=2d:2x2").save(tmp_path / "plan.json")
    cal = build_calibration(_synthetic_result(), machine_info(8, "gloo"))
    cluster = write_topology(calibrated_topology("local-cpu", 8, cal), tmp_path / "c8.yaml")
    assert main(["validate", str(plan_path), "--cluster", str(cluster)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "8 devices but the plan's layout" in err
    cal4 = build_calibration(_synthetic_result(), machine_info(4, "gloo"))
    cal4["machine"]["cpu_model"] = "Imaginary CPU 9000"
    other = write_topology(calibrated_topology("local-cpu", 4, cal4), tmp_path / "c4.yaml")
    assert main(["validate", str(plan_path), "--cluster", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cpu_model='Imaginary CPU 9000'" in err


def test_calibration_file_with_missing_fields_exits_2(tmp_path, capsys) -> None:
    plan_path = default_plan("tp=2d:2x2").save(tmp_path / "plan.json")
    cal = build_calibration(_synthetic_result(), machine_info(4, "gloo"))
    del cal["link"]
    path = write_topology(calibrated_topology("local-cpu", 4, {**cal, "link": {"latency": 1e-4, "bandwidth": 1e9}}),
                          tmp_path / "c.yaml")
    data = path.read_text().replace("  link:\n    latency: 0.0001\n    bandwidth: 1000000000.0\n", "")
    path.write_text(data)
    assert load_topology(str(path), gpus=4).calibration.link is None
    assert main(["validate", str(plan_path), "--cluster", str(path)]) == 2
    assert "calibration lacks link" in capsys.readouterr().err


def test_validate_rejects_zero_steps(capsys) -> None:
    # argparse rejects --steps 0 with status 2 and one line.
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--steps", "0"])
    assert exc.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_compare_measures_communication_on_the_calibration_basis() -> None:
    """Per-rank rows of 3 steps (step 1 is warm-up): step 100 ms, 60 ms of wall time inside collectives of
    which 10 ms CPU. Wall basis: comm = 60 ms; CPU basis with 4 ranks per core: comm = 4 x 10 = 40 ms;
    compute is the rest of the step either way."""
    from types import SimpleNamespace

    from paracube.validation.validate import compare

    def rows(step_s: float) -> list[dict]:
        return [{"step": k, "step_time_s": step_s, "comm_time_s": 0.06, "comm_cpu_s": 0.01,
                 "bytes_sent_per_rank": 1000, "peak_memory_bytes": 5000} for k in (1, 2, 3)]

    per_rank = [{"rows": rows(0.1), "base_rss": 1000} for _ in range(2)]
    est = SimpleNamespace(step_time_s=0.09, compute_time_s=0.05, comm_time_s=0.04, comm_bytes_per_gpu=1000,
                          memory=SimpleNamespace(total=4000), layout="dp=2")
    for timing, comm in (({"basis": "wall", "ranks_per_core": 1.0}, 0.06), ({"basis": "cpu", "ranks_per_core": 4.0},
                                                                             0.04)):
        out = compare(est, per_rank, {"timing": timing, "residuals": {}})
        by = {c["name"]: c for c in out["comparisons"]}
        assert by["comm_time_s"]["measured"] == pytest.approx(comm)
        assert by["compute_time_s"]["measured"] == pytest.approx(0.1 - comm)
        assert by["step_time_s"]["rel_err"] == pytest.approx(-0.1)
        assert out["bytes_equal"] and by["memory_bytes"]["measured"] == 4000
