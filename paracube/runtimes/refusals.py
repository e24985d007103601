"""Refusals of one layout field each, by what a runtime declares (Runtime.refusal calls them; each returns what follows
"runtime NAME (TITLE)", one line naming the valid values, or None)."""

from __future__ import annotations

from paracube.layout import Layout
from paracube.recompute_modules import modules_text, violations


def a2a_refusal(runs: bool, layout: Layout, dtype: str | None = None) -> str | None:
    """Why `a2ao` cannot run on this layout, `runs`: the runtime runs it (Runtime.moe_a2a_overlap): Megatron-core 0.16's
    TransformerConfig checks (expert parallelism, a virtual pipeline with pp > 1, no full recomputation, bf16 / fp16
    parameters; fp8 trains them in bf16)."""
    if not runs:
        return "does not overlap the MoE all_to_alls with another micro-batch's compute; drop a2ao"
    if layout.ep == 1:  # (ep > 1 on a model without experts: moe_violations.violations refuses it)
        return "overlaps the MoE all_to_alls (a2ao) with expert parallelism only; add ep=N (N > 1) or drop a2ao"
    if layout.pp > 1 and layout.interleave == 1:
        return f"runs a2ao with pipelines (pp={layout.pp}) only interleaved; add v=N (N > 1) or drop a2ao"
    if layout.recompute == "full":
        return "does not run a2ao with full recomputation; valid: rc=none/selective"
    if dtype == "fp32":
        return "runs a2ao in bf16 / fp16 / fp8 only (16-bit parameters), not fp32; drop a2ao"
    return None


def rcm_refusal(modules: tuple[str, ...], layout: Layout, model: object | None = None,
                fused_norms: bool = False) -> str | None:
    """Why `rcm=` cannot run on this layout, `modules`: those the runtime recomputes (Runtime.recompute_modules);
    with the model, a module it has no block for (recompute_modules.violations, with the runtime's `fused_norms`:
    rcm=layernorm on a dense model without latent attention; the estimate checks it too)."""
    pinned = layout.recompute_modules
    if not pinned:
        return None
    if not modules:
        return (f"does not recompute by module (rcm={modules_text(pinned)}: Megatron-core's --recompute-modules); "
                "drop rcm= (rc=selective recomputes by its own rule)")
    lacking = [m for m in pinned if m not in modules]
    if lacking:
        return f"does not recompute {', '.join(lacking)} (rcm={modules_text(pinned)}); valid: {', '.join(modules)}"
    bad = violations(pinned, model, fused_norms) if model is not None else []
    return f"cannot run {bad[0]}" if bad else None


__all__ = ["a2a_refusal", "rcm_refusal"]
