"""The step probes of `paracube calibrate` and what they fit: the host's cost per dispatched op and its waits.

`probe_layouts` names the executor steps probed (serial, and 1D / 2D / 3D where they tile the ranks);
`fit_host_overheads` turns their measured times into the per-op cost, the waits per collective message and
call, and the fraction of the microbenchmarks' rates a training step reaches (its docstring has the model and
the measurements behind it). Split from calibrate.py, which measures and writes the topology.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import nnls

from paracube.layout_parse import parse_layout
from paracube.topologies.calibration import Calibration
from paracube.topologies.topology import Topology

PROBE_DTYPES = ("fp32", "bf16")  # bf16 under autocast, as the executor trains it; fp16 dispatches alike


def probe_layouts(nproc: int) -> tuple[str, ...]:
    """Step-probe layouts (microbench.PROBE_MODEL): serial, and 1D, 2D, 3D on nproc ranks where they tile it."""
    out = ["dp=1"]
    t = next((t for t in (4, 2) if nproc % t == 0), 0)
    if t:
        out.append(f"dp={nproc // t},tp=1d:{t}")
    if nproc % 4 == 0:
        out.append(f"dp={nproc // 4},tp=2d:2x2")
    if nproc % 8 == 0:
        out.append(f"dp={nproc // 8},tp=3d:2x2x2")
    return tuple(out)


def fit_host_overheads(topo: Topology, probes: list[dict[str, Any]]
                       ) -> tuple[dict[str, dict[str, float]], float, float, float]:
    """(seconds per dispatched op, by dtype and tensor mode; seconds each collective message waits to be
    scheduled; seconds each collective call waits for its group to be scheduled; the fraction of the
    microbenchmarks' GEMM and memory rates a training step reaches) from the step probes. `topo` is left as is:
    the trials price a private copy.

    Serial probes (dp=1, one model per rank, every rank busy: no collective) price as
        step = compute / eff + c_dtype x ops      (compute: GEMMs, elementwise and optimizer at the fitted rates)
    and, probed at two sequence lengths (microbench.PROBE_SEQS: the same ops, 4x the tokens), give both figures
    by least squares (relative errors, at least 0): c_dtype is the executor's glue, autograd (and autocast's
    casts in bf16) per op, and eff how fast the step's GEMMs and elementwise ops run against the
    microbenchmarks' (which repeat one op on warm caches; a step's ops allocate their outputs and read what the
    previous op left): measured on a 2-core VM, the serial step grew 15 -> 24 ms from seq 16 to 64 while the
    fitted rates priced +3 ms. With one sequence length, eff = 1. Every tensor mode dispatches its ops at
    c_dtype. Waits: what the parallel probes' steps leave beyond their ops, compute and the collectives' CPU
    cost, as w_msg per message of their collectives (collective.wait_steps: gloo's algorithms) plus w_call per
    call, by non-negative least squares (relative errors; scipy nnls). On a host whose ranks share cores the
    CPU-time basis of the collective fits (timing_basis) leaves out the time a call's ranks sit idle while
    they wait to be scheduled: once per call for the group to meet (its ranks drift apart on shared cores), and
    per message for its receiver (topologies/local_cpu.py). Measured on a 2-core VM, 8 ranks (2026-12-03): the
    per-message wait alone (one figure over the 1D, 2D and 3D probes) priced the probes +5..+20% / -17..-23% /
    -2..+13% (1D's 15 calls carry 60 messages, 2D's 91 calls 140, 3D's 110 calls 408, before 2D and 3D's calls each
    counted the message of their group's meeting, collective.ALTERNATING_MEET: a figure per message
    cannot serve them all); per call they agree within -9..+10%, the fit giving ~0.9 ms per call and ~0 per
    message. Both 0 without parallel probes; with one parallel layout the per-message figure alone."""
    from paracube.calibration.fit import _nonneg_linear
    from paracube.calibration.microbench import PROBE_MICRO_BATCH, PROBE_MODEL, probe_model
    from paracube.cost_models import estimate
    from paracube.modes import MODES
    from paracube.topologies import topology_from_dict
    from paracube.workload import TrainingSpec

    trial = topology_from_dict(topo.to_dict(), source="calibration trial")
    base = trial.calibration or Calibration()

    def step(probe: dict[str, Any], per_op: dict[str, dict[str, float]], wait: float, eff: float = 1.0,
             call: float = 0.0) -> float:
        layout = parse_layout(probe["layout"]).with_(micro_batch=PROBE_MICRO_BATCH)
        dtype = probe.get("dtype", "fp32")
        trial.calibration = base.with_op_overheads(per_op, wait, call).with_compute_eff(eff)
        training = TrainingSpec(global_batch=PROBE_MICRO_BATCH * layout.dp, dtype=dtype)
        spec = probe_model(int(probe.get("seq_len", PROBE_MODEL.seq_len)))
        return estimate(spec, training, layout, trial, with_events=False).step_time_s

    serial = [p for p in probes if parse_layout(p["layout"]).world_size == 1]
    dtypes = sorted({p.get("dtype", "fp32") for p in serial})
    cols, times = [], []
    for p in serial:
        dtype = p.get("dtype", "fp32")
        g = step(p, {dtype: {"none": 0.0}}, 0.0)
        f = (step(p, {dtype: {"none": 1e-3}}, 0.0) - g) / 1e-3
        cols.append([g] + [f if d == dtype else 0.0 for d in dtypes])
        times.append(float(p["time_s"]))
    A, t = np.array(cols, dtype=float).reshape(len(serial), 1 + len(dtypes)), np.array(times)
    if len({p.get("seq_len", PROBE_MODEL.seq_len) for p in serial}) > 1:
        x = _nonneg_linear(A, t)
        slow, per = max(float(x[0]), 1e-3), [float(v) for v in x[1:]]
    else:  # eff = 1: each dtype's per-op cost by least squares (exact for one probe), at least 0
        rest, slow = t - A[:, 0], 1.0
        per = [max(0.0, float(np.sum(A[:, i] * rest / t**2) / max(np.sum((A[:, i] / t) ** 2), 1e-300)))
               for i in range(1, 1 + len(dtypes))]
    out = {d: {mode: c for mode in MODES} for d, c in zip(dtypes, per, strict=True)}
    eff = 1.0 / slow
    rows, rest = [], []
    for probe in probes:
        if parse_layout(probe["layout"]).world_size > 1:
            tm, t0 = float(probe["time_s"]), step(probe, out, 0.0, eff)
            per_msg = (step(probe, out, 1e-3, eff) - t0) / 1e-3
            per_call = (step(probe, out, 0.0, eff, 1e-3) - t0) / 1e-3
            rows.append([per_msg / tm, per_call / tm])
            rest.append((tm - t0) / tm)
    if not rows:
        return out, 0.0, 0.0, eff
    layouts = {p["layout"] for p in probes if parse_layout(p["layout"]).world_size > 1}
    A = np.array(rows) if len(layouts) > 1 else np.array(rows)[:, :1]
    x, _ = nnls(A, np.array(rest))
    return out, float(x[0]), float(x[1]) if len(x) > 1 else 0.0, eff
