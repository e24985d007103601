"""Why one tensor mode beats another, read off the estimates: bytes by purpose, links by tier, one line.

Inputs are StepEstimates (their CommEvents, `comm_bytes_per_gpu`, `comm_time_by_axis`, compute time) and
the Layouts they score; nothing is recomputed. The line names the winner, its speed-up over the runner-up
and the part of the step that makes the difference:
- communication with clearly fewer bytes (>= 15 % fewer per GPU): "fewer bytes", with the runner-up's
  largest purpose of traffic (activations, weight gathers, embedding lookup, ...);
- communication with about as many bytes or more: "faster links", with the runner-up's slowest mesh axis,
  whether its groups cross nodes (InfiniBand on the cluster presets) and its effective bandwidth
  (bytes over time on that axis, latency included);
- compute or pipeline bubble when either differs more than communication does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from paracube.estimate import CommEvent, StepEstimate
from paracube.layout import Layout
from paracube.workload import ModelSpec, TrainingSpec

Best = Mapping[str, tuple[Layout, StepEstimate]]
PURPOSES = ("activations", "weights", "embedding", "norms, biases, loss", "gradient sync", "pipeline", "other")
_WEIGHT = {"A", "dA"}
_SMALL = {"stats", "param", "bias", "dbias"}


def purpose(ev: CommEvent) -> str:
    """What a collective moves, from its phase and label (e.g. "layers.3.fc.dA" -> "weights")."""
    if ev.phase == "grad_sync":
        return "gradient sync"
    if ev.phase == "pipeline":
        return "pipeline"
    if ev.phase in ("optimizer", "metrics"):
        return "other"
    parts = ev.label.split(".")
    if parts[0] in ("tok_emb", "pos_emb", "embedding"):
        return "embedding"
    if parts[-1] in _WEIGHT:
        return "weights"
    if parts[-1] in _SMALL or parts[0] == "loss":
        return "norms, biases, loss"
    return "activations" if ev.label else "other"


def byte_shares(est: StepEstimate) -> dict[str, float]:
    """Bytes one GPU sends per step, by purpose (keys of PURPOSES with a non-zero share)."""
    out: dict[str, float] = defaultdict(float)
    for ev in est.events:
        out[purpose(ev)] += ev.sent_bytes()
    return {k: out[k] for k in PURPOSES if out.get(k)}


def axis_bytes(est: StepEstimate) -> dict[str, float]:
    """Bytes one GPU sends per step over each mesh-axis group (keys as in `comm_time_by_axis`)."""
    out: dict[str, float] = defaultdict(float)
    for ev in est.events:
        out[".".join(ev.axes)] += ev.sent_bytes()
    return dict(out)


def crosses_nodes(layout: Layout, axes: str, devices_per_node: int) -> bool:
    """Whether the groups over `axes` ("x.y") span more than one node (innermost placement = same node)."""
    names = tuple(a for a in axes.split(".") if a)
    groups = layout.groups(names)
    return any(len({int(r) // devices_per_node for r in g}) > 1 for g in groups)


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB" if x >= 1e8 else f"{x / 1e6:.1f} MB"


def _slowest_axis(lay: Layout, est: StepEstimate, per_node: int) -> str:
    if not est.comm_time_by_axis:
        return "communication is not broken down by axis"
    axis, t = max(est.comm_time_by_axis.items(), key=lambda kv: kv[1])
    moved = axis_bytes(est).get(axis, 0.0)
    tier = "crosses nodes (InfiniBand)" if crosses_nodes(lay, axis, per_node) else "stays inside a node"
    share = t / est.comm_time_s if est.comm_time_s else 0.0
    bw = f" = {moved / t / 1e9:.1f} GB/s" if t > 0 and moved > 0 else ""
    return f"axis {axis} {tier}: {_gb(moved)} in {t:.3g} s{bw}, {share:.0%} of its comm time"


def explain_winner(best: Best, devices_per_node: int) -> str:
    """One line: which mode wins (lowest step time) and the main reason, against the runner-up."""
    ranked = sorted(best.items(), key=lambda kv: kv[1][1].step_time_s)
    if not ranked:
        return "no mode has a valid layout"
    win, (_, we) = ranked[0]
    if len(ranked) == 1:
        return f"{win} wins: the only mode with a valid layout"
    run, (rl, re) = ranked[1]
    speed = re.step_time_s / we.step_time_s
    head = f"{win} wins, {speed:.2f}x faster than {run}"
    deltas = {"compute": re.compute_time_s - we.compute_time_s,
              "comm": re.exposed_comm_time_s - we.exposed_comm_time_s,
              "bubble": re.bubble_time_s - we.bubble_time_s}
    main = max(deltas, key=lambda k: deltas[k])
    if main == "compute":
        return (f"{head}: less compute per GPU ({we.compute_time_s:.3g} s vs {re.compute_time_s:.3g} s; "
                f"communication {we.exposed_comm_time_s:.3g} s vs {re.exposed_comm_time_s:.3g} s)")
    if main == "bubble":
        return f"{head}: a smaller pipeline bubble ({we.bubble_time_s:.3g} s vs {re.bubble_time_s:.3g} s)"
    if not we.comm_bytes_per_gpu:
        return f"{head}: it sends nothing ({run} sends {_gb(re.comm_bytes_per_gpu)} per GPU)"
    ratio = re.comm_bytes_per_gpu / we.comm_bytes_per_gpu
    if ratio >= 1.15:
        shares = byte_shares(re)
        top = max(shares, key=lambda k: shares[k]) if shares else "other"
        frac = shares.get(top, 0.0) / re.comm_bytes_per_gpu if re.comm_bytes_per_gpu else 0.0
        return (f"{head}: {ratio:.2f}x fewer bytes per GPU ({_gb(we.comm_bytes_per_gpu)} vs "
                f"{_gb(re.comm_bytes_per_gpu)}; {frac:.0%} of {run}'s are {top})")
    return (f"{head}: faster links, not fewer bytes ({win} sends {1 / ratio:.2f}x {run}'s bytes per GPU); "
            f"{run}'s {_slowest_axis(rl, re, devices_per_node)}")


def with_events(best: Best, model: ModelSpec, training: TrainingSpec,
                topo: object) -> dict[str, tuple[Layout, StepEstimate]]:
    """The same layouts re-estimated with their CommEvents (the planner's ranked estimates carry none)."""
    from paracube.cost_models.analytic import estimate

    return {m: (lay, est if est.events else estimate(model, training, lay, topo)) for m, (lay, est) in best.items()}


def explain_modes(best: Best, model: ModelSpec, training: TrainingSpec, topo: object) -> str:
    """`explain_winner` for planner results (adds the events, reads devices per node off the topology)."""
    return explain_winner(with_events(best, model, training, topo), int(getattr(topo, "devices_per_node", 1)))


__all__ = ["PURPOSES", "axis_bytes", "byte_shares", "crosses_nodes", "explain_modes", "explain_winner", "purpose",
           "with_events"]
