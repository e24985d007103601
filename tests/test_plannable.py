"""Plannable as run: an uneven pipeline (stage count not dividing the layers) is searched and priced by the
blocks each stage holds; `paracube plan` chooses recomputation unless pinned, and keeps what is pinned."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paracube.cli.main import main
from paracube.cost_models.analytic import evaluate, layout_links
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of, with_pins
from paracube.cost_models.links import LinkCache
from paracube.cost_models.validity import layout_arrays
from paracube.layout_parse import parse_layout
from paracube.planner import search
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec


def _llama(layers: int) -> ModelSpec:
    """Llama 3 405B's shape (Dubey et al. 2024, table 3) with `layers` blocks."""
    return ModelSpec(f"llama3-405b-like-{layers}", layers, 16384, 128, 53248, 128256, 8192, family="llama",
                     kv_heads=8)


def _stages(layers: int, text: str, topo: object, training: TrainingSpec) -> object:
    layout = parse_layout(text)
    d = with_pins(dims_of(_llama(layers), training), layout)
    return evaluate(d, layout.mode, layout_arrays(layout, layout.micro_batch or 1),
                    layout_links(layout, LinkCache(topo)), gemm_model(topo, training.dtype), zero=0)


def test_uneven_pipeline_is_plannable_and_priced_by_the_blocks_of_each_stage() -> None:
    """126 blocks on 16 stages (Llama 3 405B: 7, 8 x 14, 7): the search plans it, and each stage is priced
    with its own blocks: a middle stage like a middle stage of the even 128-block model (8 blocks), the
    first and last with one block less than in that model; the slowest is a middle stage."""
    topo = load_topology("dgx-h100", gpus=256)
    training = TrainingSpec(global_batch=32, dtype="bf16", recompute="full")
    res = search(_llama(126), training, topo, 256, fixed=parse_layout("dp=2,pp=16,tp=1d:8,sp"), top_k=1,
                 zeros=[0, 1])
    assert res.ranked, res.rejected
    lay, est = res.ranked[0]
    assert lay.pp == 16 and est.step_time_s > 0
    uneven = _stages(126, "dp=2,pp=16,tp=1d:8,mb=1,sp", topo, training)
    even = _stages(128, "dp=2,pp=16,tp=1d:8,mb=1,sp", topo, training)
    first, middle, last = (s.compute[0] for s in uneven.stages)  # type: ignore[attr-defined]
    e_first, e_middle, e_last = (s.compute[0] for s in even.stages)  # type: ignore[attr-defined]
    assert middle == pytest.approx(e_middle, rel=1e-12)
    per_block = e_middle / 8
    assert e_first - first == pytest.approx(per_block, rel=1e-9)
    assert e_last - last == pytest.approx(per_block, rel=1e-9)
    assert int(uneven.stage[0]) == 1  # type: ignore[attr-defined]
    assert float(np.asarray(uneven.step_time)[0]) < float(np.asarray(even.step_time)[0])  # type: ignore[attr-defined]


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str) -> tuple[int, dict | str]:
    out = tmp_path / "plan.json"
    if out.exists():
        out.unlink()
    code = main(["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "64", "--global-batch", "64",
                 "--top", "3", "-o", str(out), "--layout", layout])
    err = capsys.readouterr().err
    return code, json.loads(out.read_text()) if code == 0 else err


def test_plan_chooses_recomputation_unless_pinned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --recompute the search tries none, selective and full: GPT-3 175B on 64 A100s pinned to TP 8 x
    PP 8 with micro-batches of 2 fits only with full recomputation, which it picks (plan file: layout and
    training agree); pinned
    choices are kept (sp, mb, rc=full), and a pinned rc that does not fit is refused, not replaced."""
    code, free = _plan(tmp_path, capsys, "dp=1,pp=8,tp=1d:8,sp=0,mb=2")
    assert code == 0 and isinstance(free, dict)
    lay = parse_layout(free["layout"])
    assert lay.recompute == "full" and free["training"]["recompute"] == "full" and not lay.sequence_parallel
    code, pinned = _plan(tmp_path, capsys, "dp=1,pp=8,tp=1d:8,sp,rc=full,mb=1")
    assert code == 0 and isinstance(pinned, dict)
    lay = parse_layout(pinned["layout"])
    assert (lay.recompute, lay.sequence_parallel, lay.micro_batch) == ("full", True, 1)
    code, err = _plan(tmp_path, capsys, "dp=1,pp=8,tp=1d:8,sp=0,mb=2,rc=none")
    assert code == 2 and "memory > 72 GiB" in str(err) and str(err).count("\n") == 1
