"""Overlapped gradient reduction under pipelines, priced per stage and chunk (cost_models/grad_overlap.py):
the analytic engine against the event engine (which simulates every bucket on its stage's stream during that
stage's, or chunk's, last backward), and the closed form's pp = 1 case (the DDP formula it generalizes)."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.grad_overlap import exposed_grad_time
from paracube.layout import parse_layout
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


def test_one_stage_reduces_to_the_ddp_form_and_later_stages_hide_more() -> None:
    """v = 1 on stage 0: max(0, G - b (1 - x1), xl G); stage s has s more backward slots to hide it in, and
    interleaving releases the later chunks' buckets pp slots earlier each."""
    G, b = np.array([3.0, 1.0, 0.5]), np.array([2.0, 2.0, 2.0])
    x1, xl = np.array([0.25, 0.25, 0.25]), np.array([0.1, 0.4, 0.1])
    one = np.ones(3)
    got = exposed_grad_time(G, b, x1, xl, 0 * one, 4 * one, one, one > 0)
    assert got == pytest.approx(np.maximum(0.0, np.maximum(G - b * (1 - x1), xl * G)), rel=1e-12)
    later = exposed_grad_time(G, b, x1, xl, 1 * one, 4 * one, one, one < 0)
    assert np.all(later <= got) and later[0] == pytest.approx(max(0.0, G[0] - b[0] * (1 - x1[0]) - b[0]))
    inter = exposed_grad_time(G, b, x1, xl, 0 * one, 4 * one, 2 * one, one > 0)
    assert np.all(inter <= got + 1e-12)


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
