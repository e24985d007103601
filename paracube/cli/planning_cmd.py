"""`paracube plan`, `paracube compare`, `paracube simulate`: search layouts, compare modes, break one down."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from paracube.cli.options import (
    DEFAULT_CLUSTER,
    Workload,
    add_workload_options,
    human_bytes,
    human_time,
    positive_int,
    print_json,
    workload_from_args,
)
from paracube.cli.options import (
    console as make_console,
)
from paracube.errors import ParacubeError
from paracube.estimate import StepEstimate
from paracube.layout import Layout, parse_layout
from paracube.modes import COMPARE_BASELINE, MODES
from paracube.plan import LaunchSpec, Plan, load_plan, plan_cluster, recorded_cluster

MODE_ORDER = tuple(MODES)  # the registry's order (paracube/modes)
EXPLAIN_POOL = 100  # ranked layouts the runner-ups of `plan` are looked for in (planner/explain.py)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank every valid layout and write the best as a plan file")
    add_workload_options(p, layout_help="constrain the search, e.g. tp=3d:4x4x4 or dp=2,tp=1d:8")
    p.add_argument("--top", type=positive_int, default=10, help="rows to show (default 10)")
    p.add_argument("--refine", type=positive_int, default=0, metavar="K",
                   help="re-rank the best K with the discrete-event engine")
    p.add_argument("-o", "--out", default="plan.json", help="plan file to write (default plan.json)")
    # Every plan runs now (the search emits only what the executor runs): kept so old scripts still work.
    p.add_argument("--runnable", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=plan_cmd)

    p = sub.add_parser("compare", help="the best layout of each tensor mode (or, --runtime all, of each runtime) "
                       "side by side")
    add_workload_options(p)
    p.add_argument("--tensor-only", action="store_true",
                   help="all devices in one tensor group (dp=pp=1), as in Bian et al.'s experiments")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="write a time/memory picture")
    p.set_defaults(handler=compare_cmd)

    p = sub.add_parser("simulate", help="full breakdown of one layout (a plan file, or options + --layout)")
    p.add_argument("plan", nargs="?", default=None, help="plan file (default: options below)")
    add_workload_options(p, layout_help="the layout to simulate (default dp=1,tp=3d:2x2x2,mb=4 on 8 ranks)")
    p.set_defaults(cluster=None)  # with a plan file: the plan's cluster unless --cluster is given
    p.add_argument("--sequence-parallel", action="store_true", help="1D only: Megatron sequence parallelism")
    p.add_argument("--interleave", type=positive_int, default=None, metavar="V", help="virtual pipeline chunks")
    p.add_argument("--engine", default="analytic", choices=["analytic", "event"])
    p.add_argument("--overlap", action="store_true",
                   help="event engine: overlap weight-gradient reduce-scatters and dp all-reduce with backward")
    p.add_argument("--events", action="store_true", help="list every collective of the step")
    p.add_argument("--plot", default=None, metavar="FILE.png")
    p.add_argument("--trace", default=None, metavar="FILE.json", help="event engine: Chrome/Perfetto trace")
    p.add_argument("--timeline", default=None, metavar="FILE.png", help="event engine: Gantt picture")
    p.set_defaults(handler=simulate_cmd)


# --- helpers ------------------------------------------------------------------------------------------------
def estimate_with(engine: str, w: Workload, layout: Layout, topo: object, **options: object) -> StepEstimate:
    from paracube.cost_models.event import estimate_with as dispatch

    return dispatch(engine, w.model, w.training, layout, topo, **options)


def _row(est: StepEstimate) -> list[str]:
    return [human_time(est.step_time_s), human_time(est.compute_time_s), human_time(est.exposed_comm_time_s),
            human_time(est.bubble_time_s), human_bytes(est.memory.total), human_bytes(est.comm_bytes_per_gpu),
            f"{est.mfu * 100:.1f}%"]


ROW_COLUMNS = ("step time", "compute", "exposed comm", "bubble", "memory/GPU", "sent/GPU", "MFU")


def human_params(n: float) -> str:
    """13.11B, 354.87M, 0.14M: a unit that keeps small models readable."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _summary(w: Workload) -> str:
    return (f"{w.model.name} ({human_params(w.model.num_parameters())} params) on {w.gpus} x {w.cluster}, global batch "
            f"{w.training.global_batch} x {w.training.sequence_length(w.model)} tokens, {w.training.dtype}"
            + ("" if w.runtime == "paracube" else f", runtime {w.runtime}"))


def make_plan(w: Workload, layout: Layout, est: StepEstimate, topo: object) -> Plan:
    # one launcher per host: a host may hold fewer GPUs than the topology's node (GB200 NVL72: 4 of a 72-GPU domain)
    host = getattr(topo, "devices_per_host", None) or getattr(topo, "devices_per_node", w.gpus)
    per_node = min(w.gpus, int(host))
    if w.gpus % per_node:
        per_node = w.gpus
    # A searched (or rc=-pinned) recomputation is the plan's training recomputation.
    training = replace(w.training, recompute=layout.recompute) if layout.recompute else w.training
    return Plan(model=w.model, training=training, layout=layout, cluster=recorded_cluster(w.cluster), gpus=w.gpus,
                launch=LaunchSpec(nproc_per_node=per_node, nnodes=w.gpus // per_node),
                prediction=est.to_dict(), notes=est.notes + _unpriced(layout, est), runtime=w.runtime)


def _unpriced(layout: Layout, est: StepEstimate) -> tuple[str, ...]:
    """A pinned zero the cost model did not see (its estimate's layout has no zero=) is said in the plan."""
    if layout.zero and "zero=" not in est.layout:
        return (f"zero={layout.zero} is pinned but not priced: the prediction is that of zero=0 "
                "(optimizer state and parameters replicated over dp)",)
    return ()


def _search(w: Workload, topo: object, top_k: int):  # noqa: ANN202
    from paracube.layout import RECOMPUTES
    from paracube.planner import search

    # Without --recompute the planner chooses recomputation; zero stages, overlap and tpo: what the runtime runs.
    with Console(stderr=True).status(f"searching layouts of {w.gpus} devices ..."):
        return search(w.model, w.training, topo, w.gpus, fixed=w.layout, top_k=top_k,
                      recomputes=list(RECOMPUTES) if w.search_recompute else None, runtime=w.runtime)


# --- commands -----------------------------------------------------------------------------------------------
def plan_cmd(args: argparse.Namespace) -> int:
    w = workload_from_args(args)
    topo = w.topology
    from paracube.planner.explain import dedupe, explain

    if args.runnable:
        print("paracube plan: --runnable is no longer needed (every plan runs) and is ignored", file=sys.stderr)
    pool = max(args.top, args.refine, EXPLAIN_POOL)
    result = _search(w, topo, pool)
    ranked = _with_zero(dedupe(result.ranked), w.layout)
    exhaustive = len(result.ranked) < pool
    if args.refine:
        refined = [(lay, estimate_with("event", w, lay, topo)) for lay, _ in ranked[: args.refine]]
        ranked = sorted(refined, key=lambda r: r[1].step_time_s) + ranked[args.refine:]
        choices = explain(ranked[: args.refine], w.layout)
    else:
        choices = explain(ranked, w.layout, exhaustive)
    best_layout, best_est = ranked[0]
    plan = make_plan(w, best_layout, best_est, topo)
    path = plan.save(args.out)
    if args.json:
        print_json({"plan_file": str(path), "best": {"layout": str(best_layout), **best_est.to_dict()},
                    "ranked": [{"layout": str(lay), **est.to_dict()} for lay, est in ranked[: args.top]],
                    "choices": [c.to_dict() for c in choices],
                    "scored": result.scored, "pruned": result.pruned, "rejected": dict(result.rejected),
                    "elapsed_s": result.elapsed_s})
        return 0
    console = make_console()
    table = Table(title=_summary(w))
    table.add_column("#", justify="right")
    table.add_column("layout")
    for col in ROW_COLUMNS:
        table.add_column(col, justify="right")
    for i, (lay, est) in enumerate(ranked[: args.top], 1):
        table.add_row(str(i), str(lay), *_row(est))
    console.print(table)
    console.print("why this layout (pinned: given by --layout; chosen: the runner-up it beat, predicted step time):")
    for c in choices:
        console.print(f"  {c.line()}", highlight=False, markup=False)
    rejected = ", ".join(f"{n} {reason}" for reason, n in result.rejected.most_common(4))
    console.print(f"scored {result.scored} layouts in {result.elapsed_s:.2f} s"
                  + (f" ({result.pruned} more skipped: their lower bound loses)" if result.pruned else "")
                  + (f"; rejected: {rejected}" if rejected else "")
                  + (f" (+{len(result.rejected) - 4} more reasons)" if len(result.rejected) > 4 else ""))
    for note in _unpriced(best_layout, best_est):
        console.print(f"note: {note}", markup=False)
    from paracube.runtimes import get_runtime

    target = get_runtime(w.runtime).export_target
    if target:
        console.print(f"wrote {path} (best: {best_layout}, for runtime {w.runtime}); export it with "
                      f"`paracube export {path} --to {target}`", highlight=False, markup=False)
        return 0
    console.print(f"wrote {path} (best: {best_layout}); run it with `paracube run {path}`"
                  + ("" if w.gpus <= 8 else f" (on fewer CPU ranks: `paracube run {path} --model tiny --gpus 8`)"),
                  highlight=False, markup=False)
    return 0


def _with_zero(ranked: list, fixed: Layout | None) -> list:
    """The search does not vary zero: a pinned zero=N applies to every ranked layout."""
    if fixed is None or not fixed.zero:
        return ranked
    return [(lay.with_(zero=fixed.zero), est) for lay, est in ranked]


def _tensor_only_shapes(gpus: int) -> dict[str, list[tuple[int, ...]]]:
    """Per tensor mode, its shapes of exactly `gpus` ranks (every device in the tensor group)."""
    return {name: [s for s in m.shapes(gpus) if math.prod(s) == gpus] for name, m in MODES.items() if m.axes}


def _tensor_only_best(w: Workload, topo: object) -> tuple[dict[str, tuple[Layout, StepEstimate]], dict[str, str]]:
    """Best layout per mode with every device in the tensor group (the paper's setting)."""
    from paracube.planner import search

    best: dict[str, tuple[Layout, StepEstimate]] = {}
    why: dict[str, str] = {}
    for mode, shapes in _tensor_only_shapes(w.gpus).items():
        for shape in shapes:
            try:
                found = search(w.model, w.training, topo, w.gpus, fixed=Layout(mode=mode, shape=shape), top_k=1,
                               runtime=w.runtime)
            except ParacubeError as exc:
                why.setdefault(mode, str(exc))
                continue
            lay, est = found.ranked[0]
            if mode not in best or est.step_time_s < best[mode][1].step_time_s:
                best[mode] = (lay, est)
    why = {m: text for m, text in why.items() if m not in best}  # another shape of the mode was valid
    for mode in _tensor_only_shapes(w.gpus):
        if mode not in best and mode not in why:
            why[mode] = f"{w.gpus} devices do not form a {mode} tensor group"
    return best, why


def _tensor_only_verdict(w: Workload, topo: object, best: dict[str, tuple[Layout, StepEstimate]]) -> str:
    """Which mode wins and the main reason, in one line (planner/verdict.py)."""
    from paracube.planner.verdict import explain_modes

    return explain_modes(best, w.model, w.training, topo)


def compare_cmd(args: argparse.Namespace) -> int:
    if args.runtime == "all":
        from paracube.cli.runtime_compare import Planning, compare_runtimes

        return compare_runtimes(args, Planning(lambda w: _search(w, w.topology, top_k=1).ranked[0], _summary, _row,
                                               ROW_COLUMNS))
    w = workload_from_args(args)
    topo = w.topology
    if args.tensor_only:
        best, explanations = _tensor_only_best(w, topo)
    else:
        result = _search(w, topo, top_k=1)
        best = {m: result.best_per_mode[m] for m in MODE_ORDER if m in result.best_per_mode}
        explanations = result.explanations
    base = best.get(COMPARE_BASELINE)
    rows = []
    for mode, (lay, est) in best.items():
        speedup = base[1].step_time_s / est.step_time_s if base else None
        rows.append((mode, lay, est, speedup))
    verdict = _tensor_only_verdict(w, topo, best) if args.tensor_only and best else None
    if args.json:
        print_json({"workload": _summary(w), "modes": [
            {"mode": m, "speedup_over_1d": s, **est.to_dict(), "layout": str(lay)} for m, lay, est, s in rows],
            "no_layout": explanations, **({"verdict": verdict} if verdict else {})})
    else:
        table = Table(title=_summary(w) + ": best layout per tensor mode")
        table.add_column("mode")
        table.add_column("best layout")
        for col in ROW_COLUMNS:
            table.add_column(col, justify="right")
        table.add_column("speedup vs 1D", justify="right")
        for mode, lay, est, speedup in rows:
            table.add_row(mode, str(lay), *_row(est), f"{speedup:.2f}x" if speedup else "-")
        console = make_console()
        console.print(table)
        for mode, why in explanations.items():
            console.print(f"{mode}: no valid layout: {why}")
        if verdict:
            console.print(verdict, highlight=False)
    if args.plot:
        from paracube.cli.plots import plot_estimates

        plot_estimates([r[2] for r in rows], [f"{m}\n{lay}" for m, lay, _, _ in rows], args.plot,
                       title=_summary(w))
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def _print_breakdown(console: Any, est: StepEstimate, events: bool) -> None:
    """simulate's table: the estimate's figures, memory parts, time per axis and kind, then its notes
    (and, with --events, every collective)."""
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for name, value in zip(ROW_COLUMNS, _row(est), strict=True):
        table.add_row(name, value)
    for part, value in est.memory.to_dict().items():
        if part != "total":
            table.add_row(f"  memory: {part}", human_bytes(value))
    for axis, t in sorted(est.comm_time_by_axis.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  comm on axis {axis}", human_time(t))
    for kind, t in sorted(est.comm_time_by_kind.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  comm {kind}", human_time(t))
    table.add_row("collectives per step", str(len(est.events)))
    console.print(table)
    for note in est.notes:
        console.print(f"note: {note}")
    if events:
        for e in est.events:
            axes = ".".join(e.axes)
            console.print(f"{e.phase:>9} {e.kind:<15} {axes:<8} {e.payload_bytes:>12} B {e.dtype:<9} {e.label}")


def simulate_cmd(args: argparse.Namespace) -> int:
    if args.plan:
        plan = load_plan(args.plan)
        w = Workload(plan.model, plan.training, plan_cluster(plan, args.cluster, args.plan), plan.gpus, plan.layout,
                     runtime=args.runtime or plan.runtime)
        layout = plan.layout
    else:
        args.cluster = args.cluster or DEFAULT_CLUSTER
        if args.layout is None and args.gpus is None:
            args.layout = "dp=1,tp=3d:2x2x2,mb=4"
        w = workload_from_args(args)
        if w.layout is None:
            raise ParacubeError("simulate needs a layout: give a plan file or --layout (e.g. --layout dp=2,tp=2d:2x2)")
        layout = w.layout
    if args.sequence_parallel:
        layout = layout.with_(sequence_parallel=True)
    if args.interleave:
        layout = layout.with_(interleave=args.interleave)
    layout = parse_layout(str(layout))  # re-validate after the flags
    from paracube.runtimes import get_runtime

    why = get_runtime(w.runtime).refusal(layout, w.model.family, w.model.tied_embeddings, w.training.dtype)
    if why:
        raise ParacubeError(f"layout {layout}: {why}")
    topo = w.topology
    if (args.trace or args.timeline or args.overlap) and args.engine != "event":
        raise ParacubeError("--trace, --timeline and --overlap need the event engine: add --engine event")
    if args.engine == "event":
        from paracube.cost_models.event import simulate
        from paracube.cost_models.event_trace import plot_timeline, write_chrome_trace

        with make_console().status("simulating one step ..."):
            result = simulate(w.model, w.training, layout, topo, overlap=args.overlap,
                              timeline=bool(args.trace or args.timeline))
        est = result.estimate
        if args.trace:
            write_chrome_trace(result, args.trace)
        if args.timeline:
            plot_timeline(result, args.timeline)
    else:
        est = estimate_with("analytic", w, layout, topo)
    if args.plot:
        from paracube.cli.plots import plot_estimates

        plot_estimates([est], [str(layout)], args.plot, title=_summary(w))
    if args.json:
        print_json(est.to_dict(with_events=args.events))
        return 0
    console = make_console()
    console.print(f"[bold]{layout}[/bold]: {_summary(w)} ({args.engine} engine)")
    _print_breakdown(console, est, args.events)
    for out in (args.plot, args.trace, args.timeline):
        if out:
            console.print(f"wrote {Path(out)}")
    return 0
