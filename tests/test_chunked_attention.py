"""Llama 4's chunked attention priced (attention_window.py with Dims.chunked; window_stages.py per stage): the chunks'
closed form and their tiles against brute force (the executor's own mask, attention_mask.visible, as the rule), the
cp ranks' loads on context parallelism's chunk positions, a chunk no shorter than the sequence bit for bit plain
causal attention, both engines alike, and the runtimes that cannot train it refused in one line (exit 2)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from paracube.attention_chunk import Chunk
from paracube.cli.main import main
from paracube.cost_models.analytic import estimate
from paracube.cost_models.attention_window import TILE, band_fraction, band_pairs, chunk_work, rank_work, window_share
from paracube.cost_models.dims import dims_of
from paracube.cost_models.event import estimate_event
from paracube.errors import ParacubeError
from paracube.executor.layers.attention_mask import visible
from paracube.executor.layers.context_parallel import chunk_positions
from paracube.export import export_plan
from paracube.export.llama4_flags import chunk_export_refusal
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.plan import LaunchSpec, Plan
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

TRAIN = TrainingSpec(global_batch=32, dtype="bf16", recompute="selective", seq_len=32768)
SCOUT = PRESETS["llama4-scout"]
DENSE = replace(SCOUT, name="llama4-dense", moe=None, layers=8)  # chunked, RRRN, without experts: cp runs


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


def _mask(s: int, c: int) -> np.ndarray:
    pos = torch.arange(s)
    return visible(pos, pos, Chunk(c)).numpy()


@pytest.mark.parametrize(("s", "c"), [(1, 1), (7, 3), (64, 1), (64, 8), (64, 63), (64, 64), (64, 200), (300, 128)])
def test_chunk_closed_form_equals_the_mask(s: int, c: int) -> None:
    """n c (c + 1) / 2 + r (r + 1) / 2 pairs (s = n c + r) = the mask's entries = the exact (tile 1) count."""
    assert band_pairs(s, c, chunked=True) == int(_mask(s, c).sum()) == chunk_work(0, s, c, tile=1, chunked=True)


@pytest.mark.parametrize(("s", "c", "tile", "q0", "q1"), [(512, 128, 128, 0, 512), (512, 100, 64, 0, 512),
                                                         (512, 40, 32, 96, 352), (500, 200, 128, 0, 500)])
def test_tiles_are_every_tile_the_chunks_meet(s: int, c: int, tile: int, q0: int, q1: int) -> None:
    """Brute force: query tiles from q0, key tiles on the sequence's grid, a tile computed whole when any entry is
    visible (chunks not a multiple of the tile included: a query tile straddling two chunks)."""
    m = _mask(s, c)
    work = 0
    for a in range(q0, q1, tile):
        rows = m[a:min(a + tile, q1)]
        work += rows.shape[0] * tile * sum(rows[:, k:k + tile].any() for k in range(0, s, tile))
    assert chunk_work(q0, q1, c, tile, chunked=True) == work


def test_scout_share_by_hand() -> None:
    """s 32768, chunks 8192, 128 x 128 tiles: 4 chunks of 64 query tiles, each 1 + ... + 64 = 2080 tiles; causal
    1 + ... + 256 = 32896; 3 of Scout's 4 blocks chunked (RRRN): share 1/4 + 3/4 x 8320 / 32896."""
    assert TILE == 128 and band_fraction(32768, 1, 8192, TILE, True) == 4 * 2080 / 32896
    d = dims_of(SCOUT, TRAIN)
    assert (d.window, d.window_frac, d.window_pattern, d.chunked) == (8192, 0.75, "WWWF", True)
    assert window_share(d) == 0.25 + 0.75 * 4 * 2080 / 32896


@pytest.mark.parametrize(("s", "cp", "c"), [(64, 2, 8), (64, 4, 8), (64, 4, 20), (96, 3, 40)])
def test_cp_ranks_exact_work_is_the_mask_on_their_chunk_positions(s: int, cp: int, c: int) -> None:
    """rank_work (tile 1) of each cp rank = the visible pairs of its queries (context_parallel.chunk_positions: the
    executor's load-balanced chunks) over the whole sequence's keys; the busiest rank sets the share."""
    keys = torch.arange(s)
    got = [rank_work(s, cp, r, c, tile=1, chunked=True) for r in range(cp)]
    assert got == [int(visible(chunk_positions(s, cp, r), keys, Chunk(c)).sum()) for r in range(cp)]
    causal = max(rank_work(s, cp, r, s, tile=1) for r in range(cp))
    assert band_fraction(s, cp, c, 1, True) == max(got) / causal


@pytest.mark.parametrize("text", ["dp=16,ep=8,tp=none,mb=1", "dp=4,ep=4,tp=1d:4,sp,mb=1,zero=1",
                                  "dp=2,pp=8,ep=2,tp=none,mb=1", "dp=8,pp=2,ep=8,tp=none,mb=1,fa=0"])
def test_a_chunk_no_shorter_than_the_sequence_prices_exactly_as_causal(h100: object, text: str) -> None:
    layout, train = parse_layout(text), replace(TRAIN, seq_len=8192)
    plain = replace(SCOUT, attention_chunk=None)
    for chunk in (8192, 32768):
        for engine in (estimate, estimate_event):
            full = engine(plain, train, layout, h100, with_events=False)
            got = engine(replace(SCOUT, attention_chunk=chunk), train, layout, h100, with_events=False)
            assert got.step_time_s == full.step_time_s and got.memory == full.memory


# One closed form (compute.attention_core_time) read by both engines; the event engine's link sharing and pipeline
# schedule differ: the existing 2% bound (tests/test_moe_cost.py, test_sliding_window.py).
@pytest.mark.parametrize(("model", "text"), [
    (SCOUT, "dp=4,ep=4,tp=1d:4,sp,mb=1,zero=1"),
    (SCOUT, "dp=2,pp=8,ep=2,tp=none,mb=1"),  # 6 blocks a stage: 1 or 2 NoPE blocks (stages differ)
    (DENSE, "dp=8,cp=2,cpc=p2p,tp=none,mb=1"),
    (DENSE, "dp=2,cp=4,cpc=ag,tp=1d:2,sp,mb=1"),
    (DENSE, "dp=2,pp=2,tp=1d:4,sp,mb=1,rc=full"),
])
def test_engines_agree_on_chunked_models_within_2_percent(h100: object, model: object, text: str) -> None:
    layout = parse_layout(text)
    a = estimate(model, TRAIN, layout, h100, with_events=False)
    e = estimate_event(model, TRAIN, layout, h100, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
    full = estimate(replace(model, attention_chunk=None), TRAIN, layout, h100, with_events=False)
    assert a.step_time_s < full.step_time_s  # the chunks are less work than causal attention


def test_a_cp_that_does_not_split_the_sequence_is_refused_in_one_line(h100: object) -> None:
    with pytest.raises(ParacubeError, match=None) as refused:
        estimate(DENSE, replace(TRAIN, seq_len=32760), parse_layout("dp=16,cp=16,tp=none,mb=1"),
                 load_topology("dgx-h100", gpus=256), with_events=False)
    assert "cp=16" in str(refused.value) and "valid:" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan", "deepspeed"])
def test_runtimes_without_chunked_attention_refuse_beyond_one_chunk(capsys: pytest.CaptureFixture[str],
                                                                    runtime: str) -> None:
    code = main(["plan", "--model", "llama4-scout", "--cluster", "dgx-h100", "--gpus", "8", "--seq", "16384",
                 "--runtime", runtime])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"runtime {runtime}" in err and "attention_chunk=8192" in err and "--seq 16384" in err
    assert err.endswith("valid: --seq <= 8192, or --runtime paracube")


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_exports_refuse_chunks_their_runtime_cannot_train(target: str) -> None:
    """A plan of Scout at 2 chunks exported to a target whose runtime has no chunked_attention: one line; at one
    chunk the chunk check passes (megatron writes its flags). (deepspeed refuses Scout for its NoPE blocks first.)"""
    lay = parse_layout("dp=8,ep=8,tp=none,mb=1")
    for seq, refused in ((16384, True), (8192, False)):
        plan = Plan(SCOUT, replace(TRAIN, seq_len=seq), lay, "dgx-h100", 8, LaunchSpec(nproc_per_node=8, nnodes=1),
                    runtime=target)
        why = chunk_export_refusal(plan, target)
        assert (why is not None) == refused
        if refused:
            assert why is not None and "attention_chunk=8192" in why and why.endswith("valid: --seq <= 8192")
            with pytest.raises(ParacubeError, match="attention_chunk=8192") as err:
                export_plan(plan, target)
            assert "\n" not in str(err.value)
    assert "--no-rope-freq 4" in export_plan(plan, "megatron").text
