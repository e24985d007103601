"""Reliability (issue 7): faults survived, bad input refused, nothing lost. Item -> the tests that prove it:

1 a rank SIGKILLed mid-step           test_killed_rank_stops_every_rank_and_leaves_no_process
2 the job killed during a save         test_kill_during_save_keeps_the_previous_checkpoint
3 resume after kills is bit-identical  test_resumed_run_matches_the_uninterrupted_run_bit_for_bit
4 corrupt checkpoint shard             test_truncated_shard_is_named_and_nothing_is_overwritten,
                                       test_flipped_bytes_are_detected_though_dcp_alone_misses_them
5 refused before any rank starts       test_bad_sizes_are_refused_before_any_process_starts,
                                       test_a_worker_refuses_bad_sizes_before_any_collective
6 NaN/inf loss                         test_nonfinite_loss_on_four_ranks_stops_at_that_step_and_keeps_the_checkpoint;
                                       one rank, stop and skip: tests/test_train.py::
                                         test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint,
                                         test_nonfinite_loss_can_skip_the_step
7 loopback only; multi-node needs it   test_local_run_listens_on_loopback_only,
                                       test_several_nodes_need_an_explicit_master_addr

The slow tests share one story on 4 ranks (2D 2x2, synthetic data, 6-step schedule, a checkpoint each step):
  R  the uninterrupted reference, by in-process gloo workers (the same train() the CLI's ranks run); the
     same processes then run item 6's diverging job and a 4-rank resume from a corrupted copy (item 4)
  X  the same job as `paracube run` runs it, by in-process workers: rank 1 SIGKILLs itself inside the save of
     step 3, once its shard file is written (train's `after_shard_written` hook; the others are still saving)
  Y  `paracube run --resume` (from step_2); the test lists its listening sockets once it has saved step_3,
     then SIGKILLs rank 1 from outside right after step_4 is saved, i.e. during step 5
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from dist_helpers import in_process_rendezvous, run_distributed

from paracube.cli.main import main
from paracube.errors import ParacubeError
from paracube.executor.checkpoint.store import export_full_state_dict, find_checkpoint, is_complete, read_meta
from paracube.executor.launch.start import NodeSpec, is_loopback, preflight
from paracube.plan import default_plan

REPO = Path(__file__).resolve().parents[1]
LAYOUT = "dp=1,tp=2d:2x2,mb=4"
STEPS = 6
RUN_TIMEOUT = 150  # s per `paracube run`: a hang fails the test instead of the suite


# --- /proc helpers (no psutil needed) -----------------------------------------------------------------------
def _tree(pid: int) -> list[int]:
    """pid and all its descendants, breadth-first."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree = [pid]
    for p in tree:  # grows while iterating
        tree.extend(c for c, pp in parent.items() if pp == p)
    return tree


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _env_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _listening(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, local address as /proc/net/tcp* writes it) of every listening TCP socket these processes hold."""
    owner: dict[int, int] = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                owner[int(target[8:-1])] = pid
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[9]) in owner:  # 0A: TCP_LISTEN
                out.append((owner[int(cols[9])], cols[1].rsplit(":", 1)[0]))
    return out


LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


# --- the story ------------------------------------------------------------------------------------------------
def _in_process(rank: int, world: int, root: str) -> tuple[str, str]:
    """R, then in the same 4 processes (saving starts): a run that diverges (item 6), and a resume from a copy
    of its checkpoint with flipped bytes in rank 2's shard (item 4: ranks split the hashing, all must fail)."""
    import shutil

    import torch.distributed as dist

    from paracube.executor.training.loop import TrainConfig, TrainingDiverged, train

    train(default_plan(LAYOUT), rank, world, STEPS, metrics_path=Path(root) / "R.jsonl",
          config=TrainConfig(data="synthetic"))
    # lr 1e30: Adam moves every parameter by ~1e30 at step 1, so step 2's activations overflow fp32.
    cfg = TrainConfig(data="synthetic", lr=1e30, warmup_steps=0)
    diverged = corrupt = "no error"
    try:
        train(default_plan(LAYOUT), rank, world, 4, checkpoint_dir=Path(root) / "nan", save_every=1, config=cfg)
    except TrainingDiverged as exc:
        diverged = str(exc)
    bad = Path(root) / "flipped"
    if rank == 0:
        shutil.copytree(Path(root) / "nan", bad)
        _flip(bad / "step_1" / "__2_0.distcp")
    dist.barrier()
    try:
        train(default_plan(LAYOUT), rank, world, 2, checkpoint_dir=bad, resume=True, config=cfg)
    except ParacubeError as exc:
        corrupt = str(exc)
    return diverged, corrupt


def _die_saving_step_3(notes: Path, rank: int, step: int) -> None:
    """X's after_shard_written hook: rank 1 dies once its shard of step 3 is on disk, mid-save for the rest.
    It leaves a note first (the dying process cannot report back)."""
    if (rank, step) == (1, 3):
        notes.write_text(json.dumps({"pid": os.getpid(), "rank": rank, "step": step,
                                     "files": sorted(p.name for p in (notes.parent / "ck" / "step_3.tmp").iterdir())}))
        os.kill(os.getpid(), signal.SIGKILL)


def _run_x(rank: int, world: int, root: str) -> None:
    """What `paracube run --save-every 1 --data synthetic` runs on each rank (argv of _argv), plus the hook."""
    from paracube.executor.training.hooks import TrainHooks
    from paracube.executor.training.loop import TrainConfig, train

    train(default_plan(LAYOUT), rank, world, STEPS, metrics_path=Path(root) / "m.jsonl",
          checkpoint_dir=Path(root) / "ck", save_every=1, config=TrainConfig(data="synthetic", comm_timeout_s=60),
          hooks=TrainHooks(after_shard_written=functools.partial(_die_saving_step_3, Path(root) / "X.killed.json")))


@dataclass
class Story:
    root: Path
    reference: list[dict]
    in_process: list[tuple[str, str]]  # each rank's TrainingDiverged message, and its corrupt-resume error
    runs: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (exit code, stderr)
    after_x: dict = field(default_factory=dict)
    sockets: list[tuple[int, str]] = field(default_factory=list)
    tree: list[int] = field(default_factory=list)
    kill_to_exit_s: float = 0.0
    killed_pid: int = 0
    rank_env: dict[str, str] = field(default_factory=dict)


def _argv(root: Path, resume: bool) -> list[str]:
    argv = [sys.executable, "-m", "paracube", "run", str(root / "plan.json"), "--steps", str(STEPS),
            "--save-every", "1", "--checkpoint-dir", str(root / "ck"), "--metrics", str(root / "m.jsonl"),
            "--no-progress", "--data", "synthetic", "--comm-timeout", "60"]
    return argv + (["--resume"] if resume else [])


def _start(root: Path, name: str, resume: bool, **extra_env: str) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra_env}
    err = root / f"{name}.err"
    with open(err, "w") as f:  # a file, not a pipe: a full pipe would block the launcher
        proc = subprocess.Popen(_argv(root, resume), env=env, stdout=subprocess.DEVNULL, stderr=f,
                                start_new_session=True)
    return proc, err


def _finish(proc: subprocess.Popen, err: Path, timeout: float = RUN_TIMEOUT) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own session: the launcher and its ranks
        proc.wait()
        raise AssertionError(f"paracube run hung; stderr:\n{err.read_text()[-2000:]}") from None
    return code, err.read_text()


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _latest(ck: Path) -> str:
    try:
        return (ck / "latest").read_text().strip()
    except OSError:
        return ""


def _run_y(story: Story) -> None:
    """Resume; list sockets once it has saved step_3; SIGKILL rank 1 from outside as soon as step_4 is saved."""
    root, ck = story.root, story.root / "ck"
    proc, err = _start(root, "Y", resume=True)
    deadline = time.monotonic() + RUN_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        latest = _latest(ck)
        if not story.sockets and latest in ("step_3", "step_4"):  # Y's own saves: X never completed step 3
            story.sockets = _listening(_tree(proc.pid))
        if latest == "step_4":
            story.tree = _tree(proc.pid)
            rank1 = [p for p in story.tree if _env_of(p).get("RANK") == "1" and p != proc.pid]
            assert len(rank1) == 1, f"rank 1 not found among {story.tree}"
            story.killed_pid, story.rank_env = rank1[0], _env_of(rank1[0])
            os.kill(rank1[0], signal.SIGKILL)
            t0 = time.monotonic()
            story.runs["Y"] = _finish(proc, err)
            story.kill_to_exit_s = time.monotonic() - t0
            return
        time.sleep(0.02)
    story.runs["Y"] = _finish(proc, err)
    raise AssertionError(f"run Y ended before step_4 was saved: {story.runs['Y']}")


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    root = tmp_path_factory.mktemp("story")
    in_process = run_distributed(_in_process, 4, str(root))
    s = Story(root, _rows(root / "R.jsonl"), in_process)
    default_plan(LAYOUT).save(root / "plan.json")
    try:
        run_distributed(_run_x, 4, str(root), timeout=RUN_TIMEOUT)
        s.runs["X"] = (0, "")
    except AssertionError as exc:  # the harness names the rank that died and stops the others
        s.runs["X"] = (1, str(exc))
    ck = root / "ck"
    s.after_x = {"latest": find_checkpoint(ck).name, "rows": [r["step"] for r in _rows(root / "m.jsonl")],
                 "partial": sorted(p.name for p in (ck / "step_3.tmp").iterdir()) if (ck / "step_3.tmp").exists()
                 else None, "step_3_complete": is_complete(ck / "step_3"),
                 "export": export_full_state_dict(ck)}
    _run_y(s)
    s.after_x["latest_after_y"] = find_checkpoint(ck).name
    return s


@pytest.mark.slow
def test_kill_during_save_keeps_the_previous_checkpoint(story: Story) -> None:
    code, err = story.runs["X"]
    # The harness names rank 1's death, or the peer whose collective noticed it first (gloo: connection closed or
    # reset by peer); rank 1's note says it was the one killed, at step 3.
    assert code == 1 and (f"rank 1 exited with code {-signal.SIGKILL}" in err or "by peer" in err), err[-2000:]
    note = json.loads((story.root / "X.killed.json").read_text())
    assert (note["rank"], note["step"]) == (1, 3) and not _alive(note["pid"])
    assert "__1_0.distcp" in note["files"] and ".metadata" not in note["files"]  # mid-save: its shard, no metadata
    a = story.after_x
    assert a["rows"] == [1, 2, 3]  # step 3 trained, its save was killed
    # The killed save left rank 1's shard (at least) in step_3.tmp, but neither DCP's nor our metadata.
    assert a["partial"] is not None and "__1_0.distcp" in a["partial"]
    assert ".metadata" not in a["partial"] and "paracube.json" not in a["partial"]
    assert not a["step_3_complete"] and a["latest"] == "step_2"  # the partial one is never taken
    # The previous checkpoint is complete and loads: the serial model's full parameters, all finite.
    assert a["export"]["head.weight"].shape == (64, 256)
    assert all(bool(t.isfinite().all()) for t in a["export"].values())
    # `--resume` continued from step_2 (Y's first row is step 3), and re-saving step 3 replaced the partial.
    assert "Y" in story.runs and not (story.root / "ck" / "step_3.tmp").exists()
    assert read_meta(story.root / "ck" / "step_3")["step"] == 3


@pytest.mark.slow
def test_killed_rank_stops_every_rank_and_leaves_no_process(story: Story) -> None:
    code, err = story.runs["Y"]
    assert code != 0 and "paracube: run failed: rank 1 died (signal SIGKILL)" in err, err[-2000:]
    assert story.kill_to_exit_s < 60, story.kill_to_exit_s
    # The launcher (its elastic agent) and its 4 ranks were running; none is left.
    assert len(story.tree) == 5 and story.killed_pid in story.tree
    assert [p for p in story.tree if _alive(p)] == []
    assert story.after_x["latest_after_y"] in ("step_4", "step_5")  # the kill landed in step 5 (or its save)


@pytest.mark.slow
def test_resumed_run_matches_the_uninterrupted_run_bit_for_bit(story: Story) -> None:
    rows, ref = _rows(story.root / "m.jsonl"), story.reference
    assert [r["step"] for r in ref] == list(range(1, STEPS + 1))
    # X wrote steps 1-3, then died saving step 3; resuming from step_2, Y dropped X's row 3 and wrote 3, 4 (and
    # 5 if its save finished before the kill). Every row equals the uninterrupted run's exactly: data order (the
    # batch is a function of the step) and the LR schedule (restored from the checkpoint) continued.
    assert [r["step"] for r in rows] in ([1, 2, 3, 4], [1, 2, 3, 4, 5])
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref[:len(rows)]]
    assert [r["lr"] for r in rows] == [r["lr"] for r in ref[:len(rows)]]
    assert ref[2]["lr"] != ref[0]["lr"] and ref[2]["loss"] != ref[0]["loss"]  # a restart would be visible
    assert read_meta(story.root / "ck" / "step_4")["data"]["next_step"] == 5


@pytest.mark.slow
def test_local_run_listens_on_loopback_only(story: Story) -> None:
    by_pid: dict[int, list[str]] = {}
    for pid, addr in story.sockets:
        by_pid.setdefault(pid, []).append(addr)
    # The launcher's rendezvous store and every rank's gloo pairs: 5 processes listening, all on loopback.
    assert len(by_pid) == 5, story.sockets
    assert {addr for _, addr in story.sockets} <= LOOPBACK_HEX, story.sockets
    # Here the hostname resolves to 127.0.0.1 anyway; where it does not, this keeps gloo's pairs on loopback.
    assert story.rank_env.get("GLOO_SOCKET_IFNAME") == "lo"


# --- 4: corrupt checkpoints -------------------------------------------------------------------------------------
def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def good_checkpoint(story: Story, tmp_path: Path) -> Path:
    """A copy of the story's complete step_2 (4 shards written by 4 ranks), as the only checkpoint of a root."""
    import shutil

    root = tmp_path / "ck"
    root.mkdir()
    shutil.copytree(story.root / "ck" / "step_2", root / "step_2")
    (root / "latest").write_text("step_2\n")
    shutil.copy(story.root / "plan.json", tmp_path / "plan.json")
    return root


def _inside_tensor_bytes(data: bytes) -> int:
    """The middle of the largest gap between zip records (DCP stores each tensor as a torch.save zip): raw
    tensor bytes, where a flip changes values without breaking the file's structure."""
    marks = sorted({i for sig in (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07",
                                  b"PK\x07\x08") for i in _find_all(data, sig)} | {0, len(data)})
    start, end = max(zip(marks, marks[1:], strict=False), key=lambda ab: ab[1] - ab[0])
    return (start + end) // 2


def _find_all(data: bytes, sub: bytes) -> list[int]:
    out, i = [], data.find(sub)
    while i >= 0:
        out.append(i)
        i = data.find(sub, i + 1)
    return out


def _resume_cli(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", str(root.parent / "plan.json"), "--resume", "--checkpoint-dir", str(root), "--steps", "4",
                 "--data", "synthetic", "--no-progress"])
    return code, capsys.readouterr().err


def _resume_in_process(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' own check (torchrun started without our launcher): one rank loads it into a 1-rank model."""
    from paracube.executor.training.loop import TrainConfig, train

    with in_process_rendezvous(monkeypatch):
        train(default_plan("dp=1,mb=4"), 0, 1, 4, checkpoint_dir=root, resume=True,
              config=TrainConfig(data="synthetic"))


@pytest.mark.slow
def test_truncated_shard_is_named_and_nothing_is_overwritten(good_checkpoint: Path, capsys, monkeypatch) -> None:
    shard = good_checkpoint / "step_2" / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    before = _hashes(good_checkpoint.parent)
    code, err = _resume_cli(good_checkpoint, capsys)  # refused by the launcher, before any rank starts
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"checkpoint file {str(shard)!r} is corrupt: {len(data) // 2} bytes, {len(data)} were saved" in err
    with pytest.raises(ParacubeError, match=f"{shard}.*corrupt"):
        export_full_state_dict(good_checkpoint)
    with pytest.raises(ParacubeError, match=f"{shard}.*corrupt"):
        _resume_in_process(good_checkpoint, monkeypatch)
    assert not torch.distributed.is_initialized()
    assert _hashes(good_checkpoint.parent) == before  # nothing overwritten, nothing added


def _flip(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    mid = _inside_tensor_bytes(bytes(data))
    data[mid:mid + 8] = bytes(b ^ 0xFF for b in data[mid:mid + 8])  # same size: only a checksum can tell
    shard.write_bytes(bytes(data))


def _dcp_alone(step_dir: Path) -> dict[str, torch.Tensor]:
    """The model's tensors of a checkpoint read by DCP alone, as export_full_state_dict reads them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(step_dir)).read_metadata()
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
          if k.startswith("model.") and isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=str(step_dir), no_dist=True)
    return {k[len("model."):]: v for k, v in sd.items()}


@pytest.mark.slow
def test_flipped_bytes_are_detected_though_dcp_alone_misses_them(good_checkpoint: Path, monkeypatch,
                                                                  story: Story) -> None:
    intact = export_full_state_dict(good_checkpoint)
    shard = good_checkpoint / "step_2" / "__2_0.distcp"
    _flip(shard)
    # DCP alone (no manifest check: paracube refuses a checkpoint without one) loads the flipped bytes
    # silently: some parameter changed.
    flipped = _dcp_alone(good_checkpoint / "step_2")
    assert any(not torch.equal(intact[k], flipped[k]) for k in intact)
    before = _hashes(good_checkpoint.parent)
    with pytest.raises(ParacubeError, match=f"{shard}.*sha256 differs"):
        export_full_state_dict(good_checkpoint)
    with pytest.raises(ParacubeError, match=f"{shard}.*sha256 differs"):
        _resume_in_process(good_checkpoint, monkeypatch)
    assert _hashes(good_checkpoint.parent) == before
    # On 4 ranks, each hashing a share of the files: all 4 refuse with the same message, naming the file.
    bad = story.root / "flipped" / "step_1" / "__2_0.distcp"
    assert {err for _, err in story.in_process} == {f"checkpoint file {str(bad)!r} is corrupt: its sha256 "
                                                    "differs from the one recorded at save time"}


# --- 5: refused before any rank starts ----------------------------------------------------------------------------
def _plan_file(tmp_path: Path, layout: str, **changes: object) -> Path:
    path = default_plan(layout).save(tmp_path / "plan.json")
    if changes:
        data = json.loads(path.read_text())
        for key, value in changes.items():
            section, _, name = key.partition(".")
            if name:
                data[section][name] = value
            else:
                data[section] = value
        path.write_text(json.dumps(data))
    return path


BAD_SIZES = [
    # (layout, plan changes, extra argv, the one-line refusal)
    ("dp=1,tp=2d:2x2,mb=4", {"gpus": 8, "launch.nproc_per_node": 8}, [], "needs 4 ranks but the plan has gpus=8"),
    ("dp=1,tp=2d:2x2,mb=4", {}, ["--nproc-per-node", "2"], "1 x nproc_per_node=2 = 2 ranks, but layout"),
    ("dp=1,tp=2.5d:2x2x3,mb=1", {}, [], "micro_batch=1: its 1 x 64 = 64 tokens do not split 6 ways"),  # q d ways
    ("dp=1,tp=1d:3,mb=4", {}, [], "heads=4 is not divisible by 3"),  # the tiny GPT has 4 heads
    ("dp=3,tp=1d:2,mb=4", {}, [], "global_batch=8 is not divisible by 12"),  # dp x mb
]


@pytest.mark.parametrize(("layout", "changes", "extra", "message"), BAD_SIZES)
def test_bad_sizes_are_refused_before_any_process_starts(tmp_path: Path, capsys, monkeypatch, layout: str,
                                                         changes: dict, extra: list[str], message: str) -> None:
    import torch.distributed.launcher.api as launcher_api

    started: list[object] = []

    def forbidden(*args: object, **kwargs: object) -> None:
        started.append(args)
        raise AssertionError("a process was about to start")

    monkeypatch.setattr(launcher_api, "elastic_launch", forbidden)
    monkeypatch.setattr(subprocess.Popen, "__init__", forbidden)
    children = set(_tree(os.getpid()))
    path = _plan_file(tmp_path, layout, **changes)
    t0 = time.monotonic()
    code = main(["run", str(path), "--steps", "2", "--metrics", str(tmp_path / "m.jsonl"), *extra])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    # No agent, no rank process, no process group: a refusal, not a hang in a collective.
    assert started == [] and set(_tree(os.getpid())) <= children
    assert not torch.distributed.is_initialized() and not (tmp_path / "m.jsonl").exists()
    assert elapsed < 30  # only file reads and arithmetic (generous: other test suites share the cores)


def test_a_worker_refuses_bad_sizes_before_any_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank started by torchrun directly (no preflight) checks too, before init_process_group: with no
    MASTER_ADDR set, reaching it would raise a different error (or wait for peers that never come)."""
    from paracube.executor.training.loop import train

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ParacubeError, match=r"world size 3 != the 4 ranks layout dp=1,tp=2d:2x2,mb=4 needs"):
        train(default_plan(LAYOUT), 0, 3, 2)
    with pytest.raises(ParacubeError, match="micro_batch=1: its 1 x 64 = 64 tokens do not split 6 ways"):
        train(default_plan("dp=1,tp=2.5d:2x2x3,mb=1"), 0, 12, 2)
    assert not torch.distributed.is_initialized()


# --- 6: NaN/inf on 4 ranks ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_nonfinite_loss_on_four_ranks_stops_at_that_step_and_keeps_the_checkpoint(story: Story) -> None:
    ck = story.root / "nan"
    assert len(story.in_process) == 4
    for msg, _ in story.in_process:  # every rank sees the same all-reduced loss, so all stop at the same step
        assert msg.startswith("loss is ") and f"at step 2; stopped. Last good checkpoint: {ck / 'step_1'}" in msg
    assert find_checkpoint(ck).name == "step_1" and not (ck / "step_2").exists()
    assert all(bool(t.isfinite().all()) for t in export_full_state_dict(ck).values())


# --- 7: multi-node needs an explicit address ------------------------------------------------------------------------
def test_several_nodes_need_an_explicit_master_addr(capsys: pytest.CaptureFixture[str]) -> None:
    for addr in ([], ["--master-addr", "127.0.0.1"], ["--master-addr", "localhost"], ["--master-addr", "::1"],
                 ["--master-addr", "10.0.0.1"]):  # the last one lacks --master-port
        code = main(["run", "--nnodes", "2", "--nproc-per-node", "4", *addr])
        err = capsys.readouterr().err
        assert code == 2 and "a run over several nodes needs --master-addr" in err, (addr, err)
    plan = default_plan()  # 8 ranks: 2 nodes x 4 pass with an explicit address and port
    assert preflight(plan, NodeSpec(nnodes=2, nproc_per_node=4, master_addr="10.0.0.1", master_port=29500)) == 4
    assert [is_loopback(a) for a in ("127.0.0.1", "127.1.2.3", "::1", "localhost", "10.0.0.1", "node0")] == \
        [True, True, True, True, False, False]
