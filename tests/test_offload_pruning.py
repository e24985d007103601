"""The offloading ladder's shortcuts (planner/offload_passes.py: a pass looks only at the configurations still pending
and fit-checks only those its count may fit) keep the search exact. Equivalence template: the search with bound
pruning against the exhaustive search (prune=False: every layout that fits is scored), on a case where offloading is
chosen (Llama 3 70B FSDP on 64 GB200s, benchmarks/published_runs.py's gb200-l3-70B-fsdp row: off=30 at 4.134 s) and
on cases where the ladder runs but offloading loses (GPT-3 175B on 64 and 128 H100s); and the fit a count is
predicted to give against fits._valid's (the ladder skips the checks it proves would refuse; rel 1e-9: the same terms
summed in another order)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from test_planner import assert_same_search

from paracube.calibration.run_prediction import preset_topology
from paracube.calibration.runs_csv import read_runs
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of, with_options
from paracube.cost_models.links import LinkCache
from paracube.model_presets import PRESETS as MODELS
from paracube.modes import LayoutBatch
from paracube.planner.configs import _configs, _mode_structures
from paracube.planner.search import search
from paracube.planner.search_state import _Search
from paracube.runtimes import RUNTIMES
from paracube.topologies import load_topology
from paracube.topologies.presets import PRESETS
from paracube.workload import TrainingSpec


@pytest.fixture(scope="module")
def gb200_row() -> object:
    return {r.name: r for r in read_runs("benchmarks/data/published_runs_today.csv", tuple(PRESETS))}[
        "gb200-l3-70B-fsdp"]


def _case(name: str, gb200_row: object) -> tuple[object, ...]:
    if name == "gb200-l3-70B":  # offloading chosen
        r = gb200_row
        return r.model, r.training, preset_topology(r), r.gpus, "megatron"  # type: ignore[attr-defined, arg-type]
    gpus = int(name.split("-")[-1])
    training = TrainingSpec(global_batch=512, dtype="bf16", recompute="selective")
    return MODELS["gpt3-175b"], training, load_topology("dgx-h100", gpus=gpus), gpus, "paracube"


@pytest.mark.parametrize("mode_bests", [True, False])
@pytest.mark.parametrize("name", ["gb200-l3-70B", "gpt3-175b-h100-64", "gpt3-175b-h100-128"])
def test_offload_ladder_keeps_the_exact_ranking(name: str, mode_bests: bool, gb200_row: object) -> None:
    """The same ranked layouts and step times, best per mode, rejections, and scored + pruned as the exhaustive
    search; where offloading is chosen, the published row's plan."""
    model, training, topo, gpus, runtime = _case(name, gb200_row)
    kw = {"top_k": 10, "runtime": runtime, "recomputes": ["none", "selective"], "mode_bests": mode_bests}
    fast = search(model, training, topo, gpus, **kw)  # type: ignore[arg-type]
    full = search(model, training, topo, gpus, prune=False, **kw)  # type: ignore[arg-type]
    assert_same_search(fast, full)
    if name == "gb200-l3-70B":
        best, est = fast.ranked[0]
        assert str(best) == "dp=64,tp=none,mb=1,zero=3,rc=none,overlap,off=30"
        assert round(est.step_time_s, 3) == 4.134
    else:
        assert all(not lay.offload for lay, _ in fast.ranked)


@pytest.mark.parametrize("name", ["gb200-l3-70B", "gpt3-175b-h100-64"])
def test_what_a_count_frees_predicts_the_fit_check(name: str, gb200_row: object) -> None:
    """The ladder checks a configuration at a count only where its least peak without offloading, less the saved
    activations the count frees, is within the cap (offload_passes.pending_configs): that prediction equals the least
    peak fits._valid computes with the count (rel 1e-9: the same terms summed in another order), on pp = 1
    configurations of every zero stage the search allows, so no configuration that fits is left unchecked."""
    from paracube.cost_models.block_acts import saved_block_bytes
    from paracube.planner.fits import _valid
    from paracube.planner.offload_passes import _freed

    model, training, topo, gpus, runtime = _case(name, gb200_row)
    rt = RUNTIMES[runtime]
    d = replace(with_options(dims_of(model, training), rt.engine_options()), recompute="none")
    s = _Search(model, d, gemm_model(topo, training.dtype), float("inf"), LinkCache(topo), None, None, 10,  # type: ignore[arg-type]
                zeros=tuple(z for z in (0, 1, 2, 3) if z in rt.zeros), runtime=rt)
    checked = 0
    for mode in ("none", "1d"):
        rows = [row for st in _mode_structures(s, mode, gpus) if st.pp == 1
                for row in _configs(st, d.global_batch, d.L, None, None, rt)]
        batch = LayoutBatch.of_rows(rows)
        n_places = np.ones(len(rows), dtype=np.int64)
        s.d = d
        least0: list[np.ndarray] = []
        _valid(s, mode, batch, n_places, Counter(), least0)
        saved = np.broadcast_to(saved_block_bytes(d, mode, batch), (len(rows),))
        for n in (1, 2, 3, d.L // 8, d.L // 2, d.L - 1):
            s.d = replace(d, offload_frac=n / d.L)
            least: list[np.ndarray] = []
            _valid(s, mode, batch, n_places, Counter(), least)
            finite = np.isfinite(least0[0])
            assert np.array_equal(finite, np.isfinite(least[0]))
            np.testing.assert_allclose(least0[0][finite] - _freed(s.d) * saved[finite], least[0][finite], rtol=1e-9)
            checked += int(finite.sum())
    assert checked > 100
