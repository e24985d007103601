"""The event engine's context-parallel ring: each p2p step runs alongside the attention on one block of keys.

build_stage (event_program.py) lists a cp layout's exchange as traffic.py does (modes/context.py): per layer,
forward (and recompute) cp - 1 KV sends, backward cp - 1 KV and cp dK, dV sends. `ring_ops` rewrites one
micro-batch's op list into the decomposition cost_models/context_parallel.py prices:
- forward / recompute: each KV send carries one block's attention (A_f / cp, context_parallel.ring_blocks) and
  runs alongside it (Op.alongside: event.py runs the transfer and that compute together, the step taking the
  longer of the two); those seconds leave the layer's compute ops of the phase (the attention unit's first);
- backward: the k-th KV send and the k-th dK, dV send (k < cp - 1) become one batched exchange of 2 KV bytes
  alongside one block's backward attention (A_b / cp); the last dK, dV send stays alone, after the attention.
So per step exposed = max(0, step - block), as the analytic model has it. The blocks are the core's at its true
head widths (context_parallel.ring_blocks); the layer's dense ops give up the dense core's share of them
(1 / compute.core_scale) and moe_program.with_blocks adds the attention correction less the rest
(context_parallel.ring_core_extra), so each layer's compute is the analytic engine's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from paracube.cost_models.compute import GemmModel, core_scale
from paracube.cost_models.context_parallel import is_ring, ring_blocks
from paracube.cost_models.dims import Dims
from paracube.modes import LayoutBatch

BWD_SUFFIXES = (".dX", ".dA")


def _layer_phase(op: Any) -> tuple[int, str]:
    parts = op.event.label.split(".")
    return int(parts[1]), op.event.phase


def _is_compute_of(name: str, layer: int, phase: str) -> bool:
    """A compute op of `layer` in `phase` (event_program.py's names)."""
    prefix = f"layers.{layer}."
    if not name.startswith(prefix):
        return False
    if phase == "recompute":  # the recompute op; a selective core re-run sits in the backward's (recompute.py)
        return name == prefix + "recompute" or name.endswith(BWD_SUFFIXES)
    return name.endswith(".fwd") if phase == "fwd" else name.endswith(BWD_SUFFIXES)


def _take(ops: list[Any], layer: int, phase: str, unit: str, seconds: float) -> None:
    """Remove `seconds` from the compute ops of `layer` in `phase`, the attention unit's first."""
    idx = [i for i, op in enumerate(ops) if op.kind == "compute" and _is_compute_of(op.name, layer, phase)]
    own = f"layers.{layer}.{unit}."
    idx.sort(key=lambda i: (not ops[i].name.endswith(".recompute"), not ops[i].name.startswith(own)))
    for i in idx:
        if seconds <= 0:
            return
        cut = min(seconds, ops[i].seconds)
        ops[i] = replace(ops[i], seconds=ops[i].seconds - cut)
        seconds -= cut


def ring_ops(ops: list[Any], d: Dims, mode: str, b: LayoutBatch, g: GemmModel, unit: str,
             shares: list[float] | None = None) -> list[Any]:
    """One op list of a cp layout with its p2p ring steps alongside the attention blocks (module docstring);
    `shares`: each layer's windowed share where its blocks differ (window_stages.block_shares), its attention blocks
    then its own; None: every layer's of `d`."""
    if d.cp == 1 or d.cp_comm != "p2p":
        return ops
    mean = tuple(float(x[0]) for x in ring_blocks(d, mode, b, g))
    own = {x: tuple(float(y[0]) for y in ring_blocks(replace(d, window_frac=x), mode, b, g))
           for x in set(shares or ())}
    scale = core_scale(d)  # the blocks' true core; the dense part's ops hold 1 / scale of it (ring_core_extra)
    out = list(ops)
    ring = [i for i, op in enumerate(out) if op.kind == "comm" and op.event is not None
            and is_ring(op.event.kind, op.event.axes)]
    groups: dict[tuple[int, str], list[int]] = {}
    for i in ring:
        groups.setdefault(_layer_phase(out[i]), []).append(i)
    drop: set[int] = set()
    for (layer, phase), idx in groups.items():
        block_f, block_b = mean if shares is None else own[shares[layer]]
        if phase != "bwd":
            for i in idx:
                out[i] = replace(out[i], gemm=block_f, alongside=True)
            _take(out, layer, phase, unit, block_f * len(idx) / scale)
            continue
        kv = [i for i in idx if out[i].event.label.endswith("cp_kv")]
        dkv = [i for i in idx if out[i].event.label.endswith("cp_dkv")]
        for i, j in zip(kv, dkv, strict=False):  # cp - 1 batched steps; the last dK, dV stays alone
            e = out[i].event
            both = replace(e, payload_bytes=2 * e.payload_bytes, label=e.label + "+dkv")
            out[i] = replace(out[i], event=both, name=both.label, gemm=block_b, alongside=True)
            drop.add(j)
        _take(out, layer, phase, unit, block_b * len(kv) / scale)
    return [op for i, op in enumerate(out) if i not in drop]


__all__ = ["ring_ops"]
