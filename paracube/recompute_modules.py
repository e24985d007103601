"""Megatron-core's selective recomputation by module (`rcm=`), declared once: the names, what each re-runs in backward,
which blocks it applies to.

megatron-core 0.16.1 TransformerConfig.recompute_modules (`--recompute-granularity selective --recompute-modules
...`; default ["core_attn"]) names the parts of a block whose forward is re-run in backward instead of keeping its
tensors. NVIDIA's MoE recipes set it per model (Megatron-Bridge 0.6.2's perf recipes: GPT-OSS-120B and Qwen3
["layernorm", "moe_act"], DeepSeek-V3 ["mla_up_proj", "mlp"], Nemotron-H ["moe", "layernorm", ...]), so a planner
that knows only the attention core refuses layouts those recipes run.

A layout's `rcm=a+b` (Layout.recompute_modules, canonical order: MODULES') is selective recomputation with exactly
these modules (rc=selective implied; rc=none / full with rcm= is refused). Without `rcm=`, `rc=selective` keeps the
runtime's rule (Runtime.selective: Megatron's is ("core_attn",), DEFAULT). Two kinds of checkpoint (Megatron's):
- "discard" (CheckpointWithoutOutput): the module's output is freed once its consumer has used it, and made again
  right before the backward that reads it; its input is kept anyway (the residual stream or a GEMM's output). It
  saves the output's bytes and re-runs the module's forward.
- "region" (tensor_parallel.checkpoint): the module keeps only its input; everything inside is made again in
  backward, the module's collectives included ("moe": the router, the dispatch and combine all_to_alls, the
  experts). It saves every tensor inside the module less its input and re-runs its whole forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paracube.errors import check


@dataclass(frozen=True)
class Module:
    """One recomputable module: `kind` "discard" or "region" (module docstring); `needs` which blocks it applies to:
    "any" (every block), "dense_mlp" (blocks with a dense MLP: dense models, an MoE model's dense blocks), "moe" (MoE
    blocks), "shared" (MoE blocks with shared experts), "mla" (latent attention)."""

    name: str
    kind: str
    needs: str
    what: str


MODULES: dict[str, Module] = {m.name: m for m in (
    Module("core_attn", "region", "any", "the attention core (scores, softmax, probabilities x values)"),
    Module("layernorm", "discard", "any", "the input and pre-MLP norms"),
    Module("mla_up_proj", "discard", "mla", "latent attention's q / kv up projections and their rotary parts"),
    Module("mlp", "region", "dense_mlp", "a dense block's whole MLP"),
    Module("moe_act", "discard", "moe", "the routed experts' activation function (SwiGLU / GELU)"),
    Module("shared_experts", "region", "shared", "an MoE block's shared experts"),
    Module("moe", "region", "moe", "an MoE block's whole MoE layer: router, dispatch, experts, combine"),
)}
DEFAULT: tuple[str, ...] = ("core_attn",)  # Megatron-core's recompute_modules default


def parse_modules(text: str, where: str = "rcm") -> tuple[str, ...]:
    """'moe_act+layernorm' -> ('layernorm', 'moe_act') (MODULES' order, each once); one-line error otherwise."""
    names = [n.strip() for n in text.split("+")]
    for n in names:
        check(n in MODULES, f"{where}={text!r}: module {n!r} is not valid; valid: {', '.join(MODULES)} "
              "(joined by '+', e.g. rcm=layernorm+moe_act)")
    check(len(set(names)) == len(names), f"{where}={text!r}: a module named twice; give each once")
    return tuple(n for n in MODULES if n in names)


def modules_text(modules: tuple[str, ...]) -> str:
    return "+".join(modules)


def applies(module: str, spec: Any, fused_norms: bool = False) -> bool:
    """Whether `module` re-runs anything in model `spec` (workload.ModelSpec) on a runtime whose dense norms run
    inside the next linear (`fused_norms`, Runtime.fused_norms) or not: there `layernorm` re-runs only latent
    attention's input norm and a MoE block's pre-MLP norm (cost_models/recompute_modules_cost.py)."""
    needs, moe = MODULES[module].needs, spec.moe
    if needs == "any":
        return module != "layernorm" or not fused_norms or spec.mla is not None or moe is not None
    if needs == "mla":
        return spec.mla is not None
    if needs == "dense_mlp":
        return moe is None or any(not moe.is_moe_layer(i) for i in range(spec.layers))
    if needs == "shared":
        return moe is not None and moe.shared_ffn > 0
    return moe is not None  # "moe"


FUSED = ("the norms that are modules of their own (latent attention's input norm, a MoE block's pre-MLP norm; "
         "Transformer Engine runs a dense block's inside the next linear)")


def violations(modules: tuple[str, ...], spec: Any, fused_norms: bool = False) -> list[str]:
    """One line per module that would re-run nothing in `spec` (a pin that changes nothing is a mistake);
    `fused_norms`: the runtime's (`applies`)."""
    valid = ", ".join(n for n in MODULES if applies(n, spec, fused_norms))
    what = {n: FUSED if n == "layernorm" and fused_norms else m.what for n, m in MODULES.items()}
    return [f"rcm={modules_text(modules)}: {m} recomputes {what[m]}, which model {spec.name!r} does not have; "
            f"valid for it: {valid}"
            for m in modules if not applies(m, spec, fused_norms)]
