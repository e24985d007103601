"""`paracube compare --runtime all`: the same job planned for each runtime (paracube/runtimes), side by side.

Each runtime's search takes its own tensor modes, pipelines, zero stages, recomputations and overlaps
(planner/dimensions.py); a pinned --layout is refused by the runtimes that cannot run it (their row says why).
Columns: runtime, best layout, step time and its parts, memory per GPU, MFU, speedup over paracube's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table

from paracube.cli.options import Workload, console, print_json, workload_from_args
from paracube.errors import ParacubeError
from paracube.estimate import StepEstimate
from paracube.layout import Layout


@dataclass(frozen=True)
class Planning:
    """What `paracube compare` shares with this view (cli/compare_cmd.py): the best layout of a workload, the
    workload's one-line summary, and the table row of an estimate with its column names."""

    best: Callable[[Workload], tuple[Layout, StepEstimate]]
    summary: Callable[[Workload], str]
    row: Callable[[StepEstimate], list[str]]
    columns: Sequence[str]


def _plan_each(args: argparse.Namespace, how: Planning
               ) -> tuple[list[tuple[str, Layout, StepEstimate]], dict[str, str], str]:
    from paracube.runtimes import RUNTIMES

    rows: list[tuple[str, Layout, StepEstimate]] = []
    why: dict[str, str] = {}
    summary = ""
    for name in RUNTIMES:
        args.runtime = name
        try:
            w = workload_from_args(args)
            summary = summary or how.summary(w).rsplit(", runtime", 1)[0]
            lay, est = how.best(w)
            rows.append((name, lay, est))
        except ParacubeError as exc:
            why[name] = str(exc)
    args.runtime = "all"
    return rows, why, summary


def compare_runtimes(args: argparse.Namespace, how: Planning) -> int:
    rows, why, summary = _plan_each(args, how)
    if not rows:
        raise ParacubeError("no runtime has a layout for this job: " + "; ".join(f"{k}: {v}" for k, v in why.items()))
    base = next((est for name, _, est in rows if name == "paracube"), None)
    if args.json:
        print_json({"workload": summary, "runtimes": [
            {"runtime": name, **est.to_dict(), "layout": str(lay),
             "speedup_over_paracube": base.step_time_s / est.step_time_s if base else None}
            for name, lay, est in rows], "no_layout": why})
    else:
        table = Table(title=f"{summary}: best layout per runtime")
        table.add_column("runtime")
        table.add_column("best layout", overflow="fold")
        for col in how.columns:
            table.add_column(col, justify="right")
        table.add_column("vs paracube", justify="right")
        for name, lay, est in rows:
            table.add_row(name, str(lay), *how.row(est), f"{base.step_time_s / est.step_time_s:.2f}x" if base else "-")
        con = console()
        con.print(table)
        for name, text in why.items():
            con.print(f"{name}: no layout: {text}", markup=False, highlight=False)
    if args.plot:
        import textwrap

        from paracube.cli.plots import plot_estimates

        labels = [name + "\n" + "\n".join(textwrap.wrap(str(lay).replace(",", ", "), 18)).replace(", ", ",")
                  for name, lay, _ in rows]
        plot_estimates([est for _, _, est in rows], labels, args.plot, title=summary, rotation=0)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


__all__ = ["Planning", "compare_runtimes"]
