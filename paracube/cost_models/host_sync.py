"""The host synchronization of a dropless MoE block: the GPU idles while its host waits for the expert counts.

What runs. A dropless MoE block's buffer sizes depend on the routing, so the runtime copies the expert counts to the
host and waits for them every MoE forward (Runtime.moe_host_sync): Megatron-core 0.16 (token_dispatcher.py
MoEAlltoAllTokenDispatcher: `_maybe_dtoh_and_synchronize` at its `cuda_sync_point`, "before_ep_alltoall" with ep > 1,
for the all_to_all's split sizes; the flex dispatcher's HybridEP dispatch runs `non_blocking=False` when the permuted
token count is not given, fused_a2a.hybrid_ep_dispatch, and DeepEP hands its received counts to the host as a list;
TEGroupedMLP's `tokens_per_expert.tolist()`, experts.py), torchtitan (`input_splits.tolist()`, token_dispatcher.py)
and paracube's executor (`counts.tolist()`, executor/model/moe.py). A run padded to a capacity (MoESpec.
capacity_factor under a runtime that pads, Runtime.moe_capacity "pad": Megatron-core's drop_and_pad) sizes every
buffer from the capacity and does not wait; one that drops without padding ("drop": paracube's executor) still reads
its uneven counts and waits. CUDA graphs
of the dispatch's preprocessing (Megatron-core's cuda_graph_scope moe_preprocess, the later NVIDIA recipes) would
remove the wait; no runtime here declares them.

Price. The wait drains the GPU's queue; the GPU then idles until the host has issued the next kernel: the host's
wake-up on the finished copy, the ops between the wait and the dispatch (the split sizes read, the permute, the
all_to_all or the dispatch kernel launched) at PyTorch's eager cost per op, and the launch. Per MoE block forward
(again in a full recomputation, which re-runs the dispatch) one wait of DeviceSpec.sync_s seconds (a device's host
figure; 0 where none is set: the local CPU, whose host is the device), added to the block's forward compute
(moe.block_cost, BlockCost.wait), which both engines read (the event engine as an op of its own before the
dispatch); `a2ao`'s combined steps overlap compute, not the wait (moe_step.py, moe_program.py). NOT FITTED: no fit
row exercises it (devices.HOST_SYNC_S gives its source). A host slower than its GPU between two waits (the ops of a
fine-grained block, each issued at the host's rate, longer than the GPU's kernels) keeps the GPU waiting for the whole
segment: host_issue.py prices it from the ops a runtime declares per block (Runtime.moe_host_ops). What it leaves out:
where the dispatch exchanges the counts among the expert group before its host reads them (DeepEP's and HybridEP's
received counts), each wait also lasts until the slowest peer has issued its dispatch; not priced.
"""

from __future__ import annotations

from paracube.cost_models.compute import GemmModel
from paracube.cost_models.dims import Dims

HOST_WAIT = ".host_wait"  # the event engine's op name suffix of a block's wait (moe_program.py)


def waits_per_forward(moe: object, d: Dims) -> int:
    """Host waits per MoE block forward (module docstring): 1 for a block of a runtime that waits, dropless or not
    padded to its capacity, else 0."""
    sized = getattr(moe, "capacity_factor", None) is not None and d.moe_capacity == "pad"
    return int(d.moe_host_sync and not sized)


def sync_seconds(moe: object, d: Dims, g: GemmModel) -> float:
    """Seconds one MoE block forward idles on its host's waits (module docstring)."""
    return waits_per_forward(moe, d) * g.sync


__all__ = ["HOST_WAIT", "sync_seconds", "waits_per_forward"]
