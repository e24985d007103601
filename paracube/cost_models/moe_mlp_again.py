"""On a model with MoE blocks, the dense MLP collectives a checkpointed region issues again in backward
(recompute_modules_cost.py): a dense block's MLP under `mlp`, a MoE block's shared expert under `shared_experts` or
`moe` (the MoE layer's region holds it: executor/model/moe.py). The dense engines price `moe.dense_part(model)` with
only DENSE's modules (analytic.prepare), so neither adds them; both engines add them here, from one list
(`again_events`, recompute_again.mlp_again: the MLP's forward up to its last saved tensor, phase "recompute"):
- the analytic engine adds their time per micro-batch to the MoE stage's (moe.stage_cost, as moe_unshared's drop);
- the event engine inserts their ops at the start of each such block's backward (moe_program.with_blocks);
- moe_traffic.moe_stage_events lists them (tests/test_recompute_modules_run.py: equal to the executor's record).
A shared expert's collectives are the dense MLP's (moe_traffic.py: the executor runs MoE blocks in none and 1D + sp,
whose MLP collectives carry T h, whatever the width). Blocks are numbered stage-locally (traffic labels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

from paracube.cost_models.compute import GemmModel
from paracube.cost_models.dims import Dims
from paracube.cost_models.moe_unshared import dropped_time
from paracube.cost_models.recompute_modules_cost import MOE_REGION, moe_side
from paracube.cost_models.traffic import stage_events
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.stages import stage_chunks
from paracube.moe_spec import MoESpec
from paracube.workload import ModelSpec

BLOCK = "layers.0."


def again_blocks(moe: MoESpec | None, layers: int, layout: Layout, stage: int) -> list[int]:
    """Stage-local indices of the blocks of stage `stage` (of a model of `layers` blocks) whose MLP collectives run
    again (module docstring)."""
    mods = moe_side(layout)
    if moe is None or not mods:
        return []
    shared = bool(moe.shared_ffn) and ("shared_experts" in mods or MOE_REGION in mods)
    blocks = [i for chunk in stage_chunks(layers, layout.pp, layout.interleave, stage) for i in chunk]
    return [j for j, i in enumerate(blocks) if (shared if moe.is_moe_layer(i) else "mlp" in mods)]


@lru_cache(maxsize=512)  # the stages of a layout and the search's variants of it price the same block: once
def again_events(d: Dims, layout: Layout, mb: int) -> tuple[CommEvent, ...]:
    """One block's MLP collectives of one micro-batch issued again in backward, labelled `layers.0.`."""
    one = layout.with_(pp=1, interleave=1, micro_batch=mb, recompute_modules=("mlp",))
    dm = replace(d, L=1, global_batch=layout.dp * mb, recompute="selective", recompute_modules=("mlp",))
    return tuple(e for e in stage_events(one, dm, mb) if e.phase == "recompute" and e.label.startswith(BLOCK))


def relabel(events: Sequence[CommEvent], block: int) -> list[CommEvent]:
    return [replace(e, label=e.label.replace(BLOCK, f"layers.{block}.", 1)) for e in events]


def stage_again(model: ModelSpec, d: Dims, layout: Layout, mb: int, stage: int, links: dict,
                g: GemmModel) -> tuple[dict[tuple[str, tuple[str, ...]], float], list[CommEvent]]:
    """The analytic engine's terms of one micro-batch on stage `stage`: seconds by (kind, axes), as moe_unshared
    prices a collective (fastest algorithm, per-call waits), and the events (moe.stage_cost)."""
    blocks = again_blocks(model.moe, model.layers, layout, stage)
    one = again_events(d, layout, mb) if blocks else ()
    seconds: dict[tuple[str, tuple[str, ...]], float] = {}
    alt = layout.tensor_mode.alternating
    for e in one:
        seconds[e.kind, e.axes] = seconds.get((e.kind, e.axes), 0.0) + len(blocks) * dropped_time([e], links, g, alt)
    return seconds, [e for j in blocks for e in relabel(one, j)]


__all__ = ["again_blocks", "again_events", "relabel", "stage_again"]
