"""Many inter-node ring hops routed at once, by parts (link_loads.HopParts), with numpy: same ids, same floats.

HopTable routes every rank pair the link loads ask for (~34k pairs for GPT-3 175B on 1,024 A100s). A hop between
nodes whose route splits into parts is (GPU -> NIC -> switch of rank a) + (fabric between the two switches) +
(switch -> NIC -> GPU of rank b) (link_loads.py's docstring), so its edge ids are a gather of three cached pieces
and its latency the sum of the edges' latencies in path order. `route_by_parts` looks each piece up once per rank
and once per switch pair (not once per pair), gathers the ids with numpy and adds the latencies column by column
over the padded [pair, position] matrix: the left-to-right additions of Python's sum (0 + l0 + l1 + ...; a
trailing 0.0 changes nothing), so the floats are bit-identical to Topology._hops. Pairs on one node, or whose
route does not split (a piece is None), are left to the caller (Topology._hops routes them one by one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Topology = Any  # topology.Topology (it imports link_loads, which imports this module)


def route_by_parts(topo: Topology, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """For the pairs a[i] -> b[i]: (which were routed here, then for those only: their edge ids concatenated in
    pair order, edges per pair, each pair's summed latency)."""
    dpn, parts = topo.devices_per_node, topo._parts
    ok = (a // dpn) != (b // dpn)
    empty = np.zeros(0, dtype=np.int64)
    if not ok.any():
        return ok, empty, empty, np.zeros(0)
    pieces: list[list[int]] = []  # every distinct piece (up, down per rank; fabric per switch pair)
    switch: dict[str, int] = {}

    def sides(ranks: np.ndarray, up: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per rank of `ranks`: its piece's index (-1: no route by parts) and its switch's number."""
        uniq, inv = np.unique(ranks, return_inverse=True)
        piece, sw = np.full(len(uniq), -1, dtype=np.int64), np.zeros(len(uniq), dtype=np.int64)
        for i, r in enumerate(uniq.tolist()):
            side = parts._side(r, up)
            if side is not None:
                piece[i], sw[i] = len(pieces), switch.setdefault(side[1], len(switch))
                pieces.append(side[0])
        return piece[inv.reshape(-1)], sw[inv.reshape(-1)]

    up, sa = sides(a, True)
    down, sb = sides(b, False)
    ok &= (up >= 0) & (down >= 0)
    names = list(switch)
    code = sa * max(len(names), 1) + sb
    uniq, first, inv = np.unique(np.where(ok, code, -1), return_index=True, return_inverse=True)
    mid = np.full(len(uniq), -1, dtype=np.int64)
    for i, (c, j) in enumerate(zip(uniq.tolist(), first.tolist(), strict=True)):
        if c >= 0:
            ids = parts._middle(int(a[j]), int(b[j]), names[int(sa[j])], names[int(sb[j])])
            if ids is not None:
                mid[i] = len(pieces)
                pieces.append(ids)
    mid = mid[inv.reshape(-1)]
    ok &= mid >= 0
    if not ok.any():
        return ok, empty, empty, np.zeros(0)
    piece_len = np.array([len(p) for p in pieces], dtype=np.int64)
    piece_flat = np.array([i for p in pieces for i in p], dtype=np.int64)
    piece_start = np.cumsum(piece_len) - piece_len
    seg = np.stack([up[ok], mid[ok], down[ok]], axis=1).reshape(-1)  # per pair: up, fabric, down (path order)
    seg_len = piece_len[seg]
    total = int(seg_len.sum())
    ends = np.cumsum(seg_len)
    ids = piece_flat[np.arange(total, dtype=np.int64) + np.repeat(piece_start[seg] - (ends - seg_len), seg_len)]
    lens = seg_len.reshape(-1, 3).sum(axis=1)
    pos = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    mat = np.zeros((len(lens), int(lens.max()) if len(lens) else 0))
    mat[np.repeat(np.arange(len(lens)), lens), pos] = np.asarray(topo._lat_of)[ids]
    lat = np.zeros(len(lens))
    for col in mat.T:  # left to right, as sum() adds them
        lat = lat + col
    return ok, ids, lens, lat


__all__ = ["route_by_parts"]
