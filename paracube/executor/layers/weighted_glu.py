"""The routed experts' activation weighted by the routing weights, Megatron-core's way (megatron-core 0.16.1
transformer/moe/experts.py l.680-746 TEGroupedMLP.forward's bias_act_func: act(fc1_out) * permuted_probs, cast back
to the activation's dtype; fused as fusions/fused_bias_swiglu.py l.191-206 WeightedSwiGLUFunction, which saves only
fc1's output and the weights and recomputes the activation in backward, l.90-97 weighted_swiglu_back).

`weighted_act(y, w, act)`: y [n, 2 f] fc1's output (gate and up interleaved), w [n, 1] each copy's routing weight
(the router's dtype: fp32, fp64 for fp64 copies), act: y -> [n, f] (executor/layers/llama.swiglu: plain SwiGLU or
GPT-OSS's clamped one with its glu offset; the experts run no other activation, moe_spec.py). Returns
(act(y) * w).to(y.dtype). Saved for backward: y and w only (not act(y), not the product). Backward re-runs act on
y with a graph (so its gradient is exactly act's autograd one, the clamps' included) and gives
    dy = act'(y)^T (grad * w),   dw = sum over the row of grad * act(y)   (in w's dtype, as Megatron's).
Why: weighting the experts' outputs after fc2 (y2 * w) keeps fc2's output [n, h] for w's gradient; weighting inside
the activation keeps nothing fc2 and the activation do not keep already (cost_models/moe.py's count).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

Act = Callable[[Tensor], Tensor]


class _WeightedAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: Tensor, w: Tensor, act: Act) -> Tensor:
        ctx.save_for_backward(y, w)
        ctx.act = act
        with torch.no_grad():
            return (act(y) * w).to(y.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        y, w = ctx.saved_tensors
        with torch.enable_grad():
            leaf = y.detach().requires_grad_(True)
            a = ctx.act(leaf)
            dy = torch.autograd.grad(a, leaf, (grad.to(w.dtype) * w).to(a.dtype))[0] if ctx.needs_input_grad[0] \
                else None
        dw = (a.detach().to(w.dtype) * grad.to(w.dtype)).sum(-1, keepdim=True) if ctx.needs_input_grad[1] else None
        return dy, dw, None


def weighted_act(y: Tensor, w: Tensor, act: Act) -> Tensor:
    """(act(y) * w).to(y.dtype), keeping only y and w for backward (module docstring)."""
    return _WeightedAct.apply(y, w, act)


__all__ = ["weighted_act"]
