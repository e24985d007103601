"""Tokens split over b x s (executor/layers/tokens.py): 2D, 2.5D and 3D run any micro-batch whose token count divides,
a rank holding part of a sequence (or the end of one and the start of the next) and gathering keys and values
for attention.

One 8-rank launch. Per case (layout, micro-batch, recomputation, family): losses and gradient norms of 3 AdamW
steps and the parameters after them equal the serial model's (rel 1e-5, serial and sharded copies in fp64:
dist_helpers.TOL_FP64 says why); the collectives of an fp32 step equal `traffic.stage_events` of the same plan as
a multiset (the key / value gathers included); the activation bytes autograd saves on the rank holding a
sequence's end (the largest) equal the model's (2%). Plus the refusal of a micro-batch no split divides, and the
planner accepting what now runs.

The same launch runs the sliding-window 2.5D and 3D cases (tests/test_sliding_window_run.py's CASES_8, whole and
split sequences: one 8-rank launch instead of two), checked by that file's `check_case`, and Qwen3-style attention's
(tests/test_qk_norm_run.py's CASES_8: a head width other than hidden / heads, per-head q / k norms) likewise, and
GPT-OSS's (tests/test_gpt_oss_run.py's CASES_8: attention sinks and biases)."""

from __future__ import annotations

from typing import Any

import pytest
import test_gpt_oss_run as oss
import test_qk_norm_run as qwen3
import test_sliding_window_run as windowed
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
from paracube.errors import ParacubeError
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

N_MICRO, TOL = 2, TOL_FP64
MODELS = {"gpt": SPEC, "llama": LLAMA}
CASES = [  # (layout, micro-batch, recompute, family): the token split is 4 in each
    ("tp=3d:2x2x2", 1, "none", "gpt"),  # 4 ranks per sequence: keys / values gathered over (x, z)
    ("tp=3d:2x2x2,kw=1", 2, "selective", "gpt"),  # 2 per sequence: over z
    ("tp=3d:2x2x2,fa=0", 1, "full", "gpt"),
    ("tp=2.5d:2x2x2", 1, "none", "gpt"),  # over (dep, row)
    ("tp=2.5d:2x2x2,fa=0", 2, "selective", "llama"),  # over row
    ("dp=2,tp=2d:2x2,fa=0", 1, "none", "gpt"),  # over row
    ("pp=2,tp=2d:2x2", 1, "none", "gpt"),  # the flat activations [T / q, h / q] between stages
    # blocks straddling two sequences (c = T / n not dividing s): masked windows
    ("tp=3d:2x2x2", 3, "none", "gpt"),  # c = 12, s = 16: windows up to 24 keys, gathered over (x, z)
    ("tp=3d:2x2x2,fa=0", 3, "selective", "llama"),
    ("tp=2.5d:2x2x2", 6, "none", "llama"),  # c = 24: over row
]


def training(layout_text: str, mb: int, recompute: str) -> TrainingSpec:
    return TrainingSpec(global_batch=parse_layout(layout_text).dp * mb * N_MICRO, dtype="fp32", recompute=recompute)


def _batches(spec: ModelSpec, dp: int, mb: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(31)
    return [[(torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen),
              torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen)) for _ in range(N_MICRO)]
            for _ in range(dp)]


def _one_case(rank: int, layout_text: str, mb: int, recompute: str, family: str) -> dict[str, Any]:
    spec, layout = MODELS[family], parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    batches = _batches(spec, layout.dp, mb)
    micro = batches[mesh.coord("dp")]
    tokens = layout.dp * mb * N_MICRO * spec.seq_len
    out: dict[str, Any] = {"errors": {}, "stage": _stage_name(mesh), "activations": 0}
    model = build_model(spec, mesh, seed=7, recompute=recompute)  # fp32: the priced activations and traffic
    if layout.pp == 1:
        loss, out["activations"] = saved_bytes(model, *micro[0])
        loss.backward()
        model = build_model(spec, mesh, seed=7, recompute=recompute)
    out["events"] = one_step_events(model, micro, tokens, MAX_NORM)
    model = build_model(spec, mesh, seed=7, recompute=recompute, dtype=F64)
    ref = serial_reference(spec, seed=7, vocab=model.vocab, dtype=F64)
    opt, ref_opt = fp64_optimizer(model), fp64_optimizer(ref)
    out["errors"], _ = steps_against_serial(model, opt, ref, ref_opt, micro,
                                            [m for r in batches for m in r], tokens, STEPS, MAX_NORM)
    return out


def _all_cases(rank: int, world: int) -> dict[str, list[dict[str, Any]]]:
    return {"split": [_one_case(rank, *case) for case in CASES],
            "windowed": [windowed._one_case(rank, *case) for case in windowed.CASES_8],
            "qwen3": [qwen3._one_case(rank, *case) for case in qwen3.CASES_8],
            "oss": [oss._one_case(rank, *case) for case in oss.CASES_8]}


@pytest.fixture(scope="module")
def executed() -> list[dict[str, list[dict[str, Any]]]]:
    return run_distributed(_all_cases, 8, timeout=900.0)  # [rank]{"split" | "windowed" | "qwen3" | "oss": [case]}


@pytest.fixture(scope="module")
def results(executed) -> list[list[dict[str, Any]]]:
    return [per_rank["split"] for per_rank in executed]  # [rank][case]


@pytest.mark.parametrize("case", range(len(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_split_sequences_match_serial_traffic_and_memory(results, case: int) -> None:
    text, mb, rc, family = CASES[case]
    spec = MODELS[family]
    layout = parse_layout(text).with_(micro_batch=mb)
    assert (mb * spec.seq_len // layout.token_split) % spec.seq_len  # a rank's tokens are not whole sequences
    d = dims_of(spec, training(text, mb, rc))
    for rank, per_case in enumerate(results):
        r = per_case[case]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL}
        assert not bad, f"rank {rank}: relative errors above {TOL}: {bad}"
        events = stage_events(layout, d, mb, r["stage"])
        assert any(e.label.endswith("qkv.kv") for e in events)
        diff = traffic_difference(events, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
    if layout.pp == 1:
        est = estimate(spec, training(text, mb, rc), layout, load_topology("local-cpu", gpus=8), with_events=False)
        measured = max(per_case[case]["activations"] for per_case in results)
        assert measured == pytest.approx(est.memory.activations, rel=0.02)


@pytest.mark.parametrize("case", range(len(windowed.CASES_8)), ids=windowed.IDS_8)
def test_windowed_2_5d_and_3d_match_serial_and_the_cost_model(executed, case: int) -> None:
    """Sliding-window attention in 2.5D and 3D (tests/test_sliding_window_run.py: its models, cases and checks)."""
    windowed.check_case([per_rank["windowed"][case] for per_rank in executed], *windowed.CASES_8[case])


GRID9 = ModelSpec("grid9", layers=2, hidden=72, heads=9, ffn_hidden=144, vocab=99, seq_len=18)  # 2D 3x3 sizes


@pytest.mark.parametrize(("layout", "spec", "seq", "mb", "global_", "nearest"), [
    ("tp=2.5d:2x2x3", SPEC, 16, 2, 6, "3 (dividing"),  # 32 tokens, 6 ways
    ("tp=3d:2x2x2", SPEC, 10, 1, 4, "2 (dividing"),  # training sequences of 10 tokens, 4 ways
    ("tp=2d:3x3", GRID9, 10, 1, 2, "3 (none divides")])
def test_a_micro_batch_no_split_divides_is_refused_naming_the_nearest(layout: str, spec: ModelSpec, seq: int,
                                                                     mb: int, global_: int, nearest: str) -> None:
    """One line before any rank starts: the tokens, the split, and the nearest micro-batch sizes that run."""
    with pytest.raises(ParacubeError) as err:
        check_divisibility(spec, parse_layout(layout), mb, global_, seq)
    text = str(err.value)
    assert "\n" not in text and f"micro_batch={mb}: its {mb} x {seq} = {mb * seq} tokens do not split" in text
    assert f"nearest valid micro-batch sizes: {nearest}" in text


def test_micro_batches_below_the_token_split_are_plannable() -> None:
    """The planner offers 3D with one sequence per micro-batch (8 ranks, 4-way token split) and prices its key /
    value gathers; a micro-batch whose tokens do not divide stays refused with the rule's name."""
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search

    tiny, topo = PRESETS["tiny"], load_topology("dgx-a100", gpus=8)
    res = search(tiny, TrainingSpec(global_batch=8), topo, 8, fixed=parse_layout("tp=3d:2x2x2,mb=1"), top_k=1)
    best = res.ranked[0][0]
    assert best.micro_batch == 1
    events = stage_events(best, dims_of(tiny, TrainingSpec(global_batch=8)), 1)
    assert [e.axes for e in events if e.label.endswith("qkv.kv")][0] == ("x", "z")
    with pytest.raises(ParacubeError, match=r"3d: micro-batch tokens % token split != 0"):  # 24 x 1 or 3 tokens
        search(tiny, TrainingSpec(global_batch=3, seq_len=24), load_topology("dgx-a100", gpus=64), 64,
               fixed=parse_layout("tp=3d:4x4x4"), top_k=1)


@pytest.mark.parametrize("case", range(len(qwen3.CASES_8)), ids=qwen3.IDS_8)
def test_qwen3_attention_in_2_5d_and_3d_matches_serial_and_the_cost_model(executed, case: int) -> None:
    """Qwen3-style attention in 2.5D and 3D (tests/test_qk_norm_run.py: its models, cases and checks)."""
    qwen3.check_case([per_rank["qwen3"][case] for per_rank in executed], *qwen3.CASES_8[case])


@pytest.mark.parametrize("case", range(len(oss.CASES_8)), ids=oss.IDS_8)
def test_gpt_oss_in_2_5d_and_3d_matches_serial_and_the_cost_model(executed, case: int) -> None:
    """GPT-OSS's sinks and biases in 2.5D and 3D (tests/test_gpt_oss_run.py: its models, cases and checks)."""
    oss.check_case([per_rank["oss"][case] for per_rank in executed], *oss.CASES_8[case])
