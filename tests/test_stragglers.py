"""The slowest replica's wait (cost_models/stragglers.py): E[max of n normals] against its exact integral, and both
engines adding s sqrt(step) E[max of dp] to the step they price, the same closed form on their own step."""

from __future__ import annotations

from dataclasses import replace

import pytest
from scipy import integrate, stats

from paracube.cost_models.analytic import estimate
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event
from paracube.cost_models.stragglers import expected_max, straggler_wait, without_wait
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.topologies.calibration import as_calibration
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("mid", layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=32000, seq_len=1024)


def _exact(n: int) -> float:
    """The order statistic's mean: the integral of x n phi(x) Phi(x)^(n - 1) (the reference)."""
    return integrate.quad(lambda x: x * n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1), -12, 12)[0]


@pytest.mark.parametrize("n", [2, 3, 4, 8, 32, 128, 512, 2048, 16384])
def test_expected_max_is_blom_within_its_bound(n: int) -> None:
    """Blom's approximation is within 0.03 of the exact mean (the docstring's bound; 0.026 at n = 2, the worst)."""
    assert float(expected_max(n)) == pytest.approx(_exact(n), abs=0.03)


def test_one_replica_waits_for_nobody() -> None:
    assert float(expected_max(1)) == 0.0
    assert float(straggler_wait(2.0, 1, 0.05)) == 0.0
    assert float(straggler_wait(2.0, 64, 0.0)) == 0.0
    assert float(straggler_wait(4.0, 32, 0.01)) == pytest.approx(0.01 * 2.0 * _exact(32), abs=0.01 * 2.0 * 0.03)


def _topo(gpus: int, s: float):
    """The dgx-h100 preset with its calibration's jitter figure replaced by `s`."""
    topo = load_topology("dgx-h100", gpus=gpus)
    cal = as_calibration(topo.calibration)
    topo.calibration = replace(cal, gemm=replace(cal.gemm, straggler=s))
    return topo


CASES = [(64, "dp=16,mb=4,overlap"), (128, "dp=8,tp=1d:2,mb=8,overlap"), (64, "dp=16,zero=1,mb=4"),
         (64, "dp=4,pp=2,tp=1d:2,mb=2,overlap")]


@pytest.mark.parametrize("gb,text", CASES)
def test_both_engines_add_the_wait_on_their_own_step(gb: int, text: str) -> None:
    """With the figure the step grows by exactly straggler_wait(step without it, dp, s) in each engine (the wait is
    the last term both add; 1e-9: float sums), and it brings the engines no further apart: x + c sqrt(x) is
    increasing and grows slower than x, so (e + c sqrt(e)) / (a + c sqrt(a)) lies between 1 and e / a."""
    layout = parse_layout(text)
    training = TrainingSpec(global_batch=gb, dtype="bf16", recompute="none")
    s = 0.05
    topo, free = _topo(layout.world_size, s), _topo(layout.world_size, 0.0)
    assert gemm_model(topo, "bf16").straggler == s and gemm_model(free, "bf16").straggler == 0.0
    steps = []
    for price in (lambda t: estimate(SPEC, training, layout, t, with_events=False), lambda t: estimate_event(
            SPEC, training, layout, t)):
        with_it, without = price(topo), price(free)
        want = float(straggler_wait(without.step_time_s, layout.dp, s))
        assert want > 0
        assert with_it.step_time_s - without.step_time_s == pytest.approx(want, rel=1e-9)
        assert with_it.exposed_comm_time_s - without.exposed_comm_time_s == pytest.approx(want, rel=1e-6)
        steps.append((with_it.step_time_s, without.step_time_s))
    (a, a0), (e, e0) = steps
    assert abs(e / a - 1) <= abs(e0 / a0 - 1) + 1e-12


@pytest.mark.parametrize("gb,text", CASES)
def test_the_search_adds_the_same_wait(gb: int, text: str) -> None:
    """The planner's batch path (analytic_scores.evaluate over many layouts) carries it too: the layout it ranks
    first costs straggler_wait(its step without the figure) more with it (1e-9: float sums)."""
    from paracube.planner.search import search

    layout = parse_layout(text)
    training = TrainingSpec(global_batch=gb, dtype="bf16", recompute="none")
    s = 0.05
    ranked = [search(SPEC, training, _topo(layout.world_size, x), layout.world_size, fixed=layout, top_k=1,
                     zeros=[layout.zero]).ranked[0] for x in (s, 0.0)]
    (lay, with_it), (lay0, without) = ranked
    assert str(lay) == str(lay0)
    want = float(straggler_wait(without.step_time_s, lay.dp, s))
    assert with_it.step_time_s - without.step_time_s == pytest.approx(want, rel=1e-9)


def test_pruning_by_the_bounds_keeps_the_same_ranking() -> None:
    """score_bounds adds the wait on its bound (the wait grows with the step): pruned and exhaustive searches rank
    the same layouts at the same step times (1e-12: the same float sums) with a large figure."""
    from paracube.planner.search import search

    topo = _topo(64, 0.05)
    training = TrainingSpec(global_batch=64, dtype="bf16", recompute="none")
    pruned, full = (search(SPEC, training, topo, 64, top_k=5, prune=p).ranked for p in (True, False))
    assert [str(lay) for lay, _ in pruned] == [str(lay) for lay, _ in full]
    assert [e.step_time_s for _, e in pruned] == pytest.approx([e.step_time_s for _, e in full], rel=1e-12)


@pytest.mark.parametrize("step,replicas,s", [(2.0, 512, 0.014), (1e-3, 8, 0.05), (30.0, 2, 0.2), (0.5, 1, 0.1)])
def test_without_wait_inverts_the_wait(step: float, replicas: int, s: float) -> None:
    """moe_step.with_moe takes the dense part's wait off before adding the experts' time: the inverse is exact."""
    with_it = step + float(straggler_wait(step, replicas, s))
    assert float(without_wait(with_it, replicas, s)) == pytest.approx(step, rel=1e-12)
