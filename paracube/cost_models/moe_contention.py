"""The expert gradients' reduction against the last backward's all_to_alls on the same NICs (layouts with `overlap`
whose expert group spans nodes), priced as the event engine runs them.

When ep x etp ranks exceed a node, each rank's dispatch / combine leaves through its own NIC (moe_a2a.py), and the
expert gradients' all_reduce over edp (whose members then sit on other nodes) uses the same NIC; issued as the last
micro-batch's backward starts (moe_program.py), it runs beside that backward. The event engine shares a link max-min
fairly between the flow classes crossing it (event_network.py): each progresses at the same rate r with
sum of weights x r <= capacity, so while both run an all_to_all's time per byte becomes
1 / B'_a2a = max(n_a + 1 / B_edp, o_a) instead of 1 / B_a2a = max(n_a, o_a) (n_a, o_a: its largest weight over
capacity on the fabric links and on the others, moe_a2a.a2a_terms; B_edp the gradient ring's link): the all_to_alls
slow by s = B_a2a / B'_a2a, and the gradients keep (s - 1) / s of their rate beside them.

Formula. With C the last backward's compute and A its all_to_alls (one micro-batch, uncontended), x = A / (C + A), and
u the uncontended progress of that backward: real time u (1 - x) + u x s, gradient work u (1 - x) + u x (s - 1) =
u (1 + x (s - 2)). The gradients (G seconds alone) end at u_g = G / (1 + x (s - 2)), so
    exposed = u x (s - 1) + max(0, G - (C + A)(1 + x (s - 2))),   u = min(C + A, u_g):
the backward's delay, plus the gradients the backward did not cover. s = 1 (no shared NIC): max(0, G - C).

Beside an FSDP unit's reduce-scatter (zero >= 2, pp = 1, `overlap`: moe_fsdp.Chain): a block's backward all_to_all
(D seconds alone) starts while the stream still has W seconds of reduce-scatter (alone) queued, on links both use:
an expert unit's over edp right after the experts' backward (the dispatch's backward follows), the block's dense
unit's over the data axes as its backward ends (the next block's combine backward follows). Max-min sharing as
above, per byte 1 / B'_a2a = max(n_a + n_r, o_a + o_r), the ring's (n_r, o_r) = (1 / B_ring, 0) over nodes, (0,
1 / B_ring) on one node (`rates`: s_a, s_r, each flow's slowdown while both run). The one of the two that finishes
first ends at D s_a or W s_r; so (`beside`), when D s_a <= W s_r the all_to_all takes e = D (s_a - 1) more and the
queue ends D s_a (1 - 1 / s_r) later, else e = W s_r (1 - 1 / s_a) and the queue W (s_r - 1) later (one shared
bottleneck: e = min(D (s - 1), W), the queue D or W / (s - 1) later: the link's work is conserved).
"""

from __future__ import annotations


def slowdown(nic: float, other: float, edp_bw: float) -> float:
    """s = B_a2a / B'_a2a (module docstring) from moe_a2a.a2a_terms's (n_a, o_a) and the edp ring's bandwidth."""
    alone = max(nic, other)
    if alone <= 0 or nic <= 0 or edp_bw <= 0:
        return 1.0
    return max(nic + 1.0 / edp_bw, other) / alone


def exposed_grads(grads: float, compute: float, a2a: float, s: float) -> float:
    """Seconds the expert gradients add to the step beside the last backward (module docstring)."""
    span = compute + a2a
    if span <= 0:
        return grads
    x = a2a / span
    rate = 1.0 + x * (s - 2.0)
    u = min(span, grads / rate) if rate > 0 else span
    return u * x * (s - 1.0) + max(0.0, grads - span * rate)


def rates(nic: float, other: float, ring_bw: float, ring_on_node: bool) -> tuple[float, float]:
    """(s_a, s_r): the all_to_all's and the ring's slowdowns while both run (module docstring), from moe_a2a.a2a_terms's
    (n_a, o_a) and the ring's bandwidth; (1, 1) where either is free."""
    alone, ring = max(nic, other), 1.0 / ring_bw if ring_bw > 0 else 0.0
    if alone <= 0 or ring <= 0:  # a group of one rank (bandwidth inf) or no link
        return 1.0, 1.0
    ring_nic, ring_other = (0.0, ring) if ring_on_node else (ring, 0.0)
    # each flow's per byte on the link classes it uses, the other's load added where both do
    a2a = max(nic + (ring_nic if nic > 0 else 0.0), other + (ring_other if other > 0 else 0.0))
    ring_both = max(ring_nic + (nic if ring_nic > 0 else 0.0), ring_other + (other if ring_other > 0 else 0.0))
    return a2a / alone, ring_both / ring


def beside(a2a: float, queued: float, s_a: float, s_r: float) -> tuple[float, float]:
    """(seconds the all_to_all takes beyond `a2a`, seconds the queue's end moves) for `queued` seconds of reduce-scatter
    ahead of it on the stream (module docstring)."""
    if a2a <= 0 or queued <= 0:
        return 0.0, 0.0
    if a2a * s_a <= queued * s_r:
        return a2a * (s_a - 1.0), a2a * s_a * (1.0 - 1.0 / s_r)
    return queued * s_r * (1.0 - 1.0 / s_a), queued * (s_r - 1.0)


__all__ = ["beside", "exposed_grads", "rates", "slowdown"]
