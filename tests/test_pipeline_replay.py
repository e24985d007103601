"""The interleaved schedule replayed over chunk costs (cost_models/pipeline_replay.py): the vectorized replay against
a plain walk of modes/stages.schedule, the closed form on even chunks, the sum form of even splits against it, the
bounds' form below the step and growing with every stage's work, the engines on uneven splits, and the search's
pruning with it."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.pipeline_bubble import bubble_seconds
from paracube.cost_models.pipeline_replay import chunk_costs, interleaved_bubble, makespan
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.stages import schedule
from paracube.planner import search
from paracube.runtimes import RUNTIMES
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec


def walk(costs: list[float], backward: float, pp: int, v: int, n_micro: int) -> float:
    """The makespan by walking every stage's `schedule` in turn, each op once its stage is free and its input is in."""
    orders = [schedule(pp, v, n_micro, s) for s in range(pp)]
    at, free, ends, last = [0] * pp, [0.0] * pp, {}, pp * v - 1
    while any(at[s] < len(orders[s]) for s in range(pp)):
        for s in range(pp):
            while at[s] < len(orders[s]):
                kind, c, m = orders[s][at[s]]
                j = c * pp + s
                dep = (None if j == 0 else ("F", j - 1, m)) if kind == "F" else \
                    (("F", j, m) if j == last else ("B", j + 1, m))
                if dep is not None and dep not in ends:
                    break
                share = backward if kind == "B" else 1.0 - backward
                free[s] = ends[(kind, j, m)] = max(free[s], ends[dep] if dep else 0.0) + share * costs[j]
                at[s] += 1
    return max(free)


@pytest.mark.parametrize(("pp", "v", "n"), [(2, 3, 2), (2, 5, 4), (4, 3, 4), (4, 2, 12), (3, 4, 6)])
@pytest.mark.parametrize("layouts", [3, 300])
def test_replay_is_a_walk_of_the_schedule(pp: int, v: int, n: int, layouts: int) -> None:
    """Random chunk costs: the replay (3 layouts: op by op; 300: wavefront by wavefront, in two blocks of columns)
    gives the walk's makespan (the same additions and maxima in another order: equal to rounding)."""
    rng = np.random.default_rng(pp * 100 + v * 10 + n)
    costs = rng.uniform(0.5, 3.0, size=(pp * v, layouts))
    got = makespan(costs, 2.0 / 3.0, pp, v, n)
    want = [walk(list(costs[:, k]), 2.0 / 3.0, pp, v, n) for k in (0, 1, layouts - 1)]
    assert got[[0, 1, layouts - 1]] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("layers", "pp", "v"), [(48, 4, 3), (48, 2, 4), (32, 8, 2), (24, 3, 2)])
@pytest.mark.parametrize("periods", [1, 2, 4, 7])
def test_even_chunks_without_edge_work_give_the_closed_form(layers: int, pp: int, v: int, periods: int) -> None:
    """Every chunk alike: the replay (exact up to 4 pp micro-batches, extrapolated beyond) is Narayanan's
    (pp - 1) / (v N) of the slowest stage's work."""
    n = periods * pp
    work = np.full((3, 1), 3.0 * n * layers / pp)
    got = interleaved_bubble(work, layers, np.array([pp]), np.array([v]), np.array([n]))
    assert got[0] == pytest.approx((pp - 1) * work[0, 0] / (v * n), rel=1e-12)


def test_chunk_costs_add_up_to_each_stage() -> None:
    """Each physical stage's chunks cost its representative stage's work per micro-batch (heavier edges: the excess
    on the edge chunk; a lighter first stage: spread over its chunks)."""
    layers, pp, v = 80, 4, 3  # 6, 7 x 10, 4
    work = np.array([[20.0, 18.0], [21.0, 21.0], [25.0, 25.0]])  # first, middle (blocks 7 + 7 + 7), last
    costs = chunk_costs(work, layers, pp, v)
    per_stage = costs.reshape(v, pp, 2).sum(axis=0)
    assert per_stage[0] == pytest.approx(work[0]) and per_stage[-1] == pytest.approx(work[2])
    assert per_stage[1] == pytest.approx(work[1]) and per_stage[2] == pytest.approx(work[1])
    assert costs[-1, 0] == pytest.approx(4 + 7.0)  # the last chunk: its 4 blocks at 1 each, the head's 7 more


@pytest.mark.parametrize(("layers", "pp", "v"), [(80, 4, 3), (80, 4, 7), (24, 2, 5), (61, 8, 4)])
@pytest.mark.parametrize("periods", [1, 2, 4, 9])
def test_bounds_form_is_below_the_step_and_grows_with_work(layers: int, pp: int, v: int, periods: int) -> None:
    """The bounds read the `lower` form: never above the step the same works give, and never lower when any stage's
    work grows (score_bounds.py needs both; random works, 40 layouts)."""
    rng = np.random.default_rng(layers + pp + v + periods)
    n = periods * pp
    work = rng.uniform(0.5, 2.0, size=(3, 40)) * n * layers / pp
    args = (layers, np.full(40, pp), np.full(40, v), np.full(40, n))
    step = work.max(axis=0) + interleaved_bubble(work, *args)
    low = work.max(axis=0) + interleaved_bubble(work, *args, lower=True)
    assert np.all(low <= step * (1 + 1e-12))
    for s in range(3):
        more = work.copy()
        more[s] *= rng.uniform(1.0, 1.5, size=40)
        assert np.all(more.max(axis=0) + interleaved_bubble(more, *args, lower=True) >= low * (1 - 1e-12))


def test_even_splits_take_the_sum_over_the_other_devices() -> None:
    """Given the model's blocks, only uneven splits are replayed: on an even one bubble_seconds is the sum form,
    (total - slowest) / (v N) (pipeline_bubble.py)."""
    work = np.array([[30.0], [24.0], [36.0]])
    got = bubble_seconds(work, np.array([4]), np.array([2]), np.array([8.0]), layers=80)
    assert got == pytest.approx([(30.0 + 2 * 24.0 + 36.0 - 36.0) / (2 * 8.0)], rel=1e-12)


def test_sum_form_is_the_replay_where_the_head_is_the_extra_work() -> None:
    """Even splits whose first stage carries a small embedding and whose last a head of up to 2.5 chunks: the sum
    form against the schedule replayed over the chunks (the reference the event engine runs), random shapes (pp 2-16,
    v 2-12, 1-8 blocks a chunk, pp to 8 pp micro-batches), against (pp - 1) copies of the slowest stage's chunk (the
    form it replaced). Measured: mean |diff| 0.32% (old 0.58%), worst +2.0% / -1.7% (old +9.2% / -1.6%); the bounds
    leave room for other draws (1,500 of them: worst +3.2% / -2.1%), all of it deterministic arithmetic."""
    rng = np.random.default_rng(4)
    new, old = [], []
    for _ in range(400):
        pp, v, per = (int(rng.choice(c)) for c in ([2, 3, 4, 6, 8, 16], [2, 3, 4, 6, 12], [1, 2, 3, 4, 8]))
        n = pp * int(rng.choice([1, 2, 3, 4, 8]))
        blocks = v * per
        edge = rng.uniform(0.975, 1.025, size=2) * blocks
        work = np.array([[edge[0] + 0.02 * rng.random()], [float(blocks)],
                         [edge[1] + rng.choice([0.0, 0.05, 0.3, 1.0, 2.5]) * rng.random()]])
        if pp == 2:
            work[1] = work[0]
        work *= n
        replay = work.max() + interleaved_bubble(work, pp * blocks, np.array([pp]), np.array([v]), np.array([n]))[0]
        summed = work.max() + bubble_seconds(work, np.array([pp]), np.array([v]), np.array([float(n)]))[0]
        new.append(summed / replay - 1)
        old.append(work.max() * (1 + (pp - 1) / (v * n)) / replay - 1)
    assert np.mean(np.abs(new)) < 0.005 and np.mean(np.abs(new)) < np.mean(np.abs(old))
    assert max(np.abs(new)) < 0.05 < max(np.abs(old))


@pytest.mark.parametrize("v", [3, 6, 7])
def test_engines_agree_on_uneven_interleaved_splits(v: int) -> None:
    """llama3-70b's 80 blocks on pp 4 x v (6, 7 x 10, 4 / 3, 4 x 18, 1 x 5 / 2, 3 x 25, 2, 1) with 4 micro-batches:
    the closed form put the event engine -6.5%, +1.4%, -4.4% from the analytic step; the replay within 0.5% (measured
    0.0-0.4%). Both engines are deterministic arithmetic: the bound is their agreement, not a timing tolerance."""
    topo = load_topology("dgx-h100", gpus=64)
    model, training = PRESETS["llama3-70b"], TrainingSpec(global_batch=16, dtype="bf16", seq_len=4096)
    lay = parse_layout(f"dp=2,pp=4,tp=1d:8,mb=2,v={v},sp,zero=1")
    opts = RUNTIMES["megatron"].engine_options()
    a = estimate(model, training, lay, topo, with_events=False, options=opts)
    e = estimate_event(model, training, lay, topo, with_events=False, options=opts)
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.005), (a.step_time_s, e.step_time_s)


def test_pruning_keeps_the_exact_ranking_with_uneven_interleaving() -> None:
    """Few micro-batches and layers that split unevenly over most pp x v: the bound-pruned search returns the
    exhaustive search's ranking (the bounds' form is below every placement's step)."""
    topo = load_topology("dgx-h100", gpus=64)
    model, training = PRESETS["llama3-70b"], TrainingSpec(global_batch=32, dtype="bf16", seq_len=4096)
    fast = search(model, training, topo, 64, top_k=10, runtime="megatron")
    full = search(model, training, topo, 64, top_k=10, runtime="megatron", prune=False)
    assert fast.pruned > 0 and any(lay.interleave > 1 for lay, _ in full.ranked)
    assert [(repr(lay), est.step_time_s) for lay, est in fast.ranked] == \
        [(repr(lay), est.step_time_s) for lay, est in full.ranked]
