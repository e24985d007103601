"""`paracube simulate`: the full breakdown of one layout (a plan file, or options + --layout), either engine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from paracube.cli.options import (
    DEFAULT_CLUSTER,
    Workload,
    add_workload_options,
    human_bytes,
    human_time,
    positive_int,
    print_json,
    with_routing,
    workload_from_args,
)
from paracube.cli.options import (
    console as make_console,
)
from paracube.cli.outputs import add_force_option, writable
from paracube.cli.planning_cmd import ROW_COLUMNS, _host, _row, _summary, engine_options, estimate_with
from paracube.errors import ParacubeError
from paracube.estimate import StepEstimate
from paracube.layout_parse import parse_layout
from paracube.plan import load_plan, plan_cluster


def register(sub: argparse._SubParsersAction) -> None:
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
    add_force_option(p)
    p.set_defaults(handler=simulate_cmd)


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
    # the analytic engine's are each collective's own seconds summed (overlapped ones included), the event engine's
    # the seconds the step waits on them: labelled so, side by side they differ by what overlap hides
    how = "exposed" if est.engine == "event" else "serialized"
    for axis, t in sorted(est.comm_time_by_axis.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  comm on axis {axis} ({how})", human_time(t))
    for kind, t in sorted(est.comm_time_by_kind.items(), key=lambda kv: -kv[1]):
        table.add_row(f"  comm {kind} ({how})", human_time(t))
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
        w = Workload(with_routing(plan.model, args), plan.training, plan_cluster(plan, args.cluster, args.plan),
                     plan.gpus, plan.layout, runtime=args.runtime or plan.runtime)
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

    why = get_runtime(w.runtime).refusal(layout, w.model.family, w.model.tied_embeddings, w.training.dtype,
                                         windowed=w.model.sliding_window is not None, sinks=w.model.attention_sinks)
    if why:
        raise ParacubeError(f"layout {layout}: {why}")
    if (args.trace or args.timeline or args.overlap) and args.engine != "event":
        raise ParacubeError("--trace, --timeline and --overlap need the event engine: add --engine event")
    for flag in ("plot", "trace", "timeline"):
        writable(getattr(args, flag), f"--{flag}", args.force)
    topo = w.topology
    if args.engine == "event":
        from paracube.cost_models.event import simulate
        from paracube.cost_models.event_trace import plot_timeline, write_chrome_trace

        with make_console().status("simulating one step ..."):
            result = simulate(w.model, w.training, layout, topo, overlap=args.overlap,
                              timeline=bool(args.trace or args.timeline), options=engine_options(w))
        est = result.estimate
        if args.trace:
            write_chrome_trace(result, args.trace)
        if args.timeline:
            plot_timeline(result, args.timeline, title=f"{layout}: {_summary(w)} (event engine, one step)")
    else:
        est = estimate_with("analytic", w, layout, topo, options=engine_options(w))
    if args.plot:
        from paracube.cli.plots import plot_estimates

        plot_estimates([est], [str(layout)], args.plot, title=_summary(w))
    if args.json:
        print_json(est.to_dict(with_events=args.events))
        return 0
    console = make_console()
    console.print(f"[bold]{layout}[/bold]: {_summary(w)} ({args.engine} engine)")
    _print_breakdown(console, est, args.events)
    host = _host(w, layout, topo, 0.0)  # an offloaded layout's host bytes (off=N)
    if host:
        console.print(host[1], highlight=False, markup=False)
    for out in (args.plot, args.trace, args.timeline):
        if out:
            console.print(f"wrote {Path(out)}")
    return 0
