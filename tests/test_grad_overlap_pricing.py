"""Overlapped gradient reduction under pipelines, priced per stage and chunk (cost_models/grad_overlap.py):
the analytic engine against the event engine (which simulates every bucket on its stage's stream during that
stage's, or chunk's, last backward), and the closed form's pp = 1 case (the DDP formula it generalizes)."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.grad_overlap import exposed_grad_time
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

PP_OVERLAP = [  # (model, global batch, topology, GPUs, layout): 1F1B and interleaved, zero=0 and zero=1
    ("gpt3-1.3b", 64, "dgx-a100", 32, "dp=4,pp=2,tp=1d:4,mb=2,overlap"),
    ("gpt3-1.3b", 64, "dgx-a100", 32, "dp=4,pp=2,v=2,tp=1d:4,mb=2,zero=1,overlap"),
    ("gpt3-6.7b", 256, "dgx-a100", 64, "dp=4,pp=4,tp=1d:4,mb=2,overlap"),
    ("gpt3-6.7b", 64, "dgx-a100", 64, "dp=8,pp=2,v=2,tp=1d:4,mb=1,zero=1,overlap"),
    ("llama2-7b", 256, "dgx-h100", 128, "dp=8,pp=4,tp=1d:4,mb=1,zero=1,overlap"),
]


@pytest.mark.parametrize("name,gb,topo,gpus,text", PP_OVERLAP)
def test_engines_agree_on_overlap_under_pipelines(name: str, gb: int, topo: str, gpus: int, text: str) -> None:
    """Within 2% with overlap (the engines agree within 0.4% on these layouts without it), and overlap
    shortens the step in both."""
    model, training, topology = PRESETS[name], TrainingSpec(global_batch=gb, dtype="bf16"), load_topology(topo, gpus)
    over, plain = parse_layout(text), parse_layout(text.replace(",overlap", ""))
    an, ev = (estimate(model, training, over, topology, with_events=False),
              estimate_event(model, training, over, topology, with_events=False))
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.02)
    assert an.step_time_s < estimate(model, training, plain, topology, with_events=False).step_time_s
    assert ev.step_time_s < estimate_event(model, training, plain, topology, with_events=False).step_time_s


def _uniform(blocks: int, xl: np.ndarray, v: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One release per block of an even share of (1 - xl), the last one with the rest (xl + a block's)."""
    n = len(xl)
    per = (1 - xl) / blocks
    done = np.arange(1, blocks + 1)
    chunk = (v - 1 - (done - 1) // (blocks // v)).astype(float)
    frac = (done - (v - 1 - chunk) * (blocks // v)) / (blocks // v)
    share = 1 - per[:, None] * (done - 1)[None, :]
    return np.broadcast_to(chunk, (n, blocks)), np.broadcast_to(frac, (n, blocks)), share


def test_one_stage_reduces_to_the_ddp_form_and_later_stages_hide_more() -> None:
    """v = 1 on stage 0 with a bucket per block: max(0, G - b (1 - x1), xl' G) with xl' the last release's share
    (the last block's and the embedding's); stage s has s more backward slots to hide it in, and interleaving
    releases the later chunks' buckets pp slots earlier each."""
    G, b = np.array([3.0, 1.0, 0.5]), np.array([2.0, 2.0, 2.0])
    xl = np.array([0.1, 0.4, 0.1])
    one = np.ones(3)
    prof = _uniform(4, xl)
    last = xl + (1 - xl) / 4
    got = exposed_grad_time(G, b, 0 * one, 4 * one, one, prof)
    assert got == pytest.approx(np.maximum(0.0, np.maximum(G - b * (1 - 0.25), last * G)), rel=1e-12)
    later = exposed_grad_time(G, b, 1 * one, 4 * one, one, prof)
    assert np.all(later <= got) and later[0] == pytest.approx(max(0.0, G[0] - b[0] * (1 - 0.25) - b[0]))
    inter = exposed_grad_time(G, b, 0 * one, 4 * one, 2 * one, _uniform(4, xl, 2))
    assert np.all(inter <= got + 1e-12)


def test_release_profile_is_the_event_engines() -> None:
    """The analytic queue is fed as the event engine's (modes/buckets.release_counts): the last release carries
    the last block's gradients, the bucket it completes and the embedding's, never less than the embedding."""
    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.grad_overlap import release_profile
    from paracube.cost_models.local_parameters import parameter_units
    from paracube.modes.buckets import bucket_numels, release_counts

    d = dims_of(PRESETS["gpt3-1.3b"], TrainingSpec(global_batch=64, dtype="bf16"))
    units = parameter_units("1d", d, 2, 1, d.L, True, True)
    counts = release_counts(units, True, True)
    assert len(counts) == d.L + 1 and sum(counts) == len(bucket_numels([n for u in units for n in u]))
    one = np.ones(1, dtype=np.int64)
    chunk, frac, share = release_profile("1d", d, 2 * one, one, d.L * one, one, one, one, one, 25 * 2 ** 20)
    live = share[0] > 0
    assert np.all(chunk[0][live] == 0) and frac[0][live][-1] == 1.0 and np.all(np.diff(share[0][live]) < 0)
    total = sum(sum(u) for u in units)
    at_end = share[0][live & (frac[0] == 1.0)].max()  # what is still queued once the backward ends
    assert at_end >= (sum(units[0]) + sum(units[1])) / total * 0.999  # embedding and block 0 at least


def test_planner_prices_and_emits_overlap_with_pipelines() -> None:
    """A pinned pp=2 structure with `overlap` comes back overlapped (the executor runs it: ExecutorSupport
    grad_overlap_pp) and is priced below the same structure without overlap."""
    from paracube.modes import MODES
    from paracube.planner.search import search

    assert all(m.executor.grad_overlap_pp for m in MODES.values() if m.executor is not None and m.executor.pipeline)
    model, training = PRESETS["gpt3-1.3b"], TrainingSpec(global_batch=64, dtype="bf16")
    topo = load_topology("dgx-a100", 32)
    on = search(model, training, topo, 32, fixed=parse_layout("dp=4,pp=2,tp=1d:4,mb=2,overlap"), top_k=1).ranked[0]
    off = search(model, training, topo, 32, fixed=parse_layout("dp=4,pp=2,tp=1d:4,mb=2,overlap=0"), top_k=1).ranked[0]
    assert on[0].overlap and on[0].pp == 2 and not off[0].overlap
    assert on[1].step_time_s < off[1].step_time_s


@pytest.mark.parametrize("text", ["dp=16,zero=1,mb=1,overlap", "dp=8,tp=1d:2,sp,mb=2,overlap"])
def test_sixteen_bit_buckets_leave_as_their_elements_are_produced(text: str) -> None:
    """With 16-bit gradients (grad_bytes=2) a bucket still waits for all its elements: the event engine counts
    elements, not fp32 bytes (release_counts), and the engines agree within 2% as with fp32 buckets."""
    from paracube.cost_models.analytic import estimate as analytic
    from paracube.workload import ModelSpec

    spec = ModelSpec("mid", layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=8192, seq_len=1024)
    layout = parse_layout(text)
    topo, training = load_topology("dgx-a100", layout.world_size), TrainingSpec(global_batch=16, dtype="bf16")
    a = analytic(spec, training, layout, topo, with_events=False, param_overlap=True, grad_bytes=2)
    e = estimate_event(spec, training, layout, topo, with_events=False, param_overlap=True, grad_bytes=2)
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.02)
