"""The training run: data split and determinism, LR schedule, and the default plan learning on 8 ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from dist_helpers import run_distributed

from paracube.errors import ParacubeError
from paracube.executor.training.config import LRSchedule, TrainConfig
from paracube.executor.training.data import _text_bytes, parse_source, replica_micro_batches
from paracube.executor.training.hooks import TrainHooks

# --- data -------------------------------------------------------------------------------------------------


def test_batch_depends_only_on_seed_and_step() -> None:
    src = parse_source("synthetic", vocab=256, seq_len=16, seed=3)
    assert torch.equal(src.batch(5, 8), parse_source("synthetic", 256, 16, seed=3).batch(5, 8))
    assert not torch.equal(src.batch(5, 8), src.batch(6, 8))
    assert not torch.equal(src.batch(5, 8), parse_source("synthetic", 256, 16, seed=4).batch(5, 8))


def test_synthetic_sequences_count_up_by_a_stride() -> None:
    tokens = parse_source("synthetic", vocab=50, seq_len=32).batch(1, 4)
    assert tokens.shape == (4, 33) and tokens.dtype == torch.int64
    steps = (tokens[:, 1:] - tokens[:, :-1]) % 50  # one stride per sequence, in 1..4
    assert torch.equal(steps, steps[:, :1].expand_as(steps)) and bool(((steps >= 1) & (steps <= 4)).all())


def test_text_rows_are_windows_of_the_pydoc_corpus() -> None:
    corpus = bytes(_text_bytes(None))
    tokens = parse_source("text", vocab=256, seq_len=20).batch(2, 3)
    for row in tokens.tolist():
        assert bytes(row) in corpus


def test_replicas_split_the_global_batch_and_labels_are_next_tokens() -> None:
    src = parse_source("synthetic", vocab=256, seq_len=8, seed=1)
    full = src.batch(7, 8)
    rows = []
    for dp_index in range(2):
        micro = replica_micro_batches(src, 7, global_batch=8, dp=2, dp_index=dp_index, micro_batch=2)
        assert len(micro) == 2
        for ids, labels in micro:
            assert ids.shape == labels.shape == (2, 8)
            assert torch.equal(ids[:, 1:], labels[:, :-1])
            rows.append(torch.cat([ids, labels[:, -1:]], dim=1))
    assert torch.equal(torch.cat(rows), full)


def test_bad_sources_are_refused() -> None:
    with pytest.raises(ParacubeError, match="data source 'wiki'"):
        parse_source("wiki", 256, 8)
    with pytest.raises(ParacubeError, match="vocab >= 256"):
        parse_source("text", 128, 8)
    with pytest.raises(ParacubeError, match="cannot read data file"):
        parse_source("text:/nonexistent/corpus.txt", 256, 8)


# --- schedule ----------------------------------------------------------------------------------------------


def test_lr_schedule_warmup_then_cosine() -> None:
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup=4, total=14)
    assert [s(k) for k in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert s(9) == pytest.approx(0.55)  # halfway through the cosine: (1 + 0.1) / 2
    assert s(14) == pytest.approx(0.1) and s(20) == pytest.approx(0.1)
    assert TrainConfig(lr=2.0).schedule(30) == LRSchedule(2.0, 0.2, 3, 30)


# --- the default plan on 8 ranks ----------------------------------------------------------------------------



def _worker(rank: int, world: int, root: str) -> None:

    from paracube.executor.training.loop import train
    from paracube.plan import default_plan
    from paracube.workload import TrainingSpec

    plan = default_plan()
    train(plan, rank, world, 20, metrics_path=Path(root) / "fp32.jsonl")
    bf16 = default_plan(training=TrainingSpec(global_batch=8, dtype="bf16"))
    train(bf16, rank, world, 3, metrics_path=Path(root) / "bf16.jsonl", config=TrainConfig(schedule_steps=20))
    half = default_plan("dp=1,tp=2.5d:2x2x2,mb=4")  # the same model, data and seed in 2.5D
    train(half, rank, world, 5, metrics_path=Path(root) / "2.5d.jsonl", config=TrainConfig(schedule_steps=20))


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("train")
    run_distributed(_worker, 8, str(root))
    return {name: [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()]
            for name in ("fp32", "bf16", "2.5d")}


@pytest.mark.slow
def test_default_plan_loss_falls(metrics: dict[str, list[dict]]) -> None:
    rows = metrics["fp32"]
    assert [r["step"] for r in rows] == list(range(1, 21))
    losses = [r["loss"] for r in rows]
    # Initialization (std 0.02) predicts nearly uniformly over 256 bytes: loss ~ ln 256.
    assert losses[0] == pytest.approx(math.log(256), abs=0.1)
    # Byte-level English text: unigram statistics alone bring it near 3 nats; demand a clear drop.
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0


@pytest.mark.slow
def test_metrics_rows(metrics: dict[str, list[dict]]) -> None:
    rows = metrics["fp32"]
    schedule = TrainConfig().schedule(20)
    for r in rows:
        assert set(r) >= {"step", "loss", "lr", "step_time_s", "tokens_per_s", "bytes_sent_per_rank",
                          "peak_memory_bytes", "grad_norm"}
        assert r["lr"] == pytest.approx(schedule(r["step"]))
        assert r["tokens_per_s"] == pytest.approx(8 * 64 / r["step_time_s"])
        assert r["peak_memory_bytes"] > 0 and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    # Every step issues the same collectives: the same bytes each step, and some of them.
    assert len({r["bytes_sent_per_rank"] for r in rows}) == 1 and rows[0]["bytes_sent_per_rank"] > 0


@pytest.mark.slow
def test_bf16_follows_fp32_loosely(metrics: dict[str, list[dict]]) -> None:
    fp32 = [r["loss"] for r in metrics["fp32"][:3]]
    bf16 = [r["loss"] for r in metrics["bf16"]]
    assert bf16 == pytest.approx(fp32, abs=0.05)  # bf16 matmuls: ~3 significant digits
    assert bf16 != fp32  # and they did run in bf16
    # bf16 collectives of X, A, dY... carry half the bytes of fp32 ones.
    assert metrics["bf16"][0]["bytes_sent_per_rank"] < metrics["fp32"][0]["bytes_sent_per_rank"]


@pytest.mark.slow
def test_2_5d_trains_like_3d(metrics: dict[str, list[dict]]) -> None:
    """The 2.5D plan computes the serial model's math: the default (3D) run's losses, and they fall."""
    half = [r["loss"] for r in metrics["2.5d"]]
    assert half == pytest.approx([r["loss"] for r in metrics["fp32"][:5]], rel=1e-5)
    assert half[-1] < half[0]


# --- NaN/inf: stop or skip (one in-process rank; the step is poisoned on purpose) ----------------------------


def _poisoned_step(bad_step: int) -> TrainHooks:
    """Hooks whose step wrapper makes the `bad_step`-th step see NaN parameters (so its loss, gradients and
    update are NaN)."""
    calls: list[int] = []

    def wrap(real):  # type: ignore[no-untyped-def]
        def poisoned(model, optimizer, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(1)
            if len(calls) == bad_step:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float("nan"))
            return real(model, optimizer, *args, **kwargs)

        return poisoned

    return TrainHooks(wrap_step=wrap)


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from dist_helpers import in_process_rendezvous

    from paracube.plan import default_plan

    with in_process_rendezvous(monkeypatch):
        yield default_plan("dp=1,mb=4")


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(one_rank, tmp_path: Path) -> None:
    from paracube.executor.checkpoint.store import export_full_state_dict, find_checkpoint
    from paracube.executor.training.loop import TrainingDiverged, train

    with pytest.raises(TrainingDiverged, match=r"loss is nan .* at step 3; stopped.*step_2"):
        train(one_rank, 0, 1, 5, checkpoint_dir=tmp_path, save_every=1, config=TrainConfig(data="synthetic"),
              hooks=_poisoned_step(bad_step=3))
    assert find_checkpoint(tmp_path).name == "step_2"
    assert all(bool(t.isfinite().all()) for t in export_full_state_dict(tmp_path).values())


def test_nonfinite_loss_can_skip_the_step(one_rank, tmp_path: Path) -> None:
    from paracube.executor.training.loop import train

    cfg = TrainConfig(data="synthetic", on_nonfinite="skip")
    rows = train(one_rank, 0, 1, 4, metrics_path=tmp_path / "m.jsonl", config=cfg,
                 hooks=_poisoned_step(bad_step=2)).metrics
    assert [r.get("skipped", False) for r in rows] == [False, True, False, False]
    assert math.isnan(rows[1]["loss"])
    # The skipped step left no trace: steps 3 and 4 see the parameters after step 1, and learn on.
    assert all(math.isfinite(r["loss"]) for r in (rows[0], rows[2], rows[3]))
    assert rows[3]["loss"] < rows[0]["loss"]


class _Fault(Exception):
    """What the fault hook raises: the run must stop there and keep what it saved."""


def test_hooks_see_every_step_and_a_fault_hook_stops_the_run(one_rank, tmp_path: Path) -> None:
    from paracube.executor.checkpoint.store import find_checkpoint
    from paracube.executor.training.loop import train

    seen: list[tuple[int, str]] = []

    def fault(step: int) -> None:
        if step == 3:
            raise _Fault(f"step {step}")

    hooks = TrainHooks(before_step=fault, after_step=lambda row, ck: seen.append((row["step"], Path(ck).name)))
    with pytest.raises(_Fault, match="step 3"):
        train(one_rank, 0, 1, 5, checkpoint_dir=tmp_path, save_every=1, config=TrainConfig(data="synthetic"),
              hooks=hooks)
    assert seen == [(1, "step_1"), (2, "step_2")]  # after each step, once its checkpoint is saved
    assert find_checkpoint(tmp_path).name == "step_2" and not torch.distributed.is_initialized()
