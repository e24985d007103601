"""The CLI: every planning command with its embedded default, --json contents, and each bad input
(one line on stderr, exit status 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from paracube.cli.main import main
from paracube.cli.sweep_cmd import pareto_front
from paracube.plan import load_plan


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_default_writes_a_loadable_plan(tmp_path, capsys) -> None:
    out_file = tmp_path / "plan.json"
    code, out, _ = run_cli(capsys, "plan", "-o", str(out_file), "--json")
    assert code == 0
    data = json.loads(out)
    plan = load_plan(out_file)
    assert str(plan.layout) == data["best"]["layout"]
    assert plan.gpus == 8 and plan.prediction is not None
    times = [r["step_time_s"] for r in data["ranked"]]
    assert times == sorted(times)
    for key in ("step_time_s", "memory_per_gpu_bytes", "memory_breakdown_bytes", "comm_bytes_per_gpu", "mfu"):
        assert key in data["best"]


def test_plan_with_fixed_layout(tmp_path, capsys) -> None:
    code, out, _ = run_cli(capsys, "plan", "--layout", "tp=3d:2x2x2", "-o", str(tmp_path / "p.json"), "--json")
    assert code == 0
    assert all("tp=3d:2x2x2" in r["layout"] for r in json.loads(out)["ranked"])


def test_compare_default_has_each_mode_and_speedup(tmp_path, capsys) -> None:
    png = tmp_path / "compare.png"
    code, out, _ = run_cli(capsys, "compare", "--json", "--plot", str(png))
    assert code == 0
    modes = {m["mode"]: m for m in json.loads(out)["modes"]}
    assert {"1d", "2d", "3d"} <= set(modes)
    assert modes["1d"]["speedup_over_1d"] == pytest.approx(1.0)
    for m in modes.values():
        assert m["speedup_over_1d"] == pytest.approx(modes["1d"]["step_time_s"] / m["step_time_s"])
    assert png.stat().st_size > 10_000


def test_compare_tensor_only_uses_every_device_in_one_group(capsys) -> None:
    code, out, _ = run_cli(capsys, "compare", "--tensor-only", "--json")
    assert code == 0
    for m in json.loads(out)["modes"]:
        assert m["layout"].startswith("dp=1,")


def test_simulate_default_and_plan_file_agree(tmp_path, capsys) -> None:
    code, out, _ = run_cli(capsys, "simulate", "--json", "--events")
    assert code == 0
    default = json.loads(out)
    assert default["layout"].startswith("dp=1,tp=3d:2x2x2")
    assert sum(1 for e in default["events"]) > 0
    plan_file = tmp_path / "p.json"
    # kw=0: the default plan's layout pins nothing, priced as kw=0; the search would keep weights (kw=1)
    run_cli(capsys, "plan", "--layout", "tp=3d:2x2x2,mb=4,kw=0", "-o", str(plan_file))
    code, out, _ = run_cli(capsys, "simulate", str(plan_file), "--json")
    assert code == 0
    assert json.loads(out)["step_time_s"] == pytest.approx(default["step_time_s"])


def test_models_and_topologies_list_presets(capsys) -> None:
    code, out, _ = run_cli(capsys, "models", "--json")
    assert code == 0 and any(m["name"] == "gpt3-175b" for m in json.loads(out))
    code, out, _ = run_cli(capsys, "topologies", "--json")
    assert code == 0 and {t["name"] for t in json.loads(out)} >= {"longhorn", "dgx-a100", "dgx-h100", "local-cpu"}


def test_sweep_marks_a_pareto_front(capsys) -> None:
    code, out, _ = run_cli(capsys, "sweep", "--model", "small", "--cluster", "dgx-a100,dgx-h100", "--gpus", "8,16",
                           "--global-batch", "64", "--json")
    assert code == 0
    points = json.loads(out)
    assert len(points) == 4 and any(p["pareto"] for p in points)
    for p in points:
        assert p["cost_usd"] == pytest.approx(p["train_hours"] * p["gpus"] * p["price_per_gpu_hour"])


def test_sweep_in_fp8_plans_the_clusters_with_fp8_and_says_why_not_elsewhere(capsys) -> None:
    """--dtype fp8 (what H100 / B200 buyers plan for): each H100 point is the plan `paracube plan --dtype fp8` makes,
    and each A100 point a row saying why it has none (no FP8 tensor cores), not a refusal of the whole sweep."""
    code, out, _ = run_cli(capsys, "sweep", "--model", "small", "--cluster", "dgx-a100,dgx-h100", "--gpus", "8",
                           "--global-batch", "64", "--dtype", "fp8", "--json")
    assert code == 0
    a100, h100 = json.loads(out)
    assert a100["layout"] is None and "A100-SXM-80GB has no fp8 peak" in a100["reason"] and not a100["pareto"]
    code, text, _ = run_cli(capsys, "plan", "--model", "small", "--cluster", "dgx-h100", "--gpus", "8",
                            "--global-batch", "64", "--dtype", "fp8", "--json", "-o", os.devnull, "--force")
    assert code == 0 and h100["pareto"]
    assert h100["step_time_s"] == json.loads(text)["ranked"][0]["step_time_s"]


def test_pareto_front_by_hand() -> None:
    # (time, cost): (1, 5) and (2, 2) are each best in one; (3, 3) is dominated by (2, 2); (2, 2) duplicate kept.
    assert pareto_front([(1, 5), (2, 2), (3, 3), (2, 2)]) == [True, True, False, True]


@pytest.mark.parametrize("argv, message", [
    (["plan", "--model", "gpt5"], "unknown model 'gpt5'"),
    (["plan", "--cluster", "summit"], "summit"),
    (["plan", "--layout", "tp=3d:2x2x3"], "cube"),
    (["plan", "--layout", "tp=2d:2x2", "--gpus", "6"], "uses 4 ranks, which do not divide --gpus 6"),
    (["simulate", "--layout", "tp=2d:2x2", "--gpus", "8"], "uses 4 ranks but --gpus is 8"),
    (["compare", "--gpus", "0"], "must be >= 1"),
    (["simulate", "missing-plan.json"], "does not exist"),
    (["simulate", "--layout", "tp=1d:3", "--gpus", "3"], "heads"),
    (["sweep", "--gpus", "8,x"], "comma-separated integers"),
    (["sweep", "--cluster", "dgx-a100", "--price-per-gpu-hour", "1", "2"], "1 value or one per cluster"),
    (["plan", "--model", "gpt3-175b", "--cluster", "longhorn", "--gpus", "4"], "fits"),
    (["nonsense"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a plan that is written by mistake lands here, not in the checkout
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors exit from inside parse_args
        code = exc.code
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_console_script_entry_point() -> None:
    done = subprocess.run([sys.executable, "-m", "paracube", "plan", "--layout", "tp=9d:2"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "tensor mode '9d'" in done.stderr and "Traceback" not in done.stderr


def test_simulate_event_engine_writes_trace_and_timeline(tmp_path, capsys) -> None:
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    code, out, _ = run_cli(capsys, "simulate", "--engine", "event", "--trace", str(trace), "--timeline", str(png),
                           "--json")
    assert code == 0
    est = json.loads(out)
    assert est["engine"] == "event" and est["step_time_s"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)
    assert png.stat().st_size > 5_000
    code, _, err = run_cli(capsys, "simulate", "--trace", str(trace))
    assert code == 2 and "--engine event" in err


def test_plan_refine_reranks_with_the_event_engine(tmp_path, capsys) -> None:
    code, out, _ = run_cli(capsys, "plan", "--refine", "3", "--top", "3", "-o", str(tmp_path / "p.json"), "--json")
    assert code == 0
    ranked = json.loads(out)["ranked"]
    assert [r["engine"] for r in ranked] == ["event"] * 3
    assert [r["step_time_s"] for r in ranked] == sorted(r["step_time_s"] for r in ranked)


def test_plan_gives_a_plan_the_executor_accepts_without_runnable(tmp_path, capsys) -> None:
    """Every ranked layout runs (the search emits only what the executor runs); --runnable is a no-op."""
    from paracube.executor.launch.start import NodeSpec, preflight
    from paracube.layout_parse import parse_layout

    out_file = tmp_path / "p.json"
    code, out, err = run_cli(capsys, "plan", "--model", "small", "--cluster", "dgx-h100", "--gpus", "16",
                             "--global-batch", "64", "-o", str(out_file), "--json")
    assert code == 0 and "--runnable" not in err
    plan = load_plan(out_file)
    for row in json.loads(out)["ranked"]:  # pipelines, 2.5d, zero=1 and 1D sp among them
        node = NodeSpec(nnodes=plan.launch.nnodes, master_addr="node0", master_port=29500)  # as `launch` checks
        preflight(plan.with_layout(parse_layout(row["layout"])), node, data="synthetic", check_devices=False)
    code, _, err = run_cli(capsys, "plan", "--model", "small", "--cluster", "dgx-h100", "--gpus", "16", "--runnable",
                           "--global-batch", "64", "-o", str(tmp_path / "q.json"), "--json")
    assert code == 0 and "--runnable is no longer needed" in err
    assert load_plan(tmp_path / "q.json").layout == plan.layout
