"""A topology's links for the event engine: integer ids with capacities and latencies, and paths between ranks.

`LinkPaths` numbers the directed links of a topology's graph in first-seen order (capacity = the edge's bandwidth in
B/s, latency its seconds; a link with a bandwidth that is not a positive number, or a latency that is not a
non-negative one, is refused in one line naming it), and gives each pair of ranks its path as link ids with the
path's summed latency, computed once per pair. It routes through the topology (topology.route, or route_hop where
the topology has already summed the same latencies in the same order); on a topology that offers it
(topology.hop_edges) the routes of many hops come as one numpy array (`_routes`), numbered as a loop over the routes
would. A rank not on the topology, or a device cut off from the others, is one ParacubeError line.
event_links.LinkTable builds the engine's ring templates on these paths.
"""

from __future__ import annotations

import math

import numpy as np

from paracube.errors import ParacubeError
from paracube.topologies.protocol import RoutedTopology


class LinkPaths:
    """Directed links of a topology as integer ids with capacities and latencies; paths between ranks as link ids."""

    def __init__(self, topo: RoutedTopology) -> None:
        self.topo = topo
        graph = topo.graph
        self._adj = getattr(graph, "_adj", None) or graph.adj  # networkx's dict of dicts: no view per lookup
        self.ids: dict[tuple[str, str], int] = {}
        self.cap: list[float] = []
        self.latency: list[float] = []
        self._paths: dict[tuple[int, int], list[int]] = {}
        self._alpha: dict[int, float] = {}  # id(path list) -> summed link latency
        # The topology's own edge ids and latency sums (topology.route_hop), mapped to ours (-1: not seen yet); ours
        # stay numbered in first-seen order, as when routes came as edges.
        self._route_hop = getattr(topo, "route_hop", None)
        self._topo_edges: list[tuple[str, str]] = list(topo.edges) if self._route_hop is not None else []
        self._from_topo = np.full(len(self._topo_edges), -1, dtype=np.int64)
        self._hop_edges = getattr(topo, "hop_edges", None)  # many routes in one numpy call (topology.hop_edges)
        self._channel_arrays = getattr(topo, "ring_channel_arrays", None)

    def _link(self, u: str, v: str) -> int:
        lid = self.ids.get((u, v))
        if lid is None:
            data = self._adj[u][v]
            bw, lat = data.get("bandwidth"), data.get("latency")
            # Messages built only on failure: a 16,384-GPU job creates ~100k links.
            fast = type(bw) is float and type(lat) is float and 0.0 < bw < math.inf and 0.0 <= lat < math.inf
            if not fast and not (isinstance(bw, (int, float)) and math.isfinite(bw) and bw > 0):
                raise ParacubeError(f"link {u!r}-{v!r} has bandwidth={bw!r}; expected a positive number (bytes/s)")
            if not fast and not (isinstance(lat, (int, float)) and math.isfinite(lat) and lat >= 0):
                raise ParacubeError(f"link {u!r}-{v!r} has latency={lat!r}; expected a non-negative number (s)")
            lid = self.ids[(u, v)] = len(self.cap)
            self.cap.append(float(bw))
            self.latency.append(float(lat))
        return lid

    def path(self, a: int, b: int) -> list[int]:
        """Link ids from rank a's device to rank b's, computed once per pair (templates of a big job share
        many: a stage's tp rings are hops of the stage-spanning rings too)."""
        hit = self._paths.get((a, b))
        if hit is None:
            if self._route_hop is not None:  # the topology summed the same latencies in the same order
                hit, alpha = self._path_hop(a, b)
            else:
                hit = self._path(a, b)
                lat = self.latency
                alpha = sum(lat[link] for link in hit)
            self._paths[a, b] = hit
            self._alpha[id(hit)] = alpha  # the list lives in _paths: its id is stable
        return hit

    def _path_hop(self, a: int, b: int) -> tuple[list[int], float]:
        """Our ids of the topology's route_hop (its edge ids mapped; links seen for the first time numbered in
        path order) and its summed latency."""
        n = self.topo.num_devices
        for r in (a, b):
            if not 0 <= r < n:
                raise ParacubeError(f"rank {r} is not on topology {self.topo.name!r}; valid ranks: 0..{n - 1}")
        try:
            ids, alpha = self._route_hop(a, b)  # type: ignore[misc]
        except (AssertionError, KeyError) as exc:  # a graph with a device cut off from the others
            raise ParacubeError(f"no route from rank {a} to rank {b} on topology "
                                f"{self.topo.name!r}: device disconnected ({exc})") from None
        if a != b and not len(ids):
            raise ParacubeError(f"no route from rank {a} to rank {b}: device disconnected")
        return self._ours(ids).tolist(), float(alpha)

    def _ours(self, topo_ids: np.ndarray) -> np.ndarray:
        """Our ids of the topology's edges (in order); links seen for the first time numbered in order of first
        appearance, as a loop over the routes would."""
        out = self._from_topo[topo_ids]
        fresh = out < 0
        if fresh.any():
            new, first = np.unique(topo_ids[fresh], return_index=True)
            edges, link, mine = self._topo_edges, self._link, self._from_topo
            for t in new[np.argsort(first)].tolist():
                mine[t] = link(*edges[t])
            out = mine[topo_ids]
        return out

    def routes(self, send: np.ndarray, recv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """`_routes`, for the all-pairs loads of an all_to_all (moe_a2a.py)."""
        return self._routes(send, recv)

    def _routes(self, send: np.ndarray, recv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(our link ids of the hops' routes concatenated, links per hop, each hop's latency) in one numpy pass;
        None where the topology cannot (then each hop goes through `path`, which names what is wrong)."""
        n = self.topo.num_devices
        if self._hop_edges is None or not len(send) or min(send.min(), recv.min()) < 0 or \
                max(send.max(), recv.max()) >= n or (send == recv).any():
            return None
        try:
            ids, lens, lat = self._hop_edges(send, recv)
        except (AssertionError, KeyError):  # a device cut off from the others
            return None
        if (lens == 0).any():
            return None
        return self._ours(ids), lens, lat

    def _path(self, a: int, b: int) -> list[int]:
        n = self.topo.num_devices
        for r in (a, b):
            if not 0 <= r < n:
                raise ParacubeError(f"rank {r} is not on topology {self.topo.name!r}; valid ranks: 0..{n - 1}")
        try:
            edges = self.topo.route(a, b)
        except (AssertionError, KeyError) as exc:  # a graph with a device cut off from the others
            raise ParacubeError(f"no route from rank {a} to rank {b} on topology "
                                f"{self.topo.name!r}: device disconnected ({exc})") from None
        if a != b and not edges:
            raise ParacubeError(f"no route from rank {a} to rank {b}: device disconnected")
        get, link = self.ids.get, self._link
        out = [get(e) for e in edges]
        if None in out:  # a link seen for the first time
            out = [link(u, v) if lid is None else lid for (u, v), lid in zip(edges, out, strict=True)]
        return out


__all__ = ["LinkPaths"]
