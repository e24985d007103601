"""The analytic cost model: closed forms per layout, vectorized, and the explicit event list of one layout.

`evaluate` scores arrays of layouts of one tensor mode (the planner's fast path); `estimate` scores one
layout with the same formulas and attaches its explicit CommEvents (traffic.py). Pipeline (1F1B,
interleaved with v chunks; Narayanan et al. 2021): with W the per-step work of the slowest stage
(compute + its per-micro-batch communication over N micro-batches), step = W (1 + (pp-1)/(v N))
+ per-step communication (gradients, grad norm, metrics). The stages considered are first (embedding),
middle and last (head, loss); memory is that of the most loaded stage. No compute/communication overlap
(see comm.py), so exposed communication = all communication.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from paracube.cost_models.comm import ALTERNATING_MODES, Entry, axes_used, calibrated_link, comm_entries
from paracube.cost_models.compute import (
    GemmModel,
    gemm_model,
    model_flops_per_step,
    ops_per_step,
    stage_compute_time,
)
from paracube.cost_models.dims import Dims, dims_of
from paracube.cost_models.links import LinkCache, placement_of
from paracube.cost_models.memory import stage_memory, total
from paracube.cost_models.traffic import stage_events
from paracube.cost_models.validity import layout_arrays, resolve_micro_batch
from paracube.estimate import MemoryBreakdown, StepEstimate
from paracube.layout import Layout
from paracube.workload import ModelSpec, TrainingSpec

Arr = np.ndarray
Links = dict[tuple[str, ...], tuple[Arr, Arr]]
STAGES = ("first", "middle", "last")
MEM_KEYS = ("parameters", "gradients", "optimizer", "activations", "temporaries")


def _flags(stage: str, pp: Arr) -> tuple[Arr, Arr]:
    """(first, last) flags per layout: without pipelining the one stage is both; pp = 2 has no middle."""
    single = pp == 1
    first = single | (stage == "first") | ((stage == "middle") & (pp == 2))
    last = single | (stage == "last")
    return first.astype(np.int64), last.astype(np.int64)


def _stage(d: Dims, mode: str, a: dict[str, Arr], links: Links, g: GemmModel, stage: str, rows: Arr) -> dict:
    """Per-config quantities (counts, payloads, compute) are computed once per configuration row of `a`;
    only the link-dependent times are evaluated per layout (`rows` maps layouts to configuration rows)."""
    F, H = _flags(stage, a["pp"])
    entries = comm_entries(d, mode, a, F, H)
    n = len(rows)
    micro, step, sent = np.zeros(n), np.zeros(n), np.zeros(len(a["dp"]))
    for e in entries:
        if not np.any(e.count):
            continue
        bw, lat = calibrated_link(g.comm, e.kind, e.n[rows], *links[e.axes], mode in ALTERNATING_MODES)
        lat_f = 2.0 * (e.n - 1) if e.kind == "all_reduce" else (1.0 if e.kind == "send" else e.n - 1.0)
        e_sent = e.sent()
        tm = (e.count * lat_f)[rows] * lat + e_sent[rows] / bw
        tm = np.where(e.count[rows] > 0, tm, 0.0)
        if e.per_step:
            step += tm
        else:
            micro += tm
        sent += np.where(e.count > 0, e_sent, 0.0)
    # Per-op overhead (Python dispatch + launch; zero without a calibration) is compute-side time of the rank.
    compute = (stage_compute_time(d, mode, a, H, g) + g.op_cost(mode) * ops_per_step(d, mode, a, F, H))[rows]
    return {"entries": entries, "micro": micro, "step": step, "sent": sent[rows], "compute": compute}


def evaluate(
    d: Dims, mode: str, a: dict[str, Arr], links: Links, g: GemmModel, rows: Arr | None = None
) -> dict[str, Arr]:
    """Scores of many layouts of one mode. `a`: int64 arrays dp, pp, t, q, d, mb, v, sp, one entry per
    configuration (valid ones); `rows[i]`: the configuration of layout i (default: one layout per
    configuration); `links[axes]`: (bandwidth, latency) arrays per layout."""
    rows = np.arange(len(a["dp"])) if rows is None else rows
    stages = [_stage(d, mode, a, links, g, s, rows) for s in STAGES]
    work = np.stack([s["compute"] + s["micro"] for s in stages])
    slow = np.argmax(work, axis=0)
    idx = np.arange(len(slow))
    pick = lambda key: np.stack([s[key] for s in stages])[slow, idx]  # noqa: E731
    N = d.global_batch / (a["dp"] * a["mb"])[rows]
    W = work[slow, idx]
    bubble = (a["pp"] - 1)[rows] / (a["v"][rows] * N) * W
    step_comm = pick("step")
    step_time = W + bubble + step_comm
    mems = [stage_memory(d, mode, a, s == "first", s == "last") for s in ("first", "last")]
    tot = np.stack([total(m) for m in mems])
    heavy = np.argmax(tot, axis=0)
    cidx = np.arange(len(heavy))
    out = {
        "step_time": step_time,
        "compute": pick("compute"),
        "comm": pick("micro") + step_comm,
        "bubble": bubble,
        "bytes": pick("sent"),
        "memory": tot[heavy, cidx][rows],
        "stage": slow,
    }
    for k in MEM_KEYS:
        out["mem_" + k] = np.stack([m[k] for m in mems])[heavy, cidx][rows]
    out["_stages"] = stages  # type: ignore[assignment]
    return out


def layout_links(layout: Layout, cache: LinkCache) -> Links:
    place = placement_of(layout)
    links: Links = {}
    for axes in axes_used(layout.mode):
        axes_ok = tuple(a for a in axes if a in layout.axis_names)
        bw, lat = cache.get(place, axes_ok)
        links[axes] = (np.array([bw]), np.array([lat]))
    return links


def estimate(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    topo: object,
    with_events: bool = True,
    cache: LinkCache | None = None,
) -> StepEstimate:
    """Predict one training step of `layout` on `topo` (see the module docstrings of this package)."""
    from paracube.cost_models.validity import violations  # local: keeps the import graph one-way

    d = dims_of(model, training)
    mb, note = resolve_micro_batch(layout, d)
    bad = violations(layout, d, mb)
    if bad:
        from paracube.errors import ParacubeError

        raise ParacubeError(f"layout {layout}: {'; '.join(bad)}")
    a = layout_arrays(layout, mb)
    g = gemm_model(topo, training.dtype)
    res = evaluate(d, layout.mode, a, layout_links(layout, cache or LinkCache(topo)), g)
    stage = STAGES[int(res["stage"][0])]
    chosen = res["_stages"][int(res["stage"][0])]  # type: ignore[index]
    links = layout_links(layout, cache or LinkCache(topo))
    by_axis: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for e in chosen["entries"]:
        e: Entry
        if e.count[0] > 0:
            tm = float(e.time(*links[e.axes], g.comm, layout.mode in ALTERNATING_MODES)[0])
            by_axis[".".join(e.axes)] += tm
            by_kind[e.kind] += tm
    world = layout.world_size
    peak = g.peak
    flops = model_flops_per_step(d)
    step = float(res["step_time"][0])
    notes = [n for n in (note,) if n]
    if layout.pp > 1:
        notes.append(f"pipeline: events and time of the slowest stage ({stage}); memory of the most loaded")
    split = {"1d": layout.tensor_size, "2d": layout.q, "2.5d": layout.q, "3d": layout.q**2}.get(
        layout.mode, 1
    )
    if d.V % split:
        notes.append(
            f"vocab {d.V} padded to a multiple of {split} for cost only (the executor needs it to divide)"
        )
    mem = MemoryBreakdown(**{k: float(res["mem_" + k][0]) for k in MEM_KEYS})
    events = tuple(stage_events(layout.with_(micro_batch=mb), d, mb, stage)) if with_events else ()
    comm = float(res["comm"][0])
    return StepEstimate(
        layout=str(layout.with_(micro_batch=mb)),
        engine="analytic",
        step_time_s=step,
        compute_time_s=float(res["compute"][0]),
        comm_time_s=comm,
        exposed_comm_time_s=comm,
        bubble_time_s=float(res["bubble"][0]),
        memory=mem,
        comm_bytes_per_gpu=float(res["bytes"][0]),
        flops_per_gpu=flops / world,
        mfu=flops / (step * peak * world),
        comm_time_by_axis=dict(by_axis),
        comm_time_by_kind=dict(by_kind),
        events=events,
        notes=tuple(notes),
    )


estimate_batch = evaluate  # the name the design notes use for the vectorized path
