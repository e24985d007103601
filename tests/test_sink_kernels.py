"""Attention sinks fused into the flash kernel (paracube/executor/layers/sink_kernels.py) against the sink softmax
written out, and what it saves for backward.

- Values: `sink_flash` (which runs the fused Function on CPU: asserted) against an unfused reference written here
  (scores, a sink column s_h per row, softmax, the column dropped, times v; k and v repeated over their query
  heads) in fp64: output, dq, dk, dv and ds, causal, a sliding window, and a split sequence's mask (queries the
  last c of more keys), with and without grouped-query heads. Bound: relative 1e-10 of the largest reference
  value. Both are fp64 sums of <= 24 terms (a few roundings of 2^-53 ~ 1e-16 relative each, ~1e-15 measured
  here): a wrong formula (a sink counted twice, a missing rescale, D taken from O instead of O') differs by
  > 1e-3, so the bound separates the two with room on any CPU. gradcheck (finite differences) on a tiny case.
- Memory: the distinct storages saved for backward by one call (saved_tensors_hooks) are q, k, v, O', L' and s,
  plus the boolean mask [c, keys] where one is passed without the recipe that made it (`remake`); with it, backward
  builds the mask again and the values are the same bit for bit. O' is the storage the caller's [b, c, H d] view
  reads.
- The OSS model of tests/test_gpt_oss_run.py (one rank, mb 2, fp32, rc none): its saved bytes (dist_helpers.
  saved_bytes) equal the activation count on flash (its blocks pass their masks' recipes); unfused, they exceed it
  by the sink probabilities [b, heads, s] fp32 per block. Printed with -s (sinks.py's figure).
- Without sinks, a masked flash call (functional.flash_attention with the mask's recipe) runs the same Function:
  bit for bit scaled_dot_product_attention's values, keeping no mask where that keeps it as floats.
- Attention dropout runs the padded path (sinks.py).
- The CUDA kernels' calls (flash, efficient) run on meta tensors: argument order and the shapes of the outputs
  and gradients (no numerics: no GPU here).
"""

from __future__ import annotations

import math

import pytest
import torch
from dist_helpers import saved_bytes
from test_gpt_oss_run import OSS

from paracube.cost_models import estimate
from paracube.executor import Mesh, build_model
from paracube.executor.layers.attention_mask import sequence_mask
from paracube.executor.layers.functional import flash_attention
from paracube.executor.layers.sink_kernels import fused_sink_flash, kernel_for
from paracube.executor.layers.sinks import padded_sink_flash, sink_flash
from paracube.executor.layers.tokens import window_mask
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

F64 = torch.float64
TOL = 1e-10  # fp64 (module docstring)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
               allowed: torch.Tensor) -> torch.Tensor:
    """softmax over [scores, s_h] with the sink's column dropped, times v."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    sink = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1] @ v


def _masks(c: int, keys: int) -> dict[str, torch.Tensor | None]:
    cpu = torch.device("cpu")
    return {"causal": None, "window": sequence_mask(c, 3, cpu),
            # the last c of `keys` tokens, two sequences of 6 in the window (executor/layers/tokens.py)
            "split": window_mask((keys - c, 0, 6), c, keys, cpu, 4)}


def _operands(kv: int, group: int, c: int, keys: int, dtype: torch.dtype, seed: int = 3) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    d = 8
    q = torch.randn(2, kv * group, c, d, generator=gen, dtype=dtype)
    k, v = (torch.randn(2, kv, keys, d, generator=gen, dtype=dtype) for _ in range(2))
    sinks = torch.randn(kv * group, generator=gen, dtype=dtype).mul(2)
    return tuple(t.requires_grad_() for t in (q, k, v, sinks))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("group", [1, 3], ids=["mha", "gqa"])
@pytest.mark.parametrize("mask", ["causal", "window", "split"])
def test_fused_sinks_match_the_sink_softmax(group: int, mask: str) -> None:
    c, keys = (6, 6) if mask != "split" else (6, 10)
    q, k, v, sinks = _operands(2, group, c, keys, F64)
    allowed = _masks(c, keys)[mask]
    assert kernel_for(q, k, v, allowed) == "cpu_flash"  # sink_flash runs the fused Function, not the fallback
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(4), dtype=F64)
    ref_mask = allowed if allowed is not None else torch.ones(c, keys, dtype=torch.bool).tril()
    runs = []
    for fn in (lambda: sink_flash(q, k, v, sinks, 0.0, None, group > 1, allowed),
               lambda: _reference(q, k, v, sinks, ref_mask)):
        out = fn()
        runs.append((out, *torch.autograd.grad(out, (q, k, v, sinks), grad)))
    for ours, ref, what in zip(runs[0], runs[1], ("out", "dq", "dk", "dv", "ds"), strict=True):
        assert ours.shape == ref.shape and _rel(ours, ref) < TOL, (what, _rel(ours, ref))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask, enable_gqa=group > 1)
    assert _rel(plain, runs[1][0]) > 1e-3  # the sinks change the output (the comparison is not vacuous)


@pytest.mark.parametrize("mask", ["causal", "split"])
def test_fused_sinks_gradcheck(mask: str) -> None:
    c, keys = (3, 3) if mask == "causal" else (3, 5)
    q, k, v, sinks = _operands(1, 2, c, keys, F64, seed=5)
    q, k, v = q[:1, :, :, :4].detach().requires_grad_(), k[:1, :, :, :4].detach().requires_grad_(), \
        v[:1, :, :, :4].detach().requires_grad_()
    allowed = None if mask == "causal" else window_mask((keys - c, 0, 4), c, keys, torch.device("cpu"))
    kernel = kernel_for(q, k, v, allowed)
    assert kernel == "cpu_flash"
    assert torch.autograd.gradcheck(lambda *t: fused_sink_flash(*t, allowed, kernel, 0.5), (q, k, v, sinks))


def _saved_storages(fn: object) -> tuple[torch.Tensor, dict[int, int]]:
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()  # type: ignore[operator]
    return out, saved


@pytest.mark.parametrize("remade", [False, True], ids=["mask-kept", "mask-remade"])
@pytest.mark.parametrize("mask", ["causal", "window", "split"])
def test_fused_sinks_save_q_k_v_o_l_and_s(mask: str, remade: bool) -> None:
    c, keys = (6, 6) if mask != "split" else (6, 10)
    q, k, v, sinks = _operands(2, 3, c, keys, torch.float32)
    allowed = _masks(c, keys)[mask]
    remake = (lambda: _masks(c, keys)[mask]) if remade else None
    out, saved = _saved_storages(lambda: sink_flash(q, k, v, sinks, 0.0, None, True, allowed, remake))
    b, heads, _, d = q.shape
    lse = 4 * b * heads * c  # fp32
    expected = sum(t.nbytes for t in (q, k, v, sinks)) + out.nbytes + lse
    expected += 0 if allowed is None or remade else c * keys  # the boolean mask, one byte per score
    assert sum(saved.values()) == expected, (saved, expected)
    grads = torch.autograd.grad(out, (q, k, v, sinks), torch.ones_like(out))
    kept = sink_flash(q, k, v, sinks, 0.0, None, True, allowed)
    assert torch.equal(out, kept)
    kept_grads = torch.autograd.grad(kept, (q, k, v, sinks), torch.ones_like(kept))
    assert all(torch.equal(a, b) for a, b in zip(grads, kept_grads, strict=True))
    assert out.untyped_storage().data_ptr() in saved
    flat = out.transpose(1, 2).reshape(b, c, heads * d)  # the caller's layout: a view of the saved O'
    assert flat.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    _, padded = _saved_storages(lambda: padded_sink_flash(q, k, v, sinks, 0.0, None, True, allowed))
    assert sum(padded.values()) > expected  # the fallback's d + 1 wide copies (the figure the fused path removes)


@pytest.mark.parametrize("mask", ["window", "split"])
def test_masked_flash_without_sinks_keeps_no_mask(mask: str) -> None:
    """functional.flash_attention with a mask and its recipe (sink_kernels.masked_flash): bit for bit
    scaled_dot_product_attention's output and gradients (the same CPU flash op, the same float mask), saving q, k,
    v, O and L only, where scaled_dot_product_attention also keeps the [c, keys] float mask."""
    c, keys = (6, 6) if mask != "split" else (6, 10)
    q, k, v, _ = _operands(2, 3, c, keys, torch.float32)
    allowed = _masks(c, keys)[mask]
    out, saved = _saved_storages(lambda: flash_attention(q, k, v, 0.0, None, True, allowed, lambda: allowed))
    sdpa, sdpa_saved = _saved_storages(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, enable_gqa=True))
    assert torch.equal(out, sdpa)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    sdpa_grads = torch.autograd.grad(sdpa, (q, k, v), torch.ones_like(sdpa))
    assert all(torch.equal(a, b) for a, b in zip(grads, sdpa_grads, strict=True))
    lse = 4 * q.shape[0] * q.shape[1] * c  # fp32
    assert sum(saved.values()) == sum(t.nbytes for t in (q, k, v)) + out.nbytes + lse
    assert sum(sdpa_saved.values()) == sum(saved.values()) + 4 * c * keys  # its fp32 mask


@pytest.mark.parametrize("kernel", ["cuda_flash", "cuda_efficient"])
def test_cuda_kernel_calls_on_meta_tensors(kernel: str) -> None:
    """The CUDA ops' arguments in order (their meta kernels check arity and types): O' [b, H, c, d] heads inner,
    gradients shaped as q, k, v (the efficient kernel's k, v repeated and folded back), ds as s."""
    dtype = torch.bfloat16 if kernel == "cuda_flash" else torch.float32
    c, keys = (6, 6) if kernel == "cuda_flash" else (6, 10)
    q, k, v, sinks = (t.detach().to("meta", dtype if t.dim() == 4 else torch.float32).requires_grad_()
                      for t in _operands(2, 3, c, keys, torch.float32))
    allowed = None if kernel == "cuda_flash" else _masks(c, keys)["split"].to("meta")
    out = fused_sink_flash(q, k, v, sinks, allowed, kernel, 1 / math.sqrt(8))
    assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()
    grads = torch.autograd.grad(out, (q, k, v, sinks), torch.ones_like(out))
    assert [g.shape for g in grads] == [t.shape for t in (q, k, v, sinks)]
    assert [g.dtype for g in grads] == [t.dtype for t in (q, k, v, sinks)]


@pytest.mark.parametrize("fa", [1, 0], ids=["flash", "unfused"])
def test_oss_model_saved_bytes_against_the_count(fa: int) -> None:
    """tests/test_gpt_oss_run's OSS model on one rank (module docstring): measured - counted is what the count
    leaves out of the sinks' kernels, by formula (none on flash)."""
    mb = 2
    layout = parse_layout(f"dp=1,fa={fa}").with_(micro_batch=mb)
    gen = torch.Generator().manual_seed(3)
    ids, labels = (torch.randint(0, OSS.vocab, (mb, OSS.seq_len), generator=gen) for _ in range(2))
    measured = saved_bytes(build_model(OSS, Mesh(layout, 0), seed=5, recompute="none"), ids, labels)[1]
    counted = estimate(OSS, TrainingSpec(global_batch=mb * 2, dtype="fp32", recompute="none"), layout,
                       load_topology("local-cpu", gpus=1), with_events=False).memory.activations
    s = OSS.seq_len
    windowed = sum(OSS.attention_window(i) is not None and OSS.attention_window(i) < s for i in range(OSS.layers))
    assert windowed == 1  # "WF": the comparison covers a masked and a causal block
    left_out = 0 if fa else OSS.layers * 4 * mb * OSS.heads * s
    print(f"OSS fa={fa}: measured {measured} B, counted {counted:.0f} B, {(measured / counted - 1) * 100:+.2f}%")
    assert measured - counted == left_out


def test_dropout_runs_the_padded_path() -> None:
    """Attention dropout: no fused kernel (sink_kernels.py: the kernels' RNG state is not carried); sink_flash is the
    padded path with the same seed, and the dropout acts (it differs from the undropped fused output)."""
    q, k, v, sinks = _operands(2, 3, 6, 6, F64)
    dropped = sink_flash(q, k, v, sinks, 0.5, 11, True, None)
    assert torch.equal(dropped, padded_sink_flash(q, k, v, sinks, 0.5, 11, True, None))
    assert _rel(dropped, sink_flash(q, k, v, sinks, 0.0, None, True, None)) > 1e-3
