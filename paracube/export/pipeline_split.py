"""The blocks of each (virtual) pipeline stage as the targets are told them: paracube's split (modes/stages.py:
chunk_layers, what the cost models price and the executor builds) written so each target builds the same stages.

- Megatron-core (0.16.1): an even split is `--num-layers-per-virtual-pipeline-stage` (v > 1) or nothing (v = 1);
  any other is `--pipeline-model-parallel-layout`, one entry per virtual stage in model order (virtual stage j =
  chunk c x pp + stage s, as Megatron's PipelineParallelLayerLayout reads it), "E" the embedding on the first, "L"
  the loss on the last, a "t" per block, runs of equal entries written `(tt|)*29` (Megatron-Bridge's DeepSeek-V3
  layouts are written so: "Et|(tt|)*30mL").
- torchtitan (0.3.0, distributed/pipeline_parallel.py): pipeline_parallel_layers_per_stage = lps sets the stage
  count ceil((L + in + out) / lps); _generate_llm_fqn_per_model_part then gives every stage (L + in + out) // S
  "effective" layers, one more to the first (L + in + out) % S, the embedding weighing `in` on the first and the
  head `out` on the last (pipeline_parallel_first / last_stage_less_layers). `torchtitan_split` finds the
  (lps, in, out) whose split is paracube's; a split no such triple gives (more than one block less spread over the
  last stages, with more than two blocks a stage) is refused in one line.
"""

from __future__ import annotations

from paracube.modes.stages import chunk_layers


def megatron_layout(layers: int, pp: int, v: int) -> str | None:
    """`--pipeline-model-parallel-layout`'s value for an uneven split, else None (module docstring)."""
    chunks = chunk_layers(layers, pp, v)
    if len(set(chunks)) == 1:
        return None
    stages = [("E" if j == 0 else "") + "t" * n + ("L" if j == len(chunks) - 1 else "") for j, n in enumerate(chunks)]
    runs: list[list[object]] = []
    for s in stages[:-1]:
        if runs and runs[-1][0] == s:
            runs[-1][1] = int(runs[-1][1]) + 1  # type: ignore[call-overload]
        else:
            runs.append([s, 1])
    return "".join(f"({s}|)*{k}" if k > 1 else f"{s}|" for s, k in runs) + stages[-1]


def torchtitan_stages(layers: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """Blocks per stage by torchtitan's rule (module docstring)."""
    effective = layers + first_less + last_less
    per, extra = divmod(effective, stages)
    return [per + (j < extra) - (first_less if j == 0 else 0) - (last_less if j == stages - 1 else 0)
            for j in range(stages)]


def torchtitan_split(layers: int, pp: int, v: int) -> tuple[int, int, int] | None:
    """(layers_per_stage, first_stage_less_layers, last_stage_less_layers) under which torchtitan builds paracube's
    stages, or None where none does (module docstring)."""
    chunks, stages = chunk_layers(layers, pp, v), pp * v
    most = max(chunks)
    for first in range(most + 1):
        for last in range(most + 1):
            effective = layers + first + last
            per = effective // stages
            if per < 1 or first > per or last > per or torchtitan_stages(layers, stages, first, last) != chunks:
                continue
            lps = -(-effective // stages)
            if -(-effective // lps) == stages:
                return lps, first, last
    return None


def torchtitan_split_refusal(layers: int, pp: int, v: int) -> str | None:
    """One line where torchtitan cannot build paracube's stages, else None."""
    if pp == 1 or torchtitan_split(layers, pp, v) is not None:
        return None
    return (f"its pipeline split (pipeline_parallel_layers_per_stage with the first / last stage's less layers) "
            f"cannot place the plan's blocks per virtual stage ({split_text(layers, pp, v)}; {layers} in all); valid: "
            "a pp x v that splits the blocks evenly, or with one block less on the first and / or last stage")


def split_text(layers: int, pp: int, v: int = 1) -> str:
    """Blocks per virtual stage in order, runs counted: '1, 2 x 5, 1 x 50'."""
    runs: list[list[int]] = []
    for n in chunk_layers(layers, pp, v):
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in runs)


__all__ = ["megatron_layout", "split_text", "torchtitan_split", "torchtitan_split_refusal", "torchtitan_stages"]
