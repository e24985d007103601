"""topologies/link_loads.py's fast paths (hop routes by cached parts, ring channels of translated groups) give the
direct per-pair / per-group computation's answers bit for bit: routes, channels, link loads, group links and the
event engine's templates, on preset and YAML topologies and groups of several placements."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from paracube.cost_models.event_links import LinkTable
from paracube.cost_models.links import groups_from_runs
from paracube.topologies import load_topology
from paracube.topologies.topology import Topology

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TOPOLOGIES = [("dgx-a100", 128), ("dgx-h100", 256), ("gb200-nvl72", 144), ("longhorn", 32), ("dgx2-v100", 64),
              (str(EXAMPLES / "h100-rail-32x8.yaml"), 256), (str(EXAMPLES / "pcie-2x8-100gbe.yaml"), 16)]


def _runs(n: int, dpn: int) -> list[tuple[tuple[int, bool], ...]]:
    """Placements (innermost first) of groups: inside a node, one or several members per node, strided."""
    out = [((n, True),), ((dpn, True), (n // dpn, False)), ((dpn, False), (n // dpn, True))]
    for inner in (2, 4):
        if dpn % inner == 0 and dpn > inner:
            out += [((inner, True), (n // inner, False)), ((inner, False), (dpn // inner, True), (n // dpn, True)),
                    ((inner, True), (dpn // inner, False), (n // dpn, True))]
    if n // dpn >= 4:
        out.append(((dpn, False), (2, True), (n // dpn // 2, False)))
    return out


def _direct_hop(topo, a: int, b: int) -> tuple[list[int], float]:
    path = topo._path(topo._ranks[a], topo._ranks[b])
    edges = list(zip(path, path[1:], strict=False))
    return [topo._eid[e] for e in edges], sum(topo._lat[e] for e in edges)


def _direct_load(topo, groups: frozenset) -> np.ndarray:
    """Topology._link_load before link_loads.py: per group its own channels, per hop its own path."""
    n = len(topo._bw_arr)
    whole, split, shares = [], [], []
    for group in groups:
        for chans in topo._ring_channels(group):
            for s, r, share in chans:
                ids = np.array(_direct_hop(topo, s, r)[0], dtype=np.int64)
                if len(chans) == 1:
                    whole.append(ids)
                else:
                    split.append(ids)
                    shares.append(np.full(len(ids), share))
    load = np.bincount(np.concatenate(whole), minlength=n) if whole else np.zeros(n, dtype=np.int64)
    if split:
        load = load + np.bincount(np.concatenate(split), weights=np.concatenate(shares), minlength=n)
    return load


@pytest.fixture(scope="module", params=TOPOLOGIES, ids=lambda p: Path(p[0]).stem)
def topo(request):
    name, gpus = request.param
    return load_topology(name, gpus=gpus)


def test_hops_equal_direct_routes(topo) -> None:
    n = topo.num_devices
    step = max(1, n // 48)
    for a in range(0, n, step):
        for b in range(n):
            if a != b and (b % step == 1 or abs(a - b) <= 2 or b == n - 1 - a):
                ids, lat = topo._hops(a, b)
                want_ids, want_lat = _direct_hop(topo, a, b)
                assert ids.tolist() == want_ids and lat == want_lat, (a, b)
    if topo.num_nodes > 1:  # the routes between nodes came from the cached parts
        assert any(v is not None for v in topo._parts._up.values())


def test_pairs_inside_nodes_equal_direct_routes(topo) -> None:
    """hop_batch.NodeRoutes (HopTable's pairs inside one node, by template) against each pair's own route."""
    from paracube.topologies.hop_batch import NodeRoutes

    dpn, n = topo.devices_per_node, topo.num_devices
    nodes = sorted({0, 1, topo.num_nodes - 1} & set(range(topo.num_nodes)))
    pairs = [(x, y) for k in nodes for x in range(k * dpn, min((k + 1) * dpn, n))
             for y in range(k * dpn, min((k + 1) * dpn, n)) if x != y]
    a, b = (np.array(c, dtype=np.int64) for c in zip(*pairs, strict=True))
    ok, ids, lens, lat = NodeRoutes(topo).route(a, b)
    assert ok.any() or dpn == 1
    got = np.split(ids, np.cumsum(lens)[:-1]) if len(lens) else []
    for (x, y), i, l_ in zip([p for p, k in zip(pairs, ok.tolist(), strict=True) if k], got, lat.tolist(),
                             strict=True):
        want_ids, want_lat = _direct_hop(topo, x, y)
        assert i.tolist() == want_ids and l_ == want_lat, (x, y)
    rows = topo._table.rows(a, b)  # what the link loads read, whichever way each pair was routed
    for (x, y), r in zip(pairs, rows.tolist(), strict=True):
        want_ids, want_lat = _direct_hop(topo, x, y)
        assert topo._table.gather(np.array([r]))[0].tolist() == want_ids, (x, y)
        assert float(topo._table.latencies(np.array([r]))[0]) == want_lat, (x, y)


def test_loads_channels_and_links_equal_direct(topo) -> None:
    n, dpn = topo.num_devices, topo.devices_per_node
    for runs in _runs(n, dpn):
        groups = groups_from_runs(runs)
        rows = [tuple(sorted(g)) for g in groups.tolist()]
        assert topo.ring_channels_many(groups) == [topo._ring_channels(g) for g in rows], runs
        sets = frozenset(rows)
        load = topo._link_load(sets)
        want = _direct_load(topo, sets)
        assert load.dtype == want.dtype and np.array_equal(load, want), runs  # bit for bit
        link = topo.group_link(groups[-1], groups[:-1])
        hops = [_direct_hop(topo, s, r) for chans in topo._ring_channels(rows[-1]) for s, r, _ in chans]
        ids = np.array([i for h in hops for i in h[0]], dtype=np.int64)
        bw = float((topo._bw_arr[ids] / want[ids]).min()) if len(ids) else math.inf
        assert (link.bandwidth, link.latency) == (bw, max([h[1] for h in hops] + [0.0])), runs


def _direct_channels(topo, rows: list[tuple[int, ...]]) -> list[tuple]:
    return [(s, r, share, len(hop) == 1, i) for i, g in enumerate(rows) for hop in topo._ring_channels(g)
            for s, r, share in hop]


def test_channel_table_equals_ring_channels(topo) -> None:
    """ring_batch.ring_channel_table (every group of a query at once) lists each group's channels as
    Topology._ring_channels does, in the same (group, hop, channel) order."""
    n, dpn = topo.num_devices, topo.devices_per_node
    for runs in [*_runs(n, dpn), ((2, True), (n // 2, False))]:
        groups = groups_from_runs(runs)
        rows = [tuple(sorted(g)) for g in groups.tolist()]
        got = list(zip(*(c.tolist() for c in topo.ring_channel_arrays(groups)), strict=True))
        assert got == _direct_channels(topo, rows), runs


class _RoutesOnly:
    """The topology seen through `route` and `ring_channels` only: LinkTable's path before route_hop."""

    def __init__(self, topo) -> None:
        self.name, self.graph, self.num_devices = topo.name, topo.graph, topo.num_devices
        self.route, self.ring_channels = topo.route, topo.ring_channels


def test_event_templates_equal_direct(topo) -> None:
    n, dpn = topo.num_devices, topo.devices_per_node
    fast, direct = LinkTable(topo), LinkTable(_RoutesOnly(topo))
    for runs in _runs(n, dpn):
        groups = groups_from_runs(runs)
        a = fast.ring_template("t", groups, prefer=len(groups) // 2)
        b = direct.ring_template("t", groups, prefer=len(groups) // 2)
        assert (a.hops, a.alpha, a.links) == (b.hops, b.alpha, b.links), runs
        pairs = [[(int(x), int(y))] for x, y in zip(groups[:, 0], groups[::-1, -1], strict=True) if x != y]
        a, b = fast.template("s", pairs), direct.template("s", pairs)
        assert (a.hops, a.alpha, a.links) == (b.hops, b.alpha, b.links), runs
    assert fast.ids == direct.ids and fast.cap == direct.cap and fast.latency == direct.latency


def test_translated_channels_need_the_same_nic_split() -> None:
    """Groups with two members per node run split hops, shifted from one class; a graph whose nodes split their
    GPUs over NICs differently is computed group by group, with the same answer."""
    topo = load_topology("dgx-a100", gpus=32)
    groups = groups_from_runs(((2, True), (4, False), (4, True)))
    assert topo._uniform_nics()
    chans = topo.ring_channels_many(groups)
    assert Counter(len(c) for g in chans for c in g)[2] > 0
    g = nx.Graph(topo.graph)
    g.nodes["n0.gpu1"]["nic"] = "n0.nic0"  # node 0: GPUs 0 and 1 share a NIC, elsewhere one NIC each
    odd = Topology(topo.name, g, topo.device, topo.num_nodes, topo.devices_per_node)
    assert not odd._uniform_nics()
    rows = [tuple(sorted(r)) for r in groups.tolist()]
    assert odd.ring_channels_many(groups) == [odd._ring_channels(r) for r in rows] != chans
    assert np.array_equal(odd._link_load(frozenset(rows)), _direct_load(odd, frozenset(rows)))
    got = list(zip(*(c.tolist() for c in odd.ring_channel_arrays(groups)), strict=True))
    assert got == _direct_channels(odd, rows)  # ring_batch.py keys NICs per node: the odd node's split kept
