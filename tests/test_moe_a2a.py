"""The MoE all_to_all as every rank's flows to its peers (cost_models/moe_a2a.py): the closed form on a DGX, priced
alike by both engines on layouts whose expert groups cross nodes."""

from __future__ import annotations

import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.links import LinkCache
from paracube.cost_models.moe_a2a import A2A, A2A_NIC_EFF
from paracube.cost_models.moe_links import expert_links
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.topologies import load_topology
from paracube.topologies.rates import NDR_IB
from paracube.workload import TrainingSpec

TRAIN = TrainingSpec(global_batch=64, dtype="bf16", recompute="selective")


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=32)


@pytest.mark.parametrize("ep", [16, 32])
def test_slower_of_nvlink_and_each_ranks_own_nic(h100: object, ep: int) -> None:
    """ep ranks over nodes of m = 8: 1 / B = max((m - 1) / B_nvlink, (n - m) / B_nic) / (n - 1), B_nic the NDR line
    rate x A2A_NIC_EFF: one NIC per rank, not the ring's channels over the node's eight."""
    lay = parse_layout(f"dp={ep},ep={ep},tp=none,mb=1")
    links = expert_links(lay, LinkCache(h100))
    bw, _ = links[A2A + ("ep",)]
    nvlink = load_topology("dgx-h100", gpus=8).group_link(list(range(8))).bandwidth  # type: ignore[attr-defined]
    m = 8
    want = (ep - 1) / max((m - 1) / nvlink, (ep - m) / (NDR_IB * A2A_NIC_EFF))
    assert bw == pytest.approx(want, rel=1e-6)
    ring_bw, _ = links[("ep",)]
    assert bw < ring_bw  # the ring crossed nodes over every NIC of the node


def test_a_fit_prices_its_own_all_to_all_figure() -> None:
    """The all_to_all's share of the line rate is a figure of the preset (efficiency.A2A_NIC, carried in its
    calibration), so a refit builds a preset with its trial value (published_runs.py --refit) and no module state
    changes: the NIC part of an ep=32 group over 4 nodes runs at the fit's rate, the shipped preset's at its own."""
    from dataclasses import replace

    from paracube.calibration.from_runs import shipped_fit
    from paracube.topologies.presets import PRESETS as CLUSTERS

    lay = parse_layout("dp=32,ep=32,tp=none,mb=1")
    start = shipped_fit("H100-SXM-80GB", "dgx-h100")
    nvlink = load_topology("dgx-h100", gpus=8).group_link(list(range(8))).bandwidth  # type: ignore[attr-defined]
    for eff in (0.5, A2A_NIC_EFF):
        topo = CLUSTERS["dgx-h100"].build(4, 8, fit=replace(start, a2a_eff=eff))
        bw, _ = expert_links(lay, LinkCache(topo))[A2A + ("ep",)]
        assert bw == pytest.approx(31 / max(7 / nvlink, 24 / (NDR_IB * eff)), rel=1e-6)
    shipped, _ = expert_links(lay, LinkCache(load_topology("dgx-h100", gpus=32)))[A2A + ("ep",)]
    assert shipped == pytest.approx(bw, rel=1e-12)


@pytest.mark.parametrize(("name", "text"), [
    ("qwen3-30b-a3b", "dp=32,ep=32,tp=none,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=16,ep=16,tp=1d:2,sp,mb=1,zero=1,overlap"),
    ("qwen3-30b-a3b", "dp=8,pp=2,ep=8,tp=1d:2,sp,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=32,ep=8,tp=none,mb=1,zero=1,overlap"),  # in-node all_to_alls, expert gradients across
])
def test_engines_agree_on_cross_node_all_to_alls(h100: object, name: str, text: str) -> None:
    model, layout = PRESETS[name], parse_layout(text)
    a = estimate(model, TRAIN, layout, h100, with_events=False)
    e = estimate_event(model, TRAIN, layout, h100, with_events=False)
    # the MoE collectives matter here: the all_to_alls over ep, the expert gradients over edp (their own axis since
    # 2026-12-04; booked under ep before)
    assert a.comm_time_by_axis["ep"] + a.comm_time_by_axis.get("edp", 0.0) > 0.2 * a.step_time_s
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


def test_all_pair_links_in_one_pass_equal_the_pair_by_pair_paths(h100: object) -> None:
    """moe_a2a._pair_links reads every flow's links from the topology's routes in one numpy pass: the same links,
    split the same way (inside a node, across nodes), numbered in the same order as pair-by-pair paths taken in loop
    order (a fresh table each: new links are numbered as first met)."""
    import numpy as np

    from paracube.cost_models.event_links import LinkTable
    from paracube.cost_models.moe_a2a import _pair_links

    groups = np.arange(32).reshape(2, 16)  # two ep=16 groups, each over two DGX nodes
    fast = LinkTable(h100)
    flat, cross = _pair_links(fast, groups, 8)
    slow = LinkTable(h100)
    want: dict[bool, list[int]] = {False: [], True: []}
    for g in groups.tolist():
        for a in g:
            for b in g:
                if a != b:
                    want[a // 8 != b // 8].extend(slow.path(a, b))
    assert flat.tolist() == want[False] and cross.tolist() == want[True] and len(cross) > 0
    assert fast.cap == slow.cap
