"""Where an MoE block's sequences are split (executor/model/moe.py's sequence-wise aux loss reads it): the ranks
holding parts of one sequence, and so the group its per-sequence statistics are summed over.

A rank's tokens of a micro-batch [b, s] are [b, s / (cp t)]: context parallelism gives each cp rank the
load-balanced chunks i and 2 cp - 1 - i of every sequence (executor/layers/context_parallel.py), and 1D with sp
splits those again over the tensor group's t ranks; without sp (mode none) t = 1. Each rank routes its own tokens
(router, top-k, capacity, dispatch and combine are per token or per rank: nothing there needs a whole sequence, as
in Megatron-core, whose router sees the rank's [s / (cp t), b] tokens); the shared expert is the dense MLP's
linears on the same tokens (as a dense block's MLP under cp). Only the auxiliary loss is per sequence.

DeepSeek-V3's sequence-wise balance loss, L = aux_loss x sum_e f_e P_e over one sequence of s tokens, is computed
as Megatron-core 0.16.1 does (transformer/moe/router.py l.315-366 `_apply_seq_aux_loss`): the [b, E] per-sequence
copy counts summed over the tensor-and-context-parallel group (moe_utils.py l.214-233
`get_tokens_per_expert_and_token_count`: one all_reduce over `reduce_group=self.tp_cp_group`, router.py l.48; the
sequence's tokens = the local ones x the group's size), the probabilities' sums P_e left local (moe_utils.py
l.72-85: loss = E sum_i f_i sum_j P_ij, the ranks' partial sums adding up to the sequence's). Here that group is
modes/experts.aux_count_axes, ("cp", *tensor axes) (executor/mesh.py creates it where both are > 1;
cost_models/moe_counts.py prices the same all_reduce, "moe.aux_counts"), and the loss's gradient is scaled by
the sequence's s, not the rank's s / (cp t) (moe.py's _AuxLossScaler).
"""

from __future__ import annotations

from typing import Any

from paracube.modes.experts import aux_count_axes


def sequence_split(mode: Any) -> tuple[tuple[str, ...], int]:
    """(axes, ways) of a mode (serial.Mode or a tensor mode): the group holding parts of one sequence and its size
    (1D + sp: mode.sp is the layout's sp; mode none has no tensor axes)."""
    axes = aux_count_axes(mode.mesh.layout)
    return axes, mode.mesh.size(axes) if axes else 1


__all__ = ["sequence_split"]
