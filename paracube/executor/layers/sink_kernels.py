"""Attention sinks merged into a kernel's log-sum-exp (sinks.py: the parameter and its other paths), and the same
kernel call without sinks for masked attention (`masked_flash`: functional.flash_attention's windows and split
sequences), both keeping no mask where the caller passes the mask's recipe.

A softmax with one more column s_h (value 0) in every row of head h is the plain softmax rescaled once per row:
with the kernel's row log-sum-exp L and output O,

    L' = logaddexp(L, s_h),  O' = O e^(L - L')                                   (`sink_merge`)

and its backward is the plain kernel's backward run with (O', L') in place of (O, L): P_j = exp(S_j - L') are the
sink softmax's probabilities, D' = rowsum(dO' O') its row terms, so dQ, dK, dV come out exact, and the sink column
adds ds_h = -sum_rows e^(s_h - L') D' (`sink_grad`). Context parallelism applies both after its blocks' merge
(context_parallel.py); `fused_sink_flash` applies them around one flash kernel call: a torch.autograd.Function that
saves q, k, v, O', L' and s only (FlashAttention with sinks, FA3 / cuDNN: what the activation count prices), plus,
where the caller passes a mask (a sliding window, a sequence split over ranks) without the recipe that made it, that
boolean mask [c, keys] (1 byte per score). With its recipe (`remake`, a call that builds the same mask: the
executor's blocks pass attention_mask.sequence_mask / tokens.window_mask with their arguments) nothing of the mask
is kept: backward builds it again, O(c keys) elementwise work beside the kernel's O(c keys d), as FlashAttention
builds its causal / window mask from positions inside the kernel (the kernel's own float mask is remade either way).
O' is stored [b, c, H, d] (heads inner), so the caller's transpose(1, 2).reshape is a view and the projection saves
the same storage.

The kernel, `kernel_for` (torch 2.13's aten ops; signatures: native_functions.yaml, torch/_meta_registrations.py
meta__scaled_dot_product_flash_attention_for_cpu, meta__scaled_dot_product_flash_attention,
meta__scaled_dot_product_efficient_attention, and their _backward):
- CPU ("cpu_flash"): aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0, is_causal, attn_mask=, scale=)
  -> (out, lse [b, H, c] in fp32 / fp64) and its _backward(grad, q, k, v, out, lse, 0, is_causal, attn_mask=,
  scale=), where scaled_dot_product_attention's own choice (torch._fused_sdp_choice) is FLASH_ATTENTION: fp32,
  fp64, bf16, fp16; grouped-query k, v read natively; the mask a float [c, keys] in q's dtype (0 / -inf).
- CUDA, causal, no mask ("cuda_flash"): aten._scaled_dot_product_flash_attention (FlashAttention-2, lse [b, H, c]
  fp32; grouped-query native) and _scaled_dot_product_flash_attention_backward, where
  torch.backends.cuda.can_use_flash_attention holds (fp16 / bf16, the head widths it takes);
- CUDA otherwise ("cuda_efficient"): aten._scaled_dot_product_efficient_attention with an explicit float bias
  [b, H, c, keys] (causal or the mask, its rows padded to 16 as scaled_dot_product_attention pads them; remade in
  backward, never saved), lse [b, H, 32 ceil(c / 32)] fp32, k and v repeated to the query heads inside the call and
  their gradients summed back (the saved k, v stay the kv heads'), where can_use_efficient_attention holds.
  Both CUDA ops also save their philox seed and offset (empty or scalar tensors at dropout 0).
Everything else runs sinks.py's padded path (one more key through scaled_dot_product_attention, which keeps d + 1
wide copies): attention dropout (the kernels' dropout would need their RNG state carried to backward), a CUDA
tensor neither kernel takes (fp64, a head width beyond them), other devices. cuDNN attention is not used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend

from paracube.executor.layers.kv_heads import expand as expand_kv
from paracube.executor.layers.kv_heads import fold as fold_kv

aten = torch.ops.aten
_BIAS_ALIGN = 16  # the efficient kernel's bias row alignment (scaled_dot_product_attention pads to it)


def sink_merge(out: Tensor, lse: Tensor, sinks: Tensor | None) -> tuple[Tensor, Tensor]:
    """(O', L') of a row's merged blocks (out [b, H, n, d], lse [b, H, n, 1]) with the sink column; unchanged
    without sinks."""
    if sinks is None:
        return out, lse
    new = torch.logaddexp(lse, sinks.to(lse.dtype).view(1, -1, 1, 1))
    return out * torch.exp(lse - new), new


def sink_grad(sinks: Tensor | None, lse: Tensor, delta: Tensor) -> Tensor | None:
    """ds [H] = -sum over batch and rows of p_sink D' (lse: L', delta: D' = rowsum(dO' O'), [b, H, n, 1])."""
    if sinks is None:
        return None
    p_sink = torch.exp(sinks.to(lse.dtype).view(1, -1, 1, 1) - lse)
    return -(p_sink * delta).sum((0, 2, 3)).to(sinks.dtype)


def _float_mask(allowed: Tensor | None, c: int, keys: int, like: Tensor) -> Tensor:
    """The additive [c, keys] mask in like's dtype: 0 where allowed, -inf elsewhere (None: causal)."""
    if allowed is None:
        allowed = torch.ones(c, keys, dtype=torch.bool, device=like.device).tril()
    return torch.zeros(allowed.shape, dtype=like.dtype, device=like.device).masked_fill_(~allowed, float("-inf"))


def _bias(allowed: Tensor | None, q: Tensor, keys: int) -> Tensor:
    """The efficient kernel's bias [b, H, c, keys]: the float mask, rows padded to _BIAS_ALIGN, broadcast."""
    b, heads, c, _ = q.shape
    mask = _float_mask(allowed, c, keys, q)
    padded = torch.nn.functional.pad(mask, (0, -keys % _BIAS_ALIGN))[:, :keys]
    return padded.expand(b, heads, c, keys)


def kernel_for(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> str | None:
    """The fused kernel that runs these operands (module docstring), or None (the padded path)."""
    gqa = q.shape[1] != k.shape[1]
    if q.device.type == "cpu":  # the choice scaled_dot_product_attention makes (a boolean mask is its float one)
        choice = torch._fused_sdp_choice(q, k, v, allowed, 0.0, allowed is None, scale=None, enable_gqa=gqa)
        return "cpu_flash" if choice == SDPBackend.FLASH_ATTENTION.value else None
    if q.device.type == "cuda":
        if allowed is None and torch.backends.cuda.can_use_flash_attention(
                torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, gqa)):
            return "cuda_flash"
        # the efficient call's operands: k, v repeated to the query heads (their shapes, here without the copy)
        r_k, r_v = k[:, :1].expand(*q.shape[:2], *k.shape[2:]), v[:, :1].expand(*q.shape[:2], *v.shape[2:])
        if torch.backends.cuda.can_use_efficient_attention(
                torch.backends.cuda.SDPAParams(q, r_k, r_v, _bias(allowed, q, k.shape[2]), 0.0, False, False)):
            return "cuda_efficient"
    return None


def _forward(kernel: str, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float
             ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """(out [b, H, c, d], lse [b, H, >= c], the kernel's extra state for backward)."""
    if kernel == "cpu_flash":
        mask = None if allowed is None else _float_mask(allowed, *allowed.shape, q)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, allowed is None, attn_mask=mask,
                                                                     scale=scale)
        return out, lse, ()
    if kernel == "cuda_flash":
        out, lse, _, _, _, _, seed, offset, _ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False,
                                                                                         scale=scale)
        return out, lse, (seed, offset)
    group = q.shape[1] // k.shape[1]
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
        q, expand_kv(k, group), expand_kv(v, group), _bias(allowed, q, k.shape[2]), True, 0.0, False, scale=scale)
    return out, lse, (seed, offset)


def _backward(kernel: str, grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              allowed: Tensor | None, state: tuple[Tensor, ...], scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's own backward with out = O', lse = L': the sink softmax's dq, dk, dv (module docstring)."""
    if kernel == "cpu_flash":
        mask = None if allowed is None else _float_mask(allowed, *allowed.shape, q)
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, allowed is None, attn_mask=mask, scale=scale)
    if kernel == "cuda_flash":
        c, keys = q.shape[2], k.shape[2]
        return aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, None, None, c, keys, 0.0, True, *state, scale=scale)
    group = q.shape[1] // k.shape[1]
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        grad, q, expand_kv(k, group), expand_kv(v, group), _bias(allowed, q, k.shape[2]), out, lse, *state, 0.0,
        [True, True, True, False], False, scale=scale)
    return dq, fold_kv(dk, group), fold_kv(dv, group)


class _FusedSinkFlash(torch.autograd.Function):
    """One flash kernel call with the sink merged into its log-sum-exp (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None, allowed: Tensor | None, kernel: str,
                scale: float, remake: Callable[[], Tensor] | None) -> Tensor:
        b, heads, c, d = q.shape
        out, lse, state = _forward(kernel, q, k, v, allowed, scale)
        if sinks is None:  # a masked flash call alone: O and L as the kernel gives them, O heads inner
            new = lse
            merged = out if out.transpose(1, 2).is_contiguous() else out.transpose(1, 2).contiguous().transpose(1, 2)
        else:
            new = torch.logaddexp(lse, sinks.to(lse.dtype).view(1, heads, 1))  # L', the kernel's shape (rows >= c)
            rescale = torch.exp(lse[..., :c] - new[..., :c]).unsqueeze(-1)
            merged = torch.empty_permuted((b, heads, c, d), (0, 2, 1, 3), dtype=q.dtype, device=q.device)
            torch.mul(out, rescale, out=merged)  # O' heads inner: the caller's [b, c, H d] is a view of it
        ctx.save_for_backward(q, k, v, merged, new, sinks, allowed if remake is None else None, *state)
        ctx.args = (kernel, scale, remake)
        return merged

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, merged, new, sinks, allowed, *state = ctx.saved_tensors
        kernel, scale, remake = ctx.args
        allowed = allowed if remake is None else remake()
        c = q.shape[2]
        dq, dk, dv = _backward(kernel, grad, q, k, v, merged, new, allowed, tuple(state), scale)
        if sinks is None:
            return dq, dk, dv, None, None, None, None, None
        up = new.dtype
        delta = (grad.to(up) * merged.to(up)).sum(-1, keepdim=True)  # D' = rowsum(dO' O')
        ds = sink_grad(sinks, new[..., :c].unsqueeze(-1), delta)
        return dq, dk, dv, ds, None, None, None, None


def fused_sink_flash(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, allowed: Tensor | None, kernel: str,
                     scale: float, remake: Callable[[], Tensor] | None = None) -> Tensor:
    """Attention with sinks, q [b, H, c, d], k, v [b, kv, keys, d] (H a multiple of kv), sinks [H], causal over whole
    sequences (allowed None: c = keys) or masked by `allowed` [c, keys], by `kernel` (kernel_for) -> [b, H, c, d].
    `remake`: a call returning `allowed` again, so backward rebuilds the mask instead of keeping it."""
    return _FusedSinkFlash.apply(q, k, v, sinks, allowed, kernel, scale, remake)


def masked_flash(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, kernel: str, scale: float,
                 remake: Callable[[], Tensor] | None) -> Tensor:
    """Attention without sinks masked by `allowed` [c, keys] through the same Function (q, k, v, O, L kept; the mask
    rebuilt by `remake` in backward, or kept as booleans without it), where scaled_dot_product_attention would keep
    the mask as a float tensor in q's dtype (CPU's flash op) or a float bias (CUDA's efficient op)."""
    return _FusedSinkFlash.apply(q, k, v, None, allowed, kernel, scale, remake)


__all__ = ["fused_sink_flash", "kernel_for", "masked_flash", "sink_grad", "sink_merge"]
