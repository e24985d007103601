"""A runtime's declarations as JSON-ready data (Runtime.to_dict): what it runs, overlaps, exports and offloads, each
field as runtimes/base.py declares it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

Runtime = Any  # paracube.runtimes.base.Runtime (it imports this module)


def runtime_dict(rt: Runtime) -> dict[str, object]:
    """Every declaration of runtime `rt` as JSON-ready data (lists for tuples; `offload`: its Offload fields, None
    where it does not offload activations)."""
    return {"name": rt.name, "title": rt.title, "modes": list(rt.modes), "pipeline": rt.pipeline,
            "interleave": rt.interleave, "sequence_parallel": rt.sequence_parallel,
            "zeros": list(rt.zeros), "zeros_with_pp": list(rt.zeros_with_pp),
            "hybrid_shard": rt.hybrid_shard, "recomputes": list(rt.recomputes), "dtypes": list(rt.dtypes),
            "overlaps": {"grad_reduce": [rt.grad_overlap, rt.grad_overlap_default, rt.grad_overlap_pp],
                         "param_gather": [rt.param_gather_overlap, rt.param_gather_overlap_default],
                         "tpo": [rt.tpo, rt.tpo_default, rt.tpo_needs_sp], "p2p": rt.p2p_overlap,
                         "moe_a2a": [rt.moe_a2a_overlap, rt.moe_a2a_overlap_default],
                         "fsdp_prefetch": rt.fsdp_prefetch},
            "expert_parallel": rt.expert_parallel, "expert_tensor_parallel": rt.expert_tensor_parallel,
            "etp_expert_biases": rt.etp_expert_biases,
            "every_pipeline_split": rt.pipeline_split is None,  # else its own rule (Runtime.pipeline_split)
            "export_target": rt.export_target, "cp_comms": list(rt.cp_comms),
            "sliding_window": rt.sliding_window, "window_cp_comms": list(rt.cp_comms_for(True)),
            "chunked_attention": rt.chunked_attention, "attention_sinks": rt.attention_sinks,
            "moe_blocks": rt.moe_blocks, "mla": rt.mla, "mla_with_moe": rt.mla_with_moe,
            "llama4_blocks": rt.llama4_blocks,
            "fp8_scaling": rt.fp8_scaling, "fp8_experts": rt.fp8_experts,
            "fp8_param_gather": rt.fp8_param_gather, "moe_dispatch": rt.moe_dispatch, "moe_probs": rt.moe_probs,
            "selective": rt.selective, "recompute_modules": list(rt.recompute_modules),
            "fused_norms": rt.fused_norms, "cp_core_recompute": rt.cp_core_recompute,
            "moe_host_sync": rt.moe_host_sync, "moe_capacity": rt.moe_capacity,
            "moe_host_ops": None if rt.moe_host_ops is None else list(vars(rt.moe_host_ops).values()),
            "offload": _offload(rt.offload)}


def _offload(off: object) -> dict[str, object] | None:
    """runtimes/offload.Offload's fields (tuples as lists), None where the runtime does not offload activations."""
    if off is None:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(off).items()}  # type: ignore[call-overload]


__all__ = ["runtime_dict"]
