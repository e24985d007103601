"""Sliding-window attention priced (cost_models/attention_window.py, compute.attention_core_time): the band's closed
form and its tiles against brute force, w >= s exactly full causal attention, the unfused core unchanged, the cp
ranks' bands by hand, and both engines alike."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.attention_window import TILE, band_fraction, band_pairs, chunk_work, rank_work, window_share
from paracube.cost_models.compute import attention_core_time
from paracube.cost_models.context_dims import context_local
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of
from paracube.cost_models.event import estimate_event
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

TRAIN = TrainingSpec(global_batch=32, dtype="bf16", recompute="selective")
LLAMA = replace(PRESETS["llama3-8b"], layers=8, seq_len=4096)  # a dense llama; windows set per test


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


def _mask(s: int, w: int) -> np.ndarray:
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    return (j <= i) & (i - j < w)  # the contract: i - w < j <= i


@pytest.mark.parametrize(("s", "w"), [(1, 1), (7, 3), (64, 1), (64, 63), (64, 64), (64, 200), (300, 128)])
def test_band_closed_form_equals_the_mask(s: int, w: int) -> None:
    pairs = int(_mask(s, w).sum())
    assert band_pairs(s, w) == pairs == chunk_work(0, s, w, tile=1)


@pytest.mark.parametrize(("s", "w", "tile", "q0", "q1"), [(512, 128, 128, 0, 512), (512, 100, 64, 0, 512),
                                                         (512, 37, 32, 96, 352), (500, 200, 128, 0, 500),
                                                         (512, 512, 128, 0, 512)])
def test_tiles_are_every_tile_the_band_meets(s: int, w: int, tile: int, q0: int, q1: int) -> None:
    """Brute force: query tiles from q0, key tiles on the sequence's grid; a tile is computed (whole) when any of its
    entries is in the band."""
    m = _mask(s, w)
    work = 0
    for a in range(q0, q1, tile):
        rows = m[a:min(a + tile, q1)]
        hit = [k for k in range(0, s, tile) if rows[:, k:k + tile].any()]
        work += rows.shape[0] * tile * len(hit)
    assert chunk_work(q0, q1, w, tile) == work


def test_gpt_oss_band_by_hand() -> None:
    """s 4096, w 128, 128 x 128 tiles: 32 query tiles; causal 1 + 2 + ... + 32 = 528 tiles, the band 1 + 31 x 2 = 63
    (each query tile meets its own key tile and the one before); GPT-OSS windows every other block."""
    assert TILE == 128 and band_fraction(4096, 1, 128) == 63 / 528
    d = dims_of(PRESETS["gpt-oss-120b"], TrainingSpec(seq_len=4096))
    assert (d.window, d.window_frac, d.L) == (128, 0.5, 36)
    assert window_share(d) == 0.5 + 0.5 * 63 / 528


def test_cp_ranks_band_by_hand() -> None:
    """s 1024, cp 2: chunks of 256, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2. w 128: rank 0's query tiles
    meet 1, 2 (chunk 0) and 2, 2 (chunk 3) key tiles = 7, rank 1's 2 each = 8; causal 1+2 + 7+8 = 3+4 + 5+6 = 18
    tiles on both. The busiest rank sets the share: 8 / 18."""
    assert [rank_work(1024, 2, r, 128) // (TILE * TILE) for r in (0, 1)] == [7, 8]
    assert [rank_work(1024, 2, r, 1024) // (TILE * TILE) for r in (0, 1)] == [18, 18]
    assert band_fraction(1024, 2, 128) == 8 / 18


@pytest.mark.parametrize("text", ["dp=16,tp=none,mb=1", "dp=4,tp=1d:4,sp,mb=1", "dp=8,cp=2,cpc=p2p,tp=none,mb=1",
                                  "dp=4,cp=2,cpc=ag,tp=1d:2,sp,mb=1", "dp=8,pp=2,tp=none,mb=1,fa=0"])
def test_a_window_no_shorter_than_the_sequence_prices_exactly_as_full_attention(h100: object, text: str) -> None:
    layout = parse_layout(text)
    for w in (4096, 10000):  # s = 4096
        windowed = replace(LLAMA, sliding_window=w, window_pattern="WF")
        for engine in (estimate, estimate_event):
            full = engine(LLAMA, TRAIN, layout, h100, with_events=False)
            win = engine(windowed, TRAIN, layout, h100, with_events=False)
            assert win.step_time_s == full.step_time_s and win.memory == full.memory


def test_the_unfused_core_is_unchanged_and_flash_does_the_band(h100: object) -> None:
    """fa=0: Megatron's unfused core materialises and masks the s x s scores, whatever the window. fa=1: causal minus
    windowed attention core = FLASH_CAUSAL x the score GEMMs x (1 - share), so the differences of two windows are in
    the ratio of their (1 - share) (the kernel's input / output traffic is the same for both)."""
    g = gemm_model(h100, "bf16")  # type: ignore[arg-type]
    mb, t = np.array([1]), np.array([1])
    full = dims_of(LLAMA, TRAIN)
    w1, w2 = (dims_of(replace(LLAMA, sliding_window=w), TRAIN) for w in (128, 1024))
    unfused = [attention_core_time(replace(d, flash=False), mb, t, g) for d in (full, w1)]
    assert np.array_equal(unfused[0][0], unfused[1][0]) and np.array_equal(unfused[0][1], unfused[1][1])
    (f0, b0), (f1, b1), (f2, b2) = (attention_core_time(d, mb, t, g) for d in (full, w1, w2))
    s1, s2 = window_share(w1), window_share(w2)
    assert s1 == 63 / 528 and s2 < 1.0
    # float64 sums of a few terms: 1e-12 relative
    assert ((f0 - f1) / (f0 - f2)).item() == pytest.approx((1 - s1) / (1 - s2), rel=1e-12)
    assert ((b0 - b1) / (b0 - b2)).item() == pytest.approx((1 - s1) / (1 - s2), rel=1e-12)
    cp2 = context_local(w1, 2, "ag")  # a cp rank's view: the busiest rank's band
    assert window_share(cp2) == band_fraction(4096, 2, 128)


# Attention is priced by one closed form (compute.attention_core_time) read by both engines; what differs is the event
# engine's link sharing and pipeline schedule, hence the existing 2% bound (tests/test_moe_cost.py).
@pytest.mark.parametrize(("name", "text"), [
    ("gpt-oss-20b", "dp=16,ep=8,tp=none,mb=1,zero=1"),
    ("gpt-oss-20b", "dp=4,pp=2,ep=4,tp=1d:2,sp,mb=1,zero=1"),
    ("gpt-oss-20b", "dp=8,cp=2,cpc=ag,ep=8,tp=none,mb=1,zero=1"),
    ("llama-window", "dp=8,cp=2,cpc=p2p,tp=none,mb=1"),
    ("llama-window", "dp=2,pp=2,tp=1d:4,sp,mb=1,rc=full"),
])
def test_engines_agree_on_windowed_models_within_2_percent(h100: object, name: str, text: str) -> None:
    model = PRESETS[name] if name in PRESETS else replace(LLAMA, sliding_window=512, window_pattern="WWWF")
    layout = parse_layout(text)
    a = estimate(model, TRAIN, layout, h100, with_events=False)
    e = estimate_event(model, TRAIN, layout, h100, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
    full = estimate(replace(model, sliding_window=None, window_pattern=None), TRAIN, layout, h100, with_events=False)
    assert a.step_time_s < full.step_time_s  # the band is less work than causal attention
