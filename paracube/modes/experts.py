"""The collectives of one MoE block (expert parallelism, Layout ep= / etp=), declared as the tensor modes declare
theirs (base.coll), on the folded expert axes (layout.py: every stage's dp x cp x tp ranks regrouped as
(edp, ep, etp), etp innermost; Megatron-core's MoE Parallel Folding, arXiv 2504.14960).

Per MoE block and micro-batch a rank holds `T` tokens (its share of the micro-batch: the sequence split by cp,
and by tp, as Megatron-core's alltoall token dispatcher splits the tensor group's tokens before dispatch) and
routes each to `k` experts. Forward (Megatron-core token_dispatcher.MoEAlltoAllTokenDispatcher):
    dispatch   all_to_all over ep   each rank sends its T k routed token copies [h] to the ranks of their experts
    gather     all_gather over etp  the etp ranks of an expert shard gather their tokens (etp > 1), payload the
                                    gathered copies, etp x received (an all_gather's output, estimate.py)
    (expert GEMMs on fc1's column / fc2's row shards)
    scatter    reduce_scatter over etp  the partial expert outputs of the gathered copies (row-parallel fc2), in the
                                    router's dtype (megatron-core 0.16.1 token_dispatcher.py l.774-783: it
                                    reduce-scatters hidden_states.to(self.probs.dtype))
    combine    all_to_all over ep   the outputs back to the tokens' ranks
Where the experts weight their outputs by the routing weights (the dispatcher sends them: `probs`, PROBS_RULES), a
second all_to_all beside the dispatch sends each copy's weight, one element of the router's dtype (fp32; fp64 for an
fp64 model), `moe.dispatch_probs` (megatron-core 0.16.1 token_dispatcher.py l.647-673: global_probs =
all_to_all(ep_group, permuted_probs, ...)); its backward carries their gradients home; with etp > 1 the weights are
gathered over etp beside the tokens, `moe.experts.in_probs` (token_dispatcher.py l.699-701).
Backward: the mirror (combine's gradient is an all_to_all of dY, then the reduce_scatter's gradient an
all_gather, ...), the same payloads. Payload convention (estimate.ring_sent_factor): an all_to_all's
payload is the rank's whole send buffer (bytes to every peer, its own share included), so (n-1)/n of it
leaves the rank under balanced routing. The expert gradients then reduce over `edp` (the step's gradient
all_reduce of expert parameters, cost_models/moe.py).

Routing: `splits` gives the per-peer send sizes for a routing (tokens per (source rank, expert)); balanced
routing (the default) sends T k / ep token copies to each peer. The executor records the real splits; the
model prices the same bytes for the routing the run took (issue #25, item 4).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from paracube.modes import MODES
from paracube.modes.base import COMPUTE, Collective, IntOrArr, coll

EP, ETP, EDP = ("ep",), ("etp",), ("edp",)
EXPERT_AXES = ("ep", "etp", "edp")


@dataclass(frozen=True)
class ExpertSizes:
    """What an MoE block's payloads depend on: T tokens of the rank, k experts per token, `received` token copies
    this rank's experts get from its ep peers (T k under balanced routing; the most loaded rank's otherwise)."""

    T: IntOrArr
    k: int
    received: IntOrArr


# Where a runtime's dispatcher sends the routing weights by an all_to_all of their own (Runtime.moe_probs; priced
# only beside a plain all_to_all dispatch: DeepEP / HybridEP carry them inside their dispatch kernel,
# cost_models/moe_dispatch.sends_probs):
# - "none": never (the weights stay on the token's rank: torchtitan multiplies the copies before the dispatch or the
#   outputs after the combine, DeepSpeed-MoE's combine weights are applied after it);
# - "weighted": where the experts weight their outputs, not with MoESpec.probs_on_input (paracube's executor:
#   executor/model/moe.py multiplies the copies before the dispatch there);
# - "always": with probs_on_input too (Megatron-core's alltoall dispatcher: its experts apply the weights after the
#   dispatch either way, experts.py l.657-665).
PROBS_RULES = ("none", "weighted", "always")
EXECUTOR_PROBS = "weighted"  # paracube's executor (runtimes/paracube.py declares it; moe_traffic.py lists it)
ROUTER = "router"  # a Collective's dtype: the router's (router_dtype)
MIRROR = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}  # a collective's gradient's kind
PROBS, ETP_PROBS = "moe.dispatch_probs", "moe.experts.in_probs"
FWD_BEFORE, BWD_BEFORE = ("moe.dispatch", PROBS, "moe.experts.in", ETP_PROBS), ("moe.combine", "moe.experts.out")
# (the labels issued before the experts' compute, forward and backward)


def router_dtype(dtype: str) -> tuple[str, int]:
    """(name, bytes) of the router's scores and weights for a compute dtype: fp32; fp64 for an fp64 model."""
    return ("float64", 8) if dtype == "float64" else ("float32", 4)


def before_experts(labels: list[str], backward: bool) -> int:
    """How many of a block's collectives (its labels, in issue order) run before the experts' compute."""
    return sum(label.endswith(BWD_BEFORE if backward else FWD_BEFORE) for label in labels)


def block_fwd(d: Any, etp: int, probs: bool = False) -> list[Collective]:
    """One MoE block's forward collectives (d: Dims; h and c read from it); `probs`: the routing weights' all_to_all
    beside the dispatch (module docstring), and with etp > 1 their all_gather beside the tokens'."""
    def sent(z: ExpertSizes) -> IntOrArr:
        return d.c * z.T * z.k * d.h

    def weights(z: ExpertSizes) -> IntOrArr:
        return router_dtype(d.dtype)[1] * z.T * z.k

    def gathered(z: ExpertSizes) -> IntOrArr:  # the etp group's copies: an all_gather's output (estimate.py)
        return d.c * z.received * etp * d.h

    def gathered_weights(z: ExpertSizes) -> IntOrArr:
        return router_dtype(d.dtype)[1] * z.received * etp

    def partials(z: ExpertSizes) -> IntOrArr:  # reduce-scattered in the router's dtype (module docstring)
        return router_dtype(d.dtype)[1] * z.received * etp * d.h

    out = [coll("all_to_all", EP, COMPUTE, sent, "moe.dispatch")]  # type: ignore[arg-type]
    if probs:
        out.append(coll("all_to_all", EP, ROUTER, weights, PROBS))  # type: ignore[arg-type]
    if etp > 1:
        out.append(coll("all_gather", ETP, COMPUTE, gathered, "moe.experts.in"))  # type: ignore[arg-type]
        if probs:
            out.append(coll("all_gather", ETP, ROUTER, gathered_weights, ETP_PROBS))  # type: ignore[arg-type]
        out.append(coll("reduce_scatter", ETP, ROUTER, partials, "moe.experts.out"))  # type: ignore[arg-type]
    return out + [coll("all_to_all", EP, COMPUTE, sent, "moe.combine")]  # type: ignore[arg-type]


def block_bwd(d: Any, etp: int, probs: bool = False) -> list[Collective]:
    """The backward's: combine's gradient first (dY back to the experts), the weights' then the dispatch's last; an
    etp all_gather's gradient is a reduce_scatter of the same payload and vice versa."""
    fwd = block_fwd(d, etp, probs)
    return [fwd[-1], *(replace(c, kind=MIRROR.get(c.kind, c.kind)) for c in reversed(fwd[:-1]))]


def aux_count_axes(layout: Any) -> tuple[str, ...]:
    """The group an MoE block's sequence-wise aux loss sums its [b, E] per-sequence copy counts over (its
    "moe.aux_counts" all_reduce): the ranks holding parts of one sequence, cp (where > 1) then the tensor axes with
    sp (a Layout; Megatron-core 0.16.1 reduces over its tp_cp group, transformer/moe/router.py l.315-366,
    moe_utils.py l.214-233; executor/model/moe_sequence.py). () where every rank holds whole sequences."""
    tensor = tuple(layout.tensor_axes) if layout.sequence_parallel and layout.tensor_size > 1 else ()
    return (("cp",) if layout.cp > 1 else ()) + tensor


def splits(routing: np.ndarray, ep: int, rows: int = 1) -> np.ndarray:
    """Send sizes [ep sources, ep destinations] in token copies for a routing: `routing[src, e]` tokens of ep rank
    src routed to expert e, experts split contiguously (rank r holds experts r E/ep .. (r+1) E/ep - 1, as
    Megatron-core and torchtitan place them). Multiply by h x bytes for the all_to_all's split sizes."""
    routing = np.asarray(routing)
    experts = routing.shape[1]
    return routing.reshape(routing.shape[0], ep, experts // ep).sum(axis=2) * rows


def balanced_routing(tokens: int, k: int, experts: int, ep: int) -> np.ndarray:
    """routing[src, e] with every expert receiving the same tokens (T k / E from each source): the default."""
    return np.full((ep, experts), tokens * k / experts)


# What paracube's executor runs of an MoE layout (executor/model/moe.py): the modes whose tensor group keeps whole
# tokens (the folding ones, TensorMode.context_parallel: none, 1D with its sequence shards), experts split over ep
# and etp (executor/layers/expert_tensor.py), their gradients in buckets over edp (data_parallel/grad_sync.py: zero=0
# all-reduced, zero=1 sharded over edp as Megatron's distributed optimizer does), with any cp (each cp rank routes its
# own chunks; the folded groups span dp x cp x tp; executor/model/moe_sequence.py), MLA's attention too
# (executor/layers/mla.py runs it under cp); zero=2/3 (data_parallel/sharded.py, fsdp.py: a block's experts a unit of
# their own, reduce-scattered and gathered over edp, its dense parameters over the zero group), not with HSDP (shard=).
EXECUTOR_ZEROS = (0, 1, 2, 3)


def executor_modes() -> list[str]:
    return [n for n, m in MODES.items() if m.context_parallel and m.executor is not None]


def executor_refusal(layout: Any) -> str | None:
    """Why paracube's executor does not run MoE blocks in `layout` (a Layout; one line naming the value and what
    is valid), else None. The runtime declaration (runtimes/paracube.py) and executor/moe_sizes.py read it."""
    if layout.mode not in executor_modes():
        return f"MoE blocks run in tp={'/'.join(executor_modes())}, not tp={layout.mode}"
    unpinned_sp = layout.pin and not layout.forbid_sp  # a search's pins: the search adds sp where it may
    if layout.tensor_size > 1 and not layout.sequence_parallel and not unpinned_sp:
        return (f"MoE blocks with tp={layout.mode}:{layout.tensor_size} run with sp (each tensor rank routes its "
                "sequence shard); valid: add sp")
    if layout.zero not in EXECUTOR_ZEROS:
        return (f"MoE blocks with zero={layout.zero} are not run (the experts' gradients reduce over edp); valid: "
                f"zero={'/'.join(map(str, EXECUTOR_ZEROS))}")
    if layout.zero >= 2 and layout.hybrid:
        return f"MoE blocks with zero={layout.zero} run without HSDP, not shard={layout.shard_size}; valid: drop shard="
    return None


__all__ = ["EDP", "EP", "ETP", "ETP_PROBS", "EXECUTOR_PROBS", "EXECUTOR_ZEROS", "EXPERT_AXES", "PROBS", "PROBS_RULES",
           "ROUTER", "ExpertSizes", "aux_count_axes", "balanced_routing", "before_experts", "block_bwd", "block_fwd",
           "executor_modes", "executor_refusal", "router_dtype", "splits"]
