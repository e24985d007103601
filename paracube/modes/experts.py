"""The collectives of one MoE block (expert parallelism, Layout ep= / etp=), declared as the tensor modes declare
theirs (base.coll), on the folded expert axes (layout.py: every stage's dp x cp x tp ranks regrouped as
(edp, ep, etp), etp innermost; Megatron-core's MoE Parallel Folding, arXiv 2504.14960).

Per MoE block and micro-batch a rank holds `T` tokens (its share of the micro-batch: the sequence split by cp,
and by tp, as Megatron-core's alltoall token dispatcher splits the tensor group's tokens before dispatch) and
routes each to `k` experts. Forward (Megatron-core token_dispatcher.MoEAlltoAllTokenDispatcher):
    dispatch   all_to_all over ep   each rank sends its T k routed token copies [h] to the ranks of their experts
    gather     all_gather over etp  the etp ranks of an expert shard gather their tokens (etp > 1)
    (expert GEMMs)
    scatter    reduce_scatter over etp  the partial expert outputs (row-parallel down projection)
    combine    all_to_all over ep   the outputs back to the tokens' ranks
Backward: the mirror (combine's gradient is an all_to_all of dY, then the reduce_scatter's gradient an
all_gather, ...), the same four payloads. Payload convention (estimate.ring_sent_factor): an all_to_all's
payload is the rank's whole send buffer (bytes to every peer, its own share included), so (n-1)/n of it
leaves the rank under balanced routing. The expert gradients then reduce over `edp` (the step's gradient
all_reduce of expert parameters, cost_models/moe.py).

Routing: `splits` gives the per-peer send sizes for a routing (tokens per (source rank, expert)); balanced
routing (the default) sends T k / ep token copies to each peer. The executor records the real splits; the
model prices the same bytes for the routing the run took (issue #25, item 4).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def block_fwd(d: Any, etp: int) -> list[Collective]:
    """One MoE block's forward collectives (d: Dims; h and c read from it)."""
    def sent(z: ExpertSizes) -> IntOrArr:
        return d.c * z.T * z.k * d.h

    def local(z: ExpertSizes) -> IntOrArr:  # tokens this etp rank holds before its etp group gathers them
        return d.c * z.received * d.h

    out = [coll("all_to_all", EP, COMPUTE, sent, "moe.dispatch")]  # type: ignore[arg-type]
    if etp > 1:
        out += [coll("all_gather", ETP, COMPUTE, local, "moe.experts.in"),  # type: ignore[arg-type]
                coll("reduce_scatter", ETP, COMPUTE, local, "moe.experts.out")]  # type: ignore[arg-type]
    return out + [coll("all_to_all", EP, COMPUTE, sent, "moe.combine")]  # type: ignore[arg-type]


def block_bwd(d: Any, etp: int) -> list[Collective]:
    """The backward's: combine's gradient first (dY back to the experts), dispatch's last."""
    fwd = block_fwd(d, etp)
    return [fwd[-1], *reversed(fwd[1:-1]), fwd[0]]


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
# tokens (the folding ones, TensorMode.context_parallel: none, 1D with its sequence shards), experts whole (etp = 1),
# their gradients in buckets over edp (data_parallel/grad_sync.py: zero=0 all-reduced, zero=1 sharded over edp as
# Megatron's distributed optimizer does), no cp.
EXECUTOR_ZEROS = (0, 1)


def executor_modes() -> list[str]:
    return [n for n, m in MODES.items() if m.context_parallel and m.executor is not None]


def executor_refusal(layout: Any) -> str | None:
    """Why paracube's executor does not run MoE blocks in `layout` (a Layout; one line naming the value and what
    is valid), else None. The runtime declaration (runtimes/paracube.py) and executor/moe_sizes.py read it."""
    if layout.etp > 1:
        return f"etp={layout.etp} (tensor parallelism inside an expert) is not run; valid: etp=1"
    if layout.mode not in executor_modes():
        return f"MoE blocks run in tp={'/'.join(executor_modes())}, not tp={layout.mode}"
    if layout.tensor_size > 1 and not layout.sequence_parallel:
        return (f"MoE blocks with tp={layout.mode}:{layout.tensor_size} run with sp (each tensor rank routes its "
                "sequence shard); valid: add sp")
    if layout.cp > 1:
        return f"MoE blocks with cp={layout.cp} are not run; valid: cp=1"
    if layout.zero not in EXECUTOR_ZEROS:
        return (f"MoE blocks with zero={layout.zero} are not run (the experts' gradients reduce over edp); valid: "
                f"zero={'/'.join(map(str, EXECUTOR_ZEROS))}")
    return None


__all__ = ["EDP", "EP", "ETP", "EXECUTOR_ZEROS", "EXPERT_AXES", "ExpertSizes", "balanced_routing",
           "block_bwd", "block_fwd", "executor_modes", "executor_refusal", "splits"]
