"""Sliding-window attention run by the executor (ModelSpec.sliding_window / window_pattern; the mask:
executor/layers/attention_mask.py) against its serial model, in every kind of attention path.

The equivalence template (tests/test_context_parallel.py's): the serial model against the sharded copy, both fp64
(dist_helpers.TOL_FP64: why fp64 and why rel 1e-5), 3 AdamW steps of 2 micro-batches with clipping: each step's
loss and gradient norm, every gradient of the first step (the reduced ones, before clipping) and every parameter
after the steps. Windowed models have a window of 8 over sequences of 32 and the pattern "WF" (block 0 windowed,
block 1 full: both kinds run; with pp=2 stage 1 holds block 1 alone, so a local index would window it). Cases:
dp=2; 1D + sp; 2D with a rank's tokens a quarter of a sequence and, unfused, blocks straddling two sequences
(tokens.py's split-sequence mask); cp=2 by ring and by all-gather and cp=4 by ring (whose window leaves whole
key blocks out of a rank's view: computed nowhere, still exchanged); pp=2; a windowed tiny-moe over ep=2
(GPT-OSS's shape); MLA over 1D + sp. Then one fp32 step's collectives equal the cost model's list
(traffic.stage_events as a multiset: zero difference; the key / value exchanges are full attention's, the
window moves no fewer bytes) except for models with MoE blocks (tiny-moe; tiny-mla's block 1), whose
routing-dependent bytes tests/test_moe_run.py checks. And
where marked, a window of seq_len runs BIT-IDENTICAL to no window in that layout (loss and every gradient of one
fp32 micro-batch, torch.equal). ONE 4-rank launch: 2-rank cases run on ranks 0-1 (ranks 2-3 build the same groups).

Llama 4's attention runs in the same launch and checks (its chunk mask is the same helper, attention_mask.py):
"l4" models have attention chunks of 8 over sequences of 32 (20 in "l4-c20": chunks spanning token blocks, the last
chunk partial) and rope_pattern "RN" (block 0 chunked with rotary and the L2 q / k norm, block 1 NoPE with full
causal attention: with pp=2 stage 1 holds it alone, so a local index would rotate and chunk it); "l4-moe" is
tiny-moe so, with Llama 4's top-1 sigmoid router scaling the experts' input (MoESpec.probs_on_input). Bit-identity
there compares a chunk of seq_len with no chunk.

The 2.5D and 3D cases (CASES_8, 8 ranks: a 2x2x2 mesh splits a micro-batch's tokens 4 ways) run in
tests/test_token_split.py's 8-rank launch, not one of their own, and are checked there by `check_case`, the same
checks. With s = 32 a rank holds c = 8 mb tokens: mb = 1 splits each sequence into 4 blocks of 8 (the window of
8 would be one block; "w20" models, a window of 20, span three), mb = 2 into 2 blocks of 16 (the window shorter than
a block), mb = 3 gives blocks of 24 straddling two sequences, mb = 4 whole sequences (the whole-sequence mask).
The straddling case is llama's (no biases): GPT's biases start at zero, so after 3 steps their norms are only
~3 lr sqrt(n) (7e-3) and a few 1e-8 of absolute difference exceed 1e-5 of them. The copies' fp32 gradient buckets
round ~1e-9 apart and AdamW divides by sqrt(v) + eps, so elements whose gradients lie near eps step apart; with
GPT in that case every first-step gradient agreed to 1.3e-7 but its block-1 proj bias's later gradients differed
by up to 2.4e-7 absolute and the bias ended 1.1e-5 apart (llama there: 3.9e-7; the GPT cases kept: <= 1e-6).

The GPT model's key bias (qkv bias, key columns) is bounded apart in cp cases, as test_context_parallel states why:
its serial gradient is 0 in exact arithmetic (also within a window: softmax ignores a constant added to a row's
allowed scores) and AdamW turns the cp shares' rounding noise into steps of up to 3.17 lr per step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from dist_helpers import F64, TOL_FP64, fp64_optimizer, one_step_events, run_distributed
from test_context_parallel import compare_with_serial
from test_equivalence_model import MAX_NORM, STEPS
from test_pipeline import _stage_name

from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, serial_reference
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import ModelSpec, TrainingSpec

LLAMA = ModelSpec("swa-llama", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, family="llama",
                  kv_heads=2, sliding_window=8, window_pattern="WF")
GPT = ModelSpec("swa-gpt", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, sliding_window=8,
                window_pattern="WF")
MOE = replace(PRESETS["tiny-moe"], name="swa-moe", seq_len=32, sliding_window=8, window_pattern="WF")
MLA = replace(PRESETS["tiny-mla"], name="swa-mla", seq_len=32, sliding_window=8, window_pattern="WF")
L4 = ModelSpec("l4-llama", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=32, family="llama",
               kv_heads=2, attention_chunk=8, rope_pattern="RN", qk_l2_norm=True)
_TINY = PRESETS["tiny-moe"]
L4_MOE = replace(_TINY, name="l4-moe", seq_len=32, attention_chunk=8, rope_pattern="RN", qk_l2_norm=True,
                 moe=replace(_TINY.moe, top_k=1, router="sigmoid", probs_on_input=True))
MODELS = {"llama": LLAMA, "gpt": GPT, "moe": MOE, "mla": MLA, "llama-w20": replace(LLAMA, sliding_window=20),
          "gpt-w20": replace(GPT, sliding_window=20), "l4": L4, "l4-c20": replace(L4, attention_chunk=20),
          "l4-moe": L4_MOE}
N_MICRO, LR = 2, 1e-3  # fp64_optimizer's lr
CASES = [  # (layout, model, sequences per micro-batch, recompute, bit-identity checked at window = seq_len)
    ("dp=2", "llama", 2, "none", False),
    ("tp=1d:2,sp", "llama", 2, "selective", True),
    ("tp=2d:2x2", "gpt", 1, "none", True),  # 8 tokens per rank: a quarter of a sequence, keys gathered
    ("tp=2d:2x2,fa=0", "llama", 3, "full", True),  # 24 tokens per rank: blocks straddling two sequences
    ("cp=2", "llama", 2, "none", True),
    ("cp=2,cpc=ag", "llama", 2, "full", False),
    ("cp=4", "gpt", 2, "none", True),  # chunks of 4: rank 0's queries see nothing of rank 3's keys
    ("pp=2", "llama", 2, "none", False),
    ("dp=2,ep=2", "moe", 2, "none", False),
    ("tp=1d:2,sp", "mla", 2, "none", False),
    # Llama 4: chunks, NoPE, the L2 norm (module docstring)
    ("tp=1d:2,sp", "l4", 2, "selective", True),
    ("tp=2d:2x2", "l4-c20", 1, "none", True),  # a quarter of a sequence per rank; chunks spanning blocks
    ("tp=2d:2x2,fa=0", "l4", 3, "full", False),  # blocks straddling two sequences
    ("cp=2", "l4-c20", 2, "none", True),
    ("cp=4,cpc=ag", "l4", 2, "selective", False),  # chunks of 4 tokens: some ranks' keys are in no query's chunk
    ("cp=4", "l4", 2, "none", True),
    ("pp=2", "l4", 2, "none", False),
    ("dp=2,ep=2", "l4-moe", 2, "none", False),
]
CASES_8 = [  # 2.5D and 3D, run by tests/test_token_split.py's launch (module docstring: c = 8 mb tokens per rank)
    ("tp=3d:2x2x2,kw=1", "llama", 2, "selective", False),  # window shorter than a block, gathered over z
    ("tp=3d:2x2x2,fa=0", "llama-w20", 1, "full", True),  # window spanning three blocks, gathered over (x, z)
    ("tp=3d:2x2x2", "llama", 4, "none", True),  # whole sequences
    ("tp=2.5d:2x2x2", "gpt-w20", 1, "none", True),  # window spanning three blocks, gathered over (dep, row)
    ("tp=2.5d:2x2x2,kw=1,fa=0", "llama", 3, "selective", False),  # blocks straddling two sequences
    ("tp=2.5d:2x2x2", "gpt", 4, "full", True),  # whole sequences
    ("tp=3d:2x2x2", "l4-c20", 1, "selective", True),  # Llama 4 (module docstring): chunks spanning blocks
    ("tp=2.5d:2x2x2,fa=0", "l4", 3, "none", False),  # blocks straddling two sequences
]
IDS = [f"{c[1]}-{c[0]}-mb={c[2]}-rc={c[3]}" for c in CASES]
IDS_8 = [f"{c[1]}-{c[0]}-mb={c[2]}-rc={c[3]}" for c in CASES_8]


def _batches(spec: ModelSpec, dp: int, mb: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(23)
    return [[(torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen),
              torch.randint(0, spec.vocab, (mb, spec.seq_len), generator=gen)) for _ in range(N_MICRO)]
            for _ in range(dp)]


def _against_serial(spec: ModelSpec, mesh: Mesh, recompute: str, micro: list, every: list, tokens: int) -> dict:
    """Relative errors of the steps' losses and norms, the first step's gradients and the final parameters, and
    the largest difference of the GPT key bias columns (bounded apart in cp: module docstring)."""
    model = build_model(spec, mesh, seed=5, recompute=recompute, dtype=F64)
    ref = serial_reference(spec, seed=5, dtype=F64, vocab=model.vocab)
    opt, ref_opt = fp64_optimizer(model), fp64_optimizer(ref)
    errors, key_diff = compare_with_serial(spec, mesh, model, ref, (opt, ref_opt), (micro, every), tokens)
    return {"errors": errors, "key_diff": key_diff}


def serial_case(rank: int, spec: ModelSpec, layout: Any, mb: int,
                recompute: str) -> tuple[Mesh, list, int, dict[str, Any]] | None:
    """A case's common start on `rank`: None outside the layout (after the case ranks' new_group calls); else its
    mesh, its micro-batches, the step's tokens and `_against_serial`'s errors with the rank's stage name."""
    if rank >= layout.world_size:
        Mesh(layout, 0)  # the same new_group calls as the case's ranks
        return None
    mesh = Mesh(layout, rank)
    batches = _batches(spec, layout.dp, mb)
    micro, every = batches[mesh.coord("dp")], [m for r in batches for m in r]
    tokens = layout.dp * mb * N_MICRO * spec.seq_len
    out = _against_serial(spec, mesh, recompute, micro, every, tokens)
    out["stage"] = _stage_name(mesh)
    return mesh, micro, tokens, out


def _bit_identical(spec: ModelSpec, mesh: Mesh, recompute: str, ids: torch.Tensor, labels: torch.Tensor) -> bool:
    """One fp32 forward and backward with window (attention chunk) = seq_len and with none: equal loss and
    gradients."""
    runs = []
    for window in (spec.seq_len, None):
        masked = (replace(spec, attention_chunk=window) if spec.attention_chunk is not None
                  else replace(spec, sliding_window=window, window_pattern=None))
        model = build_model(masked, mesh, seed=5, recompute=recompute)
        loss, _ = model(ids, labels)
        loss.backward()
        runs.append((loss.detach(), [p.grad for p in model.parameters()]))
    (a, ga), (b, gb) = runs
    return torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(ga, gb, strict=True))


def _one_case(rank: int, text: str, family: str, mb: int, recompute: str, bitwise: bool) -> dict[str, Any]:
    spec, layout = MODELS[family], parse_layout(text)
    if (start := serial_case(rank, spec, layout, mb, recompute)) is None:
        return {}
    mesh, micro, tokens, out = start
    if spec.moe is None:  # fp32: the priced payloads (MoE's depend on the routing taken: module docstring)
        out["events"] = one_step_events(build_model(spec, mesh, seed=5, recompute=recompute), micro, tokens,
                                        MAX_NORM)
    if bitwise:
        out["bit_identical"] = _bit_identical(spec, mesh, recompute, *micro[0])
    return out


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_case(rank, *case) for case in CASES]


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return run_distributed(_all_cases, 4, timeout=900.0)  # [rank][case]


def check_case(per_rank: list[dict[str, Any]], text: str, family: str, mb: int, rc: str, bitwise: bool) -> None:
    """One case's results on every rank of its layout: errors within TOL_FP64, the cp key bias within its bound,
    the priced collectives (models without MoE blocks), bit-identity at window = seq_len where marked."""
    spec, layout = MODELS[family], parse_layout(text).with_(micro_batch=mb)
    d = dims_of(spec, TrainingSpec(global_batch=layout.dp * mb * N_MICRO, dtype="fp32", recompute=rc))
    for rank in range(layout.world_size):
        r = per_rank[rank]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
        assert not bad, f"{text} rank {rank}: relative errors above {TOL_FP64}: {bad}"
        assert r["key_diff"] <= 2 * STEPS * 3.17 * LR, r["key_diff"]
        if "events" in r:
            diff = traffic_difference(stage_events(layout, d, mb, r["stage"]), r["events"])
            assert not diff["missing_in_executor"] and not diff["unpredicted"], (text, rank, diff)
        if bitwise:
            assert r["bit_identical"], f"{text} rank {rank}: window = seq_len differs from no window"


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_windowed_model_matches_serial_and_the_cost_model(results, case: int) -> None:
    check_case([per_rank[case] for per_rank in results], *CASES[case])
