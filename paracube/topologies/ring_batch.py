"""The ring channels of many equal-size groups at once, with numpy: Topology._ring_channels' answers, in its order.

A sorted group runs a node-major ring (group_queries.py's docstring): hop i goes from member i to member i + 1 (the
last back to the first). A hop inside a node is one channel (a, b, 1.0). A hop from node A to node B runs as
    C = max(1, min(owners on A, owners on B, RING_CHANNELS))
channels, where the owners of a node are the group's first member (by rank) per distinct NIC there
(Topology._owners); C = 1: the hop itself (a, b, 1.0); else the k-th owner on A to the k-th owner on B, k < C,
each with share 1.0 / C (Topology._crossing). Python computed that hop by hop (~100k hops per GPT-3 175B search
on 1,024 GPUs: ~0.2 s); here every group of one query is an [m, n] array:
- owners: a member whose (node, NIC) key is the first of its row (numpy.unique's first index);
- per node segment of a row (its consecutive members on one node): its owners' count and where its owners start
  in the row-major list of owners;
- per hop, C from the two segments' counts; per channel, its sender and receiver gathered from that list.
The channels come flattened in (group, hop, channel) order, the order link_loads.channel_arrays gives them in,
so link loads summed from them are bit-identical (tests/test_link_loads.py compares both per group).
NIC keys: Topology._nic_of per rank as an integer, one per distinct NIC name; a GPU without a NIC keys on its node
(Topology._owners groups such members under None, per node), so keys compare within a node exactly as names do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Topology = Any  # topology.Topology (it imports link_loads, which imports this module)
# NCCL opens 16+ channels on NVSwitch systems (NCCL_MAX_NCHANNELS 32); the NICs (<= 8 per node) bound them first.
RING_CHANNELS = 16


def nic_keys(topo: Topology) -> np.ndarray:
    """Per rank, an integer naming its NIC (Topology._nic_of): equal keys on one node, equal NICs."""
    names: dict[object, int] = {}
    dpn = topo.devices_per_node
    keys = [names.setdefault(topo._nic_of(gpu) or ("no nic", r // dpn), len(names))
            for r, gpu in enumerate(topo._ranks)]
    return np.array(keys, dtype=np.int64)


def ring_channel_table(topo: Topology, arr: np.ndarray, nics: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every channel of the rings of the rows of `arr` ([m, n] ranks, each row sorted), flattened in (row, hop,
    channel) order: (senders, receivers, shares, whether the channel is its hop's only one, its row).
    `nics`: nic_keys(topo)."""
    m, n = arr.shape
    empty = np.zeros(0, dtype=np.int64)
    if n < 2 or m == 0:
        return empty, empty, np.zeros(0), np.zeros(0, dtype=bool), empty
    dpn = topo.devices_per_node
    node = arr // dpn
    flat = arr.reshape(-1)
    # node segments: runs of a row's members on one node (rows are sorted: a node's members are consecutive)
    starts = np.ones((m, n), dtype=bool)
    starts[:, 1:] = node[:, 1:] != node[:, :-1]
    seg = np.cumsum(starts.reshape(-1)) - 1  # row-major segment id of each member
    n_seg = int(seg[-1]) + 1
    # owners: the first member of its row with its (node, NIC) key
    key = (np.arange(m)[:, None] * (int(nics.max()) + 1) + nics[arr]).reshape(-1)
    _, first = np.unique(key, return_index=True)
    owner = np.zeros(m * n, dtype=bool)
    owner[first] = True
    owner_pos = np.nonzero(owner)[0]  # row-major: a segment's owners in rank order, segments in order
    count = np.bincount(seg[owner_pos], minlength=n_seg)
    begin = np.cumsum(count) - count  # each segment's first owner in owner_pos
    # hop i of a row: member i -> member (i + 1) mod n
    nxt = np.arange(1, m * n + 1)
    nxt[n - 1::n] -= n  # the last member of a row sends to its first
    cross = node.reshape(-1) != node.reshape(-1)[nxt]
    seg_a, seg_b = seg, seg[nxt]
    c = np.where(cross, np.maximum(1, np.minimum(np.minimum(count[seg_a], count[seg_b]), RING_CHANNELS)), 1)
    hop = np.repeat(np.arange(m * n), c)
    k = np.arange(len(hop)) - np.repeat(np.cumsum(c) - c, c)  # channel index within its hop
    cc = c[hop]
    whole = cc == 1
    send = np.where(whole, flat[hop], flat[owner_pos[np.where(whole, 0, begin[seg_a[hop]] + k)]])
    recv = np.where(whole, flat[nxt[hop]], flat[owner_pos[np.where(whole, 0, begin[seg_b[hop]] + k)]])
    return send, recv, 1.0 / cc, whole, hop // n


__all__ = ["RING_CHANNELS", "nic_keys", "ring_channel_table"]
