"""The event engine's FSDP program (zero=2/3, pp = 1): each unit's gather prefetched one unit ahead, its
reduce-scatter asynchronous, HSDP's replica all-reduce after it, FSDP's copies around them (fsdp_copies.py).

The issue and wait points are fsdp_overlap.py's (its module docstring states them and the analytic recursion that
prices the same program); `prefetch_program` rewrites a stage's event program (event_program.build_stage) in place.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from paracube.cost_models.event_ops import Op
from paracube.cost_models.fsdp_copies import gather_copy, scatter_copy

EMBEDDING = ("emb", "tok_emb", "pos_emb", "embedding")
HEAD = ("ln_f", "head", "loss")


def _unit_key(name: str) -> str | None:
    """The FSDP unit an op of the event program belongs to (traffic labels, event_program op names)."""
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) > 1:
        return f"layers.{parts[1]}"
    return "emb" if parts[0] in EMBEDDING else ("head" if parts[0] in HEAD else None)


def _prefetched(ops: list[Op], backward: bool, prefetch: bool = True, overlap: bool = True,
                copy: tuple[int, float] = (2, 0.0)) -> list[Op]:
    """One micro-batch's forward or backward with every unit's gather issued as the previous unit starts and
    waited for as its own starts (the first unit's: at once), and (backward) its reduce-scatter asynchronous,
    all of them waited for at the end (module docstring); each gather's copy-out after it, each reduce-scatter's
    copy-in before it (fsdp_copies.py; `copy`: (c, memory-bound bytes/s), 0: none)."""
    c, rate = copy
    gathers = {_unit_key(op.name): op for op in ops if op.kind == "comm" and op.name.endswith(".gather")}
    order = list(dict.fromkeys(k for k in (_unit_key(op.name) for op in ops) if k is not None))
    with_gather = [k for k in order if k in gathers]
    nxt = {k: next((g for g in with_gather if order.index(g) > i), None) for i, k in enumerate(order)}
    out: list[Op] = []
    issued: set[str] = set()

    def issue(key: str | None) -> None:
        if prefetch and key is not None and key not in issued:
            issued.add(key)
            out.append(replace(gathers[key], asynchronous=True, tag=key))

    issue(with_gather[0] if with_gather else None)
    started: set[str] = set()
    for op in ops:
        key = _unit_key(op.name)
        if key is not None and key not in started:
            started.add(key)
            if key in gathers and prefetch:
                out.append(replace(gathers[key], kind="wait", name=f"{key}.gather.wait", event=None, tag=key))
            elif key in gathers:  # in line, before the unit's first op (as analytic's recursion has it)
                out.append(gathers[key])
            if key in gathers and rate > 0:
                out.append(Op("compute", f"{key}.gather.copy", float(gather_copy(gathers[key].event.payload_bytes,
                                                                                  rate))))
            issue(nxt[key])
        if op.kind == "comm" and op.name.endswith(".gather"):
            continue
        if op.kind == "comm" and op.name.endswith(".rs") and rate > 0:
            out.append(Op("compute", f"{op.name}.copy", float(scatter_copy(op.event.payload_bytes, c, rate))))
        if backward and overlap and op.kind == "comm" and op.name.endswith(".rs"):
            op = replace(op, asynchronous=True)
        out.append(op)
    if backward and overlap:
        out.append(replace(ops[-1], kind="wait", name="reduce_scatter.wait", event=None, asynchronous=False, tag="",
                           seconds=0.0, gemm=0.0))
    return out


def replica_buckets(prog: Any) -> None:
    """HSDP with overlap: each unit's replica all_reduce (the step's tail, registration order) issued
    asynchronously right after the last micro-batch's reduce-scatter of that unit (backward order), as FSDP2
    does once per step; waited for before the optimizer. In place (pp = 1: one chunk)."""
    reps = [op for op in prog.tail if op.event is not None and op.event.label == "gradients.replicas"]
    ops = prog.bwd_last[0]
    where = [i for i, op in enumerate(ops) if op.kind == "comm" and op.name.endswith(".rs")]
    if not reps or len(where) != len(reps):
        return
    for op in reps:
        prog.tail.remove(op)
    for i, op in sorted(zip(where, reversed(reps), strict=True), reverse=True):
        ops.insert(i + 1, replace(op, asynchronous=True))
    prog.tail.insert(0, replace(reps[0], kind="wait", name="gradients.replicas.wait", event=None))


def prefetch_program(prog: Any, prefetch: bool = True, overlap: bool = True, copy: tuple[int, float] = (2, 0.0)
                     ) -> None:
    """The event program of a zero=2/3 stage (pp = 1; with pipelines event_program.py leaves them in line),
    rewritten with FSDP's prefetch (`prefetch`) and asynchronous reduce-scatters (`overlap`: the layout's)
    (module docstring); in place."""
    for lists, backward in ((prog.fwd, False), (prog.fwd_first, False), (prog.bwd, True), (prog.bwd_last, True)):
        lists[:] = [_prefetched(ops, backward, prefetch, overlap, copy) for ops in lists]
    if overlap:
        replica_buckets(prog)


__all__ = ["prefetch_program", "replica_buckets"]
