"""How the dispatch / combine all_to_all's bytes split between NVLink and the NICs, by dispatcher and routing.

Two dispatchers (Runtime.moe_dispatch, Dims.moe_dispatch; priced by moe_a2a.a2a_weights in both engines):
- "alltoall": Megatron-core's MoEAlltoAllTokenDispatcher (and paracube's executor, torchtitan): the tokens are
  permuted into one copy per (token, routed expert) pair and exchanged by one all_to_all (NCCL per-peer sends), so
  a rank sends T k / n copies to every rank of the n-rank group: what moe_a2a.py's flows carry as they are (factors
  1, 1).
- "deepep": Megatron-core's flex dispatcher with the DeepEP backend (deepseek-ai/DeepEP, normal-mode internode
  kernels; --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep): a token crosses to each remote
  node holding any of its experts ONCE, over RDMA to the GPU of the same local index, which forwards it over
  NVLink once to each GPU of its node holding any of its experts (the copies per local expert are made after the
  exchange, by the permute). Combine reverses the path with the same bytes. Megatron-core refuses DeepEP with
  padding to capacity (transformer_config.py: "Flex token dispatcher with deepep backend does not support
  moe_pad_expert_input_to_capacity"), so a capacity factor (token-drop runs) falls back to "alltoall".
- "hybridep": the flex dispatcher's HybridEP backend (--moe-flex-dispatcher-backend hybridep; DeepEP's hybrid-ep
  branch): priced with DeepEP's bytes (one copy per remote node over RDMA, forwarded over NVLink), and with a
  capacity factor too (Megatron-core's _HybridEPManager runs drop_and_pad); its kernels also permute the tokens by
  local expert and pad them to the FP8 multiple, so the block runs no permute / unpermute passes of its own
  (moe_passes.py).
The routing weights (Runtime.moe_probs, modes/experts.PROBS_RULES): Megatron-core's alltoall dispatcher (and
paracube's executor) sends each copy's weight by a second all_to_all beside the tokens' (token_dispatcher.py
l.647-673), its experts weighting their activation (experts.py l.680-746): with the plain all_to_all that call is
priced (T k elements of the router's dtype, and one more call's latency: modes/experts.block_fwd's
moe.dispatch_probs). DeepEP and HybridEP send the weights inside their own dispatch kernel (the flex dispatcher
hands the probs to the same dispatch call: fused_a2a.py l.116, topk_weights=token_probs): no extra call, nothing
priced (`sends_probs`).
Routing limits (MoESpec.groups / group_topk; HF deepseek_v3 n_group / topk_group; Megatron-core
moe_router_num_groups / moe_router_group_topk, moe_utils.group_limited_topk): the experts form `groups` equal groups,
a token's group_topk groups are those with the best sums of their top k / group_topk scores, and its k experts the
best within them. Force-balanced routing (router.py apply_random_logits: random logits, then the same group-limited
top-k) is taken as: group_topk groups drawn uniformly, k / group_topk experts drawn uniformly in each (a group is
chosen for its k / group_topk best, which then make the top k: sampling Megatron-core's rule,
tests/test_moe_dispatch.py, gives 3.97 distinct groups of 4 for DeepSeek-V3, where k experts drawn over the 4 groups
would give 3.63).

Formula. A group of n ranks over N nodes of m ranks each (n = N m), E experts split evenly (E / n per rank, E / N per
node). p(u) = the probability that one token has at least one expert in a given unit of E / u experts (u = N: a node,
u = n: a rank), q = k / group_topk: when each unit lies inside one routing group (u a multiple of `groups`),
    p(u) = group_topk / groups x (1 - C(E / groups - E / u, q) / C(E / groups, q));
when each unit holds j = groups / u whole groups, the chance that one of them is chosen: 1 - C(groups - j,
group_topk) / C(groups, group_topk). Without a limit (groups = group_topk = 1) this is 1 - C(E - E / u, k) / C(E, k).
Groups neither nesting in nor partitioning the units, or k not a multiple of group_topk: the routing limit is not
applied (an upper bound on the bytes).
Per rank and dispatch, with P = T k h c the all_to_all's payload:
    alltoall:  over the NICs (n - m) P / n,          over NVLink (m - 1) P / n;
    deepep:    over the NICs (N - 1) p(N) T h c,     over NVLink N (m - 1) p(n) T h c
(deepep's NVLink: the rank's own tokens to the m - 1 others of its node and, as forwarder, the tokens of its N - 1
same-index peers to the same m - 1). moe_a2a.a2a_weights scales each cross-node flow by f_nic and each in-node flow by
f_nvl, the ratios of the two:  f_nic = n (N - 1) p(N) / ((n - m) k),  f_nvl = n N p(n) / k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DISPATCHERS = ("alltoall", "deepep", "hybridep")
DEDUP = ("deepep", "hybridep")  # one copy per remote node


@dataclass(frozen=True)
class Dispatch:
    """What moe_a2a needs of the dispatcher and the routing (module docstring); hashable (a links cache key)."""

    dedup: bool = False  # "deepep": one copy per remote node over the NICs, one per GPU over NVLink
    experts: int = 1
    top_k: int = 1
    groups: int = 1
    group_topk: int = 1

    def hit(self, units: int) -> float:
        """p(units): a token has at least one expert in a given one of `units` equal parts of the experts."""
        e, k, g, gk = self.experts, self.top_k, self.groups, self.group_topk
        if not (units % g == 0 or g % units == 0) or k % gk:
            g = gk = 1
        if units % g == 0:
            per, q = e // g, k // gk
            return gk / g * (1.0 - math.comb(per - e // units, q) / math.comb(per, q))
        return 1.0 - math.comb(g - g // units, gk) / math.comb(g, gk)

    def factors(self, n: int, m: int) -> tuple[float, float]:
        """(f_nvl, f_nic): the in-node and cross-node flows' bytes over the alltoall dispatcher's (module doc) for a
        group of n ranks, m per node; (1, 1) without dedup or on one node."""
        if not self.dedup or n <= 1 or self.experts % n:
            return 1.0, 1.0
        nodes = max(1, n // m)
        k = self.top_k
        f_nvl = n * nodes * self.hit(n) / k
        f_nic = n * (nodes - 1) * self.hit(nodes) / ((n - m) * k) if nodes > 1 else 1.0
        return f_nvl, f_nic


def effective(moe: object, dispatcher: str) -> str:
    """The dispatcher a model's MoE blocks run under a runtime's (module docstring): "deepep" with a capacity factor
    falls back to "alltoall"."""
    if dispatcher == "deepep" and getattr(moe, "capacity_factor", None) is not None:
        return "alltoall"
    return dispatcher


def dispatch_of(moe: object, dispatcher: str) -> Dispatch:
    """The Dispatch of a model's MoE spec (moe_spec.MoESpec) under a runtime's dispatcher: deduplicating for
    "deepep" (dropless) and "hybridep", else the plain all_to_all (module docstring)."""
    if moe is None or effective(moe, dispatcher) not in DEDUP:
        return Dispatch()
    return Dispatch(True, moe.experts, moe.top_k, moe.groups, moe.group_topk)  # type: ignore[attr-defined]


def sends_probs(moe: object, dispatcher: str, rule: str) -> bool:
    """The routing weights travel by an all_to_all of their own (module docstring): the runtime's rule
    (modes/experts.PROBS_RULES) says so for this model and its dispatch is the plain all_to_all."""
    if moe is None or effective(moe, dispatcher) in DEDUP or rule == "none":
        return False
    return rule == "always" or not getattr(moe, "probs_on_input", False)


__all__ = ["DEDUP", "DISPATCHERS", "Dispatch", "dispatch_of", "effective", "sends_probs"]
