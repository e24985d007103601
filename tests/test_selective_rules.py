"""What `rc=selective` recomputes, as each runtime declares it (Runtime.selective, workload.SELECTIVE_RULES;
cost_models/recompute.py): "attention" (Megatron's attention core; Megatron-core, DeepSpeed, paracube's executor) and
"op" (torchtitan 0.3.0's per-op SelectiveAC: every second matmul of a block and its cheap ops re-run, the attention
core saved), priced by both engines.

Closed forms derived here from the GEMM model and the shapes: the op rule's step minus rc=none's is, per block and
micro-batch, the forward GEMMs of wk, wo and w3 (Llama's 2nd, 4th, 6th matmul; under FP8 at the FP8 model with their
X and W casts) plus the block's elementwise forward; its saved activations are the block input, wq, wv, w1, w2's
outputs and the attention output with its log-sum-exp. Both engines agree (step within 2%, compute to rounding,
memory equal).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paracube.cost_models import fp8, recompute
from paracube.cost_models.activations import block_bytes
from paracube.cost_models.analytic import estimate
from paracube.cost_models.compute import elementwise_forward
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of
from paracube.cost_models.event import estimate_with
from paracube.cost_models.validity import layout_arrays
from paracube.engine_options import EngineOptions
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.runtimes import RUNTIMES, get_runtime
from paracube.topologies import load_topology
from paracube.workload import SELECTIVE_RULES, ModelSpec, TrainingSpec

# Llama with grouped-query attention: h 512, 8 heads of 64, 4 kv heads (kv = 256), SwiGLU f 1408
LLAMA = ModelSpec("small-llama", layers=4, hidden=512, heads=8, ffn_hidden=1408, vocab=512, seq_len=1024,
                  family="llama", kv_heads=4)
H, KV, F, S = 512, 256, 1408, 1024


def _train(recompute: str, dtype: str = "bf16") -> TrainingSpec:
    return TrainingSpec(global_batch=16, dtype=dtype, recompute=recompute)  # type: ignore[arg-type]


def _options(selective: str) -> EngineOptions:
    return get_runtime("torchtitan").engine_options().with_(selective=selective)


def test_runtimes_declare_their_rule() -> None:
    """torchtitan runs the op rule, every other stack Megatron's; engine_options carries it; a bad rule is refused
    in one line naming the valid ones, by the runtime and by the engines."""
    assert SELECTIVE_RULES == ("attention", "op")
    assert {n: r.selective for n, r in RUNTIMES.items()} == {"paracube": "attention", "megatron": "attention",
                                                            "torchtitan": "op", "deepspeed": "attention"}
    assert get_runtime("torchtitan").engine_options().selective == "op"
    with pytest.raises(ValueError) as err:
        replace(get_runtime("torchtitan"), selective="layer")
    assert "\n" not in str(err.value) and "'layer'" in str(err.value) and "attention, op" in str(err.value)
    with pytest.raises(ParacubeError, match=r"^selective rule 'layer'; valid: attention, op$"):
        estimate(LLAMA, _train("selective"), parse_layout("dp=1,tp=none,mb=2"), load_topology("dgx-h100", gpus=8),
                 selective="layer")


def test_the_op_rule_recomputes_every_second_matmul() -> None:
    """torchtitan's Llama block runs wq, wk, wv, wo, w1, w3, w2: wk, wo, w3 re-run (in every dtype: under FP8 the
    policy sees aten.mm on Float8TrainingTensors, recompute.py)."""
    for dtype in ("bf16", "fp8"):
        d = dims_of(LLAMA, _train("selective", dtype))
        widths = [(n, w) for (n, w), again in zip(recompute.matmuls(d), recompute.recomputed(d), strict=True)
                  if again]
        assert recompute.matmuls(d) == [(0, H), (0, KV), (0, KV), (1, H), (2, F), (2, F), (3, H)]
        assert widths == [(0, KV), (1, H), (2, F)], dtype


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_op_rule_time_closed_form(dtype: str) -> None:
    """One H100, dp=1, mb=2 (8 micro-batches, 4 blocks): compute(rc=selective, op) - compute(rc=none) =
    32 x (GEMM(wk) + GEMM(wo) + GEMM(w3) + the elementwise forward), each GEMM at its own shape; under FP8 at the
    FP8 model plus CAST_BYTES per element of its X and W (torchtitan's dynamic scaling casts W at every use)."""
    topo = load_topology("dgx-h100", gpus=1)
    layout = parse_layout("dp=1,tp=none,mb=2")
    g = gemm_model(topo, dtype)
    T = 2.0 * S
    shapes = [(T, KV, H), (T, H, H), (T, F, H)]  # (m, n, k): X [T, k] x W [k, n]
    if dtype == "fp8":
        bw = g.mem_bw * g.mem_eff
        gemms = sum(float(g.linear.gemm_time(m, n, k)) + fp8.CAST_BYTES * (m * k + k * n) / bw for m, n, k in shapes)
    else:
        gemms = sum(float(g.gemm_time(m, n, k)) for m, n, k in shapes)
    d = dims_of(LLAMA, _train("selective", dtype))
    elem = float(elementwise_forward(d, "none", layout_arrays(layout, 2), g)[0])
    assert elem == pytest.approx(2 * (12 * T * H + 4 * T * F) / (g.mem_bw * g.mem_eff))
    op, none = (estimate(LLAMA, _train(rc, dtype), layout, topo, selective="op", fp8_scaling="dynamic")
                for rc in ("selective", "none"))
    assert op.compute_time_s - none.compute_time_s == pytest.approx(8 * 4 * (gemms + elem), rel=1e-9)


def test_op_rule_memory_closed_form() -> None:
    """Saved per block, one micro-batch (T = 2 s tokens, bf16): none: the block input, wq, wv, w1, w2's outputs and
    the attention output, c T (4h + kv + f), plus the fp32 log-sum-exp 4 b heads s; 1D with sp over t = 4: the
    sequence-sharded input c T h / t, the column outputs c T (h + kv + f) / t, w2's [T, h] partial sums c T h, the
    two reduce_scatter outputs 2 c T h / t, the attention output c T h / t, the log-sum-exp / t. The estimate's
    activations differ from rc=none's by L x (those - rc=none's block); temporaries by one block's re-made tensors."""
    T, c = 2.0 * S, 2.0
    lse = 4.0 * 2 * 8 * S
    d = dims_of(LLAMA, _train("selective"))
    d = replace(d, selective="op")
    none = block_bytes(d, "none", layout_arrays(parse_layout("dp=1,tp=none,mb=2"), 2))
    assert float(none[0]) == c * T * (4 * H + KV + F) + lse
    one_d = block_bytes(d, "1d", layout_arrays(parse_layout("dp=1,tp=1d:4,sp,mb=2"), 2))
    t = 4
    assert float(one_d[0]) == pytest.approx(c * T * H / t + c * T * (H + KV + F) / t + c * T * H
                                            + 2 * c * T * H / t + c * T * H / t + lse / t)
    topo = load_topology("dgx-h100", gpus=4)
    for text in ("dp=1,tp=none,mb=2", "dp=1,tp=1d:4,sp,mb=2"):
        layout = parse_layout(text)
        a = layout_arrays(layout, 2)
        op, rc_none = (estimate(LLAMA, _train(rc), layout, topo, selective="op") for rc in ("selective", "none"))
        kept = block_bytes(d, layout.mode, a)[0]
        every = block_bytes(replace(d, recompute="none"), layout.mode, a)[0]
        assert op.memory.activations - rc_none.memory.activations == pytest.approx(LLAMA.layers * (kept - every)), text
        assert op.memory.temporaries - rc_none.memory.temporaries == pytest.approx(every - kept), text


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("text", ["dp=8,tp=none,mb=2,zero=3", "dp=2,tp=1d:4,sp,mb=2", "dp=2,pp=2,tp=1d:2,sp,mb=1",
                                  "dp=4,tp=1d:2,sp,mb=2,zero=3"])
def test_engines_agree_under_the_op_rule(text: str, dtype: str) -> None:
    """One DGX H100 with torchtitan's options: both engines give the same compute and memory, steps within 2%, and
    each moves from Megatron's rule to the op rule by the same compute."""
    topo = load_topology("dgx-h100", gpus=8)
    layout = parse_layout(text)
    train = _train("selective", dtype)
    an, ev = (estimate_with(e, LLAMA, train, layout, topo, options=_options("op")) for e in ("analytic", "event"))
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.02), text
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6), text
    assert ev.memory == an.memory, text
    an_a, ev_a = (estimate_with(e, LLAMA, train, layout, topo, options=_options("attention"))
                  for e in ("analytic", "event"))
    assert ev.compute_time_s - ev_a.compute_time_s == pytest.approx(an.compute_time_s - an_a.compute_time_s,
                                                                    rel=1e-6, abs=1e-12), text
    assert np.isfinite(an.step_time_s) and an.compute_time_s != an_a.compute_time_s, text
