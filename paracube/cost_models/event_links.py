"""Ring templates of a topology for the event engine, built from rank groups on its links (event_paths.LinkPaths).

`LinkTable.template` picks, of the groups of one communicator that move at the same time, the representative the
engine simulates and weights its hops by the concurrent groups' load (event_network.py's module docstring: the
symmetry argument). On a topology that offers them (topology.hop_edges, ring_channel_arrays) the routes of all
groups come as one numpy array and the scores, loads and the representative's weights are numpy reductions of it:
the same floats as the per-path loop (tests/test_link_loads.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from paracube.cost_models.event_paths import LinkPaths
from paracube.topologies.protocol import RoutedTopology


@dataclass(frozen=True)
class Template:
    """A representative group's ring on the topology: hop classes and their weighted links."""

    tid: int
    name: str
    hops: tuple[tuple[tuple[int, float], ...], ...]  # per hop: (link id, weight) along its path
    alpha: float  # latency of one ring step: max over hops of the summed link latencies
    links: frozenset[int]


class LinkTable(LinkPaths):
    """Directed links of a topology as integer ids with capacities (LinkPaths); builds templates from rank groups."""

    def __init__(self, topo: RoutedTopology) -> None:
        super().__init__(topo)
        self._tid = 0

    def _scored(self, routes: tuple[np.ndarray, ...], group: np.ndarray, n_groups: int, share: np.ndarray | None,
                prefer: int) -> tuple[np.ndarray, int, float]:
        """(link loads, the busiest group, its latency) from routes of hops tagged with their group (`template`'s
        and `ring_template`'s scores, the same floats: loads summed in route order)."""
        ids, lens, lat = routes
        cap = np.asarray(self.cap)
        if share is None:
            load = np.bincount(ids, minlength=len(cap))
        else:
            load = np.bincount(ids, weights=np.repeat(share, lens), minlength=len(cap))
        ratio = load[ids] / cap[ids]
        sizes = np.zeros(n_groups, dtype=np.int64)
        np.add.at(sizes, group, lens)
        alphas = np.zeros(n_groups)
        np.maximum.at(alphas, group, lat)  # latencies are >= 0: max(..., default=0.0)
        alpha = alphas.tolist()
        best = _busiest(ratio, sizes.tolist(), alpha, prefer)
        return load, best, alpha[best]

    def template(self, name: str, groups: Sequence[Sequence[tuple[int, int]]], prefer: int = 0) -> Template:
        """Template of the slowest of `groups` (each a list of (src, dst) rank hops) that move at the same
        time. All of them load the links; the one whose worst hop sees the most loaded link (load /
        capacity; then the longest latency) is simulated, since the others wait for it at the next
        collective that couples them (`prefer` wins ties: the group of the stage's representative rank).
        Loads and each group's worst link are numpy reductions over the concatenated paths (a 16,384-GPU job
        scores ~30k groups); the scores are rounded by Python's `round`, as before, so ties are the same."""
        send = np.array([a for hops in groups for a, _ in hops], dtype=np.int64)
        recv = np.array([b for hops in groups for _, b in hops], dtype=np.int64)
        routes = self._routes(send, recv)
        if routes is not None:  # the same, by numpy over the topology's routes
            tag = np.repeat(np.arange(len(groups)), [len(hops) for hops in groups])
            load, best, alpha = self._scored(routes, tag, len(groups), None, prefer)
            return self._from_routes(name, routes, tag, best, None, [1] * len(groups[best]), load, alpha)
        paths = [[self.path(a, b) for a, b in hops] for hops in groups]
        if not paths:
            self._tid += 1
            return Template(self._tid, name, (), 0.0, frozenset())
        flat = [link for group in paths for p in group for link in p]
        sizes = [sum(len(p) for p in group) for group in paths]
        alphas = [max((self._alpha[id(p)] for p in group), default=0.0) for group in paths]
        cap = np.asarray(self.cap)
        ids = np.asarray(flat, dtype=np.int64)
        load = np.bincount(ids, minlength=len(cap)) if ids.size else np.zeros(len(cap), dtype=np.int64)
        ratio = load[ids] / cap[ids]  # float64 division per link, as load[link] / cap[link] was
        best = _busiest(ratio, sizes, alphas, prefer)
        return self._whole(name, paths[best], load, alphas[best])

    def _from_routes(self, name: str, routes: tuple[np.ndarray, ...], tag: np.ndarray, best: int,
                     share: np.ndarray | None, per_hop: list[int], load: np.ndarray, alpha: float) -> Template:
        """`_whole` (share None) or `_split` of the busiest group, read off the routes (its paths are the rows
        tagged `best`, in order; `per_hop`: paths per ring hop): the same link weights, by numpy."""
        ids, lens, _ = routes
        first, last = np.searchsorted(tag, best), np.searchsorted(tag, best, side="right")
        if first == last:  # a group without hops
            self._tid += 1
            return Template(self._tid, name, (), alpha, frozenset())
        ends = np.cumsum(lens)
        lo, hi = int(ends[first] - lens[first]), int(ends[last - 1])
        mine, lens = ids[lo:hi], lens[first:last]
        if share is None:  # Counter of the links, then max(load, own) / own: int / int, correctly rounded
            own = np.bincount(mine, minlength=len(load))
            weight = np.maximum(load[mine], own[mine]) / own[mine]
        else:  # shares summed per link in path order, then share x max(load, own) / own, left to right
            each = np.repeat(share[first:last], lens)
            own = np.bincount(mine, weights=each, minlength=len(load))
            weight = each * np.maximum(load[mine], own[mine]) / own[mine]
        links, weights = mine.tolist(), weight.tolist()
        counts = np.add.reduceat(lens, np.cumsum([0, *per_hop[:-1]])).tolist() if per_hop else []
        out, at = [], 0
        for k in counts:
            out.append(tuple(zip(links[at:at + k], weights[at:at + k], strict=True)))
            at += k
        self._tid += 1
        return Template(self._tid, name, tuple(out), alpha, frozenset(links))

    def _whole(self, name: str, mine: list[list[int]], load: np.ndarray, alpha: float) -> Template:
        own: Counter[int] = Counter(link for p in mine for link in p)
        out = tuple(tuple((link, max(int(load[link]), own[link]) / own[link]) for link in p) for p in mine)
        self._tid += 1
        return Template(self._tid, name, out, alpha, frozenset(own))

    def new_template(self, name: str, hops: tuple[tuple[tuple[int, float], ...], ...], alpha: float) -> Template:
        """A template of hops built elsewhere (cost_models/moe_a2a.py: an all_to_all's flows), with its own id."""
        self._tid += 1
        return Template(self._tid, name, hops, alpha, frozenset(link for hop in hops for link, _ in hop))

    def ring_template(self, name: str, groups: np.ndarray, prefer: int = 0) -> Template:
        """`template` of the node-major rings of `groups` (an [n_groups, size] rank array). A hop that crosses
        nodes runs as the topology's channels (topology.ring_channels: NCCL's channels over the NICs the ring's
        members own); a hop of C channels is one flow whose rate R puts share x R on each channel's links, so a
        link's load k(e) and the representative's own r(e) sum shares and its weight is share x k(e) / r(e):
        the analytic engine's fractional link load, link for link. Without split hops: `template` itself."""
        groups = np.asarray(groups)
        channels_of = getattr(self.topo, "ring_channels", None)  # a duck-typed topology may route hops whole
        if channels_of is None:
            return self.template(name, ring_hops_many(groups), prefer)
        if self._channel_arrays is not None and groups.ndim == 2 and groups.shape[0] and groups.shape[1] > 1:
            send, recv, share, whole, tag = self._channel_arrays(groups)
            routes = self._routes(send, recv)
            if routes is not None:  # the same, by numpy over the topology's routes
                shares = None if whole.all() else share
                load, best, alpha = self._scored(routes, tag, len(groups), shares, prefer)
                per_hop = [len(hop) for hop in channels_of(groups[best])]
                return self._from_routes(name, routes, tag, best, shares, per_hop, load, alpha)
        many = getattr(self.topo, "ring_channels_many", None)
        chans = many(groups) if many is not None else [channels_of(g) for g in groups.tolist()]
        if all(len(c) == 1 for g in chans for c in g):
            return self.template(name, [[(s, r) for ((s, r, _),) in g] for g in chans], prefer)
        paths = [[[(self.path(s, r), share) for s, r, share in hop] for hop in g] for g in chans]
        cap = np.asarray(self.cap)
        flat = [link for g in paths for hop in g for p, _ in hop for link in p]
        weights = [share for g in paths for hop in g for p, share in hop for _ in p]
        ids = np.asarray(flat, dtype=np.int64)
        load = np.bincount(ids, weights=weights, minlength=len(cap)) if ids.size else np.zeros(len(cap))
        alphas = [max((self._alpha[id(p)] for hop in g for p, _ in hop), default=0.0) for g in paths]
        sizes = [sum(len(p) for hop in g for p, _ in hop) for g in paths]
        ratio = load[ids] / cap[ids]
        best = _busiest(ratio, sizes, alphas, prefer)
        return self._split(name, paths[best], load, alphas[best])

    def _split(self, name: str, mine: list[list[tuple[list[int], float]]], load: np.ndarray, alpha: float) -> Template:
        own: Counter[float] = Counter()
        for hop in mine:
            for p, share in hop:
                for link in p:
                    own[link] += share
        out = tuple(tuple((link, share * max(float(load[link]), own[link]) / own[link]) for p, share in hop
                          for link in p) for hop in mine)
        self._tid += 1
        return Template(self._tid, name, out, alpha, frozenset(own))


def ring_hops_many(groups: np.ndarray) -> list[list[tuple[int, int]]]:
    """`ring_hops` of every row of an [n_groups, size] integer array, sorted once by numpy."""
    if groups.shape[1] < 2:
        return [[] for _ in range(groups.shape[0])]
    ranks = np.sort(groups, axis=1)
    nxt = np.roll(ranks, -1, axis=1)
    return [list(zip(a, b, strict=True)) for a, b in zip(ranks.tolist(), nxt.tolist(), strict=True)]


def ring_hops(group: Sequence[int]) -> list[tuple[int, int]]:
    """Node-major ring (ranks sorted: consecutive ranks share a node), so only node boundaries cross the
    network; two ranks use both directions."""
    ranks = sorted(int(r) for r in group)
    if len(ranks) < 2:
        return []
    return list(zip(ranks, ranks[1:] + ranks[:1], strict=True))


def _busiest(ratio: np.ndarray, sizes: list[int], alphas: list[float], prefer: int) -> int:
    """The group whose path set is the busiest (highest load / capacity on any of its links: the one that sets the
    collective's rate), ties to the larger latency, then to `prefer`; `ratio` is per link of the groups' paths in
    order, `sizes` the links per group."""
    worst = [0.0] * len(sizes)
    nonempty = [i for i, n in enumerate(sizes) if n]
    if nonempty:
        starts = np.cumsum([0, *sizes[:-1]])[nonempty]
        for i, w in zip(nonempty, np.maximum.reduceat(ratio, starts).tolist(), strict=True):
            worst[i] = w
    return max(range(len(sizes)), key=lambda i: (round(worst[i], 12), round(alphas[i], 15), int(i == prefer)))


__all__ = ["LinkTable", "Template", "ring_hops", "ring_hops_many"]
