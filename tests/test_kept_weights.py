"""Kept gathered weights (Layout kw=1) and the 3D embedding: equivalence with the serial model and zero traffic
difference with the cost model, in one 8-rank launch.

For 2D (dp=2; pp=2; dp=2 with zero=1), 2.5D and 3D with kw=1 (3D also with kw=0 and with full recomputation):
losses and gradient norms of 3 AdamW steps and the parameters after them equal the serial model's (rel 1e-5,
serial and sharded copies in fp64: dist_helpers.TOL_FP64); the collectives of an fp32 step equal
`traffic.stage_events` of the same layout as a multiset (the weight gathers once per step, not per micro-batch);
the bytes the kept weights hold equal memory.kept_bytes. Plus the search's kw choice and the token-split refusal
(no ranks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from dist_helpers import F64, TOL_FP64, fp64_optimizer, one_step_events, run_distributed, steps_against_serial
from test_equivalence_model import MAX_NORM, SPEC, STEPS
from test_grad_sync import _sharded
from test_pipeline import _stage_name

from paracube.cost_models.dims import dims_of
from paracube.cost_models.memory import kept_bytes
from paracube.cost_models.traffic import stage_events
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, serial_reference
from paracube.layout_parse import parse_layout
from paracube.modes import LayoutBatch
from paracube.workload import TrainingSpec

B, N_MICRO, TOL = 4, 3, TOL_FP64
CASES = [  # (layout, recompute)
    ("dp=2,tp=2d:2x2,kw=1", "none"),
    ("dp=1,tp=2.5d:2x2x2,kw=1", "none"),
    ("dp=1,tp=3d:2x2x2,kw=1", "none"),
    ("dp=1,tp=3d:2x2x2,kw=0", "none"),
    ("dp=1,tp=3d:2x2x2,kw=1", "full"),
    ("pp=2,tp=2d:2x2,kw=1", "none"),  # 1F1B: the micro-batches' forwards and backwards interleave
    ("dp=2,tp=2d:2x2,kw=1,zero=1", "none"),  # the distributed optimizer's buckets
]


def _batches(dp: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Micro-batches of every replica."""
    gen = torch.Generator().manual_seed(99)
    return [[(torch.randint(0, SPEC.vocab, (B, SPEC.seq_len), generator=gen),
              torch.randint(0, SPEC.vocab, (B, SPEC.seq_len), generator=gen)) for _ in range(N_MICRO)]
            for _ in range(dp)]


def _kept_held(model: Any, micro: list) -> int:
    """Bytes the kept weights hold after the first micro-batch's backward (gathered + fp32 accumulators)."""
    model.begin_step(len(micro))
    for ids, labels in micro:
        local_sum, _ = model(ids, labels)
        local_sum.backward()
        if ids is micro[0][0]:
            held = sum(e.gathered.numel() * e.gathered.element_size() + e.grad.numel() * 4
                       for e in model.mode.kept.entries.values())
    model.end_step()
    return held


def _one_layout(rank: int, layout_text: str, recompute: str) -> dict[str, Any]:
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    batches = _batches(layout.dp)
    micro = batches[mesh.coord("dp")]
    tokens = layout.dp * B * N_MICRO * SPEC.seq_len
    out: dict[str, Any] = {"errors": {}, "stage": _stage_name(mesh)}
    model = build_model(SPEC, mesh, seed=7, recompute=recompute)
    out["kept_bytes"] = _kept_held(model, micro) if layout.pp == 1 else 0
    model = build_model(SPEC, mesh, seed=7, recompute=recompute)  # fp32: the priced traffic
    out["events"] = one_step_events(model, micro, tokens, MAX_NORM, _sharded(model, mesh) if layout.zero == 1 else None)
    model = build_model(SPEC, mesh, seed=7, recompute=recompute, dtype=F64)
    ref = serial_reference(SPEC, seed=7, vocab=model.vocab, dtype=F64)  # padded as the model it checks
    opt, ref_opt = (_sharded(model, mesh) if layout.zero == 1 else fp64_optimizer(model)), fp64_optimizer(ref)
    out["errors"], _ = steps_against_serial(model, opt, ref, ref_opt, micro,
                                            [m for r in batches for m in r], tokens, STEPS, MAX_NORM)
    return out


def _all_layouts(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_layout(rank, text, rc) for text, rc in CASES]


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return run_distributed(_all_layouts, 8, timeout=600.0)  # [rank][case]; 7 cases: 3 min on 2 loaded cores


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{t}-{rc}" for t, rc in CASES])
def test_kept_weights_match_serial_and_the_model(results, case: int) -> None:
    text, rc = CASES[case]
    layout = parse_layout(text).with_(micro_batch=B)
    d = dims_of(SPEC, TrainingSpec(global_batch=layout.dp * B * N_MICRO, dtype="fp32", recompute=rc))
    one = np.ones(1, dtype=np.int64)
    batch = LayoutBatch.one(dp=layout.dp, pp=1, t=layout.tensor_size, q=layout.q, depth=layout.depth, mb=B, v=1, sp=0)
    predicted_kept = float(kept_bytes(d, layout.mode, batch, one, one)[0])
    for rank, per_case in enumerate(results):
        r = per_case[case]
        events = stage_events(layout, d, B, r["stage"])
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL}
        assert not bad, f"rank {rank}: relative errors above {TOL}: {bad}"
        diff = traffic_difference(events, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
        if layout.keep_weights and layout.pp == 1:
            assert r["kept_bytes"] == predicted_kept, (rank, r["kept_bytes"], predicted_kept)


def test_kept_weights_gather_once_per_step(results) -> None:
    """kw=1 issues each weight gather once per step where kw=0 issues it per micro-batch (3D, same model)."""
    kept = [k for k in results[0][2]["events"] if k[0] == "all_gather" and k[1] == ("x",)]
    plain = [k for k in results[0][3]["events"] if k[0] == "all_gather" and k[1] == ("x",)]
    assert 0 < len(kept) < len(plain)


def test_search_keeps_weights_where_they_save_traffic_and_respects_the_pin() -> None:
    """3D on 8 GPUs: with 4 micro-batches the search picks kw=1 (fewer bytes, more memory than kw=0); with one
    micro-batch (nothing to save) kw=0; a pinned kw=0 stays kw=0 and round-trips through the layout text."""
    from paracube.cost_models import estimate
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.topologies import load_topology

    tiny, topo = PRESETS["tiny"], load_topology("dgx-a100", gpus=8)
    training = TrainingSpec(global_batch=16)
    for pin, mb, want in (("", 4, 1), ("", 16, 0), (",kw=0", 4, 0)):
        best = search(tiny, training, topo, 8, fixed=parse_layout(f"tp=3d:2x2x2,mb={mb}{pin}"), top_k=1).ranked[0][0]
        assert best.keep_weights == want and str(parse_layout(str(best))) == str(best), (pin, mb, str(best))
    kept, plain = (estimate(tiny, training, parse_layout(f"tp=3d:2x2x2,mb=4,kw={k}"), topo) for k in (1, 0))
    assert kept.comm_bytes_per_gpu < plain.comm_bytes_per_gpu
    assert kept.memory.temporaries > plain.memory.temporaries
