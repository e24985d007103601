"""cost_models/collective.py: the alpha-beta cost of one collective, against hand-derived cases."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.collective import (
    best_algorithm,
    calibrated_link,
    call_steps,
    collective_time,
    fastest_time,
    latency_factor,
    ring_steps,
    sent_factor,
    wait_steps,
)
from paracube.errors import ParacubeError
from paracube.estimate import CommEvent

A, B, P = 1e-5, 1e9, 8e6  # 10 us per step, 1 GB/s, 8 MB


@pytest.mark.parametrize(("kind", "n", "want"), [
    # all_gather on 4 ranks: 3 steps of P/4 -> 3a + 3/4 P / B
    ("all_gather", 4, 3 * A + 0.75 * P / B),
    ("reduce_scatter", 8, 7 * A + 7 / 8 * P / B),
    # all_reduce on 4 ranks: reduce-scatter + all-gather, 6 steps of P/4 -> 6a + 1.5 P / B
    ("all_reduce", 4, 6 * A + 1.5 * P / B),
    ("all_reduce", 2, 2 * A + 1.0 * P / B),
    ("broadcast", 4, 3 * A + 0.75 * P / B),
    ("all_to_all", 2, 1 * A + 0.5 * P / B),
    ("send", 2, A + P / B),
])
def test_ring_time_of_one_call(kind: str, n: int, want: float) -> None:
    assert float(collective_time(kind, n, 1, P, B, A)) == pytest.approx(want, rel=1e-14)
    steps, chunk = ring_steps(kind, n, P)
    assert steps == latency_factor(kind, n)
    assert steps * chunk == pytest.approx(float(sent_factor(kind, n)) * P, rel=1e-14)
    assert steps * (A + chunk / B) == pytest.approx(want, rel=1e-14)  # the event engine's steps add up alike


def test_sent_bytes_agree_with_the_commevent_contract() -> None:
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send"):
        for n in (1, 2, 3, 4, 8):
            e = CommEvent(kind, ("x",), n, 1000)
            assert float(sent_factor(kind, n)) * 1000 == e.sent_bytes()
    assert CommEvent("all_reduce", ("dp",), 4, 1000).sent_bytes() == 1500.0
    assert CommEvent("all_gather", ("x",), 1, 1000).sent_bytes() == 0.0  # one rank sends nothing


def test_counts_sum_payloads_and_zero_counts_cost_nothing() -> None:
    # 5 all_gathers on 4 ranks whose payloads sum to P: 5 x 3 latencies, 3/4 of the summed bytes.
    assert float(collective_time("all_gather", 4, 5, P, B, A)) == pytest.approx(15 * A + 0.75 * P / B)
    assert float(collective_time("all_gather", 4, 0, P, B, A)) == 0.0


def test_vectorized_over_group_sizes_counts_and_links() -> None:
    n = np.array([2, 4, 8, 1])
    count = np.array([1, 2, 3, 1])
    payload = np.array([1e6, 2e6, 3e6, 0.0])
    bw = np.array([1e9, 2e9, 4e9, 1e9])
    lat = np.array([1e-6, 2e-6, 3e-6, 4e-6])
    got = collective_time("all_reduce", n, count, payload, bw, lat)
    want = [float(collective_time("all_reduce", int(n[i]), int(count[i]), payload[i], bw[i], lat[i]))
            for i in range(4)]
    assert got.shape == (4,) and got.tolist() == want
    assert want[1] == pytest.approx(2 * 6 * 2e-6 + 1.5 * 2e6 / 2e9)
    assert want[3] == 0.0  # one rank: no steps, no bytes


def test_tree_all_reduce_and_when_it_wins() -> None:
    # Binomial reduce + broadcast on 8 ranks: 2 log2 8 = 6 steps of the whole payload.
    assert float(collective_time("all_reduce", 8, 1, P, B, A, "tree")) == pytest.approx(6 * (A + P / B))
    assert float(latency_factor("all_reduce", 5, "tree")) == 6.0  # ceil(log2 5) = 3
    # 8 bytes on 64 ranks: latency-bound, the tree's 12 steps beat the ring's 126; 8 MB: the ring wins.
    assert best_algorithm("all_reduce", 64, 8, B, A) == "tree"
    assert best_algorithm("all_reduce", 64, P, B, A) == "ring"
    assert best_algorithm("all_gather", 64, 8, B, A) == "ring"
    with pytest.raises(ParacubeError, match="'tree' is defined for all_reduce only"):
        collective_time("all_gather", 4, 1, P, B, A, "tree")
    with pytest.raises(ParacubeError, match="valid: ring, tree"):
        latency_factor("all_reduce", 4, "butterfly")
    with pytest.raises(ParacubeError, match="collective kind 'gather'"):
        sent_factor("gather", 4)


def test_engines_take_the_faster_algorithm_per_tier_and_size() -> None:
    """fastest_time (analytic) and call_steps (event engine) pick the same algorithm: the tree for small
    all_reduces on large groups, the ring otherwise; inside a node (NVSwitch tier) and across nodes (IB tier)
    each with its own link."""
    payload = np.array([8.0, 8e3, 8e6, 8e8])
    got = fastest_time("all_reduce", 64, 1, payload, B, A)
    ring = collective_time("all_reduce", 64, 1, payload, B, A)
    tree = collective_time("all_reduce", 64, 1, payload, B, A, "tree")
    assert np.array_equal(got, np.minimum(ring, tree)) and got[0] == tree[0] and got[-1] == ring[-1]
    assert call_steps("all_reduce", 64, 8.0, B, A) == (12, 8.0)  # 2 log2 64 steps of the whole payload
    assert call_steps("all_reduce", 64, P, B, A) == ring_steps("all_reduce", 64, P)
    assert call_steps("all_gather", 64, 8.0, B, A) == ring_steps("all_gather", 64, 8.0)
    from paracube.topologies import load_topology

    topo = load_topology("dgx-a100", gpus=64)
    intra, inter = topo.group_link(list(range(8))), topo.group_link(list(range(0, 64, 8)))
    assert intra.bandwidth > 4 * inter.bandwidth and intra.latency < inter.latency
    small = [best_algorithm("all_reduce", 8, 64e3, link.bandwidth, link.latency) for link in (intra, inter)]
    big = [best_algorithm("all_reduce", 8, 64e6, link.bandwidth, link.latency) for link in (intra, inter)]
    assert big == ["ring", "ring"] and small[1] == "tree"


def test_calibrated_pair_replaces_the_link_for_its_kind_and_size_only() -> None:
    table = (("all_reduce", 4, False, 1e-3, 1e8), ("all_reduce", 4, True, 5e-3, 2e8),
             ("all_gather", 2, False, 9.0, 1.0))
    n = np.array([2, 4, 8])
    bw, lat = np.full(3, 1e10), np.full(3, 1e-6)
    got_bw, got_lat = calibrated_link(table, "all_reduce", n, bw, lat)
    assert got_bw.tolist() == [1e10, 1e8, 1e10] and got_lat.tolist() == [1e-6, 1e-3, 1e-6]
    # The alternating-groups fit overrides the fixed-group one where asked for.
    alt_bw, alt_lat = calibrated_link(table, "all_reduce", n, bw, lat, alternating=True)
    assert alt_bw.tolist() == [1e10, 2e8, 1e10] and alt_lat.tolist() == [1e-6, 5e-3, 1e-6]
    # No row for the kind: the link as given.
    assert calibrated_link(table, "reduce_scatter", n, bw, lat) == (bw, lat)
    t = collective_time("all_reduce", n, 1, 8.0, got_bw, got_lat)
    assert t[1] == pytest.approx(6 * 1e-3 + 1.5 * 8 / 1e8)


@pytest.mark.parametrize(("kind", "n", "want"), [
    ("all_reduce", 1, 0),  # one rank: no message
    ("all_reduce", 2, 2),  # gloo: 2 ceil(log2 n), reduce and spread
    ("all_reduce", 4, 4),
    ("all_reduce", 8, 6),
    ("all_reduce", 6, 6),
    ("all_gather", 2, 1),
    ("all_gather", 4, 3),
    ("reduce_scatter", 2, 2),  # ProcessGroupGloo: n reductions of n - 1 messages each
    ("reduce_scatter", 4, 12),
    ("all_to_all", 4, 3),
    ("send", 2, 1),
])
def test_wait_steps(kind: str, n: int, want: float) -> None:
    assert float(wait_steps(kind, n)) == want
    assert wait_steps(kind, np.array([n, 1])).tolist() == [want, 0.0]  # vectorized over group sizes
    # a mode whose calls switch groups: one more message (the group meets), none for a group of one rank
    assert wait_steps(kind, np.array([n, 1]), alternating=True).tolist() == [want + (n > 1), 0.0]
