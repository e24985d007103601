"""An all_to_all over a folded expert group (dispatch, combine, the copy counts): every rank sends to all its
peers at once, each flow on its own route, priced alike by both engines.

Why not the ring: NCCL's all-to-all is a grouped send / receive to every peer (nccl/src/collectives.cc:
ncclAllToAll -> one ncclSend and ncclRecv per peer), so a rank's cross-node share leaves through its own NIC (on
a rail-optimized DGX the GPU's NIC), not through the channels of a node-major ring over every NIC the group owns
(topology.ring_channels). Priced as a ring, an ep=32 group over 4 DGX H100 nodes crossed nodes at 8 NICs' rate:
about 6x too fast.

Formula. A call over n ranks with payload P (estimate.ring_sent_factor: a rank sends P / n to each peer, (n - 1)
P / n in all) runs as collective.ring_steps' n - 1 steps of P / n bytes, each step a rank sending P / (n (n - 1))
to every peer (the time average of the pairwise exchange). Flows take topology.route; a directed link e carries
k(e) = the summed shares 1 / (n - 1) of every flow crossing it, of the representative group and of every other
group of the axis with a member on one of its nodes (their flows may share its NVSwitch ports and NICs; groups
elsewhere meet it only on the fat tree's spine, which a rail-optimized, non-blocking fabric does not bottleneck).
Weighted as the ring templates are (event_links.ring_template), the representative rank's flows on e weigh
w(e) = sum over them of share x max(k(e), r(e)) / r(e) = max(k(e), r(e)), r(e) its own shares on e. One step then
takes  a + (P / n) max_e w(e) / B(e)  (a: the longest of its routes' summed latency), so

    time = (n - 1) a + (n - 1) / n P / B_a2a,      B_a2a = 1 / max_e (w(e) / B(e)),

i.e. collective_time("all_to_all", n, 1, P, B_a2a, a). On a DGX with the group over nodes of m ranks each,
1 / B_a2a = max((m - 1) / B_nvlink, (n - m) / B_nic) / (n - 1): the slower of the NVLink part and the NIC part,
each rank's cross-node share through its own NIC. B_nic: the line rate x the fabric's all_to_all figure (nic_scale;
topologies/efficiency.A2A_NIC: A2A_NIC_EFF on NDR, fitted), not the ring's
fabric efficiency (NCCL's all-to-all is many per-peer flows, not a ring's few large channels).

Latency of the deduplicating dispatchers (Dispatch.dedup: DeepEP, HybridEP; moe_dispatch.py): one call is ONE kernel
that puts every token to every remote node at once over RDMA and forwards it over NVLink as its chunks arrive
(deepseek-ai/DeepEP's normal internode kernels: RDMA senders, NVLink forwarders and receivers on their own SMs, all
peers in flight together), not a sequence of per-peer exchanges: its latency is one route's, a, not (n - 1) a. Both
engines decompose the call into the same n - 1 steps, so each step carries a / (n - 1) (`_weights`). DeepEP's own
table (H800, CX7 400 Gb/s, 4096 tokens of DeepSeek-V3's shape: 0.87-0.89 of the line rate at EP 32 / 64 once its
counted bytes are the remote nodes' only) times the whole call, so its startup sits inside that rate, which is
A2A_NIC_EFF's (fitted on an alltoall row, 0.91). The plain all_to_all (NCCL's grouped sends, the alltoall dispatcher)
keeps (n - 1) a: its fit row was fitted with it.

Engines: the analytic engine reads `a2a_link` (moe_links.expert_links, keyed A2A + axes); the event engine simulates
`a2a_template` (event_collectives.Collectives.template for an all_to_all): one flow class of the representative
rank whose link weights are the w(e) above, sharing links max-min fairly with whatever else runs (event_network.py).
A topology without routes (cost_models/uniform_topology.py) keeps the ring link (topology.group_link).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from paracube.cost_models.links import LinkCache, groups_from_runs, runs_for
from paracube.cost_models.moe_dispatch import Dispatch
from paracube.topologies.calibration import as_calibration
from paracube.topologies.efficiency import A2A_NIC_EFF, a2a_eff, fabric_eff
from paracube.topologies.nvswitch import SYSTEMS, fabrics

if TYPE_CHECKING:  # the event engine's link table loads where an all-to-all is priced (not for dense models)
    from paracube.cost_models.event_links import LinkTable, Template

A2A = ("all_to_all",)  # the links key prefix of an all_to_all's group (moe_links.expert_links, moe.comm_time)
PLAIN = Dispatch()  # the plain all_to_all: every flow as it is


def _near(groups: np.ndarray, rep: int, dpn: int) -> tuple[np.ndarray, int]:
    """(the groups with a member on a node of the representative's group, the representative's row in them)."""
    row = int(np.nonzero((groups == rep).any(axis=1))[0][0])
    nodes = np.unique(groups[row] // dpn)
    keep = np.isin(groups // dpn, nodes).any(axis=1)
    return groups[keep], int(np.count_nonzero(keep[:row]))


def nic_scale(topo: object) -> float:
    """The all_to_all's fraction of the line rate (the topology's calibration's gemm.a2a_eff, else its inter-node
    fabric's, efficiency.A2A_NIC) over the fabric efficiency an NVSwitch preset's fabric links carry (its shipped
    one, efficiency.FABRICS; a preset built with other fitted fabric figures is scaled as if shipped); 1 for any
    other topology (its links' rates as given)."""
    name = str(getattr(topo, "name", ""))
    if name not in SYSTEMS:
        return 1.0
    inter = fabrics(name)[1]
    gemm = getattr(as_calibration(getattr(topo, "calibration", None)), "gemm", None)
    eff = getattr(gemm, "a2a_eff", None) or a2a_eff(inter) or A2A_NIC_EFF
    return eff / fabric_eff(inter)


def a2a_weights(table: LinkTable, groups: np.ndarray, rep: int, dpn: int,
                dispatch: Dispatch = PLAIN) -> tuple[dict[int, float], float]:
    """({link id: w(e)} of the representative rank's flows, the longest of its routes' latency) (module doc); a
    fabric link's weight is divided by nic_scale (its capacity at A2A_NIC_EFF of the line rate). A flow between two
    nodes carries its share x f_nic, one inside a node its share x f_nvl (moe_dispatch.py: the dispatcher's and the
    routing's bytes; 1, 1 for the plain all_to_all)."""
    weights, alpha, _ = _weights(table, groups, rep, dpn, dispatch)
    return weights, alpha


def _weights(table: LinkTable, groups: np.ndarray, rep: int, dpn: int,
             dispatch: Dispatch) -> tuple[dict[int, float], float, set[int]]:
    """a2a_weights and the fabric links among them."""
    groups, row = _near(np.asarray(groups), rep, dpn)
    n = groups.shape[1]
    m = int(np.count_nonzero(groups[row] // dpn == rep // dpn))  # the group's ranks per node
    f_nvl, f_nic = dispatch.factors(n, m)
    share = 1.0 / (n - 1)
    flat, cross = _pair_links(table, groups, dpn)
    size = len(table.cap)
    load = (np.bincount(flat, minlength=size) * f_nvl + np.bincount(cross, minlength=size) * f_nic) * share
    own: dict[int, float] = {}
    fabric: set[int] = set()
    nodes = table.topo.graph.nodes
    alpha = 0.0
    for b in groups[row].tolist():
        if b == rep:
            continue
        path = table.path(rep, b)
        alpha = max(alpha, sum(table.latency[link] for link in path))
        f = f_nic if b // dpn != rep // dpn else f_nvl
        for link, (u, v) in zip(path, table.topo.route(rep, b), strict=True):
            own[link] = own.get(link, 0.0) + share * f
            if nodes[u].get("node_index") is None or nodes[v].get("node_index") is None:
                fabric.add(link)  # a leaf / spine switch at one end: the fat tree's links
    if dispatch.dedup and n > 1:  # one kernel to every peer at once: one route's latency a call (module docstring)
        alpha /= n - 1
    scale = nic_scale(table.topo)
    # each own flow on e weighs share x max(k, r) / r; summed over its flows on e: max(k(e), r(e))
    return ({link: max(float(load[link]), r) / (scale if link in fabric else 1.0) for link, r in own.items()}, alpha,
            fabric)


def _pair_links(table: LinkTable, groups: np.ndarray, dpn: int) -> tuple[np.ndarray, np.ndarray]:
    """The links of every flow a -> b (a != b) of every group, in one numpy pass over the topology's routes where it
    has them (else pair by pair): (those of the flows inside a node, those of the flows across nodes), the pairs
    taken in the order a loop over the groups, a, b takes them (new links are numbered in that order)."""
    g = np.asarray(groups, dtype=np.int64)
    n = g.shape[1]
    send, recv = np.repeat(g, n, axis=1).ravel(), np.tile(g, (1, n)).ravel()
    keep = send != recv
    send, recv = send[keep], recv[keep]
    routes = table.routes(send, recv)
    if routes is None:
        flat: list[int] = []
        cross: list[int] = []
        for a, b in zip(send.tolist(), recv.tolist(), strict=True):
            (cross if a // dpn != b // dpn else flat).extend(table.path(a, b))
        return np.asarray(flat, dtype=np.int64), np.asarray(cross, dtype=np.int64)
    ids, lens, _ = routes
    across = np.repeat(send // dpn != recv // dpn, lens)
    return ids[~across], ids[across]


def a2a_template(table: LinkTable, name: str, groups: np.ndarray, rep: int, dpn: int,
                 dispatch: Dispatch = PLAIN) -> Template:
    """The event engine's template of an all_to_all over `groups` (one row per concurrent group), simulated from
    rank `rep`: one hop whose links carry the weights w(e) (module docstring)."""
    weights, alpha = a2a_weights(table, groups, rep, dpn, dispatch)
    return table.new_template(name, (tuple(weights.items()),), alpha)


def a2a_link(cache: LinkCache, placement: Sequence[tuple[str, int]], axes: Sequence[str],
             dispatch: Dispatch = PLAIN) -> tuple[float, float]:
    """(B_a2a, latency) of an all_to_all over `axes` of `placement` for collective.collective_time (module
    docstring; `dispatch`: the dispatcher's bytes, moe_dispatch.py); the ring link where the topology has no routes
    or the group is one rank."""
    runs = runs_for(placement, axes)
    key = ("a2a", runs, dispatch)
    hit = cache.memo.get(key)
    if hit is None:
        topo = cache.topo
        groups = groups_from_runs(runs)
        if groups.shape[1] < 2 or not hasattr(topo, "route"):
            hit = cache.get_runs(runs)
        else:
            table = cache.memo.get("table")
            if table is None:
                from paracube.cost_models.event_links import LinkTable

                table = cache.memo["table"] = LinkTable(topo)  # type: ignore[arg-type]
            dpn = int(topo.devices_per_node)  # type: ignore[attr-defined]
            weights, alpha, fabric = _weights(table, groups, int(groups[0][0]), dpn, dispatch)
            terms = [max((w / table.cap[link] for link, w in weights.items() if (link in fabric) == f), default=0.0)
                     for f in (True, False)]
            cache.memo[("a2a_terms", runs, dispatch)] = (terms[0], terms[1])
            worst = max(terms)
            hit = (1.0 / worst if worst > 0 else math.inf, alpha)
        cache.memo[key] = hit
    return hit


def a2a_terms(cache: LinkCache, placement: Sequence[tuple[str, int]], axes: Sequence[str],
              dispatch: Dispatch = PLAIN) -> tuple[float, float]:
    """(max over the fabric links of w(e) / B(e), max over the others): 1 / B_a2a is the larger; (0, 1 / B) where
    a2a_link took the ring link."""
    bw, _ = a2a_link(cache, placement, axes, dispatch)
    hit = cache.memo.get(("a2a_terms", runs_for(placement, axes), dispatch))
    return hit if hit is not None else (0.0, 1.0 / bw)


__all__ = ["A2A", "A2A_NIC_EFF", "a2a_link", "a2a_terms", "a2a_template", "a2a_weights", "nic_scale"]
