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


__all__ = ["exposed_grads", "slowdown"]
