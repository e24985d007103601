"""Refusals of one layout field each, by what a runtime declares (Runtime.refusal calls them; each returns what follows
"runtime NAME (TITLE)", one line naming the valid values, or None)."""

from __future__ import annotations

from typing import Any

from paracube.layout import Layout
from paracube.modes import MODES
from paracube.recompute_modules import modules_text, violations

Runtime = Any  # runtimes/base.Runtime, which imports this module (no import back: the layers contract)


def llama4_features(model: Any) -> list[str]:
    """Llama 4's blocks the model has, as a refusal names them (Runtime.llama4_blocks; its export's refusal too)."""
    moe = getattr(model, "moe", None)
    return [what for what, on in (("NoPE blocks", getattr(model, "rope_pattern", None) is not None),
                                  ("the L2 q / k norm", bool(getattr(model, "qk_l2_norm", False))),
                                  ("router scores on the experts' input", bool(moe and moe.probs_on_input))) if on]


def model_refusal(rt: Runtime, model: Any) -> str | None:
    """Which of the model's blocks the runtime does not train, by its declarations (Runtime.moe_blocks, moe_capacity,
    mla, mla_with_moe, llama4_blocks, sliding_window, attention_sinks), else None; `model`: workload.ModelSpec.
    Model-wide, so the planner refuses the model before it searches (planner/search.py) rather than writing a plan
    the stack's export then refuses, or reporting every layout refused."""
    moe, name = getattr(model, "moe", None), getattr(model, "name", "the model")
    if getattr(model, "sliding_window", None) is not None and not rt.sliding_window:
        return f"does not train sliding-window attention ({name}: sliding_window={model.sliding_window})"
    if getattr(model, "attention_sinks", False) and not rt.attention_sinks:
        return f"does not train attention sinks ({name}: attention_sinks=true)"
    if moe is not None and not rt.moe_blocks:
        return f"does not train mixture-of-experts blocks ({name})"
    if moe is not None and moe.capacity_factor is not None and rt.moe_capacity == "none":
        return (f"runs its MoE blocks dropless only, without a capacity factor ({name}: capacity_factor="
                f"{moe.capacity_factor:g}; --capacity-factor dropless drops it)")
    if getattr(model, "mla", None) is not None and not (rt.mla_with_moe if moe is not None else rt.mla):
        return f"does not train multi-head latent attention{' with MoE blocks' if moe is not None else ''} ({name})"
    llama4 = llama4_features(model)
    if llama4 and not rt.llama4_blocks:
        return f"does not train {' or '.join(llama4)} (Llama 4's; {name})"
    return None


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


def expert_refusal(ep: bool, etp: bool, etp_biases: bool, layout: Layout, model: object | None = None) -> str | None:
    """Why the experts' layout cannot run, by what the runtime runs: `ep` / `etp`, expert (tensor) parallelism
    (Runtime.expert_parallel / expert_tensor_parallel); `etp_biases`, experts with biases (MoESpec.expert_bias,
    GPT-OSS) split over etp > 1 (Runtime.etp_expert_biases; megatron-core 0.16.1 transformer_config.py l.1588-1591
    asserts "Bias in Moe is only supported when ETP==1")."""
    if layout.ep > 1 and not ep:
        return f"does not run expert parallelism (ep={layout.ep}); valid: ep=1"
    if layout.etp > 1 and not etp:
        return f"does not run tensor parallelism inside experts (etp={layout.etp}); valid: etp=1"
    moe = getattr(model, "moe", None)
    if layout.etp > 1 and not etp_biases and moe is not None and moe.expert_bias:
        return (f"does not split experts with biases over etp={layout.etp} (model {getattr(model, 'name', '?')}: "
                "expert_bias); valid: etp=1")
    return None


def tpo_refusal(rt: Runtime, layout: Layout, dtype: str | None = None) -> str | None:
    """Why `tpo` (tensor-parallel collectives overlapped with their GEMMs) cannot run on this layout."""
    if not layout.tpo:
        return None
    if dtype == "fp8" and not rt.fp8_tpo:
        return "does not run tpo with fp8 GEMMs; drop tpo (or train in bf16)"
    if not rt.tpo:
        return "does not overlap tensor-parallel communication with GEMMs; drop tpo"
    if rt.tpo_needs_sp and not layout.sequence_parallel:
        return "runs tpo with sequence parallelism only; add sp (tp=1d:N,sp,tpo)"
    if MODES[layout.mode].tpo_needs_sp and not layout.sequence_parallel:
        return (f"runs tpo in tp={layout.mode} with sequence parallelism only (without sp its collectives are "
                f"all-reduces, none overlappable); add sp (tp={layout.mode}:N,sp,tpo)")
    return None


def context_refusal(rt: Runtime, layout: Layout, windowed: bool = False, sinks: bool = False) -> str | None:
    """Why context parallelism (cp=, cpc=), sliding windows (`windowed`) or attention sinks (`sinks`) cannot run."""
    if layout.cp > 1 and not rt.cp_comms:
        return f"does not run context parallelism (cp={layout.cp}){rt.cp_note}; valid: cp=1"
    if layout.cp > 1 and layout.cp_comm is not None and layout.cp_comm not in rt.cp_comms:
        return (f"does not run cpc={layout.cp_comm} (context parallelism's exchange); "
                f"valid: cpc={'/'.join(rt.cp_comms)}")
    if windowed and not rt.sliding_window:
        return "does not train sliding-window attention; valid: a model without sliding_window"
    if sinks and not rt.attention_sinks:
        return "does not train attention sinks (attention_sinks=true); valid: a model without them"
    if windowed and layout.cp > 1 and rt.cp_comms:
        comms = rt.cp_comms_for(True)
        if not comms:
            return f"does not run sliding-window attention with cp={layout.cp}; valid: cp=1"
        if layout.cp_comm is not None and layout.cp_comm not in comms:
            return (f"runs sliding-window attention with context parallelism with cpc={'/'.join(comms)} only, "
                    f"not cpc={layout.cp_comm}")
    return None


__all__ = ["a2a_refusal", "context_refusal", "expert_refusal", "llama4_features", "model_refusal", "rcm_refusal",
           "tpo_refusal"]
