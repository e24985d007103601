"""topologies/group_links.py (many group queries in one numpy pass) answers each query as Topology's per-query
computation does, bit for bit: every (bandwidth, latency, nodes, ranks per node), on preset and YAML topologies,
with queries of several group sizes, a mixed-size one and a one-rank one; partition_links (a mesh axis' groups in
their own order) likewise, with hops split into 3 channels (not a power of two: asked in the loop's order) and
arrays that are no partition; and LinkCache.prefetch fills the same answers as LinkCache.get. Equal floats, not
tolerances: the batch adds the same numbers in the same order, or numbers whose sums are exact in any order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paracube.cost_models.links import LinkCache, groups_from_runs, runs_for
from paracube.topologies import load_topology
from paracube.topologies.link_loads import DENSE_PAIRS
from tests.test_link_loads import _runs as link_load_runs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# the last: more ranks than HopTable's dense pair index holds (its sorted index)
TOPOLOGIES = [("dgx-a100", 128), ("dgx-h100", 256), ("gb200-nvl72", 144), ("longhorn", 32), ("dgx2-v100", 64),
              (str(EXAMPLES / "h100-rail-32x8.yaml"), 256), (str(EXAMPLES / "pcie-2x8-100gbe.yaml"), 16),
              ("dgx-a100", 4096)]


def _runs(n: int, dpn: int) -> list[tuple[tuple[int, bool], ...]]:
    """test_link_loads' placements (innermost first: inside a node, across nodes, strided) and pairs either way."""
    return list(dict.fromkeys([*link_load_runs(n, dpn), ((2, True), (n // 2, False)), ((2, False), (n // 2, True))]))


def _queries(n: int, dpn: int) -> list[tuple[list[int], list[list[int]]]]:
    qs = []
    for runs in _runs(n, dpn):
        g = groups_from_runs(runs)
        qs.append((g[0].tolist(), g[1:].tolist()))
        qs.append((g[-1].tolist(), g.tolist()))  # the group listed among its concurrent ones, last row asked
    qs.append(([0, 1], [[2, 3, 4], [5, 6]]))  # groups of mixed sizes
    qs.append(([3], [[0, 1], [2, 4]]))  # one rank
    return qs


@pytest.mark.parametrize("name,gpus", TOPOLOGIES, ids=lambda p: Path(str(p)).stem)
def test_batch_equals_each_query(name: str, gpus: int) -> None:
    batch, single = load_topology(name, gpus=gpus), load_topology(name, gpus=gpus)
    assert (gpus * gpus <= DENSE_PAIRS) == (batch._table._dense is not None)
    qs = _queries(batch.num_devices, batch.devices_per_node)
    got = batch.group_links(qs)
    for (ranks, concurrent), link in zip(qs, got, strict=True):
        group = single._group(ranks)
        want = single._group_link_uncached(group, single._groups(concurrent) | {group})  # one query, as before
        assert link == want, (ranks[:4], len(concurrent))
        assert batch.group_link(ranks, concurrent) == want  # cached answer


def test_prefetch_equals_get() -> None:
    topo = load_topology("dgx-a100", gpus=256)
    placement = (("tp", 4), ("pp", 8), ("dp", 8))
    items = [(f"{i}".encode(), placement, axes) for i, axes in
             enumerate([("tp",), ("pp",), ("dp",), ("tp", "dp"), ("pp", "dp"), ("tp", "pp", "dp")])]
    fetched = LinkCache(topo)
    fetched.prefetch(items)
    direct = LinkCache(load_topology("dgx-a100", gpus=256))
    for key, place, axes in items:
        assert fetched.keyed[key] == direct.get(place, axes) == direct.get_runs(runs_for(place, axes))
    assert fetched.queries == direct.queries == len(items)


def _one(topo, ranks, concurrent):
    group = topo._group(ranks)
    return topo._group_link_uncached(group, topo._groups(concurrent) | {group})  # one query alone, as before


@pytest.mark.parametrize("name,gpus", TOPOLOGIES, ids=lambda p: Path(str(p)).stem)
def test_partitions_equal_each_query(name: str, gpus: int) -> None:
    batch, single = load_topology(name, gpus=gpus), load_topology(name, gpus=gpus)
    parts = [groups_from_runs(r) for r in _runs(batch.num_devices, batch.devices_per_node)]
    for part, link in zip(parts, batch.partition_links(parts), strict=True):
        assert link == _one(single, part[0], part[1:]), part[0][:4]
    assert batch.partition_links(parts[:2]) == [_one(single, p[0], p[1:]) for p in parts[:2]]  # cached


def test_partitions_with_three_channels_and_no_partition() -> None:
    """Three members per node on nodes with one NIC per GPU: hops split into 3 channels (shares of 1/3, whose sums
    depend on their order); rows that share a rank, or are not sorted, are no partition: both as group_link."""
    topo, single = load_topology("dgx-a100", gpus=64), load_topology("dgx-a100", gpus=64)
    three = np.array([[8 * n + k for n in (2 * i, 2 * i + 1) for k in (0, 1, 2)] for i in range(4)])
    assert any(len(hop) == 3 for hop in topo.ring_channels(three[0]))
    odd = [three, three[::-1], np.array([[0, 1], [1, 2]]), np.array([[1, 0], [2, 3]]), np.arange(8)[:, None]]
    for part, link in zip(odd, topo.partition_links(odd), strict=True):
        assert link == _one(single, part[0], part[1:]), part[0]
