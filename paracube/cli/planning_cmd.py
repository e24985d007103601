"""`paracube plan`: search every layout, write the best as a plan file; and what `compare` and `simulate` share
with it (the search, the workload's summary line, an estimate's table row)."""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from paracube.cli.options import (
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
from paracube.cli.outputs import add_force_option, writable
from paracube.cli.train_terms import (
    DEFAULT_MEMORY_HEADROOM,
    TOKENS_PER_PARAMETER,
    add_train_options,
    headroom_line,
    host_line,
    train_cost,
)
from paracube.engine_options import EngineOptions
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.plan import LaunchSpec, Plan, recorded_cluster
from paracube.planner.config import POOL

EXPLAIN_POOL = POOL  # ranked layouts the runner-ups of `plan` are looked for in (planner/explain.py)
PLAN_MODE_BESTS = False  # `plan` shows the ranked pool only: no exact best per mode (SearchConfig.mode_bests)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank every valid layout and write the best as a plan file")
    add_workload_options(p, layout_help="constrain the search, e.g. tp=3d:4x4x4 or dp=2,tp=1d:8")
    p.add_argument("--top", type=positive_int, default=10, help="rows to show (default 10)")
    p.add_argument("--refine", type=positive_int, default=0, metavar="K",
                   help="re-rank the best K with the discrete-event engine")
    p.add_argument("-o", "--out", default="plan.json", help="plan file to write (default plan.json; an existing "
                   "file only with --force)")
    add_force_option(p)
    add_train_options(p)
    # Every plan runs now (the search emits only what the executor runs): kept so old scripts still work.
    p.add_argument("--runnable", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=plan_cmd)



# --- helpers ------------------------------------------------------------------------------------------------
def estimate_with(engine: str, w: Workload, layout: Layout, topo: object, **options: object) -> StepEstimate:
    from paracube.cost_models.event import estimate_with as dispatch

    return dispatch(engine, w.model, w.training, layout, topo, **options)


def engine_options(w: Workload) -> EngineOptions:
    """The engines' overlap options of the workload's runtime (Runtime.engine_options: the one place)."""
    from paracube.runtimes import get_runtime

    return get_runtime(w.runtime).engine_options()


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


def make_plan(w: Workload, layout: Layout, est: StepEstimate, topo: object, notes: tuple[str, ...] = ()) -> Plan:
    # one launcher per host: a host may hold fewer GPUs than the topology's node (GB200 NVL72: 4 of a 72-GPU domain)
    host = getattr(topo, "devices_per_host", None) or getattr(topo, "devices_per_node", w.gpus)
    per_node = min(w.gpus, int(host))
    if w.gpus % per_node:
        per_node = w.gpus
    # A searched (or rc=-pinned) recomputation is the plan's training recomputation (rcm=: selective, implied).
    rc = layout.recompute or ("selective" if layout.recompute_modules else None)
    training = replace(w.training, recompute=rc) if rc else w.training
    return Plan(model=w.model, training=training, layout=layout, cluster=recorded_cluster(w.cluster), gpus=w.gpus,
                launch=LaunchSpec(nproc_per_node=per_node, nnodes=w.gpus // per_node),
                prediction=est.to_dict(), notes=est.notes + _unpriced(layout, est) + notes, runtime=w.runtime)


def _unpriced(layout: Layout, est: StepEstimate) -> tuple[str, ...]:
    """A pinned zero the cost model did not see (its estimate's layout has no zero=) is said in the plan."""
    if layout.zero and "zero=" not in est.layout:
        return (f"zero={layout.zero} is pinned but not priced: the prediction is that of zero=0 "
                "(optimizer state and parameters replicated over dp)",)
    return ()


def search_config(w: Workload, headroom: float = DEFAULT_MEMORY_HEADROOM, top_k: int = POOL,  # noqa: ANN201
                  mode_bests: bool = True):
    """The search plan, compare and sweep share (planner/config.py), for this workload; its size checked first."""
    from paracube.planner.config import SearchConfig, check_size

    config = SearchConfig(w.search_recompute, top_k, headroom, w.runtime, mode_bests)
    if w.layout is None:  # a pinned layout searches a fraction of it
        check_size(config, w.model, w.training, w.gpus)
    else:
        check_size(config, w.model, w.training, 1)
    return config


def _search(w: Workload, topo: object, top_k: int = POOL, headroom: float = DEFAULT_MEMORY_HEADROOM,  # noqa: ANN202
            mode_bests: bool = True):
    # Without --recompute the planner chooses recomputation; zero stages, overlap and tpo: what the runtime runs.
    config = search_config(w, headroom, top_k, mode_bests)
    console = Console(stderr=True)
    # The spinner only where it shows: a terminal or a notebook (elsewhere rich prints nothing for it and redirects
    # nothing), so that scripts do not pay its imports and refresh thread (~10 ms of a ~1 s plan).
    shown = console.is_terminal or console.is_jupyter
    with console.status(f"searching layouts of {w.gpus} devices ...") if shown else nullcontext():
        return config.run(w.model, w.training, topo, w.gpus, fixed=w.layout)


def _host(w: Workload, layout: Layout, topo: object, headroom: float) -> tuple[float, str] | None:
    """(host bytes per device, the line that reports them: train_terms.host_line) of an offloaded layout; None
    without off=."""
    if not layout.offload:
        return None
    from paracube.cost_models.analytic import host_memory  # the cost models: loaded when a command needs them

    host = host_memory(w.model, w.training, layout, engine_options(w))
    cap = float(getattr(topo.device, "host_memory_bytes", 0.0))  # type: ignore[attr-defined]
    return host, host_line(host, cap, layout.offload, w.model.layers, headroom)


# --- commands -----------------------------------------------------------------------------------------------
def plan_cmd(args: argparse.Namespace) -> int:
    w = workload_from_args(args, partial_layout=True)
    out = writable(args.out, "-o", args.force)
    pool = max(args.top, args.refine, EXPLAIN_POOL)
    search_config(w, args.memory_headroom, pool, PLAN_MODE_BESTS)  # too large a search: refused before the topology
    topo = w.topology
    from paracube.planner.explain import dedupe, explain

    if args.runnable:
        print("paracube plan: --runnable is no longer needed (every plan runs) and is ignored", file=sys.stderr)
    result = _search(w, topo, pool, args.memory_headroom, PLAN_MODE_BESTS)
    ranked = _with_zero(dedupe(result.ranked), w.layout)
    exhaustive = len(result.ranked) < pool
    if args.refine:
        opts = engine_options(w)  # as the search priced them (planner/search.py)
        refined = [(lay, estimate_with("event", w, lay, topo, options=opts)) for lay, _ in ranked[: args.refine]]
        ranked = sorted(refined, key=lambda r: r[1].step_time_s) + ranked[args.refine:]
        choices = explain(ranked[: args.refine], w.layout)
    else:
        choices = explain(ranked, w.layout, exhaustive, result.unsearched)
    best_layout, best_est = ranked[0]
    device_memory = float(topo.device.memory_bytes)  # type: ignore[attr-defined]
    memory = headroom_line(best_est.memory.total, device_memory, args.memory_headroom)
    host = _host(w, best_layout, topo, args.memory_headroom)  # an offloaded layout's host bytes (off=N), else None
    tokens = args.tokens if args.tokens is not None else TOKENS_PER_PARAMETER * w.model.num_parameters()
    cost = train_cost(tokens, w.training.global_batch * w.training.sequence_length(w.model), best_est.step_time_s,
                      w.gpus, args.price_per_gpu_hour)
    plan = make_plan(w, best_layout, best_est, topo, (memory,) + ((host[1],) if host else ()))
    assert out is not None
    path = plan.save(out)
    if args.json:
        print_json({"plan_file": str(path), "best": {"layout": str(best_layout), **best_est.to_dict()},
                    "train": cost.to_dict(), "memory_headroom": args.memory_headroom,
                    "memory_left_bytes": device_memory * (1 - args.memory_headroom) - best_est.memory.total,
                    **({"host_bytes": host[0]} if host else {}),
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
    console.print(f"scored {result.scored} layouts in {result.elapsed_s:.2f} s, {result.layouts_per_s:,.0f} layouts/s "
                  "enumerated"
                  + (f" ({result.pruned} more skipped: their lower bound loses)" if result.pruned else "")
                  + (f"; rejected: {rejected}" if rejected else "")
                  + (f" (+{len(result.rejected) - 4} more reasons)" if len(result.rejected) > 4 else ""))
    for note in _unpriced(best_layout, best_est):
        console.print(f"note: {note}", markup=False)
    console.print(cost.line(args.tokens is None), highlight=False, markup=False)
    console.print(memory, highlight=False, markup=False)
    if host:
        console.print(host[1], highlight=False, markup=False)
    from paracube.runtimes import get_runtime

    target = get_runtime(w.runtime).export_target
    if target:
        console.print(f"wrote {path} (best: {best_layout}, for runtime {w.runtime}); export it with "
                      f"`paracube export {path} --to {target}`", highlight=False, markup=False)
        return 0
    small = "tiny-moe" if w.model.moe is not None else "tiny"  # a scaled-down run keeps the MoE blocks and ep
    console.print(f"wrote {path} (best: {best_layout}); run it with `paracube run {path}`"
                  + ("" if w.gpus <= 8 else f" (on fewer CPU ranks: `paracube run {path} --model {small} --gpus 8`)"),
                  highlight=False, markup=False)
    return 0


def _with_zero(ranked: list, fixed: Layout | None) -> list:
    """The search does not vary zero: a pinned zero=N applies to every ranked layout."""
    if fixed is None or not fixed.zero:
        return ranked
    return [(lay.with_(zero=fixed.zero), est) for lay, est in ranked]
