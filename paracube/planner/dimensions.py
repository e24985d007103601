"""The searched dimensions beyond the layout's structure, each declared once: values, pin, runtime, default.

A `Dimension` names a layout field the search fills in (Layout's module docstring has the syntax), every value
the cost models price, how a layout pins it, which values a runtime offers (paracube/runtimes: Runtime), and,
where one value is never slower in the model (`dominant`), that value: the search then takes it wherever the
runtime offers it and prices the other value for the best layout only, as its runner-up (planner/search.py).
    rc       recomputation: a pass over the configurations per value (memory and compute both change)
    zero     zero stages: per configuration the lowest offered stage under which it fits in memory
    overlap  dp gradient buckets during backward: dominant (exposed time max(0, ...) <= the whole reduction)
    tpo      tensor-parallel collectives overlapped with their GEMMs: dominant (exposed <= the whole collective)
    param_overlap  zero=1's parameter all_gather overlapped with the next forward: dominant (exposed
             max(0, gather - forward) <= the gather; cost_models/analytic.py). No Layout field: the runtime's
             `param_gather_overlap_default` decides it (Megatron / torchtitan / DeepSpeed and paracube's
             executor, executor/data_parallel/param_gather.py: on), the engines take it as a boolean (`param_overlap`)
    fsdp_prefetch  zero=2/3's per-unit gathers prefetched under the previous unit's compute and reduce-scatters
             asynchronous (cost_models/fsdp_overlap.py): dominant (the recursion's exposed time <= in line). No
             Layout field: every runtime here runs FSDP that way (Runtime.fsdp_prefetch)
    Runtime.engine_options() gives the engines both booleans (param_overlap, fsdp_prefetch) in every command.
    a2ao     MoE dispatch / combine all_to_alls of one micro-batch overlapped with another's compute (Megatron-core's
             combined 1F1B; cost_models/moe_a2a_overlap.py): dominant (the step never longer in time: exposed
             max(a, c + s a) <= a + c); taken only where the runtime turns it on by default or the layout pins it
             (Megatron: opt-in, so pinned only), on the layouts it runs there (Runtime.a2a_overlap_refusal)
    kw       kept weights (2d / 2.5d / 3d): 1 where several micro-batches and memory allow
    fa       attention kernel: flash dominant (compute.py, activations.py)
    cpc      context parallelism's key / value exchange (p2p ring, ag all-gather; modes/context.py): a pass over
             the configurations per value where the runtime offers both (Runtime.cp_comms; the cp degree itself
             is a structural axis: planner/enumerate.context_degrees)
    rcm      selective recomputation by module (rcm=; recompute_modules.py), a ladder of module sets (RCM_LADDER),
             where the runtime declares the modules (Runtime.recompute_modules), each rung less the modules the model
             lacks; a pin is the only set searched. Models with MoE blocks or MLA (planner/experts.py): tried, fewest
             first, only on a layout that fits at no zero stage without them (under rc=none / selective; the set the
             search then records is the first rung that fits). Dense models (planner/search.py): where the search
             chooses the recomputation, one pass per rung (but selective's own core_attn) before rc=full; a layout
             of a rung is ranked only where it is faster than the same layout of every earlier pass (scoring.py:
             where it makes a fit, a larger micro-batch or a lower zero stage fit)
    off      activation offloading to the host (Layout off=N): 1 where the runtime offloads (Runtime.offload), the
             search then passes over offloaded block counts, fewest first, only where nothing fits with fewer
             (planner/offload_passes.py: never faster in the model, it only frees device memory); a pin is the count
    ep, etp  expert parallelism and tensor parallelism inside experts (models with MoE blocks): every value the
             model's experts and the layout's dp x cp x tp ranks admit, priced per layout (planner/experts.py)
The search reads `values(dim, runtime, fixed, asked)`, never a runtime's name, so a new dimension is a new
declaration here plus its pricing in the engines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from paracube.layout import Layout
from paracube.layout_checks import CP_COMMS, RECOMPUTES, ZERO_STAGES
from paracube.runtimes import Runtime

PRICED_ZEROS = ZERO_STAGES  # zero stages the cost models price (all of them)


@dataclass(frozen=True)
class Dimension:
    name: str  # the layout text's key
    values: tuple[object, ...]  # every value the cost models price, in search order
    pin: Callable[[Layout], object | None]  # the layout's pinned value (None: searched)
    offered: Callable[[Runtime], tuple[object, ...]]  # the values the runtime runs (and, dominant: does by default)
    dominant: object | None = None  # never slower in the model: chosen wherever offered
    doc: str = ""


def _on_off(enabled: bool, default: bool) -> tuple[object, ...]:
    return (True, False) if enabled and default else ((False, True) if enabled else (False,))


RC = Dimension("rc", RECOMPUTES, lambda f: f.recompute or ("selective" if f.recompute_modules else None),
               lambda r: r.recomputes, doc="activation recomputation")
# rc=selective by module (rcm=), a memory ladder: each rung the one before plus the next module in order of re-run time
# per byte no longer kept (recompute_modules_cost.py: the memory-bound norms and experts' activation first, the
# attention core, MLA's up projections, the dense MLPs and shared experts, last the whole MoE layer with its
# all_to_alls); the modules a model lacks dropped from each rung (planner/experts.py)
RCM_LADDER: tuple[tuple[str, ...], ...] = (
    ("layernorm", "moe_act"), ("core_attn", "layernorm", "moe_act"),
    ("core_attn", "layernorm", "mla_up_proj", "moe_act"),
    ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "shared_experts"),
    ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe"))
RCM = Dimension("rcm", RCM_LADDER, lambda f: f.recompute_modules,
                lambda r: tuple(rung for rung in RCM_LADDER if set(rung) <= set(r.recompute_modules)),
                doc="selective recomputation by module")
ZERO = Dimension("zero", PRICED_ZEROS, lambda f: f.zero or (0 if f.forbid_zero else None), lambda r: r.all_zeros,
                 doc="zero stage")
OVERLAP = Dimension("overlap", (False, True), lambda f: True if f.overlap else (False if f.forbid_overlap else None),
                    lambda r: _on_off(r.grad_overlap, r.grad_overlap_default), True,
                    "dp gradient reduction overlapped with backward")
TPO = Dimension("tpo", (False, True), lambda f: True if f.tpo else (False if f.forbid_tpo else None),
                lambda r: _on_off(r.tpo, r.tpo_default), True,
                "tensor-parallel collectives overlapped with their GEMMs")
PARAM_OVERLAP = Dimension("param_overlap", (False, True), lambda f: None,
                          lambda r: _on_off(r.param_gather_overlap, r.param_gather_overlap_default), True,
                          "zero=1's parameter all_gather overlapped with the next forward")
FSDP_PREFETCH = Dimension("fsdp_prefetch", (False, True), lambda f: None,
                          lambda r: _on_off(r.fsdp_prefetch, r.fsdp_prefetch), True,
                          "zero=2/3's gathers prefetched, reduce-scatters asynchronous")
A2AO = Dimension("a2ao", (False, True), lambda f: True if f.a2ao else (False if f.forbid_a2ao else None),
                 lambda r: _on_off(r.moe_a2a_overlap, r.moe_a2a_overlap_default), True,
                 "MoE all_to_alls overlapped with another micro-batch's compute")
KW = Dimension("kw", (0, 1), lambda f: f.keep_weights, lambda r: (0, 1), doc="kept weights (2d / 2.5d / 3d)")
FA = Dimension("fa", (1, 0), lambda f: f.flash, lambda r: (1, 0), 1, "attention kernel (1 flash, 0 unfused)")
CPC = Dimension("cpc", CP_COMMS, lambda f: f.cp_comm, lambda r: r.cp_comms, doc="context parallelism's exchange")
_EXPERT_WAYS = tuple(2 ** i for i in range(11))  # ep / etp values priced (1 .. 1024; the model's divisors apply)
EP = Dimension("ep", _EXPERT_WAYS, lambda f: f.ep if f.ep > 1 else None,
               lambda r: _EXPERT_WAYS if r.expert_parallel else (1,), doc="expert parallelism (MoE models)")
ETP = Dimension("etp", _EXPERT_WAYS[:4], lambda f: f.etp if f.etp > 1 else None,
                lambda r: _EXPERT_WAYS[:4] if r.expert_tensor_parallel else (1,),
                doc="tensor parallelism inside an expert (MoE models)")
OFF = Dimension("off", (0, 1), lambda f: None if f.offload is None else int(f.offload > 0),
                lambda r: (0, 1) if r.offload is not None else (0,), doc="activation offloading to the host")
DIMENSIONS: dict[str, Dimension] = {d.name: d for d in (RC, ZERO, OVERLAP, TPO, PARAM_OVERLAP, FSDP_PREFETCH, KW, FA,
                                                        CPC, EP, ETP, A2AO, OFF, RCM)}


def values(dim: Dimension, runtime: Runtime, fixed: Layout | None, asked: list[object] | None = None
           ) -> tuple[object, ...]:
    """The values to search: the layout's pin where it pins one, else what the caller asks for (default: every
    priced value) that the runtime offers, in the runtime's order of preference."""
    pinned = dim.pin(fixed) if fixed is not None else None
    if pinned is not None:
        return (pinned,)
    offered = dim.offered(runtime)
    pool = dim.values if asked is None else tuple(asked)
    return tuple(v for v in offered if v in pool and v in dim.values)


def chosen(dim: Dimension, runtime: Runtime, fixed: Layout | None) -> bool:
    """A dominant dimension takes its dominant value (pinned, or offered first by the runtime)."""
    vals = values(dim, runtime, fixed)
    return bool(vals) and vals[0] == dim.dominant


__all__ = ["A2AO", "CPC", "DIMENSIONS", "EP", "ETP", "FA", "FSDP_PREFETCH", "KW", "OFF", "OVERLAP", "PARAM_OVERLAP",
           "PRICED_ZEROS", "RC", "RCM", "RCM_LADDER", "TPO", "ZERO", "Dimension", "chosen", "values"]
