"""Published (or your own) training runs as a table: parse, predict, fit a few device/fabric efficiencies.

A runs CSV has one row per measured run. Columns (one line of error naming row and field on bad input):
    run            a name
    cluster        a preset name (topologies/presets.py), e.g. dgx-a100
    gpus           world size (the layout's dp x pp x tensor ranks must equal it)
    model          a model preset (model_presets.resolve_model) -- or hidden, heads, layers, vocab (gpt, ffn = 4h) and
                   optionally kv_heads (grouped-query attention), ffn, family (gpt | llama)
    seq, global_batch, dtype, recompute (none | selective | full)
    layout         layout text (layout.parse_layout); fields it leaves open (mb, v) the planner chooses
    measured_step_s  measured seconds per optimizer step
    split          optional: fit | held_out (default fit)
    runtime        optional: the runtime the row is planned for (paracube/runtimes, e.g. torchtitan for FSDP
                   runs); empty or absent: the caller's (`predict(..., runtime)`, the benchmark's --runtime).
                   Saved activations are counted as Megatron kept them (TrainingSpec.activations="megatron")
                   unless the row names a runtime other than megatron ("paracube": flash attention, no dropout)
    grad_bucket    optional: the gradient bucket the run's stack used; empty: 25 MiB (torch DDP's default, what
                   paracube's executor and exports use, modes/buckets.py); `mcore`: Megatron-core's default,
                   max(40M, 1M x dp x cp) fp32 elements (megatron/core/distributed/distributed_data_parallel.py:
                   the bucket grows with the data-parallel size so that the ring's (n - 1) latency steps stay
                   amortized; NeMo 2 recipes leave it unset); or a number of elements
    grad_reduce    optional: fp32 (default) | bf16, the gradient buffers' dtype, which the data-parallel
                   reduction sends and memory holds (Megatron-core's grad_reduce_in_fp32; NeMo's performance
                   scripts set it False for FP8 runs, scripts/performance/llm/pretrain_*.py, and keep
                   bf16_mixed's True for bf16 ones; Megatron-Bridge's Qwen3-MoE and DeepSeek-V3 recipes set it
                   False in every precision, 0.1.0rc4 recipes/qwen/qwen3_30b_a3b.py:175)
    capacity_factor  optional, MoE rows: the experts' capacity factor of a token-drop run (Megatron-Bridge's
                   "tokendrop": 1.0, padded to capacity); empty: the preset's (dropless). It also sets the dispatcher:
                   Megatron-core runs DeepEP dropless only (cost_models/moe_dispatch.py)
    dispatcher     optional, MoE rows: the token dispatcher the run used (moe_dispatch.DISPATCHERS): alltoall,
                   deepep or hybridep (Megatron-core's flex dispatcher backends); empty: the runtime's
                   (Runtime.moe_dispatch)

Prediction: the planner's best layout matching the row's layout (search with `fixed`), its analytic step
time. Fit (`fit_runs`): least squares on log(predicted / measured) over the fit rows of the few
`calibration.gemm` efficiencies (eff_max, the shape constant m0 = n0 = k0, mem_eff) and the fabric
efficiencies (`link.intra_eff`, `link.inter_eff`: fraction of the spec-sheet NVLink / InfiniBand rate a
collective reaches), the same for every run: never a per-run factor.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from paracube.cost_models.moe_dispatch import DISPATCHERS
from paracube.errors import ParacubeError, check
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import resolve_model
from paracube.modes.buckets import GRAD_BYTES
from paracube.runtimes import RUNTIMES, Runtime, get_runtime
from paracube.topologies.nvswitch import SYSTEMS, fabrics
from paracube.topologies.presets import PRESETS, Fit
from paracube.workload import ModelSpec, TrainingSpec

REQUIRED = ("run", "cluster", "gpus", "seq", "global_batch", "dtype", "recompute", "layout", "measured_step_s")
SHAPE = ("hidden", "heads", "layers", "vocab")


@dataclass(frozen=True)
class Run:
    name: str
    cluster: str
    gpus: int
    model: ModelSpec
    training: TrainingSpec
    layout: Layout
    measured_s: float
    split: str = "fit"
    runtime: str | None = None  # the row's own runtime (None: the caller's)
    bucket_bytes: int | None = None  # the run's gradient bucket in bytes (None: modes/buckets.BUCKET_BYTES)
    grad_bytes: int = 4  # the run's gradient element (grad_reduce column: fp32 4, bf16 2)
    dispatcher: str | None = None  # the run's MoE token dispatcher (None: the runtime's)


def _int(where: str, value: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ParacubeError(f"{where}={value!r} must be a positive integer") from None
    if out < 1:
        raise ParacubeError(f"{where}={value!r} must be a positive integer")
    return out


def _float(where: str, value: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ParacubeError(f"{where}={value!r} must be a positive number of seconds") from None
    if not out > 0:
        raise ParacubeError(f"{where}={value!r} must be a positive number of seconds")
    return out


def _model(where: str, row: dict[str, str], seq: int) -> ModelSpec:
    if row.get("model"):
        try:
            return resolve_model(row["model"])
        except ParacubeError as e:
            raise ParacubeError(f"{where}: model: {e}") from None
    missing = [k for k in SHAPE if not row.get(k)]
    if missing:
        raise ParacubeError(f"{where}: missing column {missing[0]!r} (give model=PRESET or {', '.join(SHAPE)})")
    h, heads, layers, vocab = (_int(f"{where}: {k}", row[k]) for k in SHAPE)
    try:
        kv = _int(f"{where}: kv_heads", row["kv_heads"]) if (row.get("kv_heads") or "").strip() else None
        ffn = _int(f"{where}: ffn", row["ffn"]) if (row.get("ffn") or "").strip() else 4 * h
        family = (row.get("family") or "").strip() or "gpt"
        return ModelSpec(row["run"] or "run", layers, h, heads, ffn, vocab, seq, family=family,  # type: ignore[arg-type]
                         kv_heads=kv)
    except ParacubeError as e:
        raise ParacubeError(f"{where}: {e}") from None


def parse_row(i: int, row: dict[str, str], clusters: tuple[str, ...]) -> Run:
    """One CSV row (line i of the file) -> Run; one ParacubeError line naming the row and the field."""
    where = f"row {i} ({row.get('run') or '?'})"
    for key in REQUIRED:
        if not (row.get(key) or "").strip():
            raise ParacubeError(f"{where}: missing {key!r}; columns needed: {', '.join(REQUIRED)}")
    if row["cluster"] not in clusters:
        raise ParacubeError(f"{where}: cluster={row['cluster']!r} is not a preset; valid: {', '.join(clusters)}")
    gpus, seq, batch = (_int(f"{where}: {k}", row[k]) for k in ("gpus", "seq", "global_batch"))
    model = _model(where, row, seq)
    cap = (row.get("capacity_factor") or "").strip()
    if cap:
        check(model.moe is not None, f"{where}: capacity_factor={cap!r} for {model.name}, which has no experts")
        model = replace(model, moe=replace(model.moe, capacity_factor=_float(f"{where}: capacity_factor", cap)))
    dispatcher = (row.get("dispatcher") or "").strip() or None
    if dispatcher is not None:
        check(model.moe is not None, f"{where}: dispatcher={dispatcher!r} for {model.name}, which has no experts")
        check(dispatcher in DISPATCHERS, f"{where}: dispatcher={dispatcher!r}; valid: {', '.join(DISPATCHERS)}")
        check(dispatcher != "deepep" or not cap, f"{where}: dispatcher=deepep with capacity_factor={cap}: "
              "Megatron-core runs DeepEP dropless only (leave one empty)")
    runtime = (row.get("runtime") or "").strip() or None
    if runtime is not None and runtime not in RUNTIMES:
        raise ParacubeError(f"{where}: runtime={runtime!r}; valid: {', '.join(RUNTIMES)}")
    # Saved activations as Megatron kept them (dropout, unfused attention's s x s) unless the row names another
    # runtime: those (torchtitan: SDPA flash, no dropout) save what paracube's executor does.
    acts = "megatron" if runtime in (None, "megatron") else "paracube"
    try:
        training = TrainingSpec(global_batch=batch, seq_len=seq, dtype=row["dtype"],  # type: ignore[arg-type]
                                recompute=row["recompute"], activations=acts)  # type: ignore[arg-type]
        layout = parse_layout(row["layout"])
    except ParacubeError as e:
        raise ParacubeError(f"{where}: {e}") from None
    if layout.world_size != gpus:
        raise ParacubeError(f"{where}: layout={row['layout']!r} has {layout.world_size} ranks, gpus={gpus}")
    split = (row.get("split") or "fit").strip()
    if split not in ("fit", "held_out"):
        raise ParacubeError(f"{where}: split={split!r}; valid: fit, held_out")
    return Run(row["run"], row["cluster"], gpus, model, training, layout,
               _float(f"{where}: measured_step_s", row["measured_step_s"]), split, runtime,
               _bucket(where, (row.get("grad_bucket") or "").strip(), layout),
               _grad_bytes(where, (row.get("grad_reduce") or "").strip()), dispatcher)


GRAD_REDUCE = {"": 4, "fp32": 4, "bf16": 2}


def _grad_bytes(where: str, value: str) -> int:
    check(value in GRAD_REDUCE, f"{where}: grad_reduce={value!r}; valid: fp32, bf16 (empty: fp32)")
    return GRAD_REDUCE[value]


MCORE_BUCKET_MIN, MCORE_BUCKET_PER_DP = 40_000_000, 1_000_000  # elements (Megatron-core DDP's default)


def _bucket(where: str, value: str, layout: Layout) -> int | None:
    """The grad_bucket column as bytes of fp32 gradients (None: the default bucket)."""
    if not value:
        return None
    if value == "mcore":
        return GRAD_BYTES * max(MCORE_BUCKET_MIN, MCORE_BUCKET_PER_DP * layout.dp * layout.cp)
    return GRAD_BYTES * _int(f"{where}: grad_bucket (mcore or a number of elements)", value)


def read_runs(path: str | Path, clusters: tuple[str, ...]) -> list[Run]:
    p = Path(path)
    if not p.is_file():
        raise ParacubeError(f"runs file {str(p)!r} does not exist")
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [k for k in REQUIRED if k not in (reader.fieldnames or ())]
        if missing:
            raise ParacubeError(f"{p}: missing column {missing[0]!r}; columns needed: {', '.join(REQUIRED)}")
        return [parse_row(i, row, clusters) for i, row in enumerate(reader, start=2)]


def preset_topology(run: Run, fit: Fit | None = None) -> object:
    """The run's cluster preset at its GPU count, with `fit`'s efficiencies (default: the shipped ones)."""
    preset = PRESETS[run.cluster]
    # GPUs per node: the preset's, or (a run smaller than a node, or not a multiple of it: 128 GPUs of GB200
    # NVL72 racks run as 2 x 64) the largest divisor of the run's GPU count below it.
    per = max(n for n in range(1, min(run.gpus, preset.devices_per_node) + 1) if run.gpus % n == 0)
    check(run.gpus % per == 0, f"run {run.name}: gpus={run.gpus} is not a multiple of {per} per node")
    if fit is None:
        return preset.build(run.gpus // per, per)
    return preset.build(run.gpus // per, per, fit=fit)


def step_time(run: Run, layout: Layout, topo: object, runtime: str = "paracube") -> float:
    """Analytic step time of a fully specified layout (mb, v chosen) of the run, priced as `predict` prices it
    for the runtime (the row's own, else `runtime`): its parameter-gather overlap and FP8 scaling, the run's
    gradient bucket."""
    return run_estimate(run, layout, topo, runtime).step_time_s


def run_runtime(run: Run, runtime: str = "paracube") -> Runtime:
    """The runtime a row is priced for: its own (else `runtime`), with the row's MoE dispatcher where it names one."""
    rt = get_runtime(run.runtime or runtime)
    return rt if run.dispatcher is None else replace(rt, moe_dispatch=run.dispatcher)


def run_estimate(run: Run, layout: Layout, topo: object, runtime: str = "paracube") -> StepEstimate:
    """`step_time`'s whole analytic estimate (compute, exposed communication, bubble, time per mesh axis)."""
    from paracube.cost_models.analytic import estimate  # local: calibration sits above cost_models
    from paracube.planner.dimensions import PARAM_OVERLAP, chosen

    rt = run_runtime(run, runtime)
    param_overlap = chosen(PARAM_OVERLAP, rt, layout)
    options = rt.engine_options().with_(param_overlap=param_overlap, grad_bytes=run.grad_bytes,
                                        **({} if run.bucket_bytes is None else {"bucket_bytes": run.bucket_bytes}))
    return estimate(run.model, run.training, layout, topo, with_events=False, options=options)


PARAMS = ("eff_max", "m0", "mem_eff", "intra", "inter", "fp8_eff_max", "fp8_m0", "flash_eff", "overlap_drag",
          "straggler")
# plausible ranges: GEMM efficiencies below the datasheet peak, shape constants of a few tiles, memory-bound
# kernels below HBM bandwidth, collectives below the link rate, fused attention below the GEMMs' eff_max
BOUNDS = ((0.2, 0.95), (16.0, 512.0), (0.2, 0.9), (0.1, 1.0), (0.1, 1.0), (0.2, 0.95), (16.0, 1024.0), (0.1, 0.8),
          (0.0, 1.0), (0.0, 0.2))  # overlap_drag: from free overlap to none (cost_models/overlap_drag.py);
# straggler: from no jitter to 0.2 sqrt(s) (a 2 s step's replicas 14% apart: cost_models/stragglers.py)


def exercised(runs: list[Run]) -> tuple[str, ...]:
    """The PARAMS a set of runs exercises: the 16-bit curve (a run in a 16-bit dtype), the FP8 curve (an fp8
    run), memory-bound work (every run), intra-node (a multi-GPU run), inter-node (a multi-node run). The shape
    constants are left out (held at their start) unless the runs span shapes that separate them from eff_max
    (three or more distinct hidden sizes): weak-scaling series at one or two shapes cannot."""
    sixteen = any(r.training.dtype != "fp8" for r in runs)
    eight = any(r.training.dtype == "fp8" for r in runs)
    shapes = len({r.model.hidden for r in runs}) >= 3
    multi = any(r.gpus > PRESETS[r.cluster].devices_per_node for r in runs)
    flash = any(r.layout.flash != 0 for r in runs)
    ok = {"eff_max": sixteen, "m0": sixteen and shapes, "mem_eff": True, "intra": any(r.gpus > 1 for r in runs),
          "inter": multi, "fp8_eff_max": eight, "fp8_m0": eight and shapes, "flash_eff": flash and shapes,
          "overlap_drag": False, "straggler": False}  # freed by name only (benchmarks/published_runs.py
    # --refit): the other figures absorb part of them, so a default fit keeps the shipped figures
    return tuple(p for p in PARAMS if ok[p])


def _value(fit: Fit, p: str) -> float:
    v = getattr(fit, p)
    if v is None and p in ("overlap_drag", "straggler"):  # no figure: overlap free, no jitter
        return 0.0
    if v is None and p == "flash_eff":  # no figure yet: what the GEMM curve gives a 4096-token head of 128
        return fit.eff_max * 4096 / (4096 + fit.m0) * 128 / (128 + fit.m0)
    return float(v if v is not None else getattr(fit, p.removeprefix("fp8_")))  # no FP8 curve: the 16-bit one


def fit_cluster(runs: list[Run], start: Fit, layouts: list[Layout], runtime: str = "paracube",
                free: tuple[str, ...] | None = None) -> tuple[Fit, list[float]]:
    """Least squares on log(predicted / measured) over `runs` (one cluster) of the efficiencies `free` (default:
    those the runs exercise, `exercised`), each run's layout (micro-batch, interleave) held at `layouts`.
    The rest stay at `start`."""
    from scipy.optimize import least_squares

    free = exercised(runs) if free is None else free
    has_fp8 = start.fp8_eff_max is not None or any(p.startswith("fp8_") for p in free)

    def fit_of(x: np.ndarray) -> Fit:
        values = {p: _value(start, p) for p in PARAMS}
        values.update(dict(zip(free, (float(v) for v in x), strict=True)))
        if not has_fp8:
            values.update(fp8_eff_max=None, fp8_m0=None)  # type: ignore[arg-type]
        if start.flash_eff is None and "flash_eff" not in free:
            values["flash_eff"] = None  # type: ignore[assignment]
        return Fit(**values)

    def residuals(x: np.ndarray) -> np.ndarray:
        f = fit_of(x)
        return np.array([np.log(step_time(r, lay, preset_topology(r, f), runtime) / r.measured_s)
                         for r, lay in zip(runs, layouts, strict=True)])

    lo, hi = zip(*(BOUNDS[PARAMS.index(p)] for p in free), strict=True)
    x0 = np.clip([_value(start, p) for p in free], lo, hi)
    res = least_squares(residuals, x0, bounds=(lo, hi), x_scale=np.maximum(x0, 1e-3), diff_step=1e-3,
                        max_nfev=60)
    return fit_of(res.x), [float(np.expm1(v)) for v in res.fun]


def fit_runs(runs: list[Run], cluster: str, rounds: int = 2, runtime: str = "paracube",
             free: tuple[str, ...] | None = None) -> tuple[Fit, list[tuple[Run, Layout, float]]]:
    """Fit the cluster's efficiencies on its `fit` rows; between rounds every run's open choices (mb, v) are
    re-searched with the new efficiencies. Returns the fit and (run, layout, predicted s) for every row the
    runtime plans (rows it refuses are left out)."""
    mine = [r for r in runs if r.cluster == cluster]
    check(bool(mine), f"no run on cluster {cluster!r} in the runs file; clusters there: "
          f"{', '.join(sorted({r.cluster for r in runs}))}")
    fit_rows = [r for r in mine if r.split == "fit"]
    check(bool(fit_rows), f"no fit row on cluster {cluster!r} (split column: fit | held_out)")
    current = shipped_fit(PRESETS[cluster].build(1, 1).device.name, cluster)
    for _ in range(rounds):
        layouts = [predict(r, preset_topology(r, current), runtime)[0] for r in fit_rows]
        current, _ = fit_cluster(fit_rows, current, layouts, runtime, free)
    out = []
    for r in mine:
        try:
            lay, pred = predict(r, preset_topology(r, current), runtime)
        except ParacubeError:
            continue
        out.append((r, lay, pred))
    return current, out


def shipped_fit(device: str, cluster: str) -> Fit:
    """The efficiencies a preset ships (topologies/efficiency.py DEVICE_EFF, FABRIC_EFF) as a Fit."""
    from paracube.topologies.presets import DEVICE_EFF, FABRIC_EFF

    eff = DEVICE_EFF.get(device, {"eff_max": 0.85, "m0": 64.0, "mem_eff": 0.8})
    intra, inter = CLUSTER_FABRICS.get(cluster, ("", ""))
    return Fit(eff["eff_max"], eff["m0"], eff["mem_eff"], FABRIC_EFF.get(intra, 1.0), FABRIC_EFF.get(inter, 1.0),
               eff.get("fp8_eff_max"), eff.get("fp8_m0"), eff.get("flash_eff"), eff.get("overlap_drag"),
               eff.get("straggler"))


# Every NVSwitch preset's (intra-node, inter-node) fabrics (topologies/nvswitch.py): runs on any of them fit
# their device generation's and fabrics' figures.
CLUSTER_FABRICS = {name: fabrics(name) for name in SYSTEMS}
FITTABLE = tuple(CLUSTER_FABRICS)


def predict(run: Run, topo: object, runtime: str = "paracube") -> tuple[Layout, float]:
    """The planner's best layout matching the run's (its open fields chosen by the search for `runtime`: its
    overlaps, zero stages) and its step time (analytic engine). The row's own runtime column, where given,
    overrides `runtime`. The run's recomputation is pinned; sequence parallelism only where the layout asks.
    A layout the runtime cannot run: ParacubeError (one line)."""
    from paracube.planner.search import search  # local: calibration sits above the planner in the layers

    rt = run_runtime(run, runtime)
    why = rt.refusal(run.layout, run.model.family, run.model.tied_embeddings, run.training.dtype)
    check(why is None, f"run {run.name}: layout {run.layout}: {why}")
    fixed = run.layout if run.layout.sequence_parallel else run.layout.with_(forbid_sp=True)
    res = search(run.model, run.training, topo, run.gpus, fixed=fixed, top_k=1, zeros=[0, 1], runtime=rt,
                 bucket_bytes=run.bucket_bytes, grad_bytes=None if run.grad_bytes == 4 else run.grad_bytes)
    lay, est = res.ranked[0]
    # A layout axis the cost models do not price yet is dropped by the search's match (cp: context parallelism,
    # priced by the `cp` branch): refuse the row rather than report another layout's time as its prediction.
    check(lay.cp == run.layout.cp, f"run {run.name}: layout {run.layout}: cp={run.layout.cp} is not priced by "
          f"the cost models yet (the planner matched cp={lay.cp})")
    return lay, est.step_time_s


def cluster_file(cluster: str, fit: Fit) -> dict[str, object]:
    """The calibrated cluster as a topology file (loader.py's intra_node / inter_node form, any GPU count):
    the preset's nominal rates times the fitted fabric efficiencies, its device by name, the fitted GEMM and
    memory efficiencies as `calibration.gemm`. Rates and leaf size are read off a 64-node build of the preset."""
    preset = PRESETS[cluster]
    per = preset.devices_per_node
    topo = preset.build(64, per, fit=fit)
    g = topo.graph  # type: ignore[attr-defined]
    nics = sorted(n for n in g.nodes if str(n).startswith("n0.nic"))
    leaf = next(n for n in g.neighbors(nics[0]) if str(n).startswith("leaf"))
    pcie = next(d for _, b, d in g.edges(nics[0], data=True) if not str(b).startswith("leaf"))
    link = g.edges[nics[0], leaf]
    inter: dict[str, object] = {"bandwidth": float(link["bandwidth"]), "latency": float(link["latency"]),
                                "nics_per_node": len(nics), "pcie_bandwidth": float(pcie["bandwidth"]),
                                "pcie_latency": float(pcie["latency"])}
    per_leaf = sum(1 for n in g.neighbors(leaf) if str(n).startswith("n"))
    if per_leaf < 64:
        inter["nodes_per_leaf"] = per_leaf
    if g.has_edge(leaf, "spine"):
        inter["spine_latency"] = float(g.edges[leaf, "spine"]["latency"])
    intra = g.edges["n0.gpu0", "n0.switch"]
    gemm: dict[str, float] = {"eff_max": fit.eff_max, "m0": fit.m0, "n0": fit.m0, "k0": fit.m0,
                              "mem_eff": fit.mem_eff}
    if fit.fp8_eff_max is not None and fit.fp8_m0 is not None:
        gemm.update(fp8_eff_max=fit.fp8_eff_max, fp8_m0=fit.fp8_m0)
    if fit.flash_eff is not None:
        gemm["flash_eff"] = fit.flash_eff
    if fit.overlap_drag is not None:
        gemm["overlap_drag"] = fit.overlap_drag
    if fit.straggler is not None:
        gemm["straggler"] = fit.straggler
    return {"name": f"{cluster}-calibrated", "device": topo.device.name,  # type: ignore[attr-defined]
            "nodes": preset.default_nodes, "devices_per_node": per,
            "intra_node": {"bandwidth": float(intra["bandwidth"]), "latency": float(intra["latency"])},
            "inter_node": inter, "calibration": {"gemm": gemm}}
