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


__all__ = ["PartRoutes"]
