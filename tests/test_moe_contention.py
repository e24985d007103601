"""The expert gradients beside the last backward's all_to_alls on shared NICs (cost_models/moe_contention.py): the
closed form against a step-by-step replay of the same sharing, its limits, and both engines on layouts where it
applies (the dp=32,ep=16,overlap layout the engines parted on by 3.8-11%)."""

from __future__ import annotations

import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.moe_contention import exposed_grads, slowdown
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec


def replay(grads: float, compute: float, a2a: float, s: float, pieces: int = 4000) -> float:
    """The backward as `pieces` alternations of compute and all_to_all, the gradients running from its start at full
    rate beside compute and (s - 1) / s beside an all_to_all, which then runs at 1 / s: the time past C + A."""
    t, left = 0.0, grads
    for _ in range(pieces):
        for seconds, busy in ((compute / pieces, False), (a2a / pieces, True)):
            if left <= 0 or s == 1.0 and busy:
                t += seconds
                continue
            rate = (s - 1.0) / s if busy else 1.0
            stretch = s if busy else 1.0
            need = left / rate if rate > 0 else float("inf")  # seconds for the gradients to finish here
            if need >= seconds * stretch:
                left -= rate * seconds * stretch
                t += seconds * stretch
            else:  # they finish inside: the rest of the piece at full speed
                left = 0.0
                t += need + (seconds - need / stretch)
    return t + max(0.0, left) - (compute + a2a)


@pytest.mark.parametrize(("grads", "compute", "a2a", "s"), [
    (0.17, 0.172, 0.043, 7.7), (0.17, 0.172, 0.148, 3.0), (3.8, 1.9, 0.15, 9.4), (0.05, 0.3, 0.1, 2.0),
    (0.4, 0.1, 0.3, 1.5),
])
def test_closed_form_matches_the_replay(grads: float, compute: float, a2a: float, s: float) -> None:
    assert exposed_grads(grads, compute, a2a, s) == pytest.approx(replay(grads, compute, a2a, s), rel=0.01, abs=1e-4)


def test_no_shared_nic_leaves_what_compute_does_not_cover() -> None:
    for grads, compute, a2a in ((0.2, 0.1, 0.05), (0.05, 0.1, 0.05)):
        assert exposed_grads(grads, compute, a2a, 1.0) == pytest.approx(max(0.0, grads - compute))
    assert slowdown(0.0, 1e-12, 4e10) == 1.0  # an all_to_all inside a node: nothing on the NICs
    assert slowdown(2e-12, 1e-12, 4e10) == pytest.approx((2e-12 + 1 / 4e10) / 2e-12)


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=32)


@pytest.mark.parametrize(("name", "text", "recompute", "dispatch"), [
    ("qwen3-30b-a3b", "dp=32,ep=16,tp=none,mb=1,zero=1,overlap", "selective", "alltoall"),
    ("qwen3-30b-a3b", "dp=32,ep=16,tp=none,mb=1,zero=1,overlap", "selective", "deepep"),
    ("qwen3-30b-a3b", "dp=16,pp=2,ep=16,tp=none,mb=1,v=2,zero=1,overlap", "selective", "deepep"),
    ("qwen3-30b-a3b", "dp=16,ep=8,etp=2,tp=1d:2,sp,mb=1,zero=1,overlap", "selective", "alltoall"),
    ("deepseek-v3", "dp=32,ep=16,tp=none,mb=1,zero=1,overlap", "full", "deepep"),
])
def test_engines_agree_where_gradients_share_the_all_to_alls_nics(h100: object, name: str, text: str, recompute: str,
                                                                  dispatch: str) -> None:
    train = TrainingSpec(global_batch=64, dtype="bf16", recompute=recompute)  # type: ignore[arg-type]
    layout = parse_layout(text)
    a = estimate(PRESETS[name], train, layout, h100, with_events=False, moe_dispatch=dispatch)
    e = estimate_event(PRESETS[name], train, layout, h100, with_events=False, moe_dispatch=dispatch)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
