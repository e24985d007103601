"""Saved activations of attention wider or narrower than hidden / heads per head (Qwen3's head_dim) and of
multi-head latent attention (DeepSeek-V2/V3), in both counts (equivalence: a closed form per family against the
count; the executor's measured saved bytes against paracube's count).

- Megatron's count (block_acts.megatron_block_bytes): the wide-head model minus the same model at hidden / heads
  per head equals 4 (q_width - h) + 4 (kv_width - kv) + qk norms' inputs, less the projection input's FP8 saving
  (the keys' and values' part Korthikanti's GQA terms at the true kv width, the rest block_acts.attention_widths'),
  in every recomputation, sp and tp; MLA's per block equals a per-tensor sum
  written out here by hand (Megatron-core's MLA: latents, q, k, v, output).
- paracube's count (activations.block_bytes): MLA measured on the executor (tests/dist_helpers.saved_bytes, the
  storages autograd saves during one forward) on tiny-mla with dense MLPs, none / 1D / 1D + sp, rc none and
  selective, within 2% (the bound test_fidelity.py holds the dense count to: the model leaves out a few
  per-token scalars of the loss; measured here 0.1%-1%).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from dist_helpers import run_distributed, saved_bytes

from paracube.cost_models import estimate
from paracube.cost_models.activations import block_bytes
from paracube.cost_models.block_acts import attention_widths
from paracube.cost_models.block_acts import megatron_block_bytes as _block_acts
from paracube.cost_models.dims import dims_of
from paracube.cost_models.validity import layout_arrays
from paracube.executor import Mesh, build_model
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

QWEN = PRESETS["qwen3-30b-a3b"]
DSV3 = PRESETS["deepseek-v3"]


def _dims(model, dtype: str, recompute: str, wide: bool = False, **fields):  # noqa: ANN001, ANN202
    """The model's dense dims (no experts), at its own head width (`wide`) or at hidden / heads per head."""
    d = dims_of(replace(model, moe=None) if wide else replace(model, moe=None, head_size=None, qk_norm=False),
                TrainingSpec(global_batch=64, dtype=dtype, recompute=recompute, activations="megatron"))
    return replace(d, **fields)


LAYOUTS = ["tp=none,mb=2", "tp=1d:4,mb=1", "tp=1d:4,mb=1,sp"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("rc", ["none", "selective", "full"])
def test_megatron_wide_heads_closed_form(layout: str, dtype: str, rc: str) -> None:
    """Qwen3-30B-A3B (h 2048, 32 heads of 128, 4 kv heads, qk norms): wide minus h / heads per head."""
    lay = parse_layout(layout)
    b = layout_arrays(lay, lay.micro_batch)
    narrow, wide = _dims(QWEN, dtype, rc), _dims(QWEN, dtype, rc, wide=True)
    diff = _block_acts(wide, lay.mode, b, rc) - _block_acts(narrow, lay.mode, b, rc)
    t = lay.tensor_size
    qw, kw, h, kv = 32 * 128, 4 * 128, 2048, 4 * 64  # kv: 4 heads of h / heads
    per_token = 4 * (qw - h) + 4 * (kw - kv) + 2 * (qw + kw) - ((qw - h) if dtype == "fp8" else 0)
    expected = 0.0 if rc == "full" else per_token * lay.micro_batch * narrow.s / t  # all split over the heads
    assert diff[0] == pytest.approx(expected, rel=1e-12)
    assert attention_widths(wide) == (0.0, per_token - 4 * (kw - kv))  # the keys' and values': _gqa_saving's


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("rc", ["none", "selective"])
def test_megatron_mla_per_tensor_sum(layout: str, dtype: str, rc: str) -> None:
    """DeepSeek-V3's block (flash): Korthikanti's non-attention terms plus MLA's tensors, bytes per token at 2 a
    element (FP8: 1 for each linear's saved input), written tensor by tensor."""
    lay = parse_layout(layout)
    b = layout_arrays(lay, lay.micro_batch)
    d = _dims(DSV3, dtype, rc)
    h, f, H, t = d.h, d.f, d.heads, lay.tensor_size
    rq, rkv, dn, dr, dv = 1536, 512, 128, 64, 128
    e = 1 if dtype == "fp8" else 2  # a linear's saved input
    # every tensor rank whole without sp: the input norm's input, the down projections' input (FP8: each its own
    # cast), the up projections' norm inputs and norm outputs, the MLP norm's input and fc1's input
    whole = 2 * h + (2 * h if dtype == "fp8" else 2 * h) + 2 * (rq + rkv) + e * (rq + rkv) + 2 * h + e * h
    # over the heads: q, k (H (dn + dr) each), v, the core's output (= the projection's input), SwiGLU's input
    # (2f wide) and fc2's input (f)
    split = 2 * H * (dn + dr) * 2 + 2 * H * dv + e * H * dv + 2 * 2 * f + e * f
    sp = lay.sequence_parallel
    per_token = (whole + split) / t if sp else whole + split / t
    assert _block_acts(d, lay.mode, b, rc)[0] == pytest.approx(per_token * lay.micro_batch * d.s, rel=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rc", ["none", "selective", "full"])
def test_executor_count_wide_heads_closed_form(layout: str, rc: str) -> None:
    """paracube's count, Qwen3-30B-A3B's attention (what the executor's llama attention keeps at these widths;
    measured against the count in tests/test_qk_norm_run.py): wide minus h / heads per head."""
    lay = parse_layout(layout)
    b = layout_arrays(lay, lay.micro_batch)
    narrow = replace(_dims(QWEN, "bf16", rc), activations="paracube")
    wide = replace(_dims(QWEN, "bf16", rc, wide=True), activations="paracube")
    diff = block_bytes(wide, lay.mode, b) - block_bytes(narrow, lay.mode, b)
    c, t, T = 2, lay.tensor_size, lay.micro_batch * narrow.s
    qw, kw, h, kv = 32 * 128, 4 * 128, 2048, 4 * 64
    # q, k, v (views of the qkv output, or the qkv output selective keeps), the output (projection's input), the
    # q / k norms' inputs and fp32 rstd per head; the rotary tables [s, head width] (cos, sin; selective: remade)
    per_token = c * (qw + 2 * kw - h - 2 * kv) + c * (qw - h) + c * (qw + kw) + 4 * (32 + 4)
    rotary = 2 * c * narrow.s * (128 - 64) if rc == "none" else 0.0
    expected = 0.0 if rc == "full" else per_token * T / t + rotary
    assert diff[0] == pytest.approx(expected, rel=1e-12)


# --- paracube's count, measured on the executor --------------------------------------------------------------
TINY = replace(PRESETS["tiny-mla"], name="tiny-mla-dense", moe=None, seq_len=16)
# CPU's flash kernel needs the values' head width equal to the queries' (else scaled_dot_product_attention falls
# back to the math path, which keeps the s x s scores): flash cases use v_head_dim = d_n + d_r, the preset's own
# widths (v 16, q / k 24) run the unfused core (fa=0)
SPECS = {"flash": replace(TINY, mla=replace(TINY.mla, v_head_dim=TINY.mla.qk_head_dim)), "unfused": TINY}
MB = 2
CASES = [("dp=1", "none", "flash"), ("tp=1d:2", "none", "flash"), ("tp=1d:2,sp", "none", "flash"),
         ("tp=1d:2", "selective", "flash"), ("tp=1d:2,sp", "selective", "flash"), ("tp=1d:2,fa=0", "none", "unfused"),
         ("tp=1d:2,sp,fa=0", "selective", "unfused")]


def _measure(rank: int, world: int, cases: list[tuple[str, str, str]]) -> list[int]:
    import torch

    out = []
    for text, rc, kind in cases:
        spec = SPECS[kind]
        layout = parse_layout(text)
        if rank >= layout.world_size:
            Mesh(layout, 0)
            out.append(0)
            continue
        gen = torch.Generator().manual_seed(3)
        ids = torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen)
        labels = torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen)
        out.append(saved_bytes(build_model(spec, Mesh(layout, rank), seed=7, recompute=rc), ids, labels)[1])
    return out


def test_mla_executor_saved_bytes_equal_count() -> None:
    measured = run_distributed(_measure, 2, CASES)[0]
    for (text, rc, kind), got in zip(CASES, measured, strict=True):
        layout = parse_layout(text).with_(micro_batch=MB)
        training = TrainingSpec(global_batch=MB * 2, dtype="fp32", recompute=rc)
        topo = load_topology("local-cpu", gpus=layout.world_size)
        est = estimate(SPECS[kind], training, layout, topo, with_events=False)
        print(text, rc, kind, "measured", got, "predicted", est.memory.activations)
        assert got == pytest.approx(est.memory.activations, rel=0.02), (text, rc, kind)
    assert np.all(np.asarray(measured) > 0)
