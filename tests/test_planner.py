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
from paracube.model_presets import PRESETS
from paracube.modes.base import TOKEN_RULE
from paracube.planner import SearchResult, search
from paracube.planner.dimensions import FSDP_PREFETCH, PARAM_OVERLAP, chosen
from paracube.runtimes import get_runtime
from paracube.workload import ModelSpec, TrainingSpec

TINY = PRESETS["tiny"]


def topo(gpus: int, mem: float = 1e12) -> UniformTopology:
    dev = DeviceSpec("fake", {"fp32": 1e13, "fp16": 1e14, "bf16": 1e14}, mem, 1e12)
    return UniformTopology(dev, gpus, 4, 100e9, 2e-6, 10e9, 10e-6)


def _brute_force(model: ModelSpec, tr: TrainingSpec, gpus: int, tp: UniformTopology) -> float:
    """Independent enumeration: every mode/shape/dp/pp/mb/v/sp/zero and every order of the axes, one by one, priced
    with paracube's runtime's options (the search's: its zero=1 gather and zero=2/3 prefetch overlapped)."""
    rt = get_runtime("paracube")
    options = rt.engine_options().with_(param_overlap=chosen(PARAM_OVERLAP, rt, None),
                                        fsdp_prefetch=chosen(FSDP_PREFETCH, rt, None))
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
                # paracube's runtime overlaps the gradient reduction with backward where it runs it (dp > 1, pp = 1)
                base = base.with_(overlap=dp > 1 and pp == 1)
                # the runtime's zero stages where they shard (dp > 1): 2 and 3 at pp = 1 (Runtime.zeros_with_pp)
                zeros = (0,) if dp == 1 else (0, 1) if pp > 1 else (0, 1, 2, 3)
                for perm, zero in itertools.product(itertools.permutations(big), zeros):
                    est = estimate(model, tr, base.with_(placement=perm, zero=zero), tp, with_events=False,
                                   options=options)
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


def test_an_explicit_zero_0_is_a_pin() -> None:
    """zero=0 is also the default, so `--layout zero=0` must still pin it (as sp=0 pins sp off). At dp=8 the
    unsharded layouts need 3.0 MB per device and zero=2/3 about 2.0 MB: with 2.5 MB the free search shards,
    the pinned one finds nothing that fits."""
    from paracube.layout_parse import parse_layout

    training = TrainingSpec(global_batch=8)
    free = search(TINY, training, topo(8, mem=2.5e6), 8, fixed=parse_layout("dp=8,tp=none"))
    assert free.ranked[0][0].zero > 0
    pinned = parse_layout("dp=8,tp=none,zero=0")
    assert pinned.forbid_zero and str(pinned) == "dp=8,tp=none,zero=0" and parse_layout(str(pinned)) == pinned
    with pytest.raises(ParacubeError, match="memory"):
        search(TINY, training, topo(8, mem=2.5e6), 8, fixed=pinned)


def test_link_cache_matches_direct_group_queries() -> None:
    """The merged-run cache keys (links.py) and the planner's encoded keys (enumerate.py) must give what the
    real topology answers for the layout's own groups (Layout.groups) with all concurrent groups."""
    from paracube.cost_models.comm_axes import axes_used
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


PRUNE_CASES = [
    ("gpt3-13b", 128, {}),
    ("gpt3-13b", 128, {"recomputes": ["none", "selective", "full"], "zeros": [0, 1]}),
    ("gpt3-2.7b", 64, {"overlap": True, "zeros": [0, 1]}),
    ("gpt3-13b", 128, {"fixed": "sp=0"}),
    ("gpt3-13b", 128, {"fixed": "pp=4,mb=1"}),
    # zero=2/3 configurations bounded again after the zero=0/1 layouts are scored (scoring._staged_times)
    ("gpt3-13b", 128, {"runtime": "torchtitan", "recomputes": ["none", "selective", "full"]}),
    ("gpt3-13b", 128, {"recomputes": ["none", "selective", "full"]}),
    ("gpt3-13b", 64, {"runtime": "deepspeed"}),
]


def assert_same_search(fast: SearchResult, full: SearchResult) -> None:
    """The pruned search `fast` against the exhaustive `full` (prune=False): the same ranked layouts and step times,
    best per mode and rejections, and what it skipped exactly what it did not score."""
    assert fast.pruned > 0 and full.pruned == 0
    assert fast.scored + fast.pruned == full.scored and fast.rejected == full.rejected
    assert [(repr(lay), est.step_time_s) for lay, est in fast.ranked] == \
        [(repr(lay), est.step_time_s) for lay, est in full.ranked]
    assert {m: repr(lay) for m, (lay, _) in fast.best_per_mode.items()} == \
        {m: repr(lay) for m, (lay, _) in full.best_per_mode.items()}


@pytest.mark.parametrize(("model", "gpus", "options"), PRUNE_CASES)
def test_bound_pruning_keeps_the_exact_ranking(model: str, gpus: int, options: dict) -> None:
    """Skipping the placements of configurations whose lower bound loses changes nothing the search returns:
    the same ranked layouts and step times, the same best per mode, the same rejections, and the layouts it
    skips are exactly those it did not score."""
    from paracube.layout_parse import parse_layout
    from paracube.topologies import load_topology

    if "fixed" in options:
        options = {**options, "fixed": parse_layout(options["fixed"])}
    tp = load_topology("dgx-a100", gpus=gpus)
    training = TrainingSpec(global_batch=512, dtype="bf16", recompute="selective")
    fast = search(PRESETS[model], training, tp, gpus, top_k=10, **options)
    full = search(PRESETS[model], training, tp, gpus, top_k=10, prune=False, **options)
    assert_same_search(fast, full)


@pytest.mark.parametrize(("model", "gpus", "options"), PRUNE_CASES)
def test_pruning_without_mode_bests_keeps_the_exact_ranking(model: str, gpus: int, options: dict) -> None:
    """`mode_bests=False` (paracube plan's search: the bar is the top_k-th best, and the best cp=1 step, only)
    returns the ranking of the exhaustive search: the same ranked layouts and step times, the same rejections,
    every valid layout either scored or pruned; no best per mode."""
    from paracube.layout_parse import parse_layout
    from paracube.topologies import load_topology

    if "fixed" in options:
        options = {**options, "fixed": parse_layout(options["fixed"])}
    tp = load_topology("dgx-a100", gpus=gpus)
    training = TrainingSpec(global_batch=512, dtype="bf16", recompute="selective")
    fast = search(PRESETS[model], training, tp, gpus, top_k=10, mode_bests=False, **options)
    full = search(PRESETS[model], training, tp, gpus, top_k=10, prune=False, **options)
    assert fast.pruned > 0 and fast.best_per_mode == {}
    assert fast.scored + fast.pruned == full.scored and fast.rejected == full.rejected
    assert [(repr(lay), est.step_time_s) for lay, est in fast.ranked] == \
        [(repr(lay), est.step_time_s) for lay, est in full.ranked]


@pytest.mark.parametrize("overlap", [False, True])
def test_step_lower_bound_is_below_every_placement(overlap: bool) -> None:
    """analytic.step_lower_bound on each axis set's best link over a structure's placements is at most the step
    time of every placement, in every mode, with pipelines (interleaved), zero=1 and kept weights."""
    import numpy as np

    from paracube.cost_models.analytic import evaluate, step_lower_bound
    from paracube.cost_models.comm_axes import axes_used
    from paracube.cost_models.device_model import gemm_model
    from paracube.cost_models.links import LinkCache
    from paracube.cost_models.validity import first_violation
    from paracube.modes import MODES, LayoutBatch
    from paracube.planner.enumerate import structures
    from paracube.topologies import load_topology

    model, gpus = PRESETS["gpt3-2.7b"], 64
    tp = load_topology("dgx-a100", gpus=gpus)
    training = TrainingSpec(global_batch=256, dtype="bf16", recompute="selective")
    d, g, cache = dims_of(model, training), gemm_model(tp, "bf16"), LinkCache(tp)
    checked = 0
    for mode in ("none", "1d", "2d", "2.5d", "3d"):
        axes = axes_used(mode)
        for struct in structures(mode, gpus, model.layers):
            m = MODES[mode]
            q, t = (struct.shape[0] if struct.shape else 1), int(np.prod(struct.shape or (1,)))
            rows = [(struct.dp, struct.pp, t, q, m.depth(struct.shape), mb, v, 0)
                    for mb in (1, 2, 4) for v in ((1, 2) if struct.pp > 1 else (1,))]
            batch = LayoutBatch.of_rows(rows)
            batch = batch.take(np.nonzero(first_violation(mode, d, batch) < 0)[0])
            if not len(batch):
                continue
            per_place = np.array([[cache.get_keyed(k, place, ax) for k, ax in zip(keys, axes, strict=True)]
                                  for place, keys in struct.placements()])  # [P, axes, (bw, lat)]
            n, zero, kw = len(batch), np.ones(len(batch), dtype=np.int64), np.ones(len(batch), dtype=np.int64)

            def links(mat: np.ndarray, n: int = n, axes: list = axes) -> dict:
                return {ax: (np.full(n, mat[i, 0]), np.full(n, mat[i, 1])) for i, ax in enumerate(axes)}

            best = np.stack([per_place[:, :, 0].max(axis=0), per_place[:, :, 1].min(axis=0)], axis=1)
            scores = evaluate(d, mode, batch, links(best), g, zero=zero, overlap=overlap, kw=kw)
            bound = step_lower_bound(scores, d, batch, np.arange(n), overlap)
            for mat in per_place:
                step = evaluate(d, mode, batch, links(mat), g, zero=zero, overlap=overlap, kw=kw).step_time
                assert np.all(bound <= step * (1 + 1e-12)), (mode, struct)
                checked += n
    assert checked > 500


def test_an_explicit_v_1_is_a_pin() -> None:
    """`v=1` given pins plain 1F1B (Layout.forbid_interleave; the default v = 1 is searched, as zero=0's is): the
    search ranks pp = 4 layouts interleaved without it and none with it; the pin survives the layout's text."""
    from paracube.layout_parse import parse_layout
    from paracube.topologies import load_topology

    tp, training = load_topology("dgx-a100", gpus=128), TrainingSpec(global_batch=512, dtype="bf16")
    free = search(PRESETS["gpt3-13b"], training, tp, 128, fixed=parse_layout("pp=4"), top_k=20).ranked
    pinned = search(PRESETS["gpt3-13b"], training, tp, 128, fixed=parse_layout("pp=4,v=1"), top_k=20).ranked
    assert any(lay.interleave > 1 for lay, _ in free) and all(lay.interleave == 1 for lay, _ in pinned)
    lay = parse_layout("dp=2,pp=4,tp=1d:2,v=1")
    assert lay.forbid_interleave and str(lay).endswith("v=1") and parse_layout(str(lay)) == lay
    with pytest.raises(ParacubeError, match="v=1 and v=2 together"):
        Layout(pp=2, interleave=2, forbid_interleave=True)
