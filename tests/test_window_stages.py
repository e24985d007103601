"""Sliding windows per pipeline stage (cost_models/window_stages.py): each stage priced from its own blocks' windows.

Reference: the same model without windows, priced by the same engine, less N x (the stage's windowed blocks) x one
block's saving in closed form (attention_window.band_fraction of the flash kernel's causal score GEMMs, module
docstrings of attention_window.py and compute.attention_core_time); candidate: the engines' per-stage prices."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate, layout_links, prepare
from paracube.cost_models.analytic_scores import evaluate
from paracube.cost_models.attention_window import band_fraction
from paracube.cost_models.compute import FLASH_BWD, FLASH_CAUSAL
from paracube.cost_models.context_parallel import ring_time
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event
from paracube.cost_models.event_program import build_stage
from paracube.cost_models.links import LinkCache
from paracube.cost_models.recompute_modules_cost import core_recomputed
from paracube.cost_models.stage_scores import STAGES
from paracube.cost_models.validity import layout_arrays
from paracube.cost_models.window_stages import is_windowed, represented_windowed, stage_ring, stage_windowed
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.stages import stage_chunks
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

TRAIN = TrainingSpec(global_batch=32, dtype="bf16", recompute="selective")
W = 512  # the window; s = 4096
# 8 blocks of Gemma 3's pattern: block 5 full, the rest windowed
GEMMA = replace(PRESETS["llama3-8b"], layers=8, seq_len=4096, sliding_window=W, window_pattern="WWWWWF")
FULL = replace(GEMMA, sliding_window=None, window_pattern=None)
LAYOUTS = ["dp=4,pp=4,tp=none,mb=1", "dp=8,pp=2,tp=none,mb=1", "dp=4,pp=2,v=2,tp=1d:2,sp,mb=1",
           "dp=2,pp=4,tp=1d:2,mb=1,rc=full", "dp=2,pp=4,cp=2,cpc=ag,tp=none,mb=1"]


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


def test_stage_windowed_blocks_by_hand() -> None:
    """WWWWWF over 8 blocks: block 5 full. pp 4 (2 a stage): 2, 2, 1, 2 windowed; pp 2: blocks 0-3 and 4-7: 4, 3;
    pp 2 x v 2 (chunks of 2): stage 0 holds 0, 1, 4, 5 (3), stage 1 holds 2, 3, 6, 7 (4). The analytic engine's middle
    at pp 4 is the fuller (both 2 blocks) with the fewest: stage 2."""
    assert [stage_windowed("WWWWWF", 8, 4, 1, s) for s in range(4)] == [2, 2, 1, 2]
    assert [stage_windowed("WWWWWF", 8, 2, 1, s) for s in range(2)] == [4, 3]
    assert [stage_windowed("WWWWWF", 8, 2, 2, s) for s in range(2)] == [3, 4]
    assert represented_windowed("WWWWWF", 8, 4, 1, 0, 0) == 1
    assert [stage_windowed("", 8, 4, 1, s) for s in range(4)] == [2, 2, 2, 2]  # "": every block


def _scores(model: ModelSpec, text: str, topo: object) -> tuple:
    layout = parse_layout(text)
    d, mb, _ = prepare(model, TRAIN, layout)
    g = gemm_model(topo, "bf16")  # type: ignore[arg-type]
    res = evaluate(d, layout.mode, layout_arrays(layout, mb), layout_links(layout, LinkCache(topo)), g,
                   zero=layout.zero, overlap=layout.overlap)
    return layout, d, mb, g, res


def _saving(d: object, layout: object, mb: int, g: object) -> float:
    """Seconds one windowed block saves against a full one, one micro-batch, one rank: the flash kernel's score GEMMs
    (G = cp blocks x b heads / t x 2 GEMMs of 2 s_rank^2 hd FLOPs at peak x flash_eff) x FLASH_CAUSAL x the band's
    missing tiles, in the forward, the backward (FLASH_BWD) and the forward re-run (selective's attention rule or
    full recomputation; under cp selective re-runs no core with these default options, the paracube runtime's:
    Runtime.cp_core_recompute, recompute_modules_cost.core_recomputed)."""
    hd = d.h // d.heads  # type: ignore[attr-defined]
    s = d.s  # type: ignore[attr-defined]  # a cp rank's tokens
    G = d.cp * mb * d.heads / layout.tensor_size * 2 * (2.0 * s * s * hd) / (g.peak * g.flash_eff)  # type: ignore
    again = 1 if d.recompute == "full" or core_recomputed(d) else 0  # type: ignore[attr-defined, arg-type]
    return FLASH_CAUSAL * G * (1 - band_fraction(s * d.cp, d.cp, W)) * (1 + FLASH_BWD + again)  # type: ignore


def _stage_of(name: str, pp: int) -> int:
    """The stage each representative prices here: first, the windowed-fewest middle (stage 2 at pp 4), last."""
    return {"first": 0, "middle": 2 if pp == 4 else 0, "last": pp - 1}[name]


@pytest.mark.parametrize("text", LAYOUTS)
def test_each_stage_prices_its_own_blocks_in_both_engines(h100: object, text: str) -> None:
    """Per stage: the unwindowed model's stage compute less N k_s x one block's saving (closed form), k_s its own
    windowed blocks; the analytic engine's representative stages and the event engine's program of every stage
    (N x its micro-batch's compute ops). 1e-9: sums of a few dozen float64 terms in another order."""
    layout, d, mb, g, res = _scores(GEMMA, text, h100)
    assert g.flash_eff > 0
    _, d0, _, _, full = _scores(FULL, text, h100)
    N = d.global_batch // (layout.dp * mb)
    save = _saving(d, layout, mb, g)
    pp, v = layout.pp, layout.interleave
    own = {s: stage_windowed("WWWWWF", 8, pp, v, s) for s in range(pp)}
    assert len(set(own.values())) > 1  # the stages differ: the case the model's mean share priced wrongly
    for k, name in enumerate(STAGES):
        s = _stage_of(name, pp)
        expected = float(full.stages[k].compute[0]) - N * own[s] * save
        assert float(res.stages[k].compute[0]) == pytest.approx(expected, rel=1e-9)
    lay = layout.with_(micro_batch=mb)
    for s in range(pp):  # every stage, the middle ones too
        prog, ref = build_stage(lay, d, mb, s, g), build_stage(lay, d0, mb, s, g)
        got = N * (prog.compute_fwd + prog.compute_bwd)
        assert got == pytest.approx(N * (ref.compute_fwd + ref.compute_bwd) - N * own[s] * save, rel=1e-9)
        if s in (0, pp - 1) or s == _stage_of("middle", pp):
            k = 0 if s == 0 else (2 if s == pp - 1 else 1)
            assert got == pytest.approx(float(res.stages[k].compute[0]), rel=1e-9)


def test_the_bubble_sums_each_middle_stage_at_its_own_blocks(h100: object) -> None:
    """1F1B, pp 4: bubble = (sum of the stages' work - the slowest) / N (pipeline_bubble.py), each stage's work the
    unwindowed one's less its own windowed blocks' saving; stages 1 and 2 differ (2 and 1 windowed blocks)."""
    text = "dp=4,pp=4,tp=none,mb=1"
    layout, d, mb, g, res = _scores(GEMMA, text, h100)
    _, _, _, _, full = _scores(FULL, text, h100)
    N = d.global_batch // (layout.dp * mb)
    save = _saving(d, layout, mb, g)
    base = [float(st.compute[0] + st.micro[0]) for st in full.stages]  # first, middle (stages 1, 2 alike), last
    work = [base[min(s, 1) if s < 3 else 2] - N * stage_windowed("WWWWWF", 8, 4, 1, s) * save for s in range(4)]
    assert float(res.bubble[0]) == pytest.approx((sum(work) - max(work)) / N, rel=1e-9)


def test_the_p2p_ring_hides_behind_each_blocks_own_attention(h100: object) -> None:
    """cp=2 p2p: per stage, the ring's exposed seconds are its blocks' own (context_parallel.ring_time of one layer at
    the block's share: 1 windowed, 0 full), summed over the stage's blocks. At 100 GB/s a ring step (8.4 MB of keys and
    values: 84 us) outlasts a windowed block's attention on one key block (47 us forward) and hides behind a full
    one's (118 us): a windowed block exposes its steps, a full one does not. 1e-12: a few float64 sums."""
    layout = parse_layout("dp=2,pp=4,cp=2,cpc=p2p,tp=none,mb=1")
    d, mb, _ = prepare(GEMMA, TRAIN, layout)
    g = gemm_model(h100, "bf16")  # type: ignore[arg-type]
    b, rows, one = layout_arrays(layout, mb), np.arange(1), np.array([1])
    bw, lat = np.array([1e11]), np.array([0.0])
    block = {x: float(ring_time(replace(d, window_frac=x), "none", b, bw, lat, g, one, rows)[0][0]) for x in (0.0, 1.0)}
    assert block[1.0] > block[0.0]
    for name in STAGES:
        s = _stage_of(name, 4)
        first, last = np.array([int(s == 0)]), np.array([int(s == 3)])
        shares = [1.0 if is_windowed("WWWWWF", i) else 0.0 for c in stage_chunks(8, 4, 1, s) for i in c]
        got = float(stage_ring(d, "none", b, bw, lat, g, first, last, rows)[0])
        assert got == pytest.approx(sum(block[x] for x in shares), rel=1e-12)


# The engines differ by the event engine's link sharing and schedule: the existing 2% bound on steps
# (tests/test_sliding_window.py, tests/test_moe_cost.py); their compute is one closed form (1e-6, test_event_engine.py).
@pytest.mark.parametrize("text", [*LAYOUTS, "dp=2,pp=4,cp=2,cpc=p2p,tp=none,mb=1",
                                  "dp=2,pp=2,v=2,cp=2,cpc=p2p,tp=1d:2,mb=1"])
def test_engines_agree_on_stages_with_their_own_windows(h100: object, text: str) -> None:
    layout = parse_layout(text)
    a = estimate(GEMMA, TRAIN, layout, h100, with_events=False)
    e = estimate_event(GEMMA, TRAIN, layout, h100, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
    assert e.compute_time_s == pytest.approx(a.compute_time_s, rel=1e-6)


def test_gpt_oss_stages_of_odd_block_counts_in_both_engines(h100: object) -> None:
    """gpt-oss-20b (MoE blocks: moe_step.py, moe_program.py on top): 24 blocks of "WF" on pp 8 put 3 a stage, 2 or 1
    windowed: the engines agree on the step (2%) and on the slowest stage's compute (1e-6)."""
    model = PRESETS["gpt-oss-20b"]
    layout = parse_layout("dp=2,pp=8,ep=2,tp=none,mb=1,zero=1")
    assert [stage_windowed("WF", 24, 8, 1, s) for s in range(3)] == [2, 1, 2]
    a = estimate(model, TRAIN, layout, h100, with_events=False)
    e = estimate_event(model, TRAIN, layout, h100, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
    assert e.compute_time_s == pytest.approx(a.compute_time_s, rel=1e-6)


@pytest.mark.parametrize("text", LAYOUTS)
def test_windows_no_shorter_than_the_sequence_and_uniform_patterns_price_as_before(h100: object, text: str) -> None:
    """w >= s: exactly the unwindowed model (both engines, bit for bit). Every block windowed ("W" x 6, pattern None):
    every stage at the one share, so each representative's compute is its unwindowed-shape price with that share, no
    correction: the same as a pattern of all W."""
    layout = parse_layout(text)
    for w in (4096, 10000):
        for engine in (estimate, estimate_event):
            wide = engine(replace(GEMMA, sliding_window=w), TRAIN, layout, h100, with_events=False)
            full = engine(FULL, TRAIN, layout, h100, with_events=False)
            assert wide.step_time_s == full.step_time_s and wide.compute_time_s == full.compute_time_s
    every = [float(st.compute[0]) for st in _scores(replace(GEMMA, window_pattern=None), text, h100)[4].stages]
    all_w = [float(st.compute[0]) for st in _scores(replace(GEMMA, window_pattern="WWWWWW"), text, h100)[4].stages]
    assert every == all_w
    _, d, mb, g, _ = _scores(replace(GEMMA, window_pattern=None), text, h100)
    full_stages = [float(st.compute[0]) for st in _scores(FULL, text, h100)[4].stages]
    lay = parse_layout(text)
    N = d.global_batch // (lay.dp * mb)
    save = _saving(d, lay, mb, g)
    for k, name in enumerate(STAGES):
        Ls = sum(len(c) for c in stage_chunks(8, lay.pp, lay.interleave, _stage_of(name, lay.pp)))
        assert every[k] == pytest.approx(full_stages[k] - N * Ls * save, rel=1e-9)
