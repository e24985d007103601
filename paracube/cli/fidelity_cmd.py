"""`paracube calibrate` and `paracube validate`: measure this machine, and check predictions against runs."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from paracube.cli.options import human_bytes, human_time, positive_int, print_json
from paracube.cli.outputs import add_force_option, writable
from paracube.errors import ParacubeError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="measure GEMMs and collectives on local ranks, fit the cost model")
    p.add_argument("--cluster", default="local-cpu", help="base topology preset (default local-cpu)")
    p.add_argument("--nproc", type=positive_int, default=8, help="ranks to measure with (default 8)")
    p.add_argument("--out", default="cluster.yaml", help="topology file to write (default cluster.yaml)")
    p.add_argument("--quick", action="store_true", help="fewer shapes, sizes and repetitions (~1 minute)")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.add_argument("--from-runs", default=None, metavar="CSV",
                   help="fit the --cluster preset's efficiencies on measured runs instead (cli/runs_cmd.py)")
    add_force_option(p)
    p.set_defaults(handler=calibrate_command)
    p = subparsers.add_parser("validate", help="run a plan on local ranks: predicted vs measured per step")
    p.add_argument("plan", nargs="?", default=None, help="plan JSON (default: the embedded default plan)")
    p.add_argument("--steps", type=positive_int, default=5, help="steps to run; step 1 is warm-up (default 5)")
    p.add_argument("--cluster", default=None, help="calibrated topology file (default: the plan's cluster)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--from-runs", default=None, metavar="CSV",
                   help="predicted vs measured for every run of a runs CSV on --cluster (cli/runs_cmd.py)")
    p.set_defaults(handler=validate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    writable(args.out, "--out", args.force)  # before minutes of measuring
    if args.from_runs:
        from paracube.cli.runs_cmd import calibrate_from_runs

        return calibrate_from_runs(args)
    from paracube.calibration.calibrate import calibrate, fit_all, write_topology
    from paracube.layout_parse import parse_layout

    t0 = time.perf_counter()
    with Console(stderr=True).status(f"calibrating: microbenchmarks on {args.nproc} ranks ..."):
        topo, result, cal = calibrate(args.cluster, args.nproc, quick=args.quick)
    path = write_topology(topo, args.out)
    if args.json:
        print_json(cal)
        return 0
    fits = fit_all(result)
    table = Table(title=f"calibration fit residuals ({args.nproc} ranks, {cal['machine']['backend']})")
    for col in ("point", "measured", "fit", "rel err"):
        table.add_column(col, justify="left" if col == "point" else "right")
    gemm = fits["gemm"]
    for p, e in zip(result.gemm, gemm.rel_err, strict=True):  # type: ignore[union-attr]
        table.add_row(f"gemm {p['m']}x{p['n']}x{p['k']}", human_time(p["cost_s"]),
                      human_time(p["cost_s"] * (1 + e)), f"{e:+.1%}")
    for table_name in ("comm", "comm_alternating"):
        table_fits = fits[table_name]
        points = [p for p in result.collective if bool(p.get("alternating")) == (table_name != "comm")]
        for p in points:
            f = table_fits[p["kind"]][str(p["n"])]  # type: ignore[index]
            same = [q for q in points if q["kind"] == p["kind"] and q["n"] == p["n"]]
            e = f.rel_err[same.index(p)]
            table.add_row(f"{p['kind']} n={p['n']} strides {p['stride']} {human_bytes(p['bytes'])}",
                          human_time(p["cost_s"]), human_time(p["cost_s"] * (1 + e)), f"{e:+.1%}")
    console = Console()
    console.print(table)
    r = cal["residuals"]
    console.print(f"RMS relative error: gemm {r['gemm']:.1%}, elementwise {r['elementwise']:.1%}, "
                  f"collectives (per kind and size) {r['comm']:.1%}, joint link {r['link']:.1%}, "
                  f"step probes over rounds {r.get('probe', 0.0):.1%}")
    g, link = cal["gemm"], cal["link"]
    console.print(f"GEMM peak {g['peak_flops'] / 1e9:.1f} GFLOP/s per rank (m0={g['m0']:.3g}, n0={g['n0']:.3g}, "
                  f"k0={g['k0']:.3g}); link alpha {human_time(link['latency'])}, beta "
                  f"{link['bandwidth'] / 1e9:.3g} GB/s; op overhead {human_time(cal['elementwise']['op_overhead_s'])}")
    timing = cal["timing"]
    if timing["basis"] == "cpu":
        console.print(f"{args.nproc} ranks share {timing['cores']} cores: every point is priced at "
                      f"{timing['ranks_per_core']:g} x its CPU time (the step is CPU-throughput bound)")
    probes = Table(title="step probes (executor steps of a model with few FLOPs)")
    for col in ("layout", "dtype", "seq", "ops", "measured step", "per op"):
        probes.add_column(col, justify="left" if col == "layout" else "right")
    by_mode = cal["elementwise"].get("op_overhead_by_mode", {})
    for p in cal.get("probes", []):
        mode = parse_layout(p["layout"]).mode
        per_op = by_mode.get(p["dtype"], {}).get(mode, 0.0)
        probes.add_row(p["layout"], p["dtype"], str(p.get("seq_len", "")), str(p["ops"]), human_time(p["time_s"]),
                       human_time(per_op))
    console.print(probes)
    console.print(f"GEMMs and elementwise ops in a training step at {g['eff_max']:.2f} of the microbenchmarks' rates "
                  "(fitted on the serial probes at two sequence lengths)")
    wait, call = cal["elementwise"].get("step_wait_s"), cal["elementwise"].get("call_wait_s")
    if wait is not None or call is not None:
        console.print(f"waits fitted on the parallel probes: {human_time(call or 0.0)} per collective call, "
                      f"{human_time(wait or 0.0)} per message (collective.wait_steps)")
    console.print(f"wrote {path} ({time.perf_counter() - t0:.0f} s); use it with --cluster {path}")
    return 0


def validate_command(args: argparse.Namespace) -> int:
    if args.from_runs:
        from paracube.cli.runs_cmd import validate_from_runs

        return validate_from_runs(args)
    from paracube.plan import default_plan, load_plan, plan_cluster
    from paracube.topologies import PRESETS, load_topology
    from paracube.validation.validate import validate

    plan = load_plan(args.plan) if args.plan else default_plan()
    from paracube.cli.run_cmd import runnable_plan

    plan = runnable_plan(plan, args.plan)  # validate runs it with paracube's executor
    world = plan.layout.world_size
    # The plan's cluster (a calibrated file is recorded by its absolute path); --cluster only overrides.
    source = plan_cluster(plan, args.cluster, args.plan or "the default plan")
    if args.cluster is None and source in PRESETS and source != "local-cpu":
        raise ParacubeError(f"plan cluster {source!r} is not this machine; validate runs on local ranks: "
                            "pass --cluster FILE from `paracube calibrate` (or plan with --cluster FILE)")
    # A calibrated file is fixed in size: load it as written and say so if the plan needs another size.
    topo = load_topology(source, gpus=world if source in PRESETS else None)
    if topo.num_devices != world:
        raise ParacubeError(f"cluster {source!r} has {topo.num_devices} devices but the plan's layout "
                            f"{plan.layout} needs {world}; calibrate with --nproc {world}")
    with Console(stderr=True).status(f"validating: {args.steps} steps of {plan.layout} on {world} ranks ..."):
        out = validate(plan, args.steps, topo, source)
    if args.json:
        print_json(out)
        return 0
    console = Console()
    steps = Table(title=f"validate {out['layout']} on {source} (measured, mean over ranks)")
    for col in ("step", "time", "comm time", "bytes sent/rank", "memory/rank"):
        steps.add_column(col, justify="right")
    for s in out["steps"]:
        steps.add_row(str(s["step"]) + (" (warm-up)" if s["step"] not in out["measured_steps"] else ""),
                      human_time(s["step_time_s"]), human_time(s["comm_time_s"]),
                      human_bytes(s["bytes_sent_per_rank"]), human_bytes(s["memory_bytes"]))
    console.print(steps)
    table = Table(title="predicted vs measured (steps after warm-up)")
    for col in ("quantity", "predicted", "measured", "rel err", "band"):
        table.add_column(col, justify="left" if col == "quantity" else "right")
    for c in out["comparisons"]:
        fmt = human_time if c["name"].endswith("_s") else human_bytes
        table.add_row(c["name"], fmt(c["predicted"]), fmt(c["measured"]), f"{c['rel_err']:+.1%}",
                      f"±{c['band']:.0%}" if c["band"] else "")
    console.print(table)
    if not out["calibrated"]:
        console.print("note: uncalibrated cluster; run `paracube calibrate` for predictions of this machine")
    console.print(out["verdict"], highlight=False, markup=False)
    return 0
