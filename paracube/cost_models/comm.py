"""Closed forms of one step's communication, vectorized over layouts, and their alpha-beta time.

`comm_entries` returns, per (kind, axes, dtype), the number of calls and the summed payload of one step on
one rank of one pipeline stage, as numpy arrays over layouts. They are derived by hand from the per-layer
lists in traffic.py (which follows docs/algorithms.md); tests/test_cost_model.py proves that, for many
layouts, they equal the sums over the explicit list. Notation: N micro-batches, T = mb*s tokens,
R = 2 with full recompute (forward collectives issued twice) else 1, Ls = layers per stage, F / H = 1 when
the stage holds the embedding / the head. Entries whose group has one rank count zero calls.

Time of one call on a group of n ranks with link (bandwidth B, latency a), payload P:
- all_gather / reduce_scatter: (n-1) a + (n-1)/n P / B        (ring)
- all_reduce:                  2(n-1) a + 2(n-1)/n P / B      (ring reduce-scatter + all-gather)
- send:                        a + P / B
A group spanning nodes is priced with the (hierarchical) bandwidth the topology's group_link reports.
With a calibration (`topology.calibration["comm"][kind][str(n)]`, measured by `paracube calibrate` with every
rank busy), the fitted (a, B) of that kind and group size replace the link's in the same formula: on a
shared machine a collective's cost depends on its kind and size (thread hand-offs, peers' scheduling),
not only on the wire. Modes whose consecutive collectives alternate mesh axes (2D, 2.5D, 3D) read
`comm_alternating` instead, measured with calls cycling through the groups of every stride: a call then
waits on peers last synchronized with other ranks, the synchronization skew of an oversubscribed machine.
Kinds or sizes that were not measured keep the topology's link.
No overlap: the executor runs tensor-parallel collectives in line with compute and the data-parallel
gradient all_reduce after the last backward, so all communication time is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paracube.cost_models.dims import Dims
from paracube.layout import TENSOR_AXES

F32 = "float32"
Arr = np.ndarray


@dataclass
class Entry:
    kind: str
    axes: tuple[str, ...]
    dtype: str
    count: Arr
    payload: Arr
    n: Arr  # group size
    per_step: bool = False  # once per step (gradients, grad norm, metrics), not per micro-batch

    def sent(self) -> Arr:
        return sent_factor(self.kind, self.n) * self.payload

    def time(self, bw: Arr, lat: Arr, table: Table = (), alternating: bool = False) -> Arr:
        bw, lat = calibrated_link(table, self.kind, self.n, bw, lat, alternating)
        lat_f = {"all_reduce": 2.0 * (self.n - 1), "send": np.ones_like(self.n, dtype=float)}.get(
            self.kind, self.n - 1.0
        )
        return np.where(self.count > 0, self.count * lat_f * lat + self.sent() / bw, 0.0)


Table = tuple[tuple[str, int, bool, float, float], ...]  # (kind, n, alternating, latency, bandwidth)
ALTERNATING_MODES = ("2d", "2.5d", "3d")  # consecutive collectives switch mesh axes


def calibrated_link(table: Table, kind: str, n: Arr, bw: Arr, lat: Arr, alternating: bool = False
                    ) -> tuple[Arr, Arr]:
    """(bandwidth, latency) per element of `n` (group sizes): the calibrated pair of (kind, n) where the
    table has one (the alternating-groups fit if asked for and measured, else the fixed-group one), else
    the topology link's `bw`, `lat`."""
    # Fixed-group rows first, alternating ones after: a later match overrides an earlier one.
    rows = [(size, a, b) for k, size, alt, a, b in sorted(table, key=lambda r: r[2])
            if k == kind and (not alt or alternating)]
    if not rows:
        return bw, lat
    n = np.asarray(n)
    for size, a, b in rows:
        hit = n == size
        bw, lat = np.where(hit, b, bw), np.where(hit, a, lat)
    return bw, lat


def sent_factor(kind: str, n: Arr) -> Arr:
    n = np.asarray(n, dtype=float)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind == "send":
        return np.ones_like(n)
    return (n - 1) / n


def stage_layers_params(d: Dims, mode: str, a: dict[str, Arr], first: Arr, last: Arr) -> Arr:
    """Closed form of local parameters per rank (vectorized dims.local_params)."""
    t, q, pp = a["t"], a["q"], a["pp"]
    split = {"none": 1, "1d": t, "2d": q, "2.5d": q, "3d": q * q}[mode]
    V = -(-d.V // split) * split
    h, nv = d.h, d.norm_vectors
    Ls = d.L // pp
    if mode == "1d":
        rep_layer = 2 * nv * h + d.row_bias
        rep = Ls * rep_layer + first * d.pos_params + last * nv * h
        split_total = Ls * (d.layer_params() - rep_layer) + (first + last) * V * h
        return rep + split_total // t
    total = Ls * d.layer_params() + first * (V * h + d.pos_params) + last * (V * h + nv * h)
    div = {"none": 1, "2d": q * q, "2.5d": q * q, "3d": q**3}[mode]
    return total // div


def comm_entries(d: Dims, mode: str, a: dict[str, Arr], first: Arr, last: Arr) -> list[Entry]:
    dp, pp, t, q, dd, mb, v, sp = (a[k] for k in ("dp", "pp", "t", "q", "d", "mb", "v", "sp"))
    N = d.global_batch // (dp * mb)
    T = mb * d.s
    R = 2 if d.recompute == "full" else 1
    Ls = d.L // pp
    F, H = first.astype(np.int64), last.astype(np.int64)
    c, h, nv, sw = d.c, d.h, d.norm_vectors, d.stat_width
    gpt = 1 if d.family == "gpt" else 0
    one = np.ones_like(dp)
    out: list[Entry] = []

    def add(
        kind: str, axes: tuple[str, ...], dtype: str, count: Arr, payload: Arr, n: Arr, per_step: bool = False
    ) -> None:
        live = (np.asarray(n) > 1).astype(np.int64)
        out.append(Entry(kind, axes, dtype, count * live, payload * live, np.asarray(n) * one, per_step))

    if mode == "1d":
        ns = 1 - sp
        add("all_reduce", ("tp",), F32, N * (F * ns + 2 * H), N * (F * ns * 4 * T * h + H * 12 * T), t)
        blk = N * ((2 * R + 2) * Ls + H)
        add("all_reduce", ("tp",), d.dtype, blk * ns, blk * ns * c * T * h, t)
        add("reduce_scatter", ("tp",), F32, N * F * sp, N * F * sp * 4 * T * h, t)
        add("all_gather", ("tp",), F32, N * F * sp, N * F * sp * 4 * T * h, t)
        add("all_gather", ("tp",), d.dtype, blk * sp, blk * sp * c * T * h, t)
        add("reduce_scatter", ("tp",), d.dtype, blk * sp, blk * sp * c * T * h, t)
        sp_params = Ls * (2 * nv * h + d.row_bias) + F * d.pos_params + H * nv * h
        add("all_reduce", ("tp",), F32, sp, sp * 4 * sp_params, t, True)
    elif mode in ("2d", "2.5d"):
        Tq = T // dd // q
        V = -(-d.V // q) * q
        hin, w, nb, bsum = d.sum_hin(), d.sum_w(), sum(1 for li in d.linears if li[3]), d.sum_bias()
        add("all_gather", ("col",), d.dtype, N * (4 * R * Ls + H), N * c * Tq * (hin * R * Ls + H * h), q)
        add("reduce_scatter", ("col",), d.dtype, N * (4 * Ls + H), N * c * Tq * (hin * Ls + H * h), q)
        add("all_gather", ("row",), d.dtype, N * (4 * R * Ls + H), N * c * (w * R * Ls + H * h * V) // q, q)
        add("reduce_scatter", ("row",), d.dtype, N * (4 * Ls + H), N * c * (w * Ls + H * h * V) // q, q)
        emb = F * 4 * (T // dd) * h // q + F * gpt * 4 * d.s * h // q
        for kind, r in (("all_gather", R), ("reduce_scatter", 1)):
            add(
                kind,
                ("row",),
                F32,
                N * ((nb + 2 * nv) * r * Ls + nv * H + F + F * gpt),
                N * (4 * ((bsum + 2 * nv * h) * r * Ls + nv * h * H) // q + emb),
                q,
            )
        add(
            "all_reduce",
            ("col",),
            F32,
            N * (2 * R * Ls + 2 * Ls + 4 * H),
            N * (4 * sw * Tq * (2 * R * Ls + 2 * Ls + 2 * H) + 12 * Tq * H),
            q,
        )
    elif mode == "3d":
        q2 = q * q
        Tq = T // q2
        V = -(-d.V // q2) * q2
        L = d.linears
        a_in, a_out = L[0][1] + L[2][1], L[0][2] + L[2][2]
        b_in, b_out = L[1][1] + L[3][1], L[1][2] + L[3][2]
        a_b = sum(L[i][2] for i in (0, 2) if L[i][3])
        b_b = sum(L[i][2] for i in (1, 3) if L[i][3])
        na, nbb = sum(1 for i in (0, 2) if L[i][3]), sum(1 for i in (1, 3) if L[i][3])
        w = d.sum_w()
        cnt = N * (2 * R * Ls + 2 * Ls + H)
        add("all_gather", ("y",), d.dtype, cnt, N * c * Tq * (a_in * R * Ls + b_out * Ls + H * h), q)
        add("reduce_scatter", ("y",), d.dtype, cnt, N * c * Tq * (b_out * R * Ls + a_in * Ls + H * h), q)
        add("all_gather", ("z",), d.dtype, cnt, N * c * Tq * (b_in * R * Ls + a_out * Ls + H * V), q)
        add("reduce_scatter", ("z",), d.dtype, cnt, N * c * Tq * (a_out * R * Ls + b_in * Ls + H * V), q)
        add("all_gather", ("x",), d.dtype, N * (4 * R * Ls + H), N * c * (w * R * Ls + H * h * V) // q2, q)
        add("reduce_scatter", ("x",), d.dtype, N * (4 * Ls + H), N * c * (w * Ls + H * h * V) // q2, q)
        add("all_gather", ("x", "z"), F32, N * na * R * Ls, N * 4 * a_b * R * Ls // q, q2)
        add("reduce_scatter", ("x", "z"), F32, N * na * Ls, N * 4 * a_b * Ls // q, q2)
        emb = F * 4 * T * h // q + F * gpt * 4 * d.s * h // q
        for kind, r in (("all_gather", R), ("reduce_scatter", 1)):
            add(
                kind,
                ("x", "y"),
                F32,
                N * ((nbb + 2 * nv) * r * Ls + nv * H + F + F * gpt),
                N * (4 * ((b_b + 2 * nv * h) * r * Ls + nv * h * H) // q + emb),
                q2,
            )
        add(
            "all_reduce",
            ("z",),
            F32,
            N * (2 * R * Ls + 2 * Ls + 2 * H),
            N * 4 * sw * Tq * (2 * R * Ls + 2 * Ls + 2 * H),
            q,
        )
        add("all_reduce", ("y",), F32, N * 2 * H, N * 12 * Tq * H, q)
    # Pipeline sends of the stage's activation shard.
    split = {"none": one, "1d": np.where(sp > 0, t, 1), "2d": t, "2.5d": t, "3d": t}[mode]
    sends = N * (2 * v - F - H)
    add("send", ("pp",), d.dtype, sends, sends * (c * T * h // split), np.where(pp > 1, 2, 1))
    # Per step: gradients, grad-norm, metrics.
    n_local = stage_layers_params(d, mode, a, F, H)
    tensor_axes = TENSOR_AXES[mode]
    if mode == "2.5d":
        add("all_reduce", ("dp", "dep"), F32, one, 4 * n_local, dp * dd, True)
    else:
        add("all_reduce", ("dp",), F32, one, 4 * n_local, dp, True)
    add("all_reduce", tensor_axes, F32, (pp == 1) * one, 4 * one, np.where(pp == 1, t, 1), True)
    add("all_reduce", ("pp", *tensor_axes), F32, (pp > 1) * one, 4 * one, np.where(pp > 1, pp * t, 1), True)
    add("all_reduce", ("dp", *tensor_axes), F32, one, 8 * one, dp * t, True)
    return out


def axes_used(mode: str) -> list[tuple[str, ...]]:
    """Every group (mesh axes) the closed forms of `mode` may use: the planner asks the topology for these."""
    tensor = TENSOR_AXES[mode]
    per_mode = {
        "none": [],
        "1d": [("tp",)],
        "2d": [("row",), ("col",)],
        "2.5d": [("row",), ("col",)],
        "3d": [("x",), ("y",), ("z",), ("x", "z"), ("x", "y")],
    }[mode]
    grad = [("dp", "dep")] if mode == "2.5d" else [("dp",)]
    extra = [tensor] if tensor else []
    return list(dict.fromkeys(per_mode + grad + extra + [("pp", *tensor), ("dp", *tensor), ("pp",)]))
