"""One MoE block's memory-bound passes on the most loaded rank (cost_models/moe.py prices them at the device's memory
rate x mem_eff, with the block's compute, in both engines).

Bytes (Megatron-core 0.16 moe_utils.permute / sort_chunks_by_idxs / unpermute, token_dispatcher.py, TEGroupedMLP;
R the token copies at the rank's experts, T its tokens, c the compute dtype's bytes), by dispatcher
(moe_dispatch.effective):
- alltoall: permute 2 R h (read the tokens per routed copy, write the copies), the sort by local expert and back
  4 R h (ep > 1 and several local experts), unpermute 2 R h + T h;
- deepep: the tokens cross once per GPU (U = n p(n) T etp of them arrive at a rank of the n = ep rank group,
  moe_dispatch.Dispatch.hit, at most R), then the rank permutes them into its R copies, 2 R h, and unpermutes
  them back, 2 R h + U h
  (_DeepepManager.get_permuted / get_restored_hidden_states_by_experts); no sort;
- hybridep: none (its dispatch and combine kernels permute and unpermute, _HybridEPManager);
- every dispatcher: the experts' SwiGLU 3 R f_e / etp forward (its backward twice that: its inputs and gradient
  read, two written);
- with FP8 experts, Transformer Engine's quantization padding (fp8_padded): Fp8Padding copies the experts' input
  into a buffer whose per-expert row counts are rounded up to FP8_ALIGN, Fp8Unpadding copies their output back:
  4 R h each way (two copies of R h, each read and written; the backward runs the same copies on the gradients;
  the routing probabilities' padding, R values, is left out). Both return their input as it is when every count
  is already a multiple of the alignment (always after HybridEP, which pads to it in its dispatch kernel).
Memory-bound work left out: the router's softmax / top-k, the aux loss and the force-balanced random logits, a few
passes over [T, E] values (4096 x 128 x 4 bytes: about 1% of one permute's bytes at h 2048).
"""

from __future__ import annotations

import math

from paracube.cost_models.dims import Dims
from paracube.cost_models.moe_dispatch import dispatch_of, effective
from paracube.layout import Layout

# Hopper FP8 GEMMs take row counts in multiples of 16 (Transformer Engine's Fp8Padding align_size; 32 for MXFP8)
FP8_ALIGN = 16


def fp8_padded(d: Dims, layout: Layout, moe: object, T: int) -> bool:
    """Whether one block's experts copy their input into a padded buffer and their output back (Megatron-core
    TEGroupedMLP with fp8: TE Fp8Padding / Fp8Unpadding, which return the tensor as it is only when every expert's
    token count is already a multiple of FP8_ALIGN): with FP8 experts (Dims.fp8_experts), dropless routing (the
    counts vary from micro-batch to micro-batch: all of a rank's L local experts' counts land on the multiple with
    probability about 16^-L only), or a capacity whose per-expert count ceil(T k cf / E) x ep x etp (every source rank's
    capacity, Megatron-core moe_utils.get_capacity) is off it. Megatron-core's moe_router_padding_for_quantization
    (off by default; "pad the routing_map ... This can remove the explicit padding in the GroupedMLP layer",
    transformer_config.py) would remove the copies; not a runtime's declaration here."""
    if not (d.fp8 and d.fp8_experts) or effective(moe, d.moe_dispatch) == "hybridep":
        return False
    cf = getattr(moe, "capacity_factor", None)
    if cf is None:
        return True
    per_source = math.ceil(T * moe.top_k * cf / moe.experts)  # type: ignore[attr-defined]
    return (per_source * layout.ep * layout.etp) % FP8_ALIGN != 0


def pass_bytes(d: Dims, layout: Layout, ffn: int, local: int, T: int, R: float, padded: bool = False,
               moe: object = None) -> tuple[float, float]:
    """(forward, backward) bytes of one block's memory-bound passes on the most loaded rank (module docstring): the
    token moves of the dispatcher Dims.moe_dispatch runs for `moe` (alltoall without it: permute 2 R h, the sort by
    local expert and back 4 R h with ep > 1 and several local experts, unpermute 2 R h + T h), the experts' SwiGLU
    3 R f_e / etp forward (twice that backward: its inputs and gradient read, two written); `padded` (fp8_padded):
    the FP8 quantization padding of the experts' input and the unpadding of their output, 4 R h each way (each a
    copy of R h, read and written; backward the same copies of the gradients)."""
    c, h = d.c, d.h
    kind = "alltoall" if moe is None else effective(moe, d.moe_dispatch)
    if kind == "hybridep":
        moves = 0.0
    elif kind == "deepep":
        n = layout.ep  # the all_to_all's group; each arrived token is gathered over etp after it
        arrived = min(R, (n * dispatch_of(moe, kind).hit(n) if n > 1 else 1.0) * T * layout.etp)
        moves = 4 * R * h + arrived * h
    else:
        sort = 4 * R * h if layout.ep > 1 and local > 1 else 0.0
        moves = 2 * R * h + sort + 2 * R * h + T * h
    moves = c * (moves + (4 * R * h if padded else 0.0))
    act = c * 3 * R * ffn / layout.etp
    return moves + act, moves + 2 * act


__all__ = ["FP8_ALIGN", "fp8_padded", "pass_bytes"]
