"""The pipeline bubble on CPU ranks that share cores (cost_models/shared_cores.py), priced alike by both engines.

Reference vs candidate throughout: the closed form against the sum over the ramp's steps it stands for; a
device that shares its cores against the same device with a core per rank (only DeviceSpec.ranks_per_core
differs), whose nominal bubble the shared one must pay at exactly bubble_share; the event engine against the
analytic one; the planner with its pruning bounds against the planner without them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.shared_cores import bubble_share
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.planner import search
from paracube.topologies import load_topology, topology_from_dict
from paracube.topologies.device import DeviceSpec
from paracube.topologies.local_cpu import local_cpu_device
from paracube.workload import ModelSpec, TrainingSpec

SMALL = ModelSpec("small", layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)
PIPELINES = ("dp=2,pp=2,tp=1d:2,mb=2", "dp=4,pp=2", "pp=4,tp=1d:2,mb=2")


def ramp_sum(pp: int, r: float) -> float:
    """The reference: what the bubble's ramp steps k = 1..pp-1 cost beyond their work, over their unshared cost."""
    return sum(max(0.0, 1 / r - k / pp) for k in range(1, pp)) / sum(1 - k / pp for k in range(1, pp))


@pytest.mark.parametrize("pp", [2, 3, 4, 5, 8, 16, 64])
@pytest.mark.parametrize("r", [1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0])
def test_bubble_share_is_the_ramp_sum(pp: int, r: float) -> None:
    """The closed form equals the sum it was derived from (1e-12: float rounding of a few terms); a device of
    its own (r = 1) pays the whole bubble; as many ranks per core as stages or more pay none."""
    assert float(bubble_share(pp, r)) == pytest.approx(ramp_sum(pp, r), abs=1e-12)
    if r == 1.0:
        assert float(bubble_share(pp, r)) == 1.0
    if r >= pp:
        assert float(bubble_share(pp, r)) == 0.0


def topo_with(r: float) -> object:
    """8 local-cpu ranks on 2 cores (fixed figures), told that `r` ranks share each core."""
    data = load_topology("local-cpu", gpus=8).to_dict()
    return topology_from_dict({**data, "device": replace(local_cpu_device(8, cores=2), ranks_per_core=r).to_dict()})


@pytest.mark.parametrize("text", PIPELINES)
@pytest.mark.parametrize("r", [1.25, 1.5, 4.0])
def test_a_shared_core_pays_the_bubble_at_its_share(text: str, r: float) -> None:
    """Against the same device with a core per rank (ranks_per_core = 1, nothing else changed): the step less
    (1 - share) x that one's bubble, exactly (the bubble is the only term ranks_per_core enters)."""
    training, layout = TrainingSpec(global_batch=16, dtype="fp32"), parse_layout(text)
    own = estimate(SMALL, training, layout, topo_with(1.0), with_events=False)
    shared = estimate(SMALL, training, layout, topo_with(r), with_events=False)
    share = float(bubble_share(layout.pp, r))
    assert own.bubble_time_s > 0
    assert shared.bubble_time_s == pytest.approx(share * own.bubble_time_s, rel=1e-12, abs=1e-15)
    assert shared.step_time_s == pytest.approx(own.step_time_s - (1 - share) * own.bubble_time_s, rel=1e-12)


@pytest.mark.parametrize("text", PIPELINES)
@pytest.mark.parametrize("r", [1.5, 4.0])
@pytest.mark.parametrize("global_batch", [16, 64])
def test_both_engines_price_the_shared_core_bubble_alike(text: str, r: float, global_batch: int) -> None:
    """The event engine's simulated schedule against the analytic formula: within 2.5% (measured here: at most
    1.9%, at pp = 4 with 2 micro-batches per stage, where the simulated bubble and (pp-1)/(v N) W differ most;
    the same layout with a core per rank differs 4.1%, the two bubbles' difference at full size), and alike to
    1e-4 where no bubble is left (r >= pp: both are then the stage's work; measured at most 4e-6)."""
    training, layout = TrainingSpec(global_batch=global_batch, dtype="fp32"), parse_layout(text)
    topo = topo_with(r)
    ev, an = estimate_event(SMALL, training, layout, topo), estimate(SMALL, training, layout, topo)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=1e-4 if r >= layout.pp else 0.025)


def test_pruning_keeps_the_exact_ranking_on_shared_cores() -> None:
    """The planner's lower bounds take the bubble at its share too: with and without pruning the same ranked
    layouts and step times (pipelines among them) on 8 ranks sharing 2 cores."""
    topo, training = topo_with(4.0), TrainingSpec(global_batch=8, dtype="fp32")
    fast = search(PRESETS["tiny"], training, topo, 8, top_k=40)
    full = search(PRESETS["tiny"], training, topo, 8, top_k=40, prune=False)
    assert any(lay.pp > 1 for lay, _ in full.ranked)
    assert [(repr(lay), est.step_time_s) for lay, est in fast.ranked] == \
        [(repr(lay), est.step_time_s) for lay, est in full.ranked]


def test_a_device_with_fewer_than_one_rank_per_core_is_refused() -> None:
    with pytest.raises(ParacubeError, match=r"ranks_per_core=0.5 must be a number >= 1"):
        DeviceSpec("cpu", {"fp32": 1e9, "fp16": 1e9, "bf16": 1e9}, 1e9, 1e9, ranks_per_core=0.5)


def test_ranks_per_core_round_trips_through_a_topology_file() -> None:
    """The local-cpu device's ranks per core survive to_dict / topology_from_dict (a calibrated file carries
    it); a device of its own writes no such key."""
    topo = topo_with(4.0)
    again = topology_from_dict(topo.to_dict())
    assert again.device.ranks_per_core == 4.0
    assert "ranks_per_core" not in load_topology("dgx-a100", gpus=8).device.to_dict()
