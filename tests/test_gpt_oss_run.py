"""GPT-OSS's model run by the executor (attention sinks, q / k / v / o biases, router and expert biases, the clamped
SwiGLU: paracube/gpt_oss_spec.py) against its serial model, in every kind of attention path, and its collectives
against the cost model's list.

The equivalence template of tests/test_sliding_window_run.py (its `serial_case` runs it, through
tests/test_qk_norm_run.routed_case, as for Qwen3's attention): the serial model against the sharded copy, both
fp64 (dist_helpers.TOL_FP64: why fp64 and why rel 1e-5), 3 AdamW steps of 2 micro-batches
with clipping: each step's loss and gradient norm, every gradient of the first step (the reduced ones, before
clipping: the sinks' partial gradients summed over the heads' and tokens' ranks, modes/sinks.py) and every parameter
after the steps. Models, GPT-OSS's shape in small: OSS, dense blocks (hidden 32, 4 heads of 8, 2 kv heads, sinks and
biases, a window of 8 at block 0 and full attention at block 1, "WF"), and OSS_MOE (tiny-moe without its shared
expert, 8 experts top-2 with router and expert biases, the SwiGLU clamped at 0.1 so that both clamps cut real
values at this initialization: 0.02-std weights give gates of ~0.1). Biases are drawn (normal 0.02), not zero, so
their gradients are compared at their scale. Cases: 1D with flash and unfused cores, with sp; 2D with a quarter of a
sequence per rank (the split-sequence path: keys gathered) and, unfused, blocks straddling two sequences; cp=2 by ring
and by all-gather (the sink merged once per query row after the blocks' log-sum-exp merge); pp=2; ep=2 with and
without 1D + sp (MoE). Then one fp32 step's collectives equal the cost model's list as a multiset, zero difference:
traffic.stage_events (its gradient buckets count the biases and sinks; the sinks' all_reduce per block and
micro-batch), and for the MoE model moe_traffic's list for the routing the run took (tests/test_qk_norm_run._priced:
each ep peer's logged expert counts give the all_to_alls' bytes; its buckets hold the router's and experts' biases).
ONE 4-rank launch: 2-rank cases run on ranks 0-1 (ranks 2-3 build the same groups). The 2.5D and 3D cases (CASES_8)
run in tests/test_token_split.py's 8-rank launch, checked there by `check_case`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from dist_helpers import TOL_FP64, run_distributed
from test_qk_norm_run import _priced, routed_case
from test_sliding_window_run import N_MICRO

from paracube.cost_models.dims import dims_of
from paracube.estimate import traffic_difference
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import ModelSpec, TrainingSpec

OSS = ModelSpec("oss-tiny", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, family="llama",
                kv_heads=2, sliding_window=8, window_pattern="WF", attention_sinks=True, attention_bias=True)
_TINY = PRESETS["tiny-moe"]
OSS_MOE = replace(_TINY, name="oss-moe-tiny", seq_len=32, kv_heads=2, sliding_window=8, window_pattern="WF",
                  attention_sinks=True, attention_bias=True,
                  moe=replace(_TINY.moe, shared_ffn=0, expert_bias=True, swiglu_limit=0.1))
MODELS = {"oss": OSS, "oss-moe": OSS_MOE}
CASES = [  # (layout, model, sequences per micro-batch, recompute)
    ("tp=1d:2", "oss", 2, "selective"),
    ("tp=1d:2,sp,fa=0", "oss", 2, "full"),
    ("tp=2d:2x2", "oss", 1, "none"),  # 8 tokens per rank: a quarter of a sequence, keys gathered
    ("tp=2d:2x2,fa=0", "oss", 3, "selective"),  # 24 tokens per rank: blocks straddling two sequences
    ("cp=2", "oss", 2, "none"),
    ("cp=2,cpc=ag", "oss", 2, "full"),
    ("pp=2", "oss", 2, "none"),
    ("dp=2,ep=2", "oss-moe", 2, "none"),
    ("dp=2,ep=2,tp=1d:2,sp,fa=0", "oss-moe", 2, "selective"),
    ("dp=2,ep=2,etp=2,tp=1d:2,sp", "oss-moe", 2, "none"),  # etp: b2 added by etp index 0, its gradient on both
]
CASES_8 = [  # 2.5D and 3D, run by tests/test_token_split.py's 8-rank launch (c = 8 mb tokens per rank)
    ("tp=3d:2x2x2", "oss", 1, "selective"),  # a quarter of a sequence per rank, keys gathered over (x, z)
    ("tp=2.5d:2x2x2,fa=0", "oss", 3, "none"),  # blocks of 24 straddling two sequences; sinks summed over dep by dp's
]
IDS = [f"{c[1]}-{c[0]}-mb={c[2]}-rc={c[3]}" for c in CASES]
IDS_8 = [f"{c[1]}-{c[0]}-mb={c[2]}-rc={c[3]}" for c in CASES_8]


def _one_case(rank: int, text: str, family: str, mb: int, recompute: str) -> dict[str, Any]:
    return routed_case(rank, MODELS[family], parse_layout(text), mb, recompute)


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_case(rank, *case) for case in CASES]


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return run_distributed(_all_cases, 4, timeout=900.0)  # [rank][case]


def check_case(per_rank: list[dict[str, Any]], text: str, family: str, mb: int, rc: str) -> None:
    """One case's results on every rank of its layout: errors within TOL_FP64; its collectives, with the sinks'
    all_reduce where heads or tokens are split over tensor ranks."""
    spec, layout = MODELS[family], parse_layout(text).with_(micro_batch=mb)
    d = dims_of(spec, TrainingSpec(global_batch=layout.dp * mb * N_MICRO, dtype="fp32", recompute=rc))
    for rank in range(layout.world_size):
        r = per_rank[rank]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
        assert not bad, f"{text} rank {rank}: relative errors above {TOL_FP64}: {bad}"
        diff = traffic_difference(_priced(per_rank, rank, spec, layout, d, mb), r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (text, rank, diff)
        sinks = [k for k in r["events"] if k[0] == "all_reduce" and k[2] == 4 * spec.heads and k[3] == "float32"]
        assert bool(sinks) == bool(layout.tensor_size > 1), (text, rank, sinks)


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_gpt_oss_matches_serial_and_the_cost_model(results, case: int) -> None:
    check_case([per_rank[case] for per_rank in results], *CASES[case])


__all__ = ["CASES_8", "IDS_8", "MODELS", "check_case"]
