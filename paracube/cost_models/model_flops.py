"""Model FLOPs of one optimizer step: the numerator of MFU (analytic.py, event.py), not a time.

    model FLOPs = 3 (L (2 T sum_w + 4 B s^2 h) + 2 T h V),   T = B s tokens of the global batch B,
sum_w the block linears' h_in h_out summed (Dims.sum_w), V the vocabulary: Narayanan et al. 2021's count
(72 B s l h^2 (1 + s / 6h + V / 12 l h) with the block linears counted as they are), backward twice the forward, no
recomputation, the whole s x s of attention (no causal or window sparsity): the convention `model_flops_per_step`
states with its sources. What a rank computes, and in what time, is compute.py's.
"""

from __future__ import annotations

from paracube.cost_models.context_dims import full_sequence
from paracube.cost_models.dims import Dims


def model_flops_per_step(d: Dims) -> float:
    """Model FLOPs of one optimizer step for the whole model (fwd + bwd, no recomputation); a cp rank's dims are
    taken back to whole sequences first: the numerator of MFU (analytic.py, event.py).

    Convention (Narayanan et al. 2021, eq. 72 B s l h^2 (1 + s / 6h + V / 12 l h) with the block linears counted as
    they are): per block the linears' 2 T h_in h_out, and the scores Q K^T and values P V at 2 b s^2 h each over the
    whole s x s, no causal sparsity; backward twice the forward. A sliding-window block (Dims.window) counts the
    same s x s: windows are the kernel's saving (compute.attention_core_time prices the band it computes), not model
    FLOPs, as every published convention counts them: torchtitan's MoE / GPT-OSS count (models/utils.py
    get_moe_model_nparams_and_flops, 0.3.0) puts 6 x heads x (qk + v head width) x seq_len per token in every block
    with attention, windowed or not ("we follow the convention and do not account for sparsity in causal
    attention"); Megatron-LM's num_floating_point_operations (as Megatron-Bridge 0.3.1 training/utils/flop_utils.py
    carries it; megatron-core's wheel has no megatron/training) halves the score term for the causal mask and has
    no window term. So MFU compares windowed and unwindowed models on one count of work."""
    d = full_sequence(d)
    T = d.global_batch * d.s
    per_layer = 2 * T * d.sum_w() + 4 * d.global_batch * d.s * d.s * d.h
    return 3.0 * (d.L * per_layer + 2 * T * d.h * d.V)
