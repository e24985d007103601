"""What torchtitan 0.3.0 cannot build of a layout, declared once: read by its Runtime (the planner offers nothing
else) and by its export (export/torchtitan.py refuses the same).

- Pipeline split (distributed/pipeline_parallel.py): pipeline_parallel_layers_per_stage = lps sets the stage count
  ceil((L + in + out) / lps); _generate_llm_fqn_per_model_part then gives every stage (L + in + out) // S "effective"
  layers, one more to the first (L + in + out) % S, the embedding weighing `in` on the first and the head `out` on
  the last (pipeline_parallel_first / last_stage_less_layers). `split` finds the (lps, in, out) whose blocks per
  stage are paracube's (modes/stages.chunk_layers); a split none gives (a deficit spread over the last stages) is
  refused.
- Experts (ParallelismConfig.expert_parallel_degree): ep folds over dp_shard x cp x tp only (efsdp = dp_shard cp tp
  / ep), dp_shard being the FSDP shard (`fsdp_shard`).
"""

from __future__ import annotations

from paracube.layout import Layout
from paracube.modes.stages import chunk_layers, split_text


def stages_of(layers: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """Blocks per stage by torchtitan's rule (module docstring)."""
    effective = layers + first_less + last_less
    per, extra = divmod(effective, stages)
    return [per + (j < extra) - (first_less if j == 0 else 0) - (last_less if j == stages - 1 else 0)
            for j in range(stages)]


def split(layers: int, pp: int, v: int) -> tuple[int, int, int] | None:
    """(layers_per_stage, first_stage_less_layers, last_stage_less_layers) under which torchtitan builds paracube's
    stages, or None where none does."""
    chunks, stages = chunk_layers(layers, pp, v), pp * v
    most = max(chunks)
    for first in range(most + 1):
        for last in range(most + 1):
            effective = layers + first + last
            per = effective // stages
            if per < 1 or first > per or last > per or stages_of(layers, stages, first, last) != chunks:
                continue
            lps = -(-effective // stages)
            if -(-effective // lps) == stages:
                return lps, first, last
    return None


def split_refusal(layers: int, pp: int, v: int) -> str | None:
    """Why torchtitan cannot build paracube's stages of `layers` blocks on pp x v (a predicate, "cannot ..."), else
    None."""
    if pp == 1 or split(layers, pp, v) is not None:
        return None
    return (f"cannot place the plan's blocks per virtual stage with its pipeline split (pipeline_parallel_layers_"
            f"per_stage and the first / last stage's less layers: {split_text(layers, pp, v)}; {layers} in all); "
            "valid: a pp x v that splits the blocks evenly, or with one block less on the first and / or last stage")


def fsdp_shard(layout: Layout) -> int:
    """torchtitan's data_parallel_shard_degree for the layout: the FSDP shard at zero=2/3 (shard=N, else dp); with
    pipelines zero=1 is FSDP over all of dp kept unsharded across micro-batches (runtimes/torchtitan.py); else 1
    (dp replicates)."""
    if layout.zero >= 2:
        return layout.shard_size
    return layout.dp if layout.zero == 1 and layout.pp > 1 else 1


def fold_refusal(layout: Layout) -> str | None:
    """Why torchtitan cannot fold the layout's experts (a clause, "its experts ..."), else None (and for a search's
    pins without dp, Layout.pin: the search sets the ranks they fold over)."""
    if layout.fold_open:
        return None
    ranks = fsdp_shard(layout) * layout.cp * layout.tensor_size
    if layout.ep > 1 and ranks % layout.ep:
        fsdp = "zero=1" if layout.pp > 1 else "zero=3"  # its FSDP stage (runtimes/torchtitan.py)
        return (f"its experts fold over dp_shard x cp x tp = {ranks} ranks only (ParallelismConfig."
                f"expert_parallel_degree), not ep={layout.ep}: use {fsdp} (FSDP over dp) or ep dividing that")
    return None


__all__ = ["fold_refusal", "fsdp_shard", "split", "split_refusal", "stages_of"]
