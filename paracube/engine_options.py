"""How a training stack runs a layout, as both cost engines price it: one typed, frozen object.

`Runtime.engine_options()` (runtimes/base.py) is the one place it is made; the search (planner/search.py), the
published-run fits (calibration/run_prediction.py) and the CLI pass it, whole, to `analytic.estimate`,
`estimate_batch.estimate_many` and `event.simulate`, whose `prepare` copies the per-element choices into `Dims`
(`cost_models/dims.with_options`). A choice a new stack needs is a field here, read where it is priced, never a new
parameter threaded through every engine's signature. The engines also take single fields as keywords
(`estimate(..., param_overlap=True)`: `dataclasses.replace` of the options given), which tests use.

Fields (where each is priced):
- param_overlap: zero=1's parameter all_gather hidden under the next forward (grad_overlap.py, event_program.py);
- fsdp_prefetch: zero=2/3's gathers prefetched and reduce-scatters asynchronous (fsdp_overlap.py);
- grad_bytes: bytes per gradient element it keeps and reduces (memory.py, traffic.py: 4 fp32, 2 16-bit);
- bucket_bytes: its gradient bucket limit (modes/buckets.py; a published run's own, calibration/runs_csv.py);
- gather_16bit: zero=1's parameter all_gather sends the 16-bit parameters, not fp32 master shards (traffic.py);
- fp8_param_gather: with fp8, the block linears' weights are held and all-gathered as FP8 (Megatron-core's
  --fp8-param-gather; memory.py, fp8.py, traffic.py);
- fp8_scaling: how it scales FP8 tensors, "delayed" or "dynamic" (fp8.py; workload.FP8_SCALINGS);
- fp8_experts: with fp8, the routed experts' grouped GEMMs run FP8 too (moe.py);
- moe_dispatch: its MoE token dispatcher, "alltoall", "deepep" or "hybridep" (moe_dispatch.py);
- moe_probs: where its dispatcher sends the routing weights by an all_to_all of their own, "none", "weighted" or
  "always" (modes/experts.PROBS_RULES; moe_dispatch.sends_probs, moe.py);
- selective: what rc=selective recomputes, "attention" or "op" (recompute.py; workload.SELECTIVE_RULES);
- fused_norms: its dense norms run inside the next linear, rcm=layernorm re-running only latent attention's input
  norm and a MoE block's pre-MLP norm (Runtime.fused_norms; recompute_modules_cost.py);
- cp_core_recompute: under cp, rc=selective re-runs the attention core with its cp exchange (Megatron-core), else
  keeps it (paracube's executor) (Runtime.cp_core_recompute; recompute_modules_cost.core_recomputed,
  context_parallel.ring_again);
- moe_host_sync: its dropless MoE forward waits on the host for the expert counts (host_sync.py);
- moe_host_ops: the ops it issues per MoE block, counted from its code (MoEHostOps; host_issue.py), or None;
- moe_capacity: what it does with a capacity factor, "pad" (drop and pad to the capacity: no host wait) or "drop"
  (no padding) (Runtime.moe_capacity; MoESpec.load, host_sync.py); "pad" by default, as the published token-drop
  runs (Megatron-core) were priced before the rule was declared;
- offload_overlap: offloaded activations (Layout off=N) copied on their own stream beside compute, else in line
  (runtimes/offload.py; cost_models/offload.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from paracube.errors import check
from paracube.modes.buckets import BUCKET_BYTES


@dataclass(frozen=True)
class MoEHostOps:
    """Ops a runtime's host issues per MoE block and micro-batch (host_issue.py): forward `fwd` + `fwd_expert` per
    local expert, backward `bwd` + `bwd_expert` per local expert (aten ops, views included, as its code runs them);
    `bias`: the (fwd, fwd_expert, bwd, bwd_expert) more where the experts carry biases (MoESpec.expert_bias)."""

    fwd: int
    fwd_expert: int
    bwd: int
    bwd_expert: int
    bias: tuple[int, int, int, int] = (0, 0, 0, 0)

    def __post_init__(self) -> None:
        for name in ("fwd", "fwd_expert", "bwd", "bwd_expert"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 0, f"MoE host ops {name}={value!r}; valid: an integer >= 0")
        check(isinstance(self.bias, tuple) and len(self.bias) == 4
              and all(isinstance(v, int) and v >= 0 for v in self.bias),
              f"MoE host ops bias={self.bias!r}; valid: 4 integers >= 0 (fwd, fwd_expert, bwd, bwd_expert)")

    def of(self, expert_bias: bool) -> tuple[int, int, int, int]:
        """(fwd, fwd_expert, bwd, bwd_expert) for experts with or without biases."""
        fwd, fwd_expert, bwd, bwd_expert = self.bias if expert_bias else (0, 0, 0, 0)
        return self.fwd + fwd, self.fwd_expert + fwd_expert, self.bwd + bwd, self.bwd_expert + bwd_expert


@dataclass(frozen=True)
class EngineOptions:
    param_overlap: bool = False
    fsdp_prefetch: bool = False
    grad_bytes: int = 4
    bucket_bytes: int = BUCKET_BYTES
    gather_16bit: bool = False
    fp8_param_gather: bool = False
    fp8_scaling: str = "delayed"
    fp8_experts: bool = False
    moe_dispatch: str = "alltoall"
    moe_probs: str = "none"
    selective: str = "attention"
    fused_norms: bool = False
    cp_core_recompute: bool = False
    moe_host_sync: bool = False
    moe_host_ops: MoEHostOps | None = None
    moe_capacity: str = "pad"
    offload_overlap: bool = False

    def with_(self, **changes: object) -> EngineOptions:
        """A copy with `changes` (field names of this class; another name is refused in one line)."""
        bad = sorted(set(changes) - {f.name for f in fields(self)})
        check(not bad, f"unknown engine options {bad}; valid: {', '.join(f.name for f in fields(self))}")
        return replace(self, **changes) if changes else self  # type: ignore[arg-type]


def options_of(options: EngineOptions | None, changes: dict[str, object]) -> EngineOptions:
    """`options` (default: every field's default) with the single-field keywords an engine was called with."""
    return (options or EngineOptions()).with_(**changes)


__all__ = ["EngineOptions", "MoEHostOps", "options_of"]
