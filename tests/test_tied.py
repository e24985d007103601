"""Tied embeddings (the head is the token embedding's transpose) in every tensor mode, with pipelines and zero=1.

One 8-rank launch. Per case, a GPT-2 style tied model (ModelSpec(tied_embeddings=True)): 3 AdamW steps (clipping
exercised) whose losses and gradient norms, and the parameters after them, equal the serial tied model's (rel
1e-5 for every parameter, biases included: serial and sharded copies in fp64, dist_helpers.TOL_FP64 says why; a
head gradient missing or counted twice changes the table's update by its whole size, an error of O(1e-1)). No
head weight anywhere (one table, the head reads it in the embedding's own layout: modes' `tied_head_roles`); and the
collectives of one fp32 step equal `traffic.stage_events` of the same plan as a multiset of (kind, axes, bytes,
dtype): zero difference; at pp = 1 the activation bytes autograd saves equal the memory model's (2%, as
tests/test_fidelity.py holds them). The pipeline cases check that the tied copies' gradient is summed exactly once: a
second sum (or none) would move the copy's parameters away from the serial model's by the head's (or the
lookup's) gradient, far outside the tolerance, and the copies must stay identical (compared to the serial
table on both stages). Plus what the planner, the preflight and export now accept.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from dist_helpers import (
    F64,
    TOL_FP64,
    fp64_optimizer,
    one_step_events,
    run_distributed,
    saved_bytes,
    steps_against_serial,
)
from test_equivalence_model import MAX_NORM, SPEC, STEPS
from test_llama import LLAMA
from test_pipeline import _stage_name

from paracube.cost_models import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.layout_parse import parse_layout
from paracube.modes import MODES, executor_runs
from paracube.modes.buckets import BUCKET_BYTES
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

TIED = replace(SPEC, name="gpt2-style-tied", tied_embeddings=True)  # vocab 100: padded in every mode
TIED4 = replace(TIED, layers=4)  # four stages
TIED_LLAMA = replace(LLAMA, tied_embeddings=True)  # RMSNorm before the tied head, no position table
MB, N_MICRO, TOL = 4, 2, TOL_FP64
CASES = [  # (layout, model)
    ("dp=2,tp=2d:2x2", TIED),  # logits reduce-scattered over col, cross-entropy over row
    ("tp=2.5d:2x2x2", TIED),  # the same per depth layer, the table's gradient summed over dep
    ("tp=3d:2x2x2", TIED),  # the 3D linear of roles (x, y, z) on the table's blocks
    ("tp=3d:2x2x2,kw=1", TIED),  # the table's gather over y kept for the step
    ("dp=2,tp=2d:2x2", TIED_LLAMA),
    ("dp=2,pp=2,tp=1d:2,zero=1", TIED),  # the copies summed over the embedding group before the reduce-scatter
    ("dp=2,pp=4,zero=1", TIED4),  # the embedding group is first + last stage, not the pp group
    ("pp=2,tp=2d:2x2", TIED),  # a 2D pipeline: the last stage's copy in 2D blocks
    ("tp=2.5d:2x2x2,zero=1", TIED),  # zero=1 over (dp, dep)
    ("dp=4,tp=1d:2,zero=1", TIED),
    ("dp=8,zero=1", TIED),
]


def training(layout_text: str) -> TrainingSpec:
    return TrainingSpec(global_batch=parse_layout(layout_text).dp * MB * N_MICRO, dtype="fp32")


def _batches(spec: ModelSpec, dp: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(23)
    return [[(torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen),
              torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen)) for _ in range(N_MICRO)]
            for _ in range(dp)]


def _one_case(rank: int, layout_text: str, spec: ModelSpec) -> dict[str, Any]:
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    batches = _batches(spec, layout.dp)
    activations = 0
    if layout.pp == 1:  # the bytes autograd saves in one micro-batch's forward (the memory model's activations)
        model = build_model(spec, mesh, seed=5)
        loss, activations = saved_bytes(model, *batches[mesh.coord("dp")][0])
        loss.backward()
    tokens = layout.dp * MB * N_MICRO * spec.seq_len
    model = build_model(spec, mesh, seed=5)  # fp32: the priced traffic
    events = one_step_events(model, batches[mesh.coord("dp")], tokens, MAX_NORM,
                             build_optimizer(model, mesh, 1, BUCKET_BYTES) if layout.zero else None)
    model = build_model(spec, mesh, seed=5, dtype=F64)  # the equivalence: fp64 copies (TOL)
    ref = serial_reference(spec, seed=5, vocab=model.vocab, dtype=F64)
    opt = (build_optimizer(model, mesh, 1, BUCKET_BYTES, lr=1e-3, weight_decay=0.1, eps=1e-6) if layout.zero
           else fp64_optimizer(model))
    errors, _ = steps_against_serial(model, opt, ref, fp64_optimizer(ref), batches[mesh.coord("dp")],
                                     [m for r in batches for m in r], tokens, STEPS, MAX_NORM)
    return {"errors": errors, "events": events, "stage": _stage_name(mesh),
            "names": sorted(n for n, _ in model.named_parameters()), "copy": model.tied_copy,
            "activations": activations}


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_case(rank, *case) for case in CASES]


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return run_distributed(_all_cases, 8, timeout=900.0)  # [rank][case]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0]}-{c[1].family}" for c in CASES])
def test_tied_matches_serial_and_predicted_traffic(results, case: int) -> None:
    text, spec = CASES[case]
    layout = parse_layout(text).with_(micro_batch=MB)
    d = dims_of(spec, training(text))
    for rank, per_case in enumerate(results):
        r = per_case[case]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL}
        assert not bad, f"rank {rank}: relative errors above {TOL}: {bad}"
        assert "head.weight" not in r["names"]  # one table: the head reads the embedding's
        assert r["copy"] == (layout.pp > 1 and r["stage"] == "last")
        events = stage_events(layout, d, MB, r["stage"])
        diff = traffic_difference(events, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
        if layout.pp > 1 and r["stage"] != "middle":  # the copies' gradients: one sum per step, over 2 ranks
            assert [e.group_size for e in events if e.label == "embedding_grads"] == [2]
    if layout.pp == 1:  # activation memory as the model counts it (tied 2D: no gathered weight saved), 2% as
        est = estimate(spec, training(text), layout, load_topology("local-cpu", gpus=8), with_events=False)
        measured = max(per_case[case]["activations"] for per_case in results)  # test_fidelity / test_token_split
        assert measured == pytest.approx(est.memory.activations, rel=0.02)


@pytest.mark.parametrize("mode", [m for m, decl in MODES.items() if decl.executor is not None])
def test_every_mode_runs_tied_with_pipelines_and_zero1(mode: str) -> None:
    """The preflight (executor/sizes.py) and modes.executor_runs accept tied embeddings everywhere the executor
    runs the mode: pp = 1 and pp > 1, zero=0 and zero=1."""
    assert MODES[mode].ties_embeddings
    for pp in (1, 2):
        for zero in (0, 1):
            assert executor_runs(mode, pp, zero=zero, tied_embeddings=True)
    shape = {"none": "", "1d": ",tp=1d:2", "2d": ",tp=2d:2x2", "2.5d": ",tp=2.5d:2x2x2", "3d": ",tp=3d:2x2x2"}[mode]
    check_divisibility(TIED, parse_layout(f"dp=2,pp=2,zero=1{shape}"), MB, 2 * MB * N_MICRO, TIED.seq_len)


def test_planner_offers_tied_zero1_with_pipelines_and_3d() -> None:
    """A tied model plans with a pinned zero=1 and pp > 1 (issue #28) and in 3D (issue #22), priced with the tied
    head's collectives and one table."""
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.topologies import load_topology

    tiny = replace(PRESETS["tiny"], tied_embeddings=True)
    topo = load_topology("dgx-a100", gpus=8)
    res = search(tiny, TrainingSpec(global_batch=8), topo, 8, fixed=parse_layout("dp=2,pp=2,tp=1d:2,zero=1"),
                 top_k=1)
    assert res.ranked and res.ranked[0][0].zero == 1 and res.ranked[0][0].pp == 2
    res = search(tiny, TrainingSpec(global_batch=8), topo, 8, fixed=parse_layout("tp=3d:2x2x2"), top_k=1)
    best = res.ranked[0][0]
    events = stage_events(best, dims_of(tiny, TrainingSpec(global_batch=8)), best.micro_batch)
    head = {e.label: e.axes for e in events if e.label.startswith("head.") or e.label.startswith("loss.")}
    assert head["head.X"] == ("x",) and head["head.Y"] == ("z",) and head["loss.sum"] == ("x",)
