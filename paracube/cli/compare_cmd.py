"""`paracube compare`: the best layout of each tensor mode side by side (or, --runtime all, of each runtime).

The search is `plan`'s (planning_cmd._search; one best per mode, SearchConfig.mode_bests), the rows its table's
columns plus the speedup over COMPARE_BASELINE's (1D). --tensor-only puts every device in one tensor group (dp =
pp = 1, Bian et al.'s setting): each mode's shapes of exactly N ranks searched apart, and one line on which mode
wins and why (planner/verdict.py). --runtime all: cli/runtime_compare.py.
"""

from __future__ import annotations

import argparse
import math

from rich.table import Table

from paracube.cli.options import Workload, add_workload_options, print_json, workload_from_args
from paracube.cli.options import console as make_console
from paracube.cli.outputs import add_force_option, writable
from paracube.cli.planning_cmd import ROW_COLUMNS, _row, _search, _summary, search_config
from paracube.cli.train_terms import DEFAULT_MEMORY_HEADROOM, headroom_fraction
from paracube.errors import ParacubeError
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.modes import COMPARE_BASELINE, MODES

MODE_ORDER = tuple(MODES)  # the registry's order (paracube/modes)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="the best layout of each tensor mode (or, --runtime all, of each runtime) "
                       "side by side")
    add_workload_options(p)
    p.add_argument("--tensor-only", action="store_true",
                   help="all devices in one tensor group (dp=pp=1), as in Bian et al.'s experiments")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="write a time/memory picture")
    p.add_argument("--memory-headroom", type=headroom_fraction, default=DEFAULT_MEMORY_HEADROOM, metavar="F",
                   help=f"fraction of device memory left free (default {DEFAULT_MEMORY_HEADROOM:g}; see plan --help)")
    add_force_option(p)
    p.set_defaults(handler=compare_cmd)


def _tensor_only_shapes(gpus: int) -> dict[str, list[tuple[int, ...]]]:
    """Per tensor mode, its shapes of exactly `gpus` ranks (every device in the tensor group)."""
    return {name: [s for s in m.shapes(gpus) if math.prod(s) == gpus] for name, m in MODES.items() if m.axes}


def _tensor_only_best(w: Workload, topo: object,
                      headroom: float = 0.0) -> tuple[dict[str, tuple[Layout, StepEstimate]], dict[str, str]]:
    """Best layout per mode with every device in the tensor group (the paper's setting)."""
    from paracube.planner import search

    best: dict[str, tuple[Layout, StepEstimate]] = {}
    why: dict[str, str] = {}
    for mode, shapes in _tensor_only_shapes(w.gpus).items():
        for shape in shapes:
            try:
                found = search(w.model, w.training, topo, w.gpus, fixed=Layout(mode=mode, shape=shape), top_k=1,
                               runtime=w.runtime, memory_headroom=headroom)
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

        return compare_runtimes(args, Planning(lambda w: _search(w, w.topology).ranked[0], _summary, _row,
                                               ROW_COLUMNS))
    w = workload_from_args(args, partial_layout=True)
    writable(args.plot, "--plot", args.force)
    search_config(w, args.memory_headroom)  # a search too large is refused before the topology is built
    topo = w.topology
    if args.tensor_only:
        best, explanations = _tensor_only_best(w, topo, args.memory_headroom)
    else:
        result = _search(w, topo, headroom=args.memory_headroom)
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
