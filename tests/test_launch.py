"""`paracube run` / `paracube launch`: refusals before any rank starts, Slurm script, a rank that dies."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from paracube.cli.main import main
from paracube.executor.launch.rank_procs import describe_failure
from paracube.plan import LaunchSpec, default_plan


def _plan_file(tmp_path: Path, layout: str = "dp=1,tp=1d:2,mb=4", **launch: int) -> Path:
    plan = default_plan(layout)
    if launch:
        plan = replace(plan, cluster="dgx-h100", launch=LaunchSpec(**launch))
    return plan.save(tmp_path / "plan.json")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_world_size_mismatch_is_refused_before_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _plan_file(tmp_path)
    data = json.loads(path.read_text())
    data["gpus"], data["launch"]["nproc_per_node"] = 4, 4  # the layout needs 2 ranks
    path.write_text(json.dumps(data))
    code, err = _run(["run", str(path), "--metrics", str(tmp_path / "m.jsonl")], capsys)
    assert code == 2 and "needs 2 ranks but the plan has gpus=4" in err and len(err.splitlines()) == 1
    code, err = _run(["run", "--nnodes", "2", "--master-addr", "10.0.0.1", "--master-port", "29500"], capsys)
    assert code == 2 and "16 ranks, but layout dp=1,tp=3d:2x2x2,mb=4 needs 8" in err
    assert not (tmp_path / "m.jsonl").exists()  # no rank ever started


def test_non_divisible_sizes_are_refused_before_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2.5D 2x2x3 splits each micro-batch's tokens 6 ways: one sequence of 64 tokens does not split.
    path = _plan_file(tmp_path, "dp=1,tp=2.5d:2x2x3,mb=1")
    code, err = _run(["run", str(path), "--metrics", str(tmp_path / "m.jsonl")], capsys)
    assert code == 2 and "micro_batch=1: its 1 x 64 = 64 tokens do not split 6 ways" in err
    assert not (tmp_path / "m.jsonl").exists()


def test_checkpoint_directory_mistakes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _plan_file(tmp_path)
    code, err = _run(["run", str(path), "--resume", "--checkpoint-dir", str(tmp_path / "none")], capsys)
    assert code == 2 and "does not exist" in err
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest").write_text("step_3\n")
    code, err = _run(["run", str(path), "--checkpoint-dir", str(tmp_path / "ck")], capsys)
    assert code == 2 and "already holds checkpoints" in err  # a fresh run never overwrites a checkpoint
    code, err = _run(["run", str(path), "--data", "text:/no/such/file"], capsys)
    assert code == 2 and "cannot read data file" in err


def test_slurm_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _plan_file(tmp_path, "dp=2,tp=3d:2x2x2,mb=4", nproc_per_node=8, nnodes=2)
    assert main(["launch", str(path), "--slurm", "--steps", "50", "--partition", "gpu"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "MASTER_PORT=29500"):
        assert line in script.splitlines()
    srun = next(x for x in script.splitlines() if x.startswith("srun "))
    for part in ("torch.distributed.run", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
                 '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', "--max-restarts=0",
                 "-m paracube.executor.launch.worker",
                 f"--worker {path.resolve()}", "--steps 50"):
        assert part in srun
    assert main(["launch", str(path)]) == 2  # no format asked for


def test_describe_failure_names_the_rank_that_died_first() -> None:
    failures = {0: SimpleNamespace(exitcode=1, timestamp=5, message="Connection reset by peer"),
                3: SimpleNamespace(exitcode=-int(signal.SIGKILL), timestamp=7, message=""),
                2: SimpleNamespace(exitcode=-int(signal.SIGTERM), timestamp=6, message="")}
    assert describe_failure(failures) == "rank 3 died (signal SIGKILL); ranks [0, 2] stopped after it"
    only = {1: SimpleNamespace(exitcode=2, timestamp=1, message="Traceback\nValueError: boom")}
    assert describe_failure(only) == "rank 1 died (exit code 2): ValueError: boom; the other ranks were stopped"


# A rank that dies (SIGKILL) and the resume after it: tests/test_reliability.py.


@pytest.mark.skipif(os.name != "posix" or sys.version_info < (3, 11), reason="process groups: POSIX, Python 3.11")
def test_workers_lead_their_own_process_group_in_our_session(tmp_path: Path) -> None:
    """Each worker leads its own process group (stopped by group; a terminal's Ctrl-C reaches the launcher only)
    but stays in the launcher's session: a session per worker is a scheduling group per worker under Linux
    autogroup (rank_procs.py). It gets torchrun's environment; a failed rank stops the others."""
    from paracube.executor.launch.rank_procs import RankProcs

    script = ("import os, sys, time\n"
              "e = os.environ\n"
              "print(e['RANK'], e['LOCAL_RANK'], e['WORLD_SIZE'], e['LOCAL_WORLD_SIZE'], e['MASTER_PORT'], "
              "file=open(sys.argv[1] + e['RANK'], 'w'))\n"
              "while e['RANK'] == '3' and not os.path.exists(sys.argv[1] + '2'):\n"
              "    time.sleep(0.05)\n"
              "time.sleep(0.2 if e['RANK'] == '3' else 60)\n"
              "sys.exit(3 if e['RANK'] == '3' else 0)\n")
    procs = RankProcs.start([sys.executable, "-c", script, str(tmp_path / "rank")], 2, node_rank=1, nnodes=2,
                            env={"MASTER_PORT": "29999"}, workdir=tmp_path)
    try:
        for p in procs.procs:
            assert os.getpgid(p.pid) == p.pid and os.getsid(p.pid) == os.getsid(0)
        failures = procs.wait(grace_s=5.0)
    finally:
        procs.stop(grace_s=0.1)
    assert sorted(failures) == [2, 3] and failures[3].exitcode == 3 and failures[2].exitcode == -signal.SIGTERM
    assert describe_failure(failures) == "rank 3 died (exit code 3); ranks [2] stopped after it"
    assert [(tmp_path / f"rank{r}").read_text().split() for r in (2, 3)] == [
        ["2", "0", "4", "2", "29999"], ["3", "1", "4", "2", "29999"]]
    assert all(p.poll() is not None for p in procs.procs)


def test_bad_run_arguments_are_refused_before_any_rank(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["--nproc-per-node", "0"], "--nproc-per-node: 0 must be >= 1"),
                          (["--steps", "0"], "--steps: 0 must be >= 1"),
                          (["--nnodes", "0"], "--nnodes: 0 must be >= 1"),
                          (["--master-port", "70000"], "--master-port: 70000 must be <= 65535"),
                          (["--lr", "-1"], "--lr: -1.0 must be > 0")):
        with pytest.raises(SystemExit) as exc:
            main(["run", *argv])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_oversubscription_is_said_once_with_the_slowdown() -> None:
    from paracube.cli.run_cmd import oversubscription_line

    assert oversubscription_line(8, 8) is None and oversubscription_line(2, 4) is None
    assert oversubscription_line(8, 2) == ("paracube run: 8 ranks share 2 CPU cores: expect steps about 4.0x "
                                           "slower than with a core per rank")


def test_interrupted_line_names_the_step_and_the_last_checkpoint(tmp_path: Path) -> None:
    from paracube.executor.launch.start import interrupted_line

    assert interrupted_line({}, None) == ("paracube: interrupted before the first step finished; last checkpoint: "
                                          "none (no --checkpoint-dir)")
    assert interrupted_line({"step": 3, "steps": 20}, str(tmp_path)) == (
        "paracube: interrupted during step 4 (3 of 20 done); last checkpoint: none saved yet")


def _session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (from /proc: field 6 of stat is the session id)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_ctrl_c_stops_every_rank_with_one_line(tmp_path: Path) -> None:
    """The default plan on 8 CPU ranks, interrupted once it trains: exit 130, one line naming the step and the
    last checkpoint (after the run's own header lines: at most 3 on stderr), no process left behind."""
    import subprocess
    import time

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    metrics, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    argv = [sys.executable, "-m", "paracube", "run", "--steps", "200", "--metrics", str(metrics),
            "--checkpoint-dir", str(ck), "--save-every", "1", "--data", "synthetic"]
    # A handled signal is reset to its default across exec, an ignored one stays ignored: handle SIGINT while the
    # launcher starts, so that it sees Ctrl-C even where this suite runs with SIGINT ignored (a background job).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with open(tmp_path / "err", "w") as err, open(tmp_path / "out", "w") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)  # its own session
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        # Generous: ~40 s on 2 idle cores, but 8 ranks importing torch took over 240 s with other suites running
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline and not (ck / "step_2").exists():
            time.sleep(0.1)
        assert proc.poll() is None, (tmp_path / "err").read_text()[-2000:]
        assert (ck / "step_2").exists(), "no checkpoint step_2 after 600 s"
        assert len(_session_members(proc.pid)) == 9  # the launcher and its 8 ranks
        proc.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C reaches the launcher
        code = proc.wait(timeout=60)
        time.sleep(0.5)
        left = _session_members(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = (tmp_path / "err").read_text().strip().splitlines()
    assert code == 130 and len(lines) <= 3, lines
    # Rank 0 reports a step once its metrics row is written and its checkpoint saved: the kill may fall between.
    rows = len(metrics.read_text().splitlines())
    found = re.fullmatch(rf"paracube: interrupted during step (\d+) \((\d+) of 200 done\); last checkpoint: "
                         rf"{re.escape(str(ck))}/step_(\d+)", lines[-1])
    assert found is not None, lines
    step, done, saved = (int(g) for g in found.groups())
    assert step == done + 1 and done in (rows - 1, rows) and saved in (done, done + 1) and saved >= 2
    assert left == []


def _store_seen_by_rank(rank: int, world: int) -> tuple[str, str, str]:
    import torch.distributed as dist

    from paracube.executor.launch.rendezvous import LAUNCHER_KEY

    port = int(os.environ["MASTER_PORT"])
    client = dist.TCPStore("127.0.0.1", port, None, False)  # the store the env:// rendezvous joined
    return os.environ["MASTER_PORT"], os.environ["TORCHELASTIC_USE_AGENT_STORE"], client.get(LAUNCHER_KEY).decode()


def test_ranks_join_the_store_the_launcher_bound_on_port_0() -> None:
    """run_on_ranks (the tests' and calibration's launcher) hosts the rendezvous store itself, bound on port 0,
    and the ranks are its clients: every rank sees one port, the agent-store flag, and the launcher's pid in it
    (rank 0 binding its own store on that port would have failed with EADDRINUSE). No port is chosen free."""
    from dist_helpers import run_distributed

    seen = run_distributed(_store_seen_by_rank, 2)
    assert len({port for port, _, _ in seen}) == 1, seen
    assert all(flag == "True" and pid == str(os.getpid()) for _, flag, pid in seen), seen


def test_launcher_store_listens_on_loopback_only_and_names_a_taken_port() -> None:
    import socket

    from paracube.errors import ParacubeError
    from paracube.executor.launch.rendezvous import launcher_store

    store = launcher_store()
    assert store.port > 0
    with socket.create_connection(("127.0.0.1", store.port), timeout=5):
        pass  # listening on loopback
    with pytest.raises(ParacubeError, match=rf"cannot listen on 127.0.0.1:{store.port} .*choose another --master-port"):
        launcher_store(port=store.port)
