"""Many group queries at once (Topology.group_links): each query's answer alone, bit for bit, in one numpy pass.

A search asks `group_link(group, concurrent)` for every axis set of every placement (469 distinct queries for
GPT-3 175B on 1,024 A100s), each over all the groups of a mesh axis. One at a time, each query is ~40 numpy calls
on ~1k-element arrays, so fixed per-call costs dominate. Here the queries whose groups have one size are stacked:
- the channels of every group of every query: one ring_channel_table over the stacked rows (a row's channels
  depend on that row only: its owners are keyed by row, its hops stay in the row), flattened in (query, group,
  hop, channel) order, each query's groups in the order Topology._link_load's loop visits them (`list(groups)`
  of the same frozenset, built the same way);
- their routes: one HopTable lookup (new rank pairs routed together; a pair's route does not depend on when it
  is asked);
- the link loads: one bincount over (query, edge) bins. A bin belongs to one query, and bincount adds a bin's
  weights in input order, so each query's loads are the same integers and the same float additions, in the same
  order, as link_loads.link_load of that query alone; where every split share is a multiple of 2^-20 (the usual
  1 / 2^k channels) whole and split hops are counted in one weighted bincount instead: every partial sum is then a
  multiple of 2^-20 below 2^33, exact in any order, so the loads are the same values;
- the answer: the group's own channels are the rows of the stack that are the group (a row's channels depend on
  that row only), so its bandwidth is min(bandwidth / load) over their edges and its latency the max of their
  routes' latencies (min and max do not depend on order): Topology._group_link_uncached's figures.
Queries with groups of mixed sizes, or of one rank, are computed one at a time (`one_group_link`: the query alone,
as Topology computed every query before). `cached_group_links`: Topology's per-instance cache of the answers.
`partition_links` (what a search asks: each query a mesh axis' disjoint sorted groups, cost_models/links.py) stacks
the arrays in their own row order and keys its cache by their bytes, with no frozenset per query: the loads then
add split shares in another order, which is exact where every share is a power-of-two fraction (its docstring);
other queries go through group_links.
tests/test_group_links.py compares every answer with one_group_link's, query by query.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from paracube.topologies.link_loads import channel_arrays
from paracube.topologies.ring_batch import ring_channel_table

Topology = Any  # topology.Topology (it imports this module); reads its caches (_table, _bw_arr, _nic_keys ...)
Query = tuple[tuple[int, ...], frozenset]  # (the sorted group, every concurrent group with it, sorted)
MAX_BINS = 1 << 17  # (query, edge) load bins of one pass (1 MiB of float64: temporaries the allocator reuses)
LINK_CACHE = 4096  # group_link answers kept per topology
DYADIC = float(1 << 20)  # partition_links: split-hop shares that are multiples of 1 / DYADIC sum exactly


@dataclass(frozen=True)
class GroupLink:
    bandwidth: float  # bytes/s each rank of a ring over the group gets, after link sharing
    latency: float  # seconds per ring step (alpha)
    nodes: int  # nodes the group spans
    ranks_per_node: int  # max ranks of the group in one node


def cached_group_links(topo: Topology, keys: list[Query], cache: dict[Query, GroupLink]) -> list[GroupLink]:
    """GroupLink of each (sorted group, groups) key: from `cache`, the new ones computed together and kept there
    (bounded: each key holds a mesh axis' groups)."""
    new = list(dict.fromkeys(k for k in keys if k not in cache))
    answers = dict(zip(new, group_links(topo, new), strict=True))
    out = [answers[k] if k in answers else cache[k] for k in keys]
    if len(cache) + len(answers) > LINK_CACHE:
        cache.clear()
    cache.update(answers)
    return out


def one_group_link(topo: Topology, group: tuple[int, ...], groups: frozenset) -> GroupLink:
    """One query, alone (Topology._group_link_uncached): the reference group_links' batches agree with."""
    per_node = Counter(r // topo.devices_per_node for r in group)
    if len(group) < 2:
        return GroupLink(math.inf, 0.0, len(per_node), max(per_node.values(), default=0))
    load = topo._load_cached(groups)
    # a hop's rate R puts share x R on each channel's edges: R <= bw / load on every edge (equal hop rates)
    send, recv = channel_arrays(topo, [group])[:2]  # its channels, in _ring_channels' order (ring_batch.py)
    # the HopTable's rows of the group's channels: the ids and latencies _hops gives (link_loads.py)
    rows = topo._table.rows(send, recv)
    ids = topo._table.gather(rows)[0]
    # min over hops of min over edges of bw / load == min over all the group's edges (same float divisions)
    bandwidth = float((topo._bw_arr[ids] / load[ids]).min()) if len(ids) else math.inf
    latency = float(topo._table.latencies(rows).max()) if len(rows) else 0.0
    return GroupLink(bandwidth, max(latency, 0.0), len(per_node), max(per_node.values()))


def group_links(topo: Topology, queries: Sequence[Query]) -> list[GroupLink]:
    """GroupLink of each (group, groups) query, as one_group_link(group, groups) answers it."""
    out: list[Any] = [None] * len(queries)
    by_size: dict[int, list[int]] = {}
    for i, (group, groups) in enumerate(queries):
        size = len(group)
        if size < 2 or any(len(g) != size for g in groups):
            out[i] = one_group_link(topo, group, groups)
        else:
            by_size.setdefault(size, []).append(i)
    dpn = topo.devices_per_node
    step = max(1, MAX_BINS // max(len(topo._bw_arr), 1))  # queries per pass: (query, edge) bins bounded
    for same in by_size.values():
        for at in range(0, len(same), step):
            idx = same[at:at + step]
            for i, (bw, lat) in zip(idx, _stacked(topo, [queries[i] for i in idx]), strict=True):
                per_node = Counter(r // dpn for r in queries[i][0])
                out[i] = GroupLink(bw, max(lat, 0.0), len(per_node), max(per_node.values()))
    return out


def partition_links(topo: Topology, parts: Sequence[np.ndarray], cache: dict[tuple, GroupLink]) -> list[GroupLink]:
    """group_link(p[0], concurrent=p[1:]) of each partition p: an [n_groups, size] rank array whose rows are sorted
    and disjoint (a mesh axis' groups: cost_models/links.py). Kept in `cache` by the array's bytes. Stacked in the
    arrays' own row order, not the frozenset's: a link load is a sum of whole hops (integers) and of split hops'
    shares 1 / C; where every C is a power of two (<= 2^20), each share and partial sum is a multiple of 2^-20 far
    below 2^33, exact in any order, so the loads and the answers are one_group_link's bit for bit. A query with
    another C (3, 5 ... channels), or an array that is not such a partition, is asked through group_links."""
    out: list[Any] = [None] * len(parts)
    todo: dict[int, list[tuple[int, tuple, np.ndarray]]] = {}
    for i, p in enumerate(parts):
        arr = np.asarray(p)
        key = (arr.shape, arr.dtype.str, arr.tobytes())
        if key in cache:
            out[i] = cache[key]
        elif _partition(topo, arr):
            todo.setdefault(arr.shape[1], []).append((i, key, arr.astype(np.int64, copy=False)))
        else:
            out[i] = cache[key] = topo.group_links([(arr[0], arr[1:])])[0]
    dpn = topo.devices_per_node
    for same in todo.values():
        step = max(1, MAX_BINS // max(len(topo._bw_arr), 1))  # queries per pass: (query, edge) bins bounded
        for at in range(0, len(same), step):
            chunk = same[at:at + step]
            counts = np.array([len(a) for _, _, a in chunk], dtype=np.int64)
            own = np.cumsum(counts) - counts  # each query's group: its first row
            bw, latency, dyadic = _loads(topo, np.concatenate([a for _, _, a in chunk]), counts, own)
            for (i, key, arr), b, lat, exact in zip(chunk, bw.tolist(), latency.tolist(), dyadic.tolist(),
                                                    strict=True):
                if exact:
                    per_node = Counter((arr[0] // dpn).tolist())
                    out[i] = GroupLink(b, max(lat, 0.0), len(per_node), max(per_node.values()))
                else:  # a share that is no power-of-two fraction: the loop's order (group_links)
                    out[i] = topo.group_links([(arr[0], arr[1:])])[0]
                if len(cache) >= LINK_CACHE:
                    cache.clear()
                cache[key] = out[i]
    return out


def _partition(topo: Topology, arr: np.ndarray) -> bool:
    """Whether `arr` is [n_groups, size >= 2] ranks of the topology, each row strictly increasing, no rank twice."""
    if arr.ndim != 2 or arr.dtype.kind not in "iu" or arr.shape[1] < 2 or arr.size == 0:
        return False
    if int(arr.min()) < 0 or int(arr.max()) >= topo.num_devices or not bool((arr[:, 1:] > arr[:, :-1]).all()):
        return False
    return int(np.bincount(arr.reshape(-1)).max()) <= 1


def _stacked(topo: Topology, queries: list[Query]) -> list[tuple[float, float]]:
    """(bandwidth, latency) of queries whose groups all have one size >= 2."""
    lists = [list(groups) for _, groups in queries]  # the loop's order (Topology._link_load: list(groups))
    counts = np.array([len(lst) for lst in lists], dtype=np.int64)
    offsets = np.cumsum(counts) - counts  # each query's first row in the stack
    own = offsets + np.array([lst.index(g) for lst, (g, _) in zip(lists, queries, strict=True)], dtype=np.int64)
    width = len(queries[0][0])  # the stacked groups, row by row (fromiter: no tuple conversions)
    ranks = itertools.chain.from_iterable(g for lst in lists for g in lst)
    arr = np.fromiter(ranks, dtype=np.int64, count=int(counts.sum()) * width).reshape(-1, width)
    bw, latency, _ = _loads(topo, arr, counts, own)
    return list(zip(bw.tolist(), latency.tolist(), strict=True))


def _loads(topo: Topology, arr: np.ndarray, counts: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per query of the stacked rows of `arr` (`counts` rows each, its group at row `own`): (bandwidth, latency,
    whether every split channel's share is a multiple of 2^-20)."""
    table, n_edges, n_q = topo._table, len(topo._bw_arr), len(counts)
    send, recv, share, whole, row = ring_channel_table(topo, arr, topo._nic_keys())
    query = np.repeat(np.arange(n_q), counts)[row]  # each channel's query
    rows = table.rows(send, recv)
    ids, lens = table.gather(rows)
    bins = ids + np.repeat(query * n_edges, lens)  # (query, edge) bins
    size = n_q * n_edges
    odd = np.modf(share * DYADIC)[0] != 0  # shares that are no multiple of 2^-20
    if whole.all():
        load = np.bincount(bins, minlength=size)
    elif not odd.any():  # 1.0 and multiples of 2^-20: partial sums exact (partition_links), one weighted count
        load = np.bincount(bins, weights=np.repeat(share, lens), minlength=size)
    else:  # split hops: their shares, weighted per edge, summed in input order per bin after the whole counts
        load = np.bincount(bins[np.repeat(whole, lens)], minlength=size)
        part = np.repeat(~whole, lens)
        load = load + np.bincount(bins[part], weights=np.repeat(share, lens)[part], minlength=size)
    # the group's own channels: its row of the stack
    mine = row == own[query]
    sel = rows[mine]
    q_sel = query[mine]
    ids_g, lens_g = table.gather(sel)
    ratio = topo._bw_arr[ids_g] / load[ids_g + np.repeat(q_sel * n_edges, lens_g)]
    lat = table.latencies(sel)
    # per query: min over its channels' edges, max over its channels' latencies (channels come query by query)
    edges_per_q = np.bincount(np.repeat(q_sel, lens_g), minlength=n_q)
    chans_per_q = np.bincount(q_sel, minlength=n_q)
    bw = _segment(np.minimum, ratio, edges_per_q, math.inf)
    latency = _segment(np.maximum, lat, chans_per_q, 0.0)
    dyadic = np.bincount(query[odd], minlength=n_q) == 0
    return bw, latency, dyadic


def _segment(op: np.ufunc, values: np.ndarray, lengths: np.ndarray, empty: float) -> np.ndarray:
    """op.reduce of each consecutive segment of `values` (`lengths` per segment; an empty one: `empty`)."""
    out = np.full(len(lengths), empty)
    live = lengths > 0
    if live.any():
        starts = (np.cumsum(lengths) - lengths)[live]
        out[live] = op.reduceat(values, starts)
    return out


__all__ = ["LINK_CACHE", "GroupLink", "cached_group_links", "group_links", "one_group_link", "partition_links"]
