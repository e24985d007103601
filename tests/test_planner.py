"""The planner: the best layout equals a brute force over every layout, results never break the size rules
or device memory, and rejections keep their reasons."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paracube.cost_models.analytic import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.uniform_topology import DeviceSpec, UniformTopology
from paracube.cost_models.validity import violations
from paracube.errors import ParacubeError
from paracube.layout import Layout
from paracube.modes.base import TOKEN_RULE
from paracube.planner import search
from paracube.workload import PRESETS, ModelSpec, TrainingSpec

TINY = PRESETS["tiny"]


def topo(gpus: int, mem: float = 1e12) -> UniformTopology:
    dev = DeviceSpec("fake", {"fp32": 1e13, "fp16": 1e14, "bf16": 1e14}, mem, 1e12)
    return UniformTopology(dev, gpus, 4, 100e9, 2e-6, 10e9, 10e-6)


def _brute_force(model: ModelSpec, tr: TrainingSpec, gpus: int, tp: UniformTopology) -> float:
    """Independent enumeration: every mode/shape/dp/pp/mb/v/sp and every order of the axes, one by one."""
    shapes = (
        [("none", ())]
        + [("1d", (p,)) for p in range(2, gpus + 1)]
        + [("2d", (q, q)) for q in range(2, 4)]
        + [("2.5d", (q, q, d)) for q in range(2, 4) for d in range(2, 5)]
        + [("3d", (q, q, q)) for q in range(2, 3)]
    )
    best = float("inf")
    for mode, shape in shapes:
        t = 1
        for s in shape:
            t *= s
        if gpus % t:
            continue
        for pp in range(1, gpus // t + 1):
            if (gpus // t) % pp or model.layers % pp:
                continue
            dp = gpus // t // pp
            for mb, v, sp in itertools.product(
                range(1, tr.global_batch + 1), range(1, model.layers + 1), (False, True)
            ):
                if (sp and mode != "1d") or (v > 1 and pp == 1):
                    continue
                base = Layout(
                    dp=dp,
                    pp=pp,
                    mode=mode,
                    shape=shape,
                    micro_batch=mb,
                    interleave=v,  # type: ignore[arg-type]
                    sequence_parallel=sp,
                )
                if violations(base, dims_of(model, tr), mb):
                    continue
                big = [a for a in base.axis_names if base.axis_size(a) > 1]
                for perm in itertools.permutations(big):
                    est = estimate(model, tr, base.with_(placement=perm), tp, with_events=False)
                    if est.memory.total <= tp.device.memory_bytes:
                        best = min(best, est.step_time_s)
    return best


@pytest.mark.parametrize("gpus", [4, 8])
def test_best_equals_brute_force(gpus: int) -> None:
    tr = TrainingSpec(global_batch=8)
    tp = topo(gpus)
    res = search(TINY, tr, tp, gpus)
    assert res.ranked[0][1].step_time_s == pytest.approx(_brute_force(TINY, tr, gpus, tp), rel=1e-12)
    times = [e.step_time_s for _, e in res.ranked]
    assert times == sorted(times)
    assert res.scored > 0 and set(res.best_per_mode) <= {"none", "1d", "2d", "2.5d", "3d"}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([1, 2, 4, 6, 8, 12, 16]), st.sampled_from([8, 12, 16]), st.sampled_from([2e6, 5e6, 1e12])
)
def test_results_respect_rules_and_memory(gpus: int, batch: int, mem: float) -> None:
    tr = TrainingSpec(global_batch=batch)
    tp = topo(gpus, mem)
    try:
        res = search(TINY, tr, tp, gpus, top_k=5)
    except ParacubeError as exc:
        assert "no layout" in str(exc)
        return
    for lay, est in res.ranked + list(res.best_per_mode.values()):
        assert lay.world_size == gpus
        assert violations(lay, dims_of(TINY, tr), lay.micro_batch) == []
        assert est.memory.total <= mem


def test_rejection_reasons() -> None:
    """12 GPUs have no cube: 3d is explained; the size rules and memory are counted per reason."""
    with pytest.raises(ParacubeError, match="3d needs a cube number of tensor ranks.*12 has none"):
        search(TINY, TrainingSpec(global_batch=8), topo(12), 12, modes=["3d"])
    res = search(TINY, TrainingSpec(global_batch=8), topo(8), 8)
    assert res.rejected["global batch % (dp * micro-batch) != 0"] == 0  # only divisors are enumerated
    twelve = search(TINY, TrainingSpec(global_batch=12), topo(12), 12)
    assert twelve.rejected[TOKEN_RULE] > 0  # 2.5d 2x2x3: 64 x mb tokens do not split 6 ways for mb in 1, 2, 4
    with pytest.raises(ParacubeError, match="memory"):
        search(TINY, TrainingSpec(global_batch=8), topo(8, mem=1e5), 8)


def test_fixed_and_micro_batches() -> None:
    fixed = Layout(dp=2, mode="1d", shape=(4,))
    res = search(TINY, TrainingSpec(global_batch=8), topo(8), 8, fixed=fixed, micro_batches=[2])
    assert all(lay.dp == 2 and lay.shape == (4,) and lay.micro_batch == 2 for lay, _ in res.ranked)


def test_link_cache_matches_direct_group_queries() -> None:
    """The merged-run cache keys (links.py) and the planner's encoded keys (enumerate.py) must give what the
    real topology answers for the layout's own groups (Layout.groups) with all concurrent groups."""
    from paracube.cost_models.comm import axes_used
    from paracube.cost_models.links import LinkCache
    from paracube.planner.enumerate import structures
    from paracube.topologies import load_topology

    tp = load_topology("dgx-a100", gpus=64)
    cache = LinkCache(tp)
    checked = 0
    for mode in ("1d", "2.5d", "3d"):
        for struct in structures(mode, 64, 8)[::3]:
            for place, keys in struct.placements()[::5]:
                lay = Layout(dp=struct.dp, pp=struct.pp, mode=struct.mode, shape=struct.shape,  # type: ignore[arg-type]
                             placement=tuple(a for a, _ in place))
                for key, axes in zip(keys, axes_used(mode), strict=True):
                    ax = tuple(a for a in axes if lay.axis_size(a) > 1)
                    got = cache.get_keyed(key, place, ax)
                    if not ax:
                        assert got == (float("inf"), 0.0)
                        continue
                    groups = lay.groups(ax)
                    link = tp.group_link(groups[0].tolist(), concurrent=groups[1:].tolist())
                    assert got == (link.bandwidth, link.latency)
                    checked += 1
    assert checked > 100
