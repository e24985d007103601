"""Fabric routes grown lazily (topology._fabric_path pauses its BFS once the destination switch is found) equal
the routes of a full BFS tree per source switch, whatever order the destinations are asked in."""

from __future__ import annotations

import random
from collections import deque

from paracube.topologies import load_topology


def _full_tree(topo, src: str) -> dict:
    """The reference: one complete BFS over fabric nodes from `src` (the routing before lazy growth)."""
    parent, queue = {src: None}, deque([src])
    while queue:
        u = queue.popleft()
        for v in topo._adj[u]:
            if v not in parent and topo._node_of[v] is None:
                parent[v] = u
                queue.append(v)
    return parent


def test_lazy_fabric_routes_equal_full_bfs() -> None:
    topo = load_topology("dgx-h100", gpus=512)
    n, dpn = topo.num_devices, topo.devices_per_node
    pairs = [(a, b) for a in range(0, n, 7) for b in range(3, n, 61) if a // dpn != b // dpn]
    random.Random(0).shuffle(pairs)  # ask destinations out of BFS order: the tree must resume, not restart
    trees: dict = {}
    for a, b in pairs:
        edges = topo.route(a, b)
        nodes = [edges[0][0]] + [v for _, v in edges]
        fabric = [u for u in nodes if topo._node_of[u] is None]
        tree = trees.setdefault(fabric[0], _full_tree(topo, fabric[0]))
        expect = [fabric[-1]]
        while tree[expect[-1]] is not None:
            expect.append(tree[expect[-1]])
        assert fabric == expect[::-1], (a, b)
    assert len(trees) > 1 and len(pairs) > 500  # several source switches, many destinations each
