"""The routed experts' weighted activation (executor/layers/weighted_glu.py, Megatron-core's WeightedSwiGLUFunction):
for every activation the experts run (plain SwiGLU; GPT-OSS's clamped SwiGLU with its glu offset, with inputs past
its limit so the clamps act), its values and gradients equal act(y) * w by plain autograd (fp64 gradcheck: central
differences at eps 1e-6, torch's default atol 1e-5 / rtol 1e-3, far above fp64 rounding), and it keeps only y and
w for backward (their bytes, counted with saved_tensors_hooks, against plain autograd's, which keeps more)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from paracube.executor.layers.llama import swiglu
from paracube.executor.layers.weighted_glu import weighted_act
from paracube.gpt_oss_spec import SWIGLU_ALPHA

ACTS = {"swiglu": swiglu, "gpt-oss": partial(swiglu, limit=0.7, alpha=SWIGLU_ALPHA)}
N, F = 6, 4  # copies, expert width


def _inputs(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    y = (torch.randn(N, 2 * F, generator=gen) * 1.5).to(dtype)  # some past the clamp's 0.7 either way
    w = torch.rand(N, 1, generator=gen, dtype=torch.float64)
    return y.requires_grad_(), w.requires_grad_()


def _saved_bytes(fn, *args: torch.Tensor) -> int:  # type: ignore[no-untyped-def]
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(saved.values())


@pytest.mark.parametrize("name", list(ACTS))
def test_its_gradients_equal_plain_autograds(name: str) -> None:
    act = ACTS[name]
    y, w = _inputs()
    assert torch.autograd.gradcheck(lambda y, w: weighted_act(y, w, act), (y, w))
    out = weighted_act(y, w, act)
    ref = act(y) * w
    assert torch.equal(out, ref)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (y, w), g)
    want = torch.autograd.grad(ref, (y, w), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)  # fp64, a few roundings apart


@pytest.mark.parametrize("name", list(ACTS))
def test_it_keeps_only_its_input_and_the_weights(name: str) -> None:
    act = ACTS[name]
    y, w = _inputs(torch.float32)  # fp32 activations, fp64 weights: the output in y's dtype
    out = weighted_act(y, w, act)
    assert out.dtype == torch.float32
    kept = _saved_bytes(lambda y, w: weighted_act(y, w, act), y, w)
    assert kept == y.numel() * 4 + w.numel() * 8
    assert _saved_bytes(lambda y, w: act(y) * w, y, w) > kept  # plain autograd keeps act(y) too
