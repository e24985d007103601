"""Activation offloading as each runtime runs it (Layout `off=N`): declared once per runtime (`Offload`), read by the
refusal (`offload_refusal`), the search (`offload_counts`, planner/offload_passes.py) and the engines (`overlap`:
EngineOptions.offload_overlap, cost_models/offload.py).

What the stacks run (installed packages, cited by file:line):
- Megatron-core 0.16.1: TransformerConfig.cpu_offloading / cpu_offloading_num_layers / cpu_offloading_activations
  (model_parallel_config.py:370-389; Megatron-LM's --cpu-offloading, --cpu-offloading-num-layers): layer-level, the
  first N transformer layers through Transformer Engine's get_cpu_offload_context (extensions/transformer_engine.py:
  2298-2326, transformer_block.py:303-315), copies on their own CUDA stream, double-buffered. Its checks
  (transformer_config.py:1137-1152): 0 <= N < num_layers (the last layer's activations stay: its backward follows
  at once), no pipeline parallelism, no activation recomputation (recompute_granularity None). Its module-level
  fine_grained_activation_offloading / offload_modules (transformer_config.py:889-894, 1268-1292: the inputs of
  chosen submodules, not with cpu_offloading) is not priced here.
- torchtitan 0.3.0: none in its trainer. Its `enable_cpu_offload` (config/configs.py:61) offloads FSDP's parameters,
  gradients and optimizer state, not activations; activation offloading lives in experiments/graph_trainer/
  cpu_offload.py only (a graph pass of the experimental compiler trainer): refused.
- DeepSpeed 0.19.8: activation checkpointing's `cpu_checkpointing` (activation_checkpointing/config.py:20, 84):
  with recomputation only, the checkpointed inputs of every layer copied to the host by an asynchronous engine on
  its own stream that keeps the last one on the device (checkpointing.py:65-69, 501-510: _ActivationOffloadEngine
  keep_last_count=1; its partition_activations path is not priced). So rc=full with N = layers - 1.
- paracube's executor: torch.autograd.graph.save_on_cpu around each offloaded block's forward (executor/model/
  gpt.py); its copies run on the compute stream (pack: tensor.cpu(), or a pinned copy_ on the current stream;
  torch/autograd/graph.py:400-420): in line, not overlapped. Not with full recomputation (the checkpoint saves
  nothing inside the block for the hooks to pack) nor pipelines (not wired yet), and of the recompute modules (rcm=)
  with core_attn only (executor/sizes.check_recompute_modules: the discarding checkpoints' storages are not packed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Layout = Any  # paracube.layout.Layout; Runtime: runtimes/base.py (imports this module)


@dataclass(frozen=True)
class Offload:
    """How a runtime offloads activations (module docstring)."""

    recomputes: tuple[str, ...]  # the recomputations it offloads with (rc=)
    keep_last: bool  # N <= layers - 1 (the last block's activations stay on the device)
    overlap: bool  # transfers on their own stream, overlapped with compute (else in line on the compute stream)
    all_but_last: bool = False  # N = layers - 1 only (DeepSpeed's cpu_checkpointing: every checkpoint but the last)
    modules: tuple[str, ...] = ()  # the recompute modules (rcm=) it offloads with, under rc=selective
    flags: str = ""  # how it is turned on
    source: str = ""


def offload_counts(off: Offload | None, layers: int, rungs: int = 8) -> tuple[int, ...]:
    """The offloaded block counts the search tries, fewest first: k / `rungs` of the blocks (rounded up), k = 1 ..
    `rungs`, within what the runtime runs; () where it does not offload. Eighths: each count is a pass of the search
    (planner/offload_passes.py), and a finer ladder saves under an eighth of the blocks' copies."""
    if off is None or layers < 1:
        return ()
    most = layers - 1 if off.keep_last else layers
    if off.all_but_last:
        return (most,) if most > 0 else ()
    return tuple(sorted({min(most, -(-k * layers // rungs)) for k in range(1, rungs + 1)} - {0}))


def offload_refusal(name: str, off: Offload | None, layout: Layout, layers: int | None = None,
                    recompute: str | None = None) -> str | None:
    """Why runtime `name` (its `off` declaration) cannot run the layout's `off=N` (one line after "runtime NAME
    (TITLE)"), else None; `layers` / `recompute` where known (else the count's range and the layout's rc= only)."""
    n = layout.offload
    if not n:
        return None
    if off is None:
        return f"does not offload activations to the host (off={n}); valid: off=0 (or drop off=)"
    if layout.pp > 1:
        return f"offloads activations without pipelines only (off={n} with pp={layout.pp}); valid: pp=1 or off=0"
    rc = layout.recompute or ("selective" if layout.recompute_modules else recompute)  # rcm=: selective implied
    if rc is not None and rc not in off.recomputes:
        return (f"offloads activations with rc={'/'.join(off.recomputes)} only, not rc={rc} (off={n}); "
                f"valid: rc={'/'.join(off.recomputes)} or off=0")
    lacking = [m for m in layout.recompute_modules or () if m not in off.modules]
    if lacking:
        valid = f"rcm={'+'.join(off.modules)}" if off.modules else "no rcm="
        return (f"offloads activations with the recompute modules {', '.join(off.modules) or 'none'} only, not "
                f"{', '.join(lacking)} (off={n}); valid: {valid} or off=0")
    if layers is not None:
        most = layers - 1 if off.keep_last else layers
        if off.all_but_last and n != most:
            return f"offloads every block's activations but the last or none: off={n} of {layers}; valid: off={most}"
        if n > most:
            return f"offloads at most {most} of {layers} blocks, not off={n}; valid: off=N with N in [0, {most}]"
    return None


__all__ = ["Offload", "offload_counts", "offload_refusal"]
