"""Many inter-node ring hops routed at once, by parts (link_loads.HopParts), with numpy: same ids, same floats.

HopTable routes every rank pair the link loads ask for (~34k pairs for GPT-3 175B on 1,024 A100s). A hop between
nodes whose route splits into parts is (GPU -> NIC -> switch of rank a) + (fabric between the two switches) +
(switch -> NIC -> GPU of rank b) (link_loads.py's docstring), so its edge ids are a gather of three cached pieces
and its latency the sum of the edges' latencies in path order. `PartRoutes` looks each rank's pieces up once per
topology (every rank at the first call) and the fabric's once per switch pair, gathers the ids with numpy and
adds the latencies column by column over the padded [pair, position] matrix: the left-to-right additions of
Python's sum (0 + l0 + l1 + ...; a trailing 0.0 changes nothing), so the floats are bit-identical to
Topology._hops. Pairs on one node, or whose route does not split (a piece is None), are left to the caller
(Topology._hops routes them one by one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Topology = Any  # topology.Topology (it imports link_loads, which imports this module)


class PartRoutes:
    """The pieces of every rank's route to and from the fabric, and of the fabric between switch pairs met so far,
    as one CSR of edge ids; `route` gathers whole routes from them."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        parts, n = topo._parts, topo.num_devices
        self.pieces: list[list[int]] = []
        switch: dict[str, int] = {}
        sides = []
        for up in (True, False):
            piece, sw = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
            for r in range(n):
                side = parts._side(r, up)
                if side is not None:
                    piece[r], sw[r] = len(self.pieces), switch.setdefault(side[1], len(switch))
                    self.pieces.append(side[0])
            sides.append((piece, sw))
        (self.up, self.sw_up), (self.down, self.sw_down) = sides
        self.names = list(switch)
        self.mid: dict[int, int] = {}  # switch pair code -> its piece (-1: no route by parts)
        self.lat = np.asarray(topo._lat_of, dtype=np.float64)
        self._pack()

    def _pack(self) -> None:
        self.piece_len = np.array([len(p) for p in self.pieces], dtype=np.int64)
        self.piece_flat = np.array([i for p in self.pieces for i in p], dtype=np.int64)
        self.piece_start = np.cumsum(self.piece_len) - self.piece_len

    def route(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        """For the pairs a[i] -> b[i]: (which were routed here, then for those only: their edge ids concatenated
        in pair order, edges per pair, each pair's summed latency)."""
        dpn = self.topo.devices_per_node
        up, down = self.up[a], self.down[b]
        ok = ((a // dpn) != (b // dpn)) & (up >= 0) & (down >= 0)
        code = self.sw_up[a] * max(len(self.names), 1) + self.sw_down[b]
        mid = np.full(len(a), -1, dtype=np.int64)
        if ok.any():
            uniq, first, inv = np.unique(code[ok], return_index=True, return_inverse=True)
            at = np.nonzero(ok)[0]
            grew = False
            for c, j in zip(uniq.tolist(), at[first].tolist(), strict=True):
                if c not in self.mid:
                    ids = self.topo._parts._middle(int(a[j]), int(b[j]), self.names[int(self.sw_up[a[j]])],
                                                   self.names[int(self.sw_down[b[j]])])
                    self.mid[c] = -1 if ids is None else len(self.pieces)
                    if ids is not None:
                        self.pieces.append(ids)
                        grew = True
            if grew:
                self._pack()
            mid[ok] = np.array([self.mid[c] for c in uniq.tolist()], dtype=np.int64)[inv.reshape(-1)]
        ok &= mid >= 0
        if not ok.any():
            return ok, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
        seg = np.stack([up[ok], mid[ok], down[ok]], axis=1).reshape(-1)  # per pair: up, fabric, down (path order)
        seg_len = self.piece_len[seg]
        total = int(seg_len.sum())
        ends = np.cumsum(seg_len)
        ids = self.piece_flat[np.arange(total, dtype=np.int64) + np.repeat(self.piece_start[seg] - (ends - seg_len),
                                                                           seg_len)]
        lens = seg_len.reshape(-1, 3).sum(axis=1)
        pos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        mat = np.zeros((len(lens), int(lens.max())))
        mat[np.repeat(np.arange(len(lens)), lens), pos] = self.lat[ids]
        lat = np.zeros(len(lens))
        for col in mat.T:  # left to right, as sum() adds them
            lat = lat + col
        return ok, ids, lens, lat


class NodeRoutes:
    """Rank pairs inside one node routed by the node's template, with numpy: Topology._hops' ids and latencies.

    Topology._path routes a pair on one node (Topology._node_of) as _in_node does: the template path of (the node's
    signature, the two members' labels), its labels prefixed with the node's own prefix (Topology._template). Here
    each (signature, label a, label b) is routed once, through _in_node itself, on its first pair; every pair then
    takes that path's edges on its own node, looked up by (node, edge labels) in a table of the edges inside nodes
    (built once from Topology._eid: the same ids). Latencies are added column by column in path order, as
    PartRoutes does (Python's sum: bit-identical). Pairs on two nodes, or whose template has no path (the topology
    then searches the whole graph), are left to the caller."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        t, n = topo, topo.num_devices
        names = t._ranks
        node = [t._node_of[names[r]] for r in range(n)]
        self.node = np.array([-1 if x is None else x for x in node], dtype=np.int64)
        labels: dict[tuple[int, str], int] = {}  # (signature, label) -> its id
        sig, loc = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        for r, ni in enumerate(node):
            if ni is not None:
                s_id, prefix = t._template(ni)
                sig[r], loc[r] = s_id, labels.setdefault((s_id, names[r][len(prefix):]), len(labels))
        self.sig, self.loc, self.n_labels = sig, loc, max(len(labels), 1)
        self.inner: dict[tuple[int, str, str], int] | None = None  # (node, label u, label v) -> edge id
        self.paths: dict[int, tuple[tuple[str, str], ...] | None] = {}  # (sig, a, b) code -> edge labels
        self.lat = np.asarray(t._lat_of, dtype=np.float64)

    def _inner(self) -> dict[tuple[int, str, str], int]:
        if self.inner is None:  # every edge with both ends in one node, by its labels there
            t = self.topo
            self.inner = {}
            for (u, v), i in t._eid.items():
                ni = t._node_of[u]
                if ni is not None and t._node_of[v] == ni:
                    cut = len(t._template(ni)[1])
                    self.inner[ni, u[cut:], v[cut:]] = i
        return self.inner

    def route(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        """For the pairs a[i] -> b[i]: (which were routed here, then for those only: their edge ids concatenated
        in pair order, edges per pair, each pair's summed latency)."""
        t, empty = self.topo, np.zeros(0, dtype=np.int64)
        dpn = t.devices_per_node  # Topology._hops asks HopParts first where a // dpn != b // dpn: not here
        ok = (self.node[a] >= 0) & (self.node[a] == self.node[b]) & (a != b) & (a // dpn == b // dpn)
        code = (self.sig[a] * self.n_labels + self.loc[a]) * self.n_labels + self.loc[b]
        if ok.any():
            uniq, first = np.unique(code[ok], return_index=True)
            at = np.nonzero(ok)[0]
            for c, j in zip(uniq.tolist(), at[first].tolist(), strict=True):
                if c not in self.paths:
                    src, dst = t._ranks[int(a[j])], t._ranks[int(b[j])]
                    path = t._in_node(src, dst)
                    cut = len(t._template(t._node_of[src])[1])
                    self.paths[c] = None if not path else tuple(
                        (u[cut:], v[cut:]) for u, v in zip(path, path[1:], strict=False))
            ok &= np.array([self.paths.get(c) is not None for c in code.tolist()], dtype=bool)
        if not ok.any():
            return ok, empty, empty, np.zeros(0)
        inner = self._inner()
        ids_list = [inner[nd, u, v] for nd, c in zip(self.node[a[ok]].tolist(), code[ok].tolist(), strict=True)
                    for u, v in self.paths[c]]  # type: ignore[union-attr]
        lens = np.array([len(self.paths[c]) for c in code[ok].tolist()], dtype=np.int64)  # type: ignore[arg-type]
        ids = np.array(ids_list, dtype=np.int64)
        pos = np.arange(len(ids), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        mat = np.zeros((len(lens), int(lens.max(initial=0))))
        mat[np.repeat(np.arange(len(lens)), lens), pos] = self.lat[ids]
        lat = np.zeros(len(lens))
        for col in mat.T:  # left to right, as sum() adds them
            lat = lat + col
        return ok, ids, lens, lat


__all__ = ["NodeRoutes", "PartRoutes"]
