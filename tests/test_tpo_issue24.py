"""Issue #24's bad input through `paracube run PLAN`: refused before any rank starts, one line, exit 2.

The issue's list: cp with a sequence that does not split into 2 x cp chunks, cp with a tensor mode that splits
tokens itself (2D / 2.5D / 3D), tpo without sp in 1D; fp8 where the executor does not run it (2D). FP8 with fp16
master state cannot be written in a plan (a plan's dtype fp8 is bf16 parameters with fp32 masters:
workload.TrainingSpec); the executor's own guard against it is tests/test_fp8_run.py's. Each plan file is written
as a user would edit one (a default plan's JSON, one field changed); a refusal that came from a rank would print
the launcher's "rank N died" line and exit 1, so exit 2 with one line says no rank started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paracube.cli.main import main
from paracube.layout_parse import parse_layout
from paracube.plan import default_plan

BAD = [  # (layout, dtype, a phrase of the one-line refusal)
    ("dp=1,cp=3,mb=2", "fp32", "does not split into 2 x cp = 6 chunks"),  # tiny: 64 tokens, 6 chunks
    ("dp=1,cp=2,tp=2d:2x2,mb=2", "fp32", "not 2d: its token split is already context parallel"),
    ("dp=1,cp=2,tp=2.5d:2x2x2,mb=2", "fp32", "not 2.5d: its token split is already context parallel"),
    ("dp=1,cp=2,tp=3d:2x2x2,mb=2", "fp32", "not 3d: its token split is already context parallel"),
    ("dp=1,tp=1d:4,mb=2,tpo", "fp32", "tpo in tp=1d overlaps sequence-parallel collectives: add sp"),
    ("dp=1,tp=2d:2x2,mb=2", "fp8", "dtype fp8 is not run by paracube's executor with tensor mode 2d"),
]


@pytest.mark.parametrize(("layout", "dtype", "phrase"), BAD)
def test_bad_plans_are_refused_before_any_rank_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      layout: str, dtype: str, phrase: str) -> None:
    data = default_plan("dp=1,mb=2").to_dict()
    world = parse_layout(layout.replace("cp=2,tp=", "tp=")).world_size * (2 if "cp=2,tp=" in layout else 1)
    data["layout"], data["gpus"] = layout, world
    data["launch"]["nproc_per_node"] = world
    data["training"]["dtype"] = dtype
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    try:
        code = main(["run", str(path), "--steps", "1", "--data", "synthetic", "--no-progress"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2, (layout, dtype, code, err)
    assert len(err.splitlines()) == 1 and phrase in err and "Traceback" not in err, err
    assert "rank" not in err.split(":")[0], err  # the launcher's failure lines start "rank N"
