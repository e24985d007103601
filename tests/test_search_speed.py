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
    opts = {"param_overlap": chosen(PARAM_OVERLAP, rt, None), "fsdp_prefetch": chosen(FSDP_PREFETCH, rt, None),
            "grad_bytes": rt.grad_bytes}
    placements = {repr(lay.with_(placement=())) for lay, _ in fast.ranked}
    assert len(placements) < len(fast.ranked)  # some layouts differ only in placement: the shared path ran
    for lay, est in fast.ranked:
        assert est == estimate(model, training, lay, topo, with_events=False, **opts), str(lay)

