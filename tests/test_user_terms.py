"""A newcomer's path (issue #27): planning in the user's terms (tokens, days, cost, memory headroom), CLI hygiene
(closed pipes, no silent overwrite, did-you-mean) and the messages and verdicts a user reads."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from paracube.cli.main import main
from paracube.cli.train_terms import headroom_fraction, parse_tokens
from paracube.model_presets import resolve_model
from paracube.planner import search
from paracube.topologies import load_topology
from paracube.validation.verdict import verdict
from paracube.workload import TrainingSpec

ROOT = Path(__file__).resolve().parents[1]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("text", "value"), [("2T", 2e12), ("300B", 3e11), ("2e12", 2e12), ("1.5t", 1.5e12),
                                             ("500M", 5e8), ("20k", 2e4), ("7", 7.0), (" 2 T ", 2e12)])
def test_token_counts_in_the_users_words(text: str, value: float) -> None:
    assert parse_tokens(text) == value


@pytest.mark.parametrize("text", ["2X", "", "T", "-2T", "0", "nan", "inf", "2TT", "1e400"])
def test_bad_token_counts_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected e.g. 2T, 300B"):
        parse_tokens(text)


def test_headroom_fractions() -> None:
    assert headroom_fraction("0.1") == 0.1 and headroom_fraction("15%") == pytest.approx(0.15)
    for bad in ("1", "-0.1", "abc", "100%"):
        with pytest.raises(argparse.ArgumentTypeError):
            headroom_fraction(bad)


def test_plan_prints_days_and_cost_to_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "p.json"
    code, out, _ = run_cli(capsys, "plan", "--tokens", "2T", "--price-per-gpu-hour", "2.5", "-o", str(out_file),
                           "--json")
    assert code == 0
    data = json.loads(out)
    train, step = data["train"], data["best"]["step_time_s"]
    tokens_per_step = 8 * 64  # the tiny GPT's default global batch x sequence length
    assert train["tokens"] == 2e12 and train["tokens_per_step"] == tokens_per_step
    assert train["steps"] == math.ceil(2e12 / tokens_per_step)
    assert train["train_days"] == pytest.approx(train["steps"] * step / 86400, rel=1e-12)
    assert train["cost_usd"] == pytest.approx(train["steps"] * step / 3600 * 8 * 2.5, rel=1e-12)
    code, out, _ = run_cli(capsys, "plan", "--tokens", "300B", "--price-per-gpu-hour", "2", "-o", str(out_file),
                           "--force")
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("to train 300B tokens"))
    assert "days on 8 GPUs" in line and "x $2 = $" in line
    assert any(x.startswith("memory: ") and "10% headroom" in x for x in out.splitlines())
    notes = json.loads(out_file.read_text())["notes"]
    assert any(n.startswith("memory: ") and "more would fit" in n for n in notes)  # the plan says what is left


def test_memory_headroom_is_the_cap_the_search_keeps() -> None:
    model, training = resolve_model("gpt3-13b"), TrainingSpec(global_batch=512, dtype="bf16")
    topo = load_topology("dgx-h100", gpus=64)
    device = float(topo.device.memory_bytes)
    tight = search(model, training, topo, 64, top_k=20, memory_headroom=0.0)
    used = max(est.memory.total for _, est in tight.ranked)
    headroom = 1.0 - 0.9 * used / device  # leaves less than the largest ranked layout needs
    roomy = search(model, training, topo, 64, top_k=20, memory_headroom=headroom)
    assert all(est.memory.total <= device * (1 - headroom) for _, est in roomy.ranked)
    assert [str(lay) for lay, _ in roomy.ranked] != [str(lay) for lay, _ in tight.ranked]
    assert any(f"memory > {device * (1 - headroom) / 2**30:.0f} GiB" in r for r in roomy.rejected)


def test_outputs_are_never_overwritten_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    assert run_cli(capsys, "plan", "-o", str(plan))[0] == 0
    before = plan.read_bytes()
    code, _, err = run_cli(capsys, "plan", "--gpus", "4", "-o", str(plan))
    assert code == 2 and "the file exists; add --force" in err and str(plan) in err
    assert plan.read_bytes() == before
    code, out, _ = run_cli(capsys, "plan", "--gpus", "4", "-o", str(plan), "--force")
    assert code == 0 and f"wrote {plan}" in out and plan.read_bytes() != before
    script = tmp_path / "run.sh"
    assert run_cli(capsys, "export", str(plan), "--to", "torchrun", "-o", str(script))[0] == 0
    code, _, err = run_cli(capsys, "export", str(plan), "--to", "torchrun", "-o", str(script))
    assert code == 2 and "--force" in err
    code, _, err = run_cli(capsys, "compare", "--plot", str(script))
    assert code == 2 and "--plot" in err and "--force" in err
    code, _, err = run_cli(capsys, "plan", "-o", str(tmp_path / "nowhere" / "p.json"))
    assert code == 2 and "does not exist" in err


def _closed_pipe(*argv: str) -> tuple[int, str]:
    """Run the CLI, read a little of stdout, close it: what `paracube ... | head -c 100` does."""
    proc = subprocess.Popen([sys.executable, "-m", "paracube", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    # Outputs larger than a pipe's buffer (64 KiB on Linux), so that the writer meets the closed end.
    for argv in (["schema"], ["simulate", "--json", "--events"]):
        code, err = _closed_pipe(*argv)
        assert code in (0, 141), (argv, code, err)
        assert "Traceback" not in err and "BrokenPipe" not in err, (argv, err)


@pytest.mark.parametrize(("argv", "expected"), [
    (["plan", "--model", "gpt3-13", "-o", "x"], "unknown model 'gpt3-13'; did you mean gpt3-13b?"),
    (["plan", "--cluster", "dgx_a100", "-o", "x"], "did you mean dgx-a100?"),
    (["export", "p.json", "--to", "megatorn"], "did you mean megatron?"),
    (["schema", "estimat"], "unknown schema 'estimat'; did you mean estimate?"),
    (["simulate", "--engine", "evnt"], "did you mean event?"),
    (["plna"], "did you mean plan?"),
    (["plan", "--layout", "mb=3", "-o", "x"],
     "mb=3 does not divide the global batch of 8 sequences: 8 % 3 = 2; valid mb: 1, 2, 4, 8"),
    (["plan", "--micro-batch", "3", "-o", "x"], "mb=3 does not divide the global batch of 8 sequences"),
    (["plan", "--layout", "dp=2,mb=3", "--gpus", "8", "-o", "x"],
     "mb=3 does not divide the 4 sequences per replica (global batch 8 / dp=2)"),
    (["plan", "--layout", "dp=3", "-o", "x"], "dp=3 does not divide the global batch of 8 sequences"),
    (["plan", "--tokens", "2X", "-o", "x"], "'2X' is not a token count"),
    (["plan", "--memory-headroom", "2", "-o", "x"], "'2' is not a fraction of device memory"),
    (["simulate", "nope.json"], "plan file 'nope.json' does not exist"),
])
def test_every_refusal_names_the_reason(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def _comparisons(err: float, band: float) -> list[dict]:
    return [{"name": "step_time_s", "predicted": 1 + err, "measured": 1.0, "rel_err": err, "band": band}]


def test_validate_verdict_line() -> None:
    within, line = verdict(_comparisons(-0.50, 0.12), True)
    assert within is False and line == ("verdict: step time -50.0% is OUTSIDE the prediction's ±12% band; "
                                        "bytes sent agree exactly")
    within, line = verdict(_comparisons(0.05, 0.12), True)
    assert within is True and "+5.0% is WITHIN the prediction's ±12% band" in line
    within, line = verdict(_comparisons(0.05, 0.12), False)
    assert within is False and "DIFFER" in line
    within, line = verdict(_comparisons(0.3, 0.0), True)
    assert within is None and "no band" in line and "paracube calibrate" in line


def test_run_help_says_checkpoints_are_trusted_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Checkpoints are trusted input" in text and "pickle" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "checkpoints are trusted input" in readme.lower()
