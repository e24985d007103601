"""`paracube calibrate`: measure this machine under training load, fit the cost model, write a topology.

Measured (microbench.py): GEMMs, elementwise ops, collectives per kind / group size / payload / axis pattern,
and step probes (executor steps of a model with few FLOPs, serial and 1D/2D/3D). Priced on the basis the host
calls for (timing_basis: wall time, or CPU time x ranks per core when ranks share cores), fitted (fit.py),
then the per-op overhead set from the serial probe step and the waits per collective call and per message from
the parallel ones (host_overheads.py).

The file is the base preset in explicit form with (a) the device's fp32 peak and memory bandwidth set to
the fitted values (fp16/bf16 peaks keep the preset's ratio to fp32), (b) for a one-node hub preset
(local-cpu) the hub links set to the joint alpha/beta fit, and (c) a `calibration:` section (shape in
fit.py's docstring) that records the machine it was measured on.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
from pathlib import Path
from typing import Any

import torch

from paracube.calibration.fit import Fit, fit_alpha_beta, fit_elementwise, fit_gemm
from paracube.calibration.host_overheads import PROBE_DTYPES, fit_host_overheads, probe_layouts
from paracube.calibration.microbench import (
    KINDS,
    BenchConfig,
    BenchResult,
    run_benchmarks,
    run_probes,
)
from paracube.errors import ParacubeError, check
from paracube.executor.launch import affinity
from paracube.executor.launch.local_ranks import resolve_backend
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.topologies.calibration import as_calibration
from paracube.topologies.topology import Topology
from paracube.workload import ModelSpec

SCHEMA = 1
MACHINE_KEYS = ("hostname", "cpu_model", "nproc", "torch_version")
REQUIRED = ("schema", "machine", "gemm", "elementwise", "comm", "link", "residuals")
# Layouts of the default model whose local GEMM shapes the benchmark covers (8 ranks, micro-batch 4).
DEFAULT_LAYOUTS = ("dp=2,tp=1d:4,mb=4", "dp=2,tp=2d:2x2,mb=4", "tp=3d:2x2x2,mb=4")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(nproc: int, backend: str) -> dict[str, Any]:
    """What must match for a calibration to apply (plus the backend, for information)."""
    return {"hostname": socket.gethostname(), "cpu_model": cpu_model(), "nproc": nproc,
            "torch_version": str(torch.__version__), "backend": backend, "cpu_count": os.cpu_count(),
            "cpu_bind": affinity.policy_from_env()}


def timing_basis(nproc: int, backend: str) -> dict[str, Any]:
    """How a measured point becomes the cost model's seconds: "wall" time per call, or, for CPU ranks that
    outnumber the cores they share, "cpu": ranks_per_core x the process CPU seconds per call.

    Why: on a shared host the step is bound by CPU throughput. While a rank waits in a collective, the
    ranks sharing its core run, so a call's wall time (peers' scheduling included) is not what it adds to
    the step; its CPU seconds (its own and its communication threads'), times the ranks taking turns on a
    core, are. Measured on a 2-core VM with 8 bound ranks (1D, 2D, 3D plans of tiny and of a smaller
    model): step wall = 1.06-1.14 x 4 x the mean CPU seconds per rank per step, in every mode; the wall time
    inside collectives on groups of 2 was 1.2-2.4x (the data-parallel all-reduce 6x) what the lockstep
    microbenchmark measured, their waits absorbing the other groups' work. What this leaves out (the
    executor's glue; idle cores while calls and messages wait to be scheduled) is in the per-op overhead and the
    waits per collective call and message fitted on the step probes (fit_host_overheads)."""
    cores = len(affinity.available_cores())
    if backend == "gloo" and nproc > cores:
        return {"basis": "cpu", "ranks_per_core": nproc / cores, "cores": cores}
    return {"basis": "wall", "ranks_per_core": 1.0, "cores": cores}


def add_costs(result: BenchResult, timing: dict[str, Any]) -> BenchResult:
    """Give every point `cost_s`, the seconds the fits use (timing_basis)."""
    share = float(timing["ranks_per_core"])
    for p in result.gemm + result.elementwise + result.collective:
        p["cost_s"] = share * p["cpu_s"] if timing["basis"] == "cpu" else p["time_s"]
    return result


def layout_gemm_shapes(model: ModelSpec, layout_text: str) -> set[tuple[int, int, int]]:
    """Forward and backward (m, n, k) of every linear of one block and the head, on one rank."""
    lay = parse_layout(layout_text)
    T, h, f, V, q, t = (lay.micro_batch or 1) * model.seq_len, model.hidden, model.ffn_hidden, model.vocab, \
        lay.q, lay.tensor_size
    linears = [(h, 3 * h, True), (h, h, False), (h, f, True), (f, h, False), (h, V, True)]
    shapes: set[tuple[int, int, int]] = set()
    for h_in, h_out, column in linears:
        m, n, k = lay.tensor_mode.gemm_shape(T, h_in, h_out, column, t, q, lay.depth)  # paracube/modes
        shapes |= {(m, n, k), (m, k, n), (k, n, m)}  # Y = XA, dX = dY A^T, dA = X^T dY
    return shapes


def bench_config(nproc: int, quick: bool, backend: str = "auto") -> BenchConfig:
    tiny = PRESETS["tiny"]
    shapes: set[tuple[int, int, int]] = set()
    for text in DEFAULT_LAYOUTS:
        shapes |= layout_gemm_shapes(tiny, text)
    shapes |= {(s, s, s) for s in ((32, 128, 512) if quick else (16, 32, 64, 128, 256, 512))}
    # Every stride of each group size (all mesh axes of that size), cycled through: see microbench.py.
    patterns = [(n, s) for n in (2, 4, 8) if nproc % n == 0 for s in (1, 2, 4, 8, 16, 32) if nproc % (n * s) == 0]
    # From 256 B: below that gloo takes a cheaper path for a few floats per rank, which no model's calls hit.
    sizes = (256, 8192, 131072) if quick else (256, 1024, 8192, 65536, 262144, 1 << 20)
    return BenchConfig(nproc=nproc, gemm_shapes=tuple(sorted(shapes)), comm_bytes=sizes,
                       patterns=tuple(dict.fromkeys(patterns)), reps=5 if quick else 20,
                       warmup=1 if quick else 3, min_time_s=0.03 if quick else 0.1,
                       backend=backend)


def fit_all(result: BenchResult) -> dict[str, Fit | dict[str, dict[str, Fit]]]:
    comm: dict[str, dict[str, Fit]] = {}
    alternating: dict[str, dict[str, Fit]] = {}
    for kind in KINDS:
        for n in sorted({int(p["n"]) for p in result.collective}):
            for alt, table in ((False, comm), (True, alternating)):
                pts = [(kind, n, p["bytes"], p["cost_s"]) for p in result.collective
                       if p["kind"] == kind and p["n"] == n and bool(p.get("alternating")) == alt]
                if len(pts) >= 2:
                    table.setdefault(kind, {})[str(n)] = fit_alpha_beta(pts)
    return {
        "gemm": fit_gemm([(p["m"], p["n"], p["k"], p["cost_s"]) for p in result.gemm]),
        "elementwise": fit_elementwise([(p["bytes"], p["cost_s"]) for p in result.elementwise]),
        "link": fit_alpha_beta([(p["kind"], p["n"], p["bytes"], p["cost_s"]) for p in result.collective
                                if not p.get("alternating")]),
        "comm": comm,
        "comm_alternating": alternating,
    }


def probe_spread(probes: list[dict[str, Any]]) -> float:
    """RMS over probes of the relative standard deviation of their rounds' step times (0 with one round)."""
    rel = []
    for p in probes:
        rounds = p.get("round_times_s", [])
        if len(rounds) > 1:
            mean = sum(rounds) / len(rounds)
            rel.append((sum((r - mean) ** 2 for r in rounds) / (len(rounds) - 1)) ** 0.5 / mean)
    return float((sum(r * r for r in rel) / len(rel)) ** 0.5) if rel else 0.0


def build_calibration(result: BenchResult, machine: dict[str, Any], timing: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
    """The `calibration:` dict (fit.py's docstring) from measured points (with `cost_s`: add_costs)."""
    fits = fit_all(result)
    gemm, elem, link = fits["gemm"], fits["elementwise"], fits["link"]
    assert isinstance(gemm, Fit) and isinstance(elem, Fit) and isinstance(link, Fit)
    comm_fits, alt_fits = fits["comm"], fits["comm_alternating"]
    assert isinstance(comm_fits, dict) and isinstance(alt_fits, dict)
    comm, alternating = ({kind: {n: {**f.params, "rms_rel_err": f.rms} for n, f in by_n.items()}
                          for kind, by_n in table.items()} for table in (comm_fits, alt_fits))
    all_comm = [e for table in (comm_fits, alt_fits) for by_n in table.values() for f in by_n.values()
                for e in f.rel_err]
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "timing": timing or {"basis": "wall", "ranks_per_core": 1.0, "cores": machine.get("cpu_count")},
        "gemm": {"eff_max": 1.0, "m0": gemm.params["m0"], "n0": gemm.params["n0"], "k0": gemm.params["k0"],
                 "mem_eff": 1.0, "peak_flops": gemm.params["peak_flops"], "rms_rel_err": gemm.rms},
        "elementwise": {**elem.params, "rms_rel_err": elem.rms},
        "comm": comm,
        "comm_alternating": alternating,
        "link": {**link.params, "rms_rel_err": link.rms},
        "residuals": {"gemm": gemm.rms, "elementwise": elem.rms, "comm": float(
            (sum(e * e for e in all_comm) / max(1, len(all_comm))) ** 0.5), "link": link.rms,
            "probe": probe_spread(result.probe)},
    }


def calibrated_topology(cluster: str, nproc: int, calibration: dict[str, Any]) -> Topology:
    """The base preset (sized to nproc ranks) with fitted device figures, hub links and the calibration."""
    from paracube.topologies import load_topology, topology_from_dict

    base = load_topology(cluster, gpus=nproc)
    data = base.to_dict()
    fp32 = float(data["device"]["peak_flops"]["fp32"])
    scale = calibration["gemm"]["peak_flops"] / fp32
    data["device"]["peak_flops"] = {k: float(v) * scale for k, v in data["device"]["peak_flops"].items()}
    data["device"]["memory_bandwidth"] = float(calibration["elementwise"]["bandwidth"])
    data["device"]["name"] = f"{data['device']['name']} (calibrated)"
    if base.num_nodes == 1:
        # One ring hop crosses two hub links: latency a/2 each, bandwidth B (fit.py's docstring).
        for link in data["graph"]["links"]:
            link["latency"] = calibration["link"]["latency"] / 2
            link["bandwidth"] = calibration["link"]["bandwidth"]
    data["calibration"] = calibration
    return topology_from_dict(data, source=f"calibrated {cluster}")


def calibrate(cluster: str = "local-cpu", nproc: int = 8, quick: bool = False,
              backend: str = "auto") -> tuple[Any, BenchResult, dict[str, Any]]:
    """Run the microbenchmarks on nproc local ranks and fit; returns (topology, measurements, fits)."""
    check(isinstance(nproc, int) and nproc >= 2, f"--nproc {nproc!r} must be an integer >= 2")
    check(cluster == "local-cpu" or torch.cuda.is_available(),
          f"--cluster {cluster!r}: calibrating a GPU cluster needs CUDA on this machine; valid here: local-cpu")
    cfg = bench_config(nproc, quick, backend)
    chosen = resolve_backend(cfg.backend)
    timing = timing_basis(nproc, chosen)
    # Probe rounds before and after the microbenchmarks: a machine's speed drifts over tens of seconds, and
    # the rounds' spread is the probes' uncertainty (probe_spread). A probe's step is its faster round: other
    # jobs only ever slow a step down (measured under a load of 20 on a 2-core VM: one round of the serial
    # probe 126 ms, the other 19 ms, as on the quiet machine).
    rounds, steps = (1, 3) if quick else (2, 6)
    layouts = probe_layouts(nproc)
    probe_runs = [run_probes(layouts, PROBE_DTYPES, steps, nproc, backend, cfg.timeout_s)]
    result = add_costs(run_benchmarks(cfg), timing)
    probe_runs += [run_probes(layouts, PROBE_DTYPES, steps, nproc, backend, cfg.timeout_s)
                   for _ in range(rounds - 1)]
    result.probe = [{**first, "time_s": min(r[i]["time_s"] for r in probe_runs),
                     "cpu_s": sum(r[i]["cpu_s"] for r in probe_runs) / rounds,
                     "round_times_s": [r[i]["time_s"] for r in probe_runs]}
                    for i, first in enumerate(probe_runs[0])]
    calibration = build_calibration(result, machine_info(nproc, chosen), timing)
    topo = calibrated_topology(cluster, nproc, calibration)
    by_mode, wait, call, eff = fit_host_overheads(topo, result.probe)
    calibration["elementwise"]["op_overhead_by_mode"], calibration["elementwise"]["step_wait_s"] = by_mode, wait
    calibration["elementwise"]["call_wait_s"] = call
    for key in ("eff_max", "mem_eff"):  # the fitted rates as a training step reaches them (fit_host_overheads)
        calibration["gemm"][key] *= eff
    calibration["probes"] = [{k: p[k] for k in ("layout", "dtype", "seq_len", "ops", "time_s", "cpu_s",
                                                "round_times_s")}
                             for p in result.probe]
    return calibrated_topology(cluster, nproc, calibration), result, calibration


def check_calibration(topo: Any, source: str, world: int | None = None) -> dict[str, Any]:
    """The topology's calibration, as its YAML mapping, if it applies to this machine (and world size);
    ParacubeError otherwise. `topo.calibration` may be a Calibration or a mapping in the YAML shape."""
    try:
        cal = as_calibration(getattr(topo, "calibration", None))
    except ParacubeError as exc:
        raise ParacubeError(f"{source}: {exc}") from None
    check(cal is not None, f"{source}: no calibration section; run `paracube calibrate --out {source}`")
    assert cal is not None
    missing = [k for k in REQUIRED if getattr(cal, k) is None]
    check(not missing, f"{source}: calibration lacks {', '.join(missing)}; re-run `paracube calibrate`")
    check(cal.schema == SCHEMA, f"{source}: calibration schema {cal.schema!r}; this paracube reads {SCHEMA}")
    machine = cal.machine
    check(machine is not None and all(getattr(machine, k) is not None for k in MACHINE_KEYS),
          f"{source}: calibration.machine needs {', '.join(MACHINE_KEYS)}; re-run `paracube calibrate`")
    assert machine is not None and machine.nproc is not None
    here = machine_info(machine.nproc, "")
    for key in ("hostname", "cpu_model", "torch_version"):
        if getattr(machine, key) != here[key]:
            raise ParacubeError(f"{source}: calibrated on {key}={getattr(machine, key)!r} but this machine has "
                                f"{here[key]!r}; re-run `paracube calibrate` here")
    bind = machine.cpu_bind or "spread"
    if bind != here["cpu_bind"]:  # CPU ranks bound differently run at different speeds (executor/launch/affinity.py)
        raise ParacubeError(f"{source}: calibrated with {affinity.ENV}={bind} but this run uses "
                            f"{affinity.ENV}={here['cpu_bind']}; set it alike or re-run `paracube calibrate`")
    if world is not None and machine.nproc != world:
        raise ParacubeError(f"{source}: calibrated with nproc={machine.nproc} ranks but the plan runs {world}; "
                            f"re-run `paracube calibrate --nproc {world}`")
    return cal.to_dict()


def write_topology(topo: Any, path: str | Path) -> Path:
    from paracube.topologies import save_topology

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_topology(topo, path)
    return path


__all__ = ["DEFAULT_LAYOUTS", "MACHINE_KEYS", "bench_config", "build_calibration", "calibrate",
           "calibrated_topology", "check_calibration", "fit_all", "layout_gemm_shapes", "machine_info",
           "timing_basis", "add_costs", "write_topology"]
