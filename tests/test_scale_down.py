"""`paracube run PLAN --model M --gpus G` (cli/scale_down.py): a cluster plan's layout family on a small model
and a few CPU ranks. The scaled layout keeps the plan's mode, v, zero, sp, recomputation, overlap and dtype,
keeps dp / pp / the tensor group > 1 exactly where the plan's are (none grows), and passes the executor's
preflight; a family that cannot fit G ranks is refused in one line. End to end (one 4-rank launch): the
scaled plan of a dp x pp interleaved zero=1 cluster plan trains (the loss falls).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paracube.cli.main import main
from paracube.cli.scale_down import scale_down
from paracube.errors import ParacubeError
from paracube.executor.launch.start import NodeSpec, preflight
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.plan import LaunchSpec, Plan, load_plan
from paracube.workload import TrainingSpec

TINY = PRESETS["tiny"]


def _cluster_plan(layout: str, model: str = "gpt3-13b", dtype: str = "bf16") -> Plan:
    lay = parse_layout(layout)
    return Plan(model=PRESETS[model], training=TrainingSpec(global_batch=512, dtype=dtype), layout=lay,
                cluster="dgx-h100", gpus=lay.world_size,
                launch=LaunchSpec(nproc_per_node=8, nnodes=lay.world_size // 8))


@pytest.mark.parametrize(("layout", "gpus", "expected"), [
    ("dp=8,pp=8,mb=2,v=5,zero=1", 8, "dp=4,pp=2,tp=none,mb=2,v=5,zero=1"),  # gpt3-13b's best on 64 H100s
    ("dp=8,pp=4,tp=1d:2,mb=4,v=10,sp,rc=selective,overlap", 8, "dp=2,pp=2,tp=1d:2,mb=4,v=10,sp,overlap,rc=selective"),
    ("dp=4,tp=3d:4x4x4,mb=16", 16, "dp=2,tp=3d:2x2x2,mb=16"),
    ("dp=2,pp=2,tp=2d:4x4,mb=4,zero=1", 16, "dp=2,pp=2,tp=2d:2x2,mb=4,zero=1"),
])
def test_scaled_layout_keeps_the_family_and_passes_preflight(layout, gpus, expected) -> None:
    plan = _cluster_plan(layout)
    scaled, notes = scale_down(plan, TINY, gpus)
    lay, want = scaled.layout, parse_layout(expected)
    assert (lay.mode, lay.shape, lay.dp, lay.pp, lay.interleave) == (want.mode, want.shape, want.dp, want.pp,
                                                                     want.interleave)
    assert (lay.zero, lay.sequence_parallel, lay.recompute, lay.overlap, lay.micro_batch) == (
        want.zero, want.sequence_parallel, want.recompute, want.overlap, want.micro_batch)
    assert scaled.training.dtype == plan.training.dtype and scaled.gpus == gpus
    n_micro = scaled.training.global_batch // (lay.dp * lay.micro_batch)
    assert n_micro == (2 * lay.pp if lay.pp > 1 else 2)
    assert scaled.model.layers % (lay.pp * lay.interleave) == 0 or lay.pp == 1
    if scaled.model.layers != TINY.layers:  # tiny's 2 layers cannot fill pp x v virtual stages: said
        assert any(f"runs {scaled.model.layers}" in n for n in notes)
    preflight(scaled, NodeSpec(), data="synthetic")


def test_a_family_that_does_not_fit_is_refused_in_one_line() -> None:
    with pytest.raises(ParacubeError, match=r"no layout of 8 ranks keeps the shape family of dp=2,pp=4,tp=2.5d"):
        scale_down(_cluster_plan("dp=2,pp=4,tp=2.5d:2x2x2,mb=8"), TINY, 8)  # 2.5D alone needs 8


def test_run_scaled_down_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpt3-13b's 64-GPU plan (dp=8, pp=8 interleaved v=5, zero=1) on 4 CPU ranks: dp=2, pp=2, v=5, zero=1."""
    path = _cluster_plan("dp=8,pp=8,mb=2,v=5,zero=1").save(tmp_path / "p.json")
    metrics = tmp_path / "m.jsonl"
    code = main(["run", str(path), "--model", "tiny", "--gpus", "4", "--steps", "4", "--data", "synthetic",
                 "--metrics", str(metrics), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "-> tiny dp=2,pp=2,tp=none,mb=2,v=5,zero=1" in err and "runs 10" in err
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    assert len(losses) == 4 and losses[-1] < losses[0]
    scaled = err.split("scaled plan written to ")[1].split()[0]
    assert str(load_plan(scaled).layout) == "dp=2,pp=2,tp=none,mb=2,v=5,zero=1"
