"""GPT-OSS's own parts (paracube/gpt_oss_spec.py) against an independent reference, and read from its config.json.

Reference: torchtitan 0.3.0's models/gpt_oss (installed beside paracube): `apply_attention_sink_rescale` (model.py:
out x sigmoid(lse - sinks) on a softmax attention's output and log-sum-exp) and `swiglu` (moe.py: the clamped SwiGLU on
interleaved gate / up columns). Our kernels add the sink as one more softmax column (unfused) or by a log-sum-exp
merge (flash: merged into the flash kernel's own, executor/layers/sink_kernels.py, asserted to run; context
parallelism: after its blocks' merge, tests/test_gpt_oss_run.py), a different computation of the same function:
agreement in fp64 (relative 1e-10: a few roundings of a 1e-16 unit apart over sums of <= 64 terms) is the evidence
the formulas are right. The experts' biases and the top-k softmax routing against HF's GptOssMLP
formulas written out here (router logits x W + b, softmax over the top-k logits, sum of the weighted experts'
swiglu(x W1 + b1) W2 + b2).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torchtitan.models.gpt_oss.model import apply_attention_sink_rescale
from torchtitan.models.gpt_oss.moe import swiglu as titan_swiglu

from paracube.errors import ParacubeError
from paracube.executor.layers.llama import gqa_attention, rotary, rotary_tables, swiglu
from paracube.executor.layers.serial import Mode
from paracube.executor.mesh import Mesh
from paracube.executor.model.moe import MoEMLP
from paracube.hf_config import from_hf_config
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.moe_spec import MoESpec
from paracube.workload import ModelSpec

F64 = torch.float64
TOL = 1e-10  # fp64 (module docstring)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _runs_fused_sinks(out: torch.Tensor) -> bool:
    """Whether the fused sink Function (executor/layers/sink_kernels.py) produced `out` (walking its graph)."""
    todo, seen = [out.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ == "_FusedSinkFlashBackward":
            return True
        todo.extend(next_fn for next_fn, _ in fn.next_functions)
    return False


def _reference_attention(qkv: torch.Tensor, kv_heads: int, group: int, sinks: torch.Tensor,
                         window: int | None) -> torch.Tensor:
    """Plain softmax attention (repeated kv heads) with torchtitan's sink rescale; qkv as llama.py fuses it."""
    b, c, width = qkv.shape
    d = width // (kv_heads * (group + 2))
    g = qkv.view(b, c, kv_heads, group + 2, d)
    q = g[..., :group, :].reshape(b, c, kv_heads * group, d).transpose(1, 2)
    k, v = g[..., group, :].transpose(1, 2), g[..., group + 1, :].transpose(1, 2)
    cos, sin = rotary_tables(c, d, 10000.0, qkv)
    q, k = rotary(q, cos, sin), rotary(k, cos, sin)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) / d ** 0.5
    i, j = torch.arange(c).unsqueeze(1), torch.arange(c).unsqueeze(0)
    allowed = (j <= i) & ((i - j < window) if window is not None else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2)  # torchtitan's layout: [b, c, H, d], lse [b, c, H]
    out = apply_attention_sink_rescale(out, scores.logsumexp(-1).transpose(1, 2), sinks)
    return out.reshape(b, c, kv_heads * group * d)


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "unfused"])
@pytest.mark.parametrize("window", [None, 5], ids=["causal", "window5"])
def test_attention_sinks_match_torchtitans_rescale(flash: bool, window: int | None) -> None:
    """gqa_attention with sinks (3 kv heads of 2 query heads, d 8, 12 tokens) equals torchtitan's rescaled attention:
    output and the gradients of qkv and the sinks."""
    gen = torch.Generator().manual_seed(3)
    kv_heads, group, d, c = 3, 2, 8, 12
    qkv = torch.randn(2, c, kv_heads * (group + 2) * d, generator=gen, dtype=F64, requires_grad=True)
    sinks = torch.randn(kv_heads * group, generator=gen, dtype=F64).mul(2).requires_grad_()
    grad = torch.randn(2, c, kv_heads * group * d, generator=gen, dtype=F64)
    runs = []
    for fn in (lambda: gqa_attention(qkv, kv_heads, group, 10000.0, flash, window=window, sinks=sinks),
               lambda: _reference_attention(qkv, kv_heads, group, sinks, window)):
        out = fn()
        dq, ds = torch.autograd.grad(out, (qkv, sinks), grad)
        runs.append((out, dq, ds))
    assert _runs_fused_sinks(runs[0][0]) == flash  # flash: the kernel's log-sum-exp merge (not the padded key)
    for ours, ref, what in zip(runs[0], runs[1], ("output", "d qkv", "d sinks"), strict=True):
        assert _rel(ours, ref) < TOL, (what, _rel(ours, ref))
    without = gqa_attention(qkv, kv_heads, group, 10000.0, flash, window=window)
    assert _rel(without, runs[0][0]) > 1e-3  # the sinks change the output (the comparison is not vacuous)


def test_clamped_swiglu_matches_torchtitans() -> None:
    """swiglu(y, 7.0, 1.702) equals torchtitan's swiglu, values and gradient, with gates and ups beyond +-7."""
    gen = torch.Generator().manual_seed(4)
    y = (torch.randn(5, 64, generator=gen, dtype=F64) * 6).requires_grad_()
    g = torch.randn(5, 32, generator=gen, dtype=F64)
    ours, ref = swiglu(y, 7.0, 1.702), titan_swiglu(y, alpha=1.702, limit=7.0)
    assert (y.detach().abs() > 7).sum() > 20  # both clamps active
    assert _rel(ours, ref) < TOL
    assert _rel(torch.autograd.grad(ours, y, g)[0], torch.autograd.grad(ref, y, g)[0]) < TOL


def test_moe_block_with_biases_matches_gpt_oss_formulas() -> None:
    """The serial MoE MLP (router and expert biases, clamped SwiGLU, top-4 of 8) equals GptOssMLP's formulas."""
    spec = ModelSpec("oss", layers=1, hidden=16, heads=2, ffn_hidden=32, vocab=32, seq_len=8, family="llama",
                     moe=MoESpec(8, 4, 12, expert_bias=True, swiglu_limit=0.3))
    mlp = MoEMLP(Mode(spec, Mesh(parse_layout("dp=1"), 0)), 0).to(F64)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) * 0.3)
    x = torch.randn(2, 8, 16, generator=gen, dtype=F64)
    ours = mlp(x)
    xf = x.reshape(-1, 16)
    logits = xf @ mlp.router.weight + mlp.router.bias
    top, idx = logits.topk(4, dim=-1)
    weights = top.softmax(-1)  # HF GptOssTopKRouter: softmax over the top-k logits
    e = mlp.experts
    ref = torch.zeros_like(xf)
    for n in range(xf.shape[0]):
        for w, j in zip(weights[n], idx[n], strict=True):
            h = titan_swiglu(xf[n] @ e.w1[j] + e.b1[j], alpha=1.702, limit=0.3)
            ref[n] += w * (h @ e.w2[j] + e.b2[j])
    assert _rel(ours.reshape(-1, 16), ref) < TOL


def _config(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt_oss", "num_hidden_layers": 36, "num_local_experts": 128,
                                **fields}))
    return path


def test_gpt_oss_config_reads_sinks_biases_and_the_clamp(tmp_path: Path) -> None:
    spec = from_hf_config(_config(tmp_path))
    assert (spec.attention_sinks, spec.attention_bias) == (True, True)
    assert (spec.moe.expert_bias, spec.moe.swiglu_limit, spec.moe.swiglu_alpha) == (True, 7.0, 1.702)
    assert spec.num_parameters() == PRESETS["gpt-oss-120b"].num_parameters()
    assert from_hf_config(_config(tmp_path, attention_bias=False)).attention_bias is False
    assert from_hf_config(_config(tmp_path, swiglu_limit=5)).moe.swiglu_limit == 5.0


@pytest.mark.parametrize("value", [0, -7.0])
def test_a_bad_swiglu_limit_is_refused_in_one_line(tmp_path: Path, value: float) -> None:
    with pytest.raises(ParacubeError, match=rf"swiglu_limit'={value!r} must be a positive number") as err:
        from_hf_config(_config(tmp_path, swiglu_limit=value))
    assert "\n" not in str(err.value)
    with pytest.raises(ParacubeError, match=r"swiglu_limit=.* must be a positive number \(GPT-OSS: 7.0\) or null"):
        MoESpec(8, 2, 16, swiglu_limit=value).validate("model 'x'")


def test_sinks_need_grouped_query_attention() -> None:
    with pytest.raises(ParacubeError, match="attention_sinks=true needs family llama"):
        ModelSpec("g", 2, 32, 4, 64, 64, 32, attention_sinks=True)
    with pytest.raises(ParacubeError, match="attention_bias=true with multi-head latent attention"):
        replace(PRESETS["tiny-mla"], attention_bias=True)


def test_other_models_plans_keep_their_fields() -> None:
    """The new fields appear in a plan's model only where set (plans of other models read as before)."""
    mixtral = PRESETS["mixtral-8x7b"].to_dict()
    assert not {"attention_sinks", "attention_bias"} & set(mixtral)
    assert not {"expert_bias", "swiglu_limit", "swiglu_alpha"} & set(mixtral["moe"])
    oss = PRESETS["gpt-oss-20b"]
    assert ModelSpec.from_dict(oss.to_dict()) == oss


def test_a_runtime_without_sinks_refuses_them_in_one_line() -> None:
    """DeepSpeed (Megatron-DeepSpeed) has no attention sinks: its refusal names them; the others run them."""
    from paracube.runtimes import get_runtime

    lay = parse_layout("dp=8,tp=none")
    why = get_runtime("deepspeed").refusal(lay, "llama", sinks=True)
    assert why is not None and "attention sinks (attention_sinks=true)" in why and "\n" not in why
    assert get_runtime("deepspeed").refusal(lay, "llama") is None
    assert all(get_runtime(n).refusal(lay, "llama", sinks=True) is None for n in ("paracube", "megatron", "torchtitan"))


# A dense llama with GPT-OSS's attention (llama3-8b's shape, 8 blocks): the sinks' gradient all_reduce and the biases'
# gathers are declared once (modes/sinks.py, the modes' bias collectives) and read by both engines, whose step times
# then agree within the bound test_sliding_window.py holds them to (2%: link sharing and the pipeline schedule).
@pytest.mark.parametrize("text", ["dp=4,tp=1d:2,sp,mb=1", "dp=2,tp=2d:2x2,mb=1", "tp=3d:2x2x2,mb=1",
                                  "dp=2,pp=2,tp=2.5d:2x2x1,mb=1"])
def test_engines_agree_with_sinks_and_biases(text: str) -> None:
    from paracube.cost_models.analytic import estimate
    from paracube.cost_models.event import estimate_event
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    plain = replace(PRESETS["llama3-8b"], layers=8, seq_len=4096)
    oss = replace(plain, attention_sinks=True, attention_bias=True)
    train, topo, layout = TrainingSpec(global_batch=32, dtype="bf16"), load_topology("dgx-h100", gpus=16), \
        parse_layout(text)
    a = estimate(oss, train, layout, topo, with_events=True)
    e = estimate_event(oss, train, layout, topo, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
    base = estimate(plain, train, layout, topo, with_events=True)
    assert a.memory.parameters > base.memory.parameters
    sinks = [ev for ev in a.events if ev.label.endswith(".sinks")]
    assert all(ev.payload_bytes == 4 * oss.heads and ev.kind == "all_reduce" for ev in sinks) and sinks


def test_megatron_refuses_experts_with_biases_over_etp_in_one_line() -> None:
    """megatron-core 0.16.1 transformer_config.py l.1588-1591 asserts "Bias in Moe is only supported when ETP==1":
    the megatron runtime refuses GPT-OSS with etp > 1; paracube's executor splits them (executor/model/
    routed_experts.py) and runs it; a model without expert biases is not refused."""
    from paracube.runtimes import get_runtime

    lay = parse_layout("dp=4,ep=2,etp=2,tp=1d:2,sp")
    why = get_runtime("megatron").refusal(lay, "llama", moe=True, model=PRESETS["gpt-oss-120b"])
    assert why is not None and "etp=2" in why and "expert_bias" in why and "\n" not in why
    assert get_runtime("megatron").refusal(lay, "llama", moe=True, model=PRESETS["qwen3-30b-a3b"]) is None
    assert get_runtime("paracube").refusal(lay, "llama", moe=True, model=PRESETS["gpt-oss-120b"]) is None
