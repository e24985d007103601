"""Checks a cluster graph against the conventions of topology.py before a Topology is built from it.

Every node has a `kind` in NODE_KINDS and, where it carries one, a `node_index` in 0..nodes-1; every "gpu" node
holds one (node_index, local_rank) slot and the slots fill nodes x devices_per_node exactly; a GPU's `nic` names
a "nic" node; every link has a positive `bandwidth` and `latency`; every device is connected to rank 0's. A
failed check raises one line naming the bad value and what is valid (errors.check).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from paracube.errors import check
from paracube.topologies.device import _positive

NODE_KINDS: tuple[str, ...] = ("gpu", "nic", "switch", "cpu")


def validate_graph(g: Any, name: str, n_nodes: int, dpn: int) -> list[str]:
    """The graph node of each rank (rank r = local GPU r % dpn of node r // dpn), once `g` passes every check."""
    # Each message is formatted only where its check fails (`if not ...: check(False, ...)`): a cluster of 1,024
    # GPUs has ~15k checks, and formatting every message took most of the ~8 ms this pass costs.
    where = f"topology {name!r}"
    slots: dict[tuple[int, int], str] = {}
    for node, data in g.nodes(data=True):
        kind = data.get("kind")
        if kind not in NODE_KINDS:
            check(False, f"{where}: node {node!r} has kind={kind!r}; valid: {', '.join(NODE_KINDS)}")
        ni = data.get("node_index")
        if not (ni is None or (isinstance(ni, int) and 0 <= ni < n_nodes)):
            check(False, f"{where}: node {node!r} has node_index={ni!r}; valid: 0..{n_nodes - 1}")
        if kind != "gpu":
            continue
        lr = data.get("local_rank")
        if not (ni is not None and isinstance(lr, int) and 0 <= lr < dpn):
            check(False, f"{where}: device {node!r} needs node_index in 0..{n_nodes - 1} and local_rank in "
                  f"0..{dpn - 1}; got node_index={ni!r}, local_rank={lr!r}")
        if (ni, lr) in slots:
            check(False, f"{where}: devices {slots.get((ni, lr))!r} and {node!r} both claim "
                  f"node_index={ni}, local_rank={lr}")
        slots[(ni, lr)] = node
        nic = data.get("nic")
        if not (nic is None or (nic in g and g.nodes[nic].get("kind") == "nic")):
            check(False, f"{where}: device {node!r} names nic={nic!r}, which is not a nic node of the graph")
    expected = n_nodes * dpn
    check(len(slots) == expected, f"{where}: {len(slots)} devices on the graph, expected nodes x "
          f"devices_per_node = {n_nodes} x {dpn} = {expected}")
    for u, v, data in g.edges(data=True):
        for attr in ("bandwidth", "latency"):
            value = data.get(attr)
            if not _positive(value):
                check(False, f"{where}: link {u!r}-{v!r} has {attr}={value!r}; "
                      "expected a positive number (bytes/s for bandwidth, seconds for latency)")
    ranks = [slots[(r // dpn, r % dpn)] for r in range(expected)]
    reachable, queue = {ranks[0]}, deque([ranks[0]])  # ranks[0]'s connected component
    while queue:
        for v in g.adj[queue.popleft()]:
            if v not in reachable:
                reachable.add(v)
                queue.append(v)
    for node in ranks:
        if node not in reachable:
            check(False, f"{where}: device {node!r} is disconnected from device {ranks[0]!r}")
    return ranks
