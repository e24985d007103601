"""The blocks of each (virtual) pipeline stage as Megatron-core is told them: paracube's split (modes/stages.py:
chunk_layers, what the cost models price and the executor builds) written so each target builds the same stages.

- Megatron-core (0.16.1): an even split is `--num-layers-per-virtual-pipeline-stage` (v > 1) or nothing (v = 1);
  any other is `--pipeline-model-parallel-layout`, one entry per virtual stage in model order (virtual stage j =
  chunk c x pp + stage s, as Megatron's PipelineParallelLayerLayout reads it), "E" the embedding on the first, "L"
  the loss on the last, a "t" per block, runs of equal entries written `(tt|)*29` (Megatron-Bridge's DeepSeek-V3
  layouts are written so: "Et|(tt|)*30mL").
- torchtitan: runtimes/torchtitan_limits.py (its layers_per_stage split, declared once for its runtime too).
"""

from __future__ import annotations

from paracube.modes.stages import chunk_layers, run_lengths


def megatron_layout(layers: int, pp: int, v: int) -> str | None:
    """`--pipeline-model-parallel-layout`'s value for an uneven split, else None (module docstring)."""
    chunks = chunk_layers(layers, pp, v)
    if len(set(chunks)) == 1:
        return None
    stages = [("E" if j == 0 else "") + "t" * n + ("L" if j == len(chunks) - 1 else "") for j, n in enumerate(chunks)]
    return "".join(f"({s}|)*{k}" if k > 1 else f"{s}|" for s, k in run_lengths(stages[:-1])) + stages[-1]


__all__ = ["megatron_layout"]
