"""One search configuration (planner/config.py): `sweep` and `plan` choose the same best layout for the same job,
the size guard refuses a search too large before building anything, and its size estimate tracks the count the
search reports; --top 0 and negative values are refused in one line."""

from __future__ import annotations

import json

import pytest

from paracube.cli.main import main
from paracube.model_presets import resolve_model
from paracube.planner.config import MAX_GPUS, SearchConfig, check_size
from paracube.planner.search import search
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_sweep_and_plan_choose_the_same_best_layout(tmp_path, capsys) -> None:
    # The default job of both commands' flags on one cluster size: 16 A100s (two nodes, so dp, pp, tp and the
    # placement all have choices), gpt3-1.3b, global batch 512, no --recompute (both search every recomputation).
    job = ["--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--gpus", "16"]
    code, out, err = _cli(capsys, "plan", *job, "--json", "-o", str(tmp_path / "p.json"))
    assert code == 0, err
    plan = json.loads(out)["best"]
    code, out, err = _cli(capsys, "sweep", *job, "--json")
    assert code == 0, err
    (point,) = json.loads(out)
    assert point["layout"] == plan["layout"]
    assert point["step_time_s"] == plan["step_time_s"]


@pytest.mark.parametrize("top", ["0", "-1", "-10"])
def test_top_zero_and_negative_refused(top: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse's refusal: usage error, exit status 2
        main(["plan", "--top", top])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{top} must be >= 1" in err


def test_a_million_gpus_refused_in_one_line_with_the_size(capsys) -> None:
    code, _, err = _cli(capsys, "plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", str(2**20))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "1,048,576" in err and f"{MAX_GPUS:,}" in err
    code, out, err = _cli(capsys, "sweep", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", str(2**20),
                          "--json")
    assert code == 0 and "1,048,576" in json.loads(out)[0]["reason"]


def test_size_estimate_tracks_the_enumerated_count() -> None:
    # The guard's estimate counts structures x configurations x axis orders x (zero=0, zero=1 where it shards); the
    # search counts each distinct placement, zero=1 where zero=0 fits too, and once more each zero=2/3
    # configuration that fits (every mode at pp=1, 2D / 2.5D / 3D included; with pipelines where zero=0/1 do not
    # fit), a configuration that fits at neither zero=0 nor 1 once: the two agree within 10% (80,904 estimated,
    # 74,881 enumerated here; the distinct placements are most orders on 64 GPUs), and the estimate is checked.
    model, training = resolve_model("gpt3-1.3b"), TrainingSpec(global_batch=512)
    config = SearchConfig(search_recompute=False, memory_headroom=0.0)
    res = search(model, training, load_topology("dgx-a100", gpus=64), 64, top_k=config.top_k,
                 memory_headroom=0.0)
    estimate = check_size(config, model, training, 64)
    assert abs(estimate - res.enumerated) <= 0.10 * res.enumerated, (estimate, res.enumerated)
