"""A MoE block without a shared expert (Mixtral, Qwen3-MoE) runs no dense MLP, so none of the tensor mode's MLP
collectives: the routed experts take the block's tokens as they are (1D + sp: each tensor rank dispatches its
sequence shard over the folded ep group, Megatron-core's alltoall dispatcher with etp = 1; executor/model/moe.py).
The dense engines price `moe.dense_part(model)`, whose every block has an MLP (the <= 128-wide stand-in), and so its
tensor collectives (1D: the all_reduces, with sp the all_gather / reduce_scatter of T h, forward, backward and
recomputation). Both engines take those of such blocks out again, from one list (`dropped_events`):
- the analytic engine subtracts their time per micro-batch (moe.stage_cost: collective.fastest_time on the tensor
  group's links plus the device's per-call wait, as analytic.py prices a collective);
- the event engine removes their ops from the stage's program (`drop_ops`, moe_program.with_blocks).
moe_traffic.moe_stage_events drops the same events from the executor's list (tests/test_moe_run.py: zero
difference). With tpo the MLP's collectives are rings fused with the stand-in's MLP GEMMs (collective_matmul.py,
tpo.py), dropped the same way: the analytic engine subtracts what it priced for each, its alpha-beta time less the
seconds its GEMM chunks hid (`ring_hidden_seconds`: tpo.TpoPricing's rule for a ring alone), and the event engine
turns each ring op into the compute op of its GEMM chunks (their seconds had been taken out of the unit's compute
op; mlp_delta.py takes the stand-in's whole MLP back), so both drop the rings and keep the GEMMs, as the executor
runs no MLP there (tests/test_moe_run.py's tpo cases).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from paracube.cost_models.collective import fastest_time
from paracube.cost_models.compute import GemmModel
from paracube.cost_models.dims import Dims
from paracube.cost_models.traffic import stage_events
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.stages import stage_chunks
from paracube.workload import ModelSpec

if TYPE_CHECKING:  # annotations only: the event engine loads where it runs
    from paracube.cost_models.event_program import StageProgram

MLP = "layers.0.mlp."  # one block's MLP collectives (traffic labels carry the stage-local block index)


@lru_cache(maxsize=1024)  # every stage of a layout drops the same (its args hash)
def dropped_events(model: ModelSpec, d: Dims, layout: Layout, mb: int) -> tuple[CommEvent, ...]:
    """One MoE block's dense-MLP collectives of one micro-batch that the dense part prices and the block does not
    run (module docstring); () with a shared expert or without a tensor group."""
    moe = model.moe
    if moe is None or moe.shared_ffn or layout.tensor_size == 1:
        return ()
    one = layout.with_(pp=1, interleave=1, micro_batch=mb)
    return tuple(e for e in stage_events(one, replace(d, L=1, global_batch=layout.dp * mb), mb)
                 if mlp_tensor(e.label, e.axes, (MLP,), layout) and e.phase in ("fwd", "bwd", "recompute"))


def mlp_tensor(label: str, axes: tuple[str, ...], prefixes: tuple[str, ...], layout: Layout) -> bool:
    """A dense MLP's tensor collective: its label under one of `prefixes` and its group inside the tensor group
    (zero=3's gather of the block's unit, labelled after the block's last program unit, the MLP, is the block's,
    not the MLP's: traffic._unit_labels)."""
    return bool(prefixes) and label.startswith(prefixes) and set(axes) <= set(layout.tensor_axes)


def unshared_blocks(model: ModelSpec, layout: Layout, stage: int) -> list[int]:
    """Stage-local indices (the program's and traffic's block numbering) of the stage's MoE blocks whose MLP
    collectives are dropped (`dropped_events` applies)."""
    moe = model.moe
    if moe is None or moe.shared_ffn or layout.tensor_size == 1:
        return []
    blocks = [i for chunk in stage_chunks(model.layers, layout.pp, layout.interleave, stage) for i in chunk]
    return [j for j, i in enumerate(blocks) if moe.is_moe_layer(i)]


def dropped_time(events: Sequence[CommEvent], links: dict, g: GemmModel, alternating: bool) -> float:
    """Seconds the analytic engine priced for `events` (fastest algorithm, per-call waits; `alternating`: the
    layout's mode switches groups, GemmModel.call_wait)."""
    total = 0.0
    for e in events:
        bw, lat = links[e.axes]
        t = float(np.asarray(fastest_time(e.kind, e.group_size, 1, e.payload_bytes, bw, lat)).ravel()[0])
        if g.waits:
            t += float(np.asarray(g.call_wait(e.kind, e.group_size, e.payload_bytes, e.dtype,
                                              alternating)).ravel()[0])
        total += t
    return total


def ring_hidden_seconds(events: tuple[CommEvent, ...], d: Dims, layout: Layout, mb: int, links: dict,
                        g: GemmModel) -> float:
    """Of `events` (one block's MLP collectives), the seconds their tpo rings hid behind their GEMM chunks as the
    analytic engine priced them (stage_scores: alpha-beta less tpo.TpoPricing.hidden; 1D's rings run alone, no
    lock-step weight ring); 0 without tpo."""
    if not layout.tpo or not events:
        return 0.0
    from paracube.cost_models.tpo import gemm_seconds, ring_hidden  # the tpo pricing loads where tpo is priced
    from paracube.cost_models.validity import layout_arrays
    from paracube.modes import MODES

    mode = MODES[layout.mode]
    decl = {(c.label, c.kind, c.axes, phase): c for phase, calls in (("fwd", mode.layer_fwd(d)),
                                                                      ("bwd", mode.layer_bwd(d)))
            for c in calls if c.tpo}
    b, total = layout_arrays(layout, mb), 0.0
    for e in events:
        c = decl.get((e.label.split(".", 2)[2], e.kind, e.axes, "bwd" if e.phase == "bwd" else "fwd"))
        if c is None:
            continue
        bw, lat = links[e.axes]
        ab = float(np.asarray(fastest_time(e.kind, e.group_size, 1, e.payload_bytes, bw, lat)).ravel()[0])
        gemm = np.asarray(gemm_seconds(d, layout.mode, b, c.tpo, g)).ravel()[0]
        total += float(np.asarray(ring_hidden(c, ab, e.group_size, gemm, False)).ravel()[0])
    return total


def drop_ops(prog: StageProgram, blocks: list[int], layout: Layout) -> None:
    """Remove the MLP collectives of the stage-local `blocks` from every forward and backward list of `prog`; a tpo
    ring's GEMM chunks (Op.gemm) stay, as a compute op of their seconds (module docstring)."""
    prefixes = tuple(f"layers.{i}.mlp." for i in blocks)
    if not prefixes:
        return
    from paracube.cost_models.event_ops import Op  # the event engine's op type, where its programs are built

    def dropped(op: Op) -> bool:
        axes = op.event.axes if op.event is not None else tuple(layout.tensor_axes)
        return op.kind == "comm" and mlp_tensor(op.name, axes, prefixes, layout)

    for lists in (prog.fwd, prog.fwd_first, prog.bwd, prog.bwd_last):
        lists[:] = [[Op("compute", f"{op.name} gemm", op.gemm) if dropped(op) else op
                     for op in ops if not dropped(op) or op.gemm > 0] for ops in lists]


def drop_stage_events(events: tuple[CommEvent, ...], blocks: list[int], layout: Layout) -> tuple[CommEvent, ...]:
    """`events` (one stage's step) without the MLP collectives of its stage-local `blocks`."""
    prefixes = tuple(f"layers.{i}.mlp." for i in blocks)
    return tuple(e for e in events if not mlp_tensor(e.label, e.axes, prefixes, layout))


__all__ = ["drop_ops", "drop_stage_events", "dropped_events", "dropped_time", "mlp_tensor", "ring_hidden_seconds"]
