"""Qwen3-style attention run by the executor (a head width other than hidden / heads, per-head q / k RMSNorms:
executor/layers/head_norm.py) against its serial model, in every kind of attention path.

The equivalence template of tests/test_sliding_window_run.py (whose helpers run it): the serial model against the
sharded copy, both fp64 (dist_helpers.TOL_FP64: why fp64 and why rel 1e-5), 3 AdamW steps of 2 micro-batches with
clipping: each step's loss and gradient norm, every gradient of the first step (the reduced ones, before clipping:
the norms' gammas' partial gradients summed over the heads' and tokens' ranks) and every parameter after the steps.
Models: QWEN3, dense (hidden 32, 4 heads of head_dim 16: q width 64 != 32, 2 kv heads, qk_norm) and QWEN3_MOE
(tiny-moe with head_dim 32 and qk_norm). Cases: dp=2; 1D without and with sp; 2D with a rank's tokens a quarter of a
sequence (keys gathered over row); cp=2; pp=2; ep=2 (MoE). Then one fp32 step's collectives against the cost model's
list as a multiset, zero difference: traffic.stage_events, and for the MoE model cost_models/moe_traffic's list for
the routing the run took (tests/test_moe_run.py's check: each ep peer's logged expert counts give the all_to_alls'
bytes): the cost model prices every width of these models (queries and output heads x head width: qkv's and
proj's weights, their gathers and gradients; the q / k norms' gammas in the gradient buckets and their per-block
gradient sums, modes/head_norm.py). And the dense model's saved activations (autograd's storages in one forward,
on the largest rank) equal paracube's count within 2% (the bound tests/test_token_split.py and test_fidelity.py
hold the dense count to: the model leaves out a few per-token scalars), in every mode. ONE 4-rank launch:
2-rank cases run on ranks 0-1 (ranks 2-3 build the same groups). The 2.5D and 3D cases (CASES_8) run in
tests/test_token_split.py's 8-rank launch, checked there by `check_case`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from dist_helpers import F64, TOL_FP64, one_step_events, run_distributed, saved_bytes
from test_equivalence_model import MAX_NORM
from test_sliding_window_run import N_MICRO, serial_case

from paracube.cost_models import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.moe_traffic import moe_stage_events, with_routing
from paracube.cost_models.traffic import stage_events
from paracube.estimate import CommEvent, traffic_difference
from paracube.executor import build_model
from paracube.executor.model.moe import moe_blocks
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.experts import splits
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

QWEN3 = ModelSpec("qwen3-tiny", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, family="llama",
                  kv_heads=2, head_size=16, qk_norm=True)
QWEN3_MOE = replace(PRESETS["tiny-moe"], name="qwen3-moe-tiny", seq_len=32, kv_heads=2, head_size=32, qk_norm=True)
MODELS = {"qwen3": QWEN3, "qwen3-moe": QWEN3_MOE}
CASES = [  # (layout, model, sequences per micro-batch, recompute)
    ("dp=2", "qwen3", 2, "none"),
    ("tp=1d:2", "qwen3", 2, "selective"),
    ("tp=1d:2,sp", "qwen3", 2, "full"),
    ("tp=2d:2x2", "qwen3", 1, "none"),  # 8 tokens per rank: a quarter of a sequence, keys gathered
    ("cp=2", "qwen3", 2, "selective"),
    ("pp=2", "qwen3", 2, "none"),
    ("dp=2,ep=2", "qwen3-moe", 2, "none"),
    ("dp=2,ep=2,tp=1d:2,sp", "qwen3-moe", 2, "selective"),
]
CASES_8 = [  # 2.5D and 3D, run by tests/test_token_split.py's 8-rank launch (c = 8 mb tokens per rank)
    ("tp=3d:2x2x2", "qwen3", 1, "selective"),  # a quarter of a sequence per rank, keys gathered over (x, z)
    ("tp=2.5d:2x2x2", "qwen3", 3, "none"),  # blocks of 24 straddling two sequences; gammas summed over dep by dp's
]
IDS = [f"{c[1]}-{c[0]}-mb={c[2]}-rc={c[3]}" for c in CASES]
IDS_8 = [f"{c[1]}-{c[0]}-mb={c[2]}-rc={c[3]}" for c in CASES_8]


def _one_case(rank: int, text: str, family: str, mb: int, recompute: str) -> dict[str, Any]:
    return routed_case(rank, MODELS[family], parse_layout(text), mb, recompute, activations=True)


def routed_case(rank: int, spec: ModelSpec, layout: Layout, mb: int, recompute: str,
                activations: bool = False) -> dict[str, Any]:
    """One case of the equivalence template on this rank ({} where the layout leaves it out): serial_case's errors
    against the serial model, then one fp32 step's collectives and routing (`routed_step`) on a fresh model of the
    same seed; `activations`: also what autograd saves in one forward of a dense model (pp = 1; MoE's depends on
    the routing), as out["activations"]."""
    if (start := serial_case(rank, spec, layout, mb, recompute)) is None:
        return {}
    mesh, micro, tokens, out = start
    model = build_model(spec, mesh, seed=5, recompute=recompute)  # fp32: the priced payloads
    if activations and spec.moe is None and layout.pp == 1:
        _, out["activations"] = saved_bytes(build_model(spec, mesh, seed=5, recompute=recompute), *micro[0])
    out.update(routed_step(model, mesh, micro, tokens))
    return out


def routed_step(model: Any, mesh: Any, micro: list, tokens: int) -> dict[str, Any]:
    """One step's collectives, the expert counts of each MoE forward in issue order (tests/test_moe_run.py) and the
    rank's ep / edp / etp indices: what `_priced` reads."""
    log: list[torch.Tensor] = []
    for block in moe_blocks(model):
        block.routing_log = log
    return {"events": one_step_events(model, micro, tokens, MAX_NORM), "routing": [c.tolist() for c in log],
            "ep": mesh.index(("ep",)), "edp": mesh.index(("edp",)), "etp": mesh.index(("etp",))}


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_case(rank, *case) for case in CASES]


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return run_distributed(_all_cases, 4, timeout=900.0)  # [rank][case]


def _priced(per_rank: list[dict[str, Any]], rank: int, spec: ModelSpec, layout: Layout, d: Any,
            mb: int) -> list[CommEvent]:
    """The cost model's collectives of `rank`'s step; MoE: moe_traffic's for the routing the run took (each ep
    peer's logged expert counts -> modes/experts.splits, x h x 4 bytes: tests/test_moe_run.py's check; with etp > 1
    the copies the rank's etp group gathers, every etp peer's received ones)."""
    r = per_rank[rank]
    if spec.moe is None:
        return stage_events(layout, d, mb, r["stage"])

    def received(etp: int, f: int) -> np.ndarray:  # [ep sources, ep destinations] bytes of the (stage, edp, etp) group
        peers = {p["ep"]: p for p in per_rank[:layout.world_size]
                 if (p["stage"], p["edp"], p["etp"]) == (r["stage"], r["edp"], etp)}
        return splits(np.array([peers[q]["routing"][f] for q in range(len(peers))]), len(peers)) * spec.hidden * 4

    sent = []
    for f in range(len(r["routing"])):
        m = received(r["etp"], f)
        gathered = sum(int(received(t, f)[:, r["ep"]].sum()) for t in range(layout.etp))
        sent.append((int(m[r["ep"]].sum()), int(m[:, r["ep"]].sum()), gathered))
    return with_routing(moe_stage_events(layout, d, spec.moe, mb, r["stage"]), sent)


def check_case(per_rank: list[dict[str, Any]], text: str, family: str, mb: int, rc: str) -> None:
    """One case's results on every rank of its layout: errors within TOL_FP64; its collectives; its saved
    activations (dense, pp = 1)."""
    spec, layout = MODELS[family], parse_layout(text).with_(micro_batch=mb)
    d = dims_of(spec, TrainingSpec(global_batch=layout.dp * mb * N_MICRO, dtype="fp32", recompute=rc))
    for rank in range(layout.world_size):
        r = per_rank[rank]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
        assert not bad, f"{text} rank {rank}: relative errors above {TOL_FP64}: {bad}"
        if "events" in r:
            diff = traffic_difference(_priced(per_rank, rank, spec, layout, d, mb), r["events"])
            assert not diff["missing_in_executor"] and not diff["unpredicted"], (text, rank, diff)
            assert any(k[0] == "all_to_all" for k in r["events"]) == (layout.ep > 1), (text, rank)
    if "activations" in per_rank[0]:  # the largest rank's saved bytes against paracube's count
        measured = max(r["activations"] for r in per_rank[:layout.world_size])
        est = estimate(spec, TrainingSpec(global_batch=layout.dp * mb * N_MICRO, dtype="fp32", recompute=rc), layout,
                       load_topology("local-cpu", gpus=layout.world_size), with_events=False)
        assert measured == pytest.approx(est.memory.activations, rel=0.02), (text, measured, est.memory.activations)


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_qwen3_attention_matches_serial_and_the_cost_model(results, case: int) -> None:
    check_case([per_rank[case] for per_rank in results], *CASES[case])


__all__ = ["CASES", "CASES_8", "F64", "IDS_8", "MODELS", "check_case"]
