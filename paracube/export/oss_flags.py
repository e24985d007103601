"""GPT-OSS's attention sinks, biases and clamped SwiGLU in the exports (paracube/gpt_oss_spec.py's fields).

- Megatron-LM core_r0.16.1 / megatron-core 0.16.1 (transformer/transformer_config.py):
  - `--softmax-type learnable` (TransformerConfig.softmax_type "learnable": a learnable offset per head in each
    softmax row, the sink column; TE FusedAttention or the local unfused attention);
  - biases: add_bias_linear (True unless --disable-bias-linear, which the llama family writes) is one switch for
    qkv, proj, the router and every MLP's fc1 / fc2 (router.py, mlp.py); it is written where the model has them all
    (attention_bias and expert_bias) and no MLP without them (no dense MLP block, no shared expert); other mixes are
    refused (add_qkv_bias alone has no o bias);
  - the clamped SwiGLU: `--quick-geglu` (gated_linear_unit, activation_func quick_gelu = x sigmoid(1.702 x)),
    `--glu-linear-offset 1` and `--activation-func-clamp-value L` (fusions/fused_bias_geglu.py
    weighted_bias_quick_geglu_impl: gate clamped to max L, linear to [-L, L], quick_gelu(gate) x (linear + 1)):
    GPT-OSS's formula with alpha fixed at 1.702 (another swiglu_alpha is refused); it sets every MLP's activation, so
    a model whose dense blocks or shared expert keep the plain SwiGLU is refused.
- torchtitan 0.3.0: its gpt_oss module has sinks, q / k / v / o, router and expert biases and swiglu_limit 7.0 built
  in (models/gpt_oss: model.py Attention.sinks, moe.py GptOssGroupedExperts); a model with some of these but not
  GPT-OSS's all is refused; one with them is noted to run MODEL_MODULE=gpt_oss.
- DeepSpeed (Megatron-DeepSpeed): none of them: refused.
"""

from __future__ import annotations

from paracube.gpt_oss_spec import SWIGLU_ALPHA, SWIGLU_LIMIT
from paracube.workload import ModelSpec


def _parts(m: ModelSpec) -> dict[str, object]:
    moe = m.moe
    return {"attention_sinks": m.attention_sinks, "attention_bias": m.attention_bias,
            "expert_bias": bool(moe and moe.expert_bias), "swiglu_limit": moe.swiglu_limit if moe else None}


def has_oss(m: ModelSpec) -> bool:
    """The model has any of GPT-OSS's own parts."""
    return any(v not in (False, None) for v in _parts(m).values())


def _plain_mlps(m: ModelSpec) -> bool:
    """Some MLP of the model is not a routed expert (a dense block or a shared expert)."""
    return m.moe is None or m.moe.shared_ffn > 0 or m.moe.moe_layers(m.layers) < m.layers


def megatron_oss_refusal(m: ModelSpec) -> str | None:
    p = _parts(m)
    if p["attention_bias"] != p["expert_bias"] or (p["attention_bias"] and _plain_mlps(m)):
        return (f"its add_bias_linear puts biases on every linear at once: attention_bias={p['attention_bias']} with "
                f"expert_bias={p['expert_bias']} and {'some' if _plain_mlps(m) else 'no'} MLP outside the experts "
                "is not written; valid: both true with every block's MLP routed experts, or both false")
    if p["swiglu_limit"] is not None:
        moe = m.moe
        assert moe is not None
        if moe.swiglu_alpha != SWIGLU_ALPHA:
            return f"its quick_gelu has slope 1.702: swiglu_alpha={moe.swiglu_alpha} is not written; valid: 1.702"
        if _plain_mlps(m):
            return "its --quick-geglu sets every MLP's activation: a clamped SwiGLU with dense or shared MLPs is not"
    return None


def megatron_oss_args(m: ModelSpec) -> list[str]:
    """--softmax-type, the bias switch and the activation flags replacing the llama family's (module docstring)."""
    args = ["--swiglu"] if m.moe is None or m.moe.swiglu_limit is None else [
        "--quick-geglu", "--glu-linear-offset 1", f"--activation-func-clamp-value {m.moe.swiglu_limit:g}"]
    if not m.attention_bias:
        args.append("--disable-bias-linear")
    return args + (["--softmax-type learnable"] if m.attention_sinks else [])


def torchtitan_oss_refusal(m: ModelSpec) -> str | None:
    p = _parts(m)
    gpt_oss = {"attention_sinks": True, "attention_bias": True, "expert_bias": True, "swiglu_limit": SWIGLU_LIMIT}
    if not has_oss(m) or (p == gpt_oss and m.moe is not None and m.moe.swiglu_alpha == SWIGLU_ALPHA):
        return None
    mine = ", ".join(f"{k}={v}" for k, v in p.items())
    return f"its gpt_oss module has GPT-OSS's sinks, biases and SwiGLU clamp all together (limit 7), not {mine}"


def torchtitan_oss_notes(m: ModelSpec) -> list[str]:
    return ["attention sinks, biases and the clamped SwiGLU: MODEL_MODULE=gpt_oss (torchtitan 0.3.0's module with "
            "them)"] if has_oss(m) else []


def deepspeed_oss_refusal(m: ModelSpec) -> str | None:
    if not has_oss(m):
        return None
    return "Megatron-DeepSpeed has no attention sinks, no expert biases and no clamped SwiGLU (GPT-OSS's)"


__all__ = ["deepspeed_oss_refusal", "has_oss", "megatron_oss_args", "megatron_oss_refusal", "torchtitan_oss_notes",
           "torchtitan_oss_refusal"]
