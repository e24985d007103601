"""`paracube sweep`: best layout, step time, time and cost to train, per cluster type and size; Pareto front.

Prices are user inputs (`--price-per-gpu-hour`, one per cluster or one for all). The defaults below are
illustrative on-demand cloud list prices per GPU-hour in USD for each preset's device class, not quotes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.progress import Progress
from rich.table import Table

from paracube.cli.options import (
    add_routing_options,
    add_runtime_option,
    console,
    human_bytes,
    positive_int,
    print_json,
    runtime_from_args,
    with_routing,
)
from paracube.cli.outputs import add_force_option, writable
from paracube.cli.train_terms import DEFAULT_MEMORY_HEADROOM, headroom_fraction, human_count, parse_tokens
from paracube.errors import ParacubeError, check
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.model_presets import resolve_model
from paracube.workload import DTYPE_BYTES, ModelSpec, TrainingSpec, with_seq_len

DEFAULT_PRICE_PER_GPU_HOUR = {"longhorn": 0.90, "frontera-rtx": 0.50, "dgx-a100": 1.80, "dgx-h100": 2.50,
                              "local-cpu": 0.0}
DEFAULT_SWEEP = {"model": "gpt3-1.3b", "clusters": "dgx-a100,dgx-h100", "gpus": "8,16,32,64"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="time and cost to train over cluster types and sizes, with the Pareto front")
    p.add_argument("--model", default=DEFAULT_SWEEP["model"], help=f"default {DEFAULT_SWEEP['model']}")
    p.add_argument("--cluster", default=DEFAULT_SWEEP["clusters"], help="comma-separated presets or YAML files "
                   f"(default {DEFAULT_SWEEP['clusters']})")
    p.add_argument("--gpus", default=DEFAULT_SWEEP["gpus"],
                   help=f"comma-separated counts (default {DEFAULT_SWEEP['gpus']})")
    p.add_argument("--price-per-gpu-hour", type=float, nargs="+", default=None, metavar="USD",
                   help="one price for all clusters or one per cluster (defaults: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_PRICE_PER_GPU_HOUR.items()) + ")")
    p.add_argument("--tokens", type=parse_tokens, default=None, metavar="N",
                   help="tokens to train, e.g. 2T, 300B, 2e12 (default 20 per parameter, Hoffmann et al. 2022)")
    p.add_argument("--memory-headroom", type=headroom_fraction, default=DEFAULT_MEMORY_HEADROOM, metavar="F",
                   help=f"fraction of device memory left free (default {DEFAULT_MEMORY_HEADROOM:g}; see plan --help)")
    add_force_option(p)
    p.add_argument("--global-batch", type=positive_int, default=None, help="sequences per step (default 512)")
    p.add_argument("--seq", type=positive_int, default=None)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPE_BYTES),
                   help="compute dtype (default bf16); fp8 on the clusters whose devices have FP8 tensor cores, a "
                   "row saying why on the others")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="time vs cost picture with the Pareto front")
    add_runtime_option(p)
    add_routing_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=sweep_cmd)


@dataclass(frozen=True)
class SweepPoint:
    cluster: str
    gpus: int
    layout: Layout | None
    estimate: StepEstimate | None
    train_hours: float
    cost_usd: float
    reason: str = ""
    pareto: bool = False


def _parse_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    check(bool(items), f"--{what} {text!r} lists nothing")
    return items


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """True where no other point is at least as fast and as cheap, and strictly better in one."""
    return [not any((t2 <= t and c2 <= c) and (t2 < t or c2 < c) for t2, c2 in points) for t, c in points]


def sweep(model: ModelSpec, training: TrainingSpec, clusters: list[str], gpu_counts: list[int],
          prices: dict[str, float], tokens: float, runtime: str = "paracube",
          memory_headroom: float = 0.0) -> list[SweepPoint]:
    from paracube.planner.config import SearchConfig, check_size
    from paracube.topologies import load_topology

    # The search `paracube plan` runs for the same job (planner/config.py): every recomputation, its pool.
    config = SearchConfig(memory_headroom=memory_headroom, runtime=runtime)

    tokens_per_step = training.global_batch * training.sequence_length(model)
    points: list[SweepPoint] = []
    with Progress(console=console(), transient=True) as bar:
        task = bar.add_task("sweeping", total=len(clusters) * len(gpu_counts))
        for cluster in clusters:
            for gpus in gpu_counts:
                bar.update(task, description=f"{cluster} x {gpus}")
                try:
                    check_size(config, model, training, gpus)
                    topo = load_topology(cluster, gpus=gpus)
                    result = config.run(model, training, topo, gpus)
                    layout, est = result.ranked[0]
                    hours = tokens / tokens_per_step * est.step_time_s / 3600
                    points.append(SweepPoint(cluster, gpus, layout, est, hours, hours * gpus * prices[cluster]))
                except ParacubeError as exc:
                    points.append(SweepPoint(cluster, gpus, None, None, float("inf"), float("inf"), str(exc)))
                bar.advance(task)
    ok = [p for p in points if p.estimate is not None]
    front = pareto_front([(p.train_hours, p.cost_usd) for p in ok])
    marked = {id(p): f for p, f in zip(ok, front, strict=True)}
    return [SweepPoint(**{**p.__dict__, "pareto": marked.get(id(p), False)}) for p in points]


def sweep_cmd(args: argparse.Namespace) -> int:
    model = with_routing(with_seq_len(resolve_model(args.model), args.seq), args)
    writable(args.plot, "--plot", args.force)
    clusters = _parse_list(args.cluster, "cluster")
    try:
        gpu_counts = [int(g) for g in _parse_list(args.gpus, "gpus")]
    except ValueError:
        raise ParacubeError(f"--gpus {args.gpus!r} must be comma-separated integers, e.g. 64,128,256") from None
    check(all(g >= 1 for g in gpu_counts), f"--gpus {args.gpus!r}: every count must be >= 1")
    if args.price_per_gpu_hour is None:
        unknown = [c for c in clusters if c not in DEFAULT_PRICE_PER_GPU_HOUR]
        check(not unknown, f"no default price for {unknown}: give --price-per-gpu-hour")
        prices = {c: DEFAULT_PRICE_PER_GPU_HOUR[c] for c in clusters}
    else:
        given = args.price_per_gpu_hour
        check(len(given) in (1, len(clusters)),
              f"--price-per-gpu-hour takes 1 value or one per cluster ({len(clusters)}), not {len(given)}")
        check(all(p >= 0 for p in given), f"--price-per-gpu-hour {given}: prices must be >= 0")
        prices = {c: given[0] if len(given) == 1 else given[i] for i, c in enumerate(clusters)}
    tokens = args.tokens if args.tokens is not None else 20.0 * model.num_parameters()
    check(tokens > 0, f"--tokens {tokens} must be > 0")
    training = TrainingSpec(global_batch=args.global_batch or 512, seq_len=args.seq, dtype=args.dtype)
    runtime = runtime_from_args(args, None, model, args.dtype)
    points = sweep(model, training, clusters, gpu_counts, prices, tokens, runtime, args.memory_headroom)
    if args.json:
        print_json([{"cluster": p.cluster, "gpus": p.gpus, "layout": str(p.layout) if p.layout else None,
                     "step_time_s": p.estimate.step_time_s if p.estimate else None, "train_hours": p.train_hours,
                     "cost_usd": p.cost_usd, "pareto": p.pareto, "reason": p.reason,
                     "price_per_gpu_hour": prices[p.cluster]} for p in points])
    else:
        table = Table(title=f"{model.name}: {tokens:.3g} tokens, global batch {training.global_batch} x "
                      f"{training.sequence_length(model)}, {training.dtype}")
        for col in ("cluster", "GPUs", "best layout", "step time", "memory/GPU", "MFU", "days to train", "cost (USD)",
                    "Pareto"):
            table.add_column(col, justify="left" if col in ("cluster", "best layout") else "right")
        for p in points:
            if p.estimate is None:
                table.add_row(p.cluster, str(p.gpus), f"no layout: {p.reason}", "-", "-", "-", "-", "-", "")
                continue
            table.add_row(p.cluster, str(p.gpus), str(p.layout), f"{p.estimate.step_time_s:.3f} s",
                          human_bytes(p.estimate.memory.total), f"{p.estimate.mfu * 100:.1f}%",
                          f"{p.train_hours / 24:.2f}", f"{p.cost_usd:,.0f}", "*" if p.pareto else "")
        console().print(table)
    if args.plot:
        plot_sweep(points, args.plot, title=f"{model.name}: time and cost to train {human_count(tokens)} tokens")
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def plot_sweep(points: list[SweepPoint], path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, ax = plt.subplots(figsize=(8, 5.6))
    ok = [p for p in points if p.estimate is not None]
    for cluster in dict.fromkeys(p.cluster for p in ok):
        mine = [p for p in ok if p.cluster == cluster]
        ax.plot([p.train_hours / 24 for p in mine], [p.cost_usd for p in mine], "o-", label=cluster)
        for p in mine:
            ax.annotate(f"{p.gpus}", (p.train_hours / 24, p.cost_usd), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
    front = sorted((p for p in ok if p.pareto), key=lambda p: p.train_hours)
    if front:
        ax.plot([p.train_hours / 24 for p in front], [p.cost_usd for p in front], "k--", lw=1, label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}")  # 20, not 2 x 10^1
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("time to train (days, log scale)")
    ax.set_ylabel("cost to train (USD, log scale)")
    ax.set_title(title, fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.text(0.01, 0.01, "One point per cluster and GPU count (the number beside it): the best layout's predicted "
             "step time x steps to train;\ncost = GPUs x hours x price per GPU-hour. The Pareto front joins the "
             "points that no other beats on both time and cost.", fontsize=8, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)
