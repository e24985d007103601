"""Fit a few device/fabric efficiencies to a cluster's runs (`paracube calibrate --from-runs`), and write the
calibrated cluster as a topology file.

Fit (`fit_runs`): least squares on log(predicted / measured) over the fit rows (runs_csv.py; predicted:
run_prediction.py) of the few `calibration.gemm` efficiencies (eff_max, the shape constant m0 = n0 = k0, mem_eff)
and the fabric efficiencies (`link.intra_eff`, `link.inter_eff`: fraction of the spec-sheet NVLink / InfiniBand
rate a collective reaches), the same for every run: never a per-run factor.
"""

from __future__ import annotations

import numpy as np

from paracube.calibration.run_prediction import predict, preset_topology, step_time
from paracube.calibration.runs_csv import Run
from paracube.errors import ParacubeError, check
from paracube.layout import Layout
from paracube.topologies.nvswitch import SYSTEMS, fabrics
from paracube.topologies.presets import PRESETS, Fit

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
    device = fit.device()  # the curve is one m0 for every dimension (n0 = k0 = m0), written out after it
    gemm = {"eff_max": device.pop("eff_max"), "m0": device.pop("m0"), "n0": fit.m0, "k0": fit.m0, **device}
    return {"name": f"{cluster}-calibrated", "device": topo.device.name,  # type: ignore[attr-defined]
            "nodes": preset.default_nodes, "devices_per_node": per,
            "intra_node": {"bandwidth": float(intra["bandwidth"]), "latency": float(intra["latency"])},
            "inter_node": inter, "calibration": {"gemm": gemm}}
