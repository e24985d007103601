"""What the fast paths of the search (issue 26, item 2) must not change: the pool's estimates shared by layouts
that differ only in a placement with the same links are those `estimate` gives each layout, and the bar shared by
every pass and mode (planner/scoring.py) keeps the exhaustive ranking with zero=2/3 in the space (torchtitan's
FSDP) and with every recomputation searched. Timings are measured by benchmarks/search_speed.py, not here."""

from __future__ import annotations

from paracube.cost_models.analytic import estimate
from paracube.model_presets import PRESETS
from paracube.planner import search
from paracube.planner.dimensions import FSDP_PREFETCH, PARAM_OVERLAP, chosen
from paracube.runtimes import RUNTIMES
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec


def _ranking(res) -> list[tuple[str, float]]:  # noqa: ANN001
    return [(repr(lay), est.step_time_s) for lay, est in res.ranked]


def test_shared_pool_estimates_are_each_layouts_own_and_pruning_stays_exact() -> None:
    """gpt3-2.7b on 64 A100s, torchtitan (zero=0..3 searched, zero=2/3 rows beside pruned zero=0/1 rows of the
    same modes), all three recomputations: pruned == exhaustive (ranking, step times, best per mode, counts),
    and every ranked estimate equals `estimate` of its layout field by field (no tolerance: the same
    arithmetic on the same links; only the layout's name is replaced where an estimate is shared)."""
    topo = load_topology("dgx-a100", gpus=64)
    training = TrainingSpec(global_batch=512, dtype="bf16")
    model = PRESETS["gpt3-2.7b"]
    options = {"top_k": 100, "recomputes": ["none", "selective", "full"], "runtime": "torchtitan"}
    fast = search(model, training, topo, 64, **options)
    full = search(model, training, topo, 64, prune=False, **options)
    assert fast.pruned > 0 and full.pruned == 0
    assert fast.scored + fast.pruned == full.scored and fast.rejected == full.rejected
    assert _ranking(fast) == _ranking(full)
    assert {m: repr(lay) for m, (lay, _) in fast.best_per_mode.items()} == \
        {m: repr(lay) for m, (lay, _) in full.best_per_mode.items()}
    rt = RUNTIMES["torchtitan"]
    opts = rt.engine_options().with_(param_overlap=chosen(PARAM_OVERLAP, rt, None),
                                     fsdp_prefetch=chosen(FSDP_PREFETCH, rt, None))  # what search.py passes
    placements = {repr(lay.with_(placement=())) for lay, _ in fast.ranked}
    assert len(placements) < len(fast.ranked)  # some layouts differ only in placement: the shared path ran
    for lay, est in fast.ranked:
        assert est == estimate(model, training, lay, topo, with_events=False, options=opts), str(lay)



def test_fast_helpers_equal_what_they_replace() -> None:
    """The search's memoized and vectorized helpers (issue 26) return exactly what the plain forms return:
    buckets.bucket_plan = padded bucket_numels + release_counts (real stages and random units), rows.unique_rows =
    np.unique(axis=0), stages.stage_layers' per-distinct-stage path = the batch formula (stages._uneven_layers,
    the formula every stage of a batch with an uneven split takes) on each stage alone."""
    import itertools

    import numpy as np

    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.local_parameters import parameter_units
    from paracube.modes.buckets import bucket_numels, bucket_plan, padded_numel, release_counts
    from paracube.modes.rows import unique_rows
    from paracube.modes.stages import _uneven_layers, stage_layers

    def plain(units, first, last, dp, bb):  # noqa: ANN001, ANN202
        sizes = [padded_numel(n, dp) for n in bucket_numels([n for u in units for n in u], bb)]
        return sizes, release_counts(units, first, last, dp, bb)

    rng = np.random.default_rng(0)
    d = dims_of(PRESETS["gpt3-2.7b"], TrainingSpec(global_batch=512))
    for (mode, t, q), layers, (first, last), dp, bb in itertools.product(
            [("1d", 1, 1), ("1d", 4, 1), ("2d", 4, 2)], [1, 3, 8, 32], itertools.product([False, True], repeat=2),
            [1, 3, 64], [1, 2 ** 20, 25 * 2 ** 20]):
        units = parameter_units(mode, d, t, q, layers, first, last)
        assert bucket_plan(units, first, last, dp, bb) == plain(units, first, last, dp, bb)
    for _ in range(300):
        units = [tuple(int(x) for x in rng.choice([0, 1, 3, 1000, 2 ** 20, 7 * 2 ** 20], rng.integers(0, 6)))
                 for _ in range(rng.integers(2, 8))]
        first, last = bool(rng.integers(2)), bool(rng.integers(2))
        dp, bb = int(rng.choice([1, 2, 7])), int(rng.choice([1, 16, 4 * 2 ** 20]))
        assert bucket_plan(units, first, last, dp, bb) == plain(units, first, last, dp, bb)
    for _ in range(100):
        table = rng.integers(rng.integers(-3, 2), rng.integers(2, 500), size=(rng.integers(1, 200), rng.integers(1, 9)))
        keys, inverse = np.unique(table, axis=0, return_inverse=True)
        fast = unique_rows(table)
        assert np.array_equal(fast[0], keys) and np.array_equal(fast[1], inverse.reshape(-1))
    pp = np.arange(1, 49)
    for L, v in itertools.product([61, 94, 126], [1, 2, 3, 4]):  # batches with uneven splits (deficit > 2)
        for first, last in itertools.product([0, 1], repeat=2):
            fl, ll = rng.integers(0, 2, len(pp)), rng.integers(0, 2, len(pp))
            assert stage_layers(L, pp, np.full_like(pp, v), first, last).tolist() == \
                [_uneven_layers(L, int(p), v, first, last) for p in pp]
            assert stage_layers(L, pp, np.full_like(pp, v), fl, ll).tolist() == \
                [_uneven_layers(L, int(p), v, int(f), int(h)) for p, f, h in zip(pp, fl, ll, strict=True)]


def test_release_shares_are_the_plain_sums() -> None:
    """grad_overlap._releases' S_j (suffix sums of bucket_plan's sizes) equal sum(sizes[issued:]) / total."""
    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.grad_overlap import _releases
    from paracube.cost_models.local_parameters import parameter_units
    from paracube.modes.buckets import bucket_numels, padded_numel, release_counts

    d = dims_of(PRESETS["gpt3-2.7b"], TrainingSpec(global_batch=512))
    for layers, first, last, dp, v in [(32, True, True, 1, 1), (8, True, False, 4, 2), (6, False, True, 1, 3),
                                       (4, False, False, 8, 1)]:
        units = parameter_units("1d", d, 2, 1, layers, first, last)
        sizes = [padded_numel(n, dp) for n in bucket_numels([n for u in units for n in u], 2 ** 22)]
        counts = release_counts(units, first, last, dp, 2 ** 22)
        issued, shares = 0, []
        for n in counts:
            if n:
                shares.append(sum(sizes[issued:]) / max(sum(sizes), 1))
            issued += n
        assert [r[2] for r in _releases("1d", d, 2, 1, layers, first, last, dp, v, 2 ** 22)] == shares


def test_cp_runner_up_is_the_exhaustive_one() -> None:
    """`paracube plan --model llama2-70b --cluster dgx-h100 --gpus 256 --seq 32768 --dtype fp8 --global-batch 256`'s
    search: the best layout has cp > 1 and its runner-up (the best cp=1 layout, added to the ranking) is the
    exhaustive search's: cp=1 passes keep their best (scoring._cp1_best) although later recomputation passes'
    rows are pruned (zero=2/3 too: analytic.compute_lower_bound)."""
    from paracube.cli.main import build_parser
    from paracube.cli.options import workload_from_args
    from paracube.cli.planning_cmd import EXPLAIN_POOL, search_config

    args = build_parser(["plan"]).parse_args(["plan", "--model", "llama2-70b", "--cluster", "dgx-h100", "--gpus",
                                              "256", "--seq", "32768", "--dtype", "fp8", "--global-batch", "256"])
    w = workload_from_args(args, partial_layout=True)
    config = search_config(w, args.memory_headroom, max(args.top, args.refine, EXPLAIN_POOL))
    options = {"top_k": config.top_k, "recomputes": config.recomputes(), "runtime": config.runtime,
               "memory_headroom": config.memory_headroom}
    fast = search(w.model, w.training, w.topology, w.gpus, **options)
    full = search(w.model, w.training, w.topology, w.gpus, prune=False, **options)
    assert fast.ranked[0][0].cp > 1 and any(lay.cp == 1 for lay, _ in fast.ranked)
    assert fast.pruned > 0 and _ranking(fast) == _ranking(full)


def test_compute_lower_bound_is_below_every_zero_2_3_placement() -> None:
    """analytic.compute_lower_bound of one evaluation (zero priced per configuration, as the search's bound pass,
    on each axis set's best link over the placements: compute and in-line communication) is at most the step
    time evaluate gives each placement at zero=2 and zero=3, with pipelines, prefetch and asynchronous
    reduce-scatters."""
    import numpy as np

    from paracube.cost_models.analytic import compute_lower_bound, evaluate
    from paracube.cost_models.comm_axes import axes_used
    from paracube.cost_models.device_model import gemm_model
    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.links import LinkCache
    from paracube.cost_models.validity import first_violation
    from paracube.modes import MODES, LayoutBatch
    from paracube.planner.enumerate import structures

    model, gpus = PRESETS["gpt3-2.7b"], 64
    tp = load_topology("dgx-a100", gpus=gpus)
    d = dims_of(model, TrainingSpec(global_batch=256, dtype="bf16", recompute="selective"))
    g, cache, checked = gemm_model(tp, "bf16"), LinkCache(tp), 0
    for mode in ("none", "1d", "2d"):
        axes = axes_used(mode)
        for struct in structures(mode, gpus, model.layers):
            m = MODES[mode]
            q, t = (struct.shape[0] if struct.shape else 1), int(np.prod(struct.shape or (1,)))
            rows = [(struct.dp, struct.pp, t, q, m.depth(struct.shape), mb, v, 0)
                    for mb in (1, 2) for v in ((1, 2) if struct.pp > 1 else (1,))]
            batch = LayoutBatch.of_rows(rows)
            batch = batch.take(np.nonzero(first_violation(mode, d, batch) < 0)[0])
            n = len(batch)  # the bound on the best links of the structure's first three placements
            if not n or struct.dp < 2:
                continue
            places = struct.placements()[:3]
            mats = np.array([[cache.get_keyed(k, place, ax) for k, ax in zip(keys, axes, strict=True)]
                             for place, keys in places])
            best = {ax: (np.full(n, mats[:, j, 0].max()), np.full(n, mats[:, j, 1].min()))
                    for j, ax in enumerate(axes)}
            for mat in mats:
                links = {ax: (np.full(n, bw), np.full(n, lat)) for ax, (bw, lat) in zip(axes, mat, strict=True)}
                for z in (2, 3):
                    for overlap in (False, True):
                        bound = compute_lower_bound(evaluate(d, mode, batch, best, g, zero=np.full(n, z),
                                                             overlap=overlap), d, batch, np.arange(n))
                        step = evaluate(d, mode, batch, links, g, zero=z, overlap=overlap,
                                        fsdp_prefetch=True).step_time
                        assert np.all(bound <= step * (1 + 1e-12)), (mode, struct, z, overlap)
                        checked += n
    assert checked > 200


def test_distinct_link_rows_give_every_placements_own_time() -> None:
    """scoring._placement_times evaluates a configuration once per distinct link row of its structure and spreads
    the times to the placements: the same floats as evaluating every placement on its own links (scoring._evaluate
    on one row per layout), zero=0..3 rows included (torchtitan's stages, gpt3-2.7b on 64 A100s)."""
    from collections import Counter

    import numpy as np

    from paracube.cost_models.comm_axes import axes_used
    from paracube.cost_models.device_model import gemm_model
    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.links import LinkCache
    from paracube.modes import LayoutBatch
    from paracube.planner.configs import _configs, _mode_structures
    from paracube.planner.fits import _valid
    from paracube.planner.scoring import _evaluate, _overlaps, _placement_times, _structure_links
    from paracube.planner.search_state import _Search

    topo = load_topology("dgx-a100", gpus=64)
    model, training = PRESETS["gpt3-2.7b"], TrainingSpec(global_batch=512, dtype="bf16")
    rt = RUNTIMES["torchtitan"]
    s = _Search(model, dims_of(model, training), gemm_model(topo, "bf16"), 80e9, LinkCache(topo), None, None, 10,
                zeros=(0, 1, 2, 3), runtime=rt, overlap_chosen=True)
    compared = 0
    for mode in ("1d", "2d", "3d"):
        sts = _mode_structures(s, mode, 64)
        places = {st: st.placements() for st in sts}
        owners = [st for st in sts for _ in _configs(st, 512, s.d.L, None, None, rt)]
        batch = LayoutBatch.of_rows([c for st in sts for c in _configs(st, 512, s.d.L, None, None, rt)])
        idx, zeros, kws = _valid(s, mode, batch, np.array([len(places[st]) for st in owners]), Counter())
        batch, owners = batch.take(idx), [owners[i] for i in idx]
        if not len(batch):
            continue
        st_links = _structure_links(s, mode, owners, places)
        ovs, tpos = _overlaps(s, mode, batch)
        got = _placement_times(s, mode, batch, owners, st_links, zeros, zeros, kws, ovs, tpos)
        mat = np.concatenate([st_links[st] for st in owners])
        links = {ax: (mat[:, k, 0], mat[:, k, 1]) for k, ax in enumerate(axes_used(mode))}
        rows = np.repeat(np.arange(len(batch)), [len(st_links[st]) for st in owners])
        want = _evaluate(s, mode, batch, links, rows, zeros, zeros, kws, ovs, tpos)
        assert np.array_equal(got, want), mode
        assert len({tuple(r.reshape(-1)) for st in set(owners) for r in st_links[st]}) < len(mat)  # rows shared
        assert np.any(zeros >= 2)
        compared += len(got)
    assert compared > 1000


def test_moe_search_batches_give_each_layouts_own_estimate() -> None:
    """The MoE search (planner/experts.py) prices its layouts from one estimate_batch.Batch (dense parts evaluated
    together, each finished with its own expert terms when asked): qwen3-30b-a3b and tiny-mla with every zero stage,
    the rcm= ladder and interleaving in play; every ranked estimate equals `estimate` of its layout field by field
    (no tolerance: row i of a vectorized evaluation is the single layout's arithmetic), and a Batch of layouts
    differing in ep, etp, zero, rcm= and v gives each its own estimate, refusing what `estimate` refuses."""
    from dataclasses import replace

    from paracube.cost_models.estimate_batch import Batch
    from paracube.cost_models.links import LinkCache
    from paracube.errors import ParacubeError
    from paracube.layout_parse import parse_layout

    for name, cluster, gpus, rt_name in (("qwen3-30b-a3b", "dgx-h100", 16, "megatron"),
                                         ("tiny-mla", "local-cpu", 8, "paracube")):
        topo = load_topology(cluster, gpus=gpus)
        training = TrainingSpec(global_batch=64, dtype="bf16" if cluster != "local-cpu" else "fp32")
        model, rt = PRESETS[name], RUNTIMES[rt_name]
        res = search(model, training, topo, gpus, top_k=40, runtime=rt_name)
        opts = rt.engine_options().with_(param_overlap=chosen(PARAM_OVERLAP, rt, None), grad_bytes=rt.grad_bytes)
        assert len(res.ranked) > 5
        for lay, est in res.ranked:
            assert est == estimate(model, training, lay, topo, with_events=False, options=opts), str(lay)
    topo, model = load_topology("dgx-h100", gpus=16), PRESETS["qwen3-30b-a3b"]
    training = TrainingSpec(global_batch=64, dtype="bf16")
    base = parse_layout("dp=8,pp=2,ep=8,tp=1d:1,mb=1,zero=1,overlap")
    layouts = [replace(base, ep=ep, etp=etp, zero=z, interleave=v, recompute_modules=rcm)
               for ep in (2, 4, 8) for etp in (1,) for z in (0, 1) for v in (1, 2, 3)
               for rcm in (None, ("moe_act",), ("layernorm", "moe_act"))]
    layouts.append(replace(base, interleave=2, a2ao=True, recompute="full"))  # refused by estimate (analytic.prepare)
    batch = Batch(model, training, topo, LinkCache(topo))
    batch.add(layouts + layouts[:5])  # a layout added twice is evaluated once
    priced = 0
    for lay in layouts:
        try:
            want = estimate(model, training, lay, topo, with_events=False)
        except ParacubeError:
            assert batch.estimate(lay) is None, str(lay)
            continue
        assert batch.estimate(lay) == want, str(lay)
        priced += 1
    assert len(layouts) - 1 == priced
    assert batch.estimate(replace(base, ep=1)) is None  # not added
