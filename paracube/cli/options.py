"""Options shared by plan / compare / simulate / sweep, and turning them into typed specs."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rich.console import Console

from paracube.attention_chunk import chunk_refusal
from paracube.errors import ParacubeError, check, divisors_text
from paracube.executor.launch.run_args import int_at_least  # torch-free: one argparse type for CLI and worker
from paracube.model_presets import DEFAULT_MODEL, resolve_model
from paracube.workload import DTYPE_BYTES, ModelSpec, TrainingSpec, check_dtype_on, with_seq_len

if TYPE_CHECKING:  # numpy and the modes load in workload_from_args: `paracube models` needs neither
    from paracube.layout import Layout

DEFAULT_CLUSTER = "local-cpu"
DEFAULT_GPUS = 8


positive_int = int_at_least(1)


def add_workload_options(p: argparse.ArgumentParser,
                         layout_help: str = "fix the layout, e.g. dp=2,tp=3d:2x2x2") -> None:
    g = p.add_argument_group("workload and cluster")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"preset name or HF config.json (default {DEFAULT_MODEL})")
    g.add_argument("--cluster", default=DEFAULT_CLUSTER,
                   help=f"topology preset or YAML file (default {DEFAULT_CLUSTER})")
    g.add_argument("--gpus", type=positive_int, default=None, help=f"number of devices (default {DEFAULT_GPUS})")
    g.add_argument("--global-batch", type=positive_int, default=None, help="sequences per step (default 8, or 512 "
                   "for models of 100M+ parameters)")
    g.add_argument("--micro-batch", type=positive_int, default=None, help="sequences per micro-batch per replica")
    g.add_argument("--seq", type=positive_int, default=None, help="sequence length (default: the model's)")
    g.add_argument("--dtype", default=None, choices=list(DTYPE_BYTES),
                   help="compute dtype (default fp32 on local-cpu, else bf16); fp8: Transformer Engine style, "
                   "bf16 parameters and activations, FP8 GEMM inputs (devices with FP8 tensor cores)")
    g.add_argument("--recompute", default=None, choices=["none", "selective", "full"],
                   help="activation recomputation (default: plan searches none, selective, full; other "
                   "commands use none)")
    g.add_argument("--activations", default="paracube", choices=["paracube", "megatron"],
                   help="whose saved activations to count: paracube's executor (fp32 residual stream, fused "
                   "attention; default) or Megatron's (Korthikanti et al. 2022)")
    g.add_argument("--layout", default=None, help=layout_help)
    add_runtime_option(g)
    add_routing_options(g)
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_routing_options(g: Any) -> None:
    """MoE routing the cost models price (moe_spec.MoESpec.load): the model's own unless given."""
    g.add_argument("--moe-imbalance", type=float, default=None, metavar="F",
                   help="MoE models: the busiest expert's tokens over the balanced share (default: the model's, 1.0 = "
                   "force-balanced routing, as published benchmarks run; e.g. 1.2 for 20%% more on the busiest)")
    g.add_argument("--capacity-factor", default=None, metavar="F|dropless",
                   help="MoE models: each expert keeps at most F x its balanced share of the tokens (token drop; "
                   "padded up to it where the runtime pads: megatron, deepspeed); dropless: every token kept "
                   "(default: the model's; dropless for every preset)")


def with_routing(model: ModelSpec, args: argparse.Namespace) -> ModelSpec:
    """The model with --moe-imbalance / --capacity-factor applied (absent: as it is); each refused in one line for a
    model without routed experts or a value outside what MoESpec prices."""
    imbalance, capacity = getattr(args, "moe_imbalance", None), getattr(args, "capacity_factor", None)
    if imbalance is None and capacity is None:
        return model
    flag = "--moe-imbalance" if imbalance is not None else "--capacity-factor"
    check(model.moe is not None, f"{flag}: model {model.name!r} has no routed experts; valid: a MoE model "
          "(`paracube models` lists them, e.g. mixtral-8x7b, qwen3-30b-a3b, tiny-moe)")
    moe = model.moe
    assert moe is not None
    if imbalance is not None:
        check(1.0 <= imbalance <= moe.experts, f"--moe-imbalance {imbalance:g}: valid: 1.0 (balanced) to "
              f"{moe.experts} (every routed token on one of {model.name}'s {moe.experts} experts)")
        moe = replace(moe, imbalance=float(imbalance))
    if capacity is not None:
        moe = replace(moe, capacity_factor=_capacity(capacity))
    return replace(model, moe=moe)


def _capacity(text: str) -> float | None:
    """--capacity-factor: a positive number, or dropless (None)."""
    if text.strip().lower() == "dropless":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    check(value > 0 and value != float("inf"), f"--capacity-factor {text!r}: valid: a positive number (e.g. 1.0 or "
          "1.25) or dropless")
    return value


def add_runtime_option(g: Any, all_ok: bool = False) -> None:
    from paracube.runtimes import RUNTIMES  # numpy and the modes: the planning commands load them anyway

    g.add_argument("--runtime", default=None, metavar="NAME",
                   help=f"the training stack the plan is for: {', '.join(RUNTIMES)}"
                   + (", or all (side by side)" if all_ok else "") + " (default paracube: `paracube run` runs it)")


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    training: TrainingSpec
    cluster: str
    gpus: int
    layout: Layout | None
    search_recompute: bool = False  # --recompute not given: the planner chooses it
    runtime: str = "paracube"  # paracube/runtimes: what runs the plan

    @property
    def topology(self):  # noqa: ANN201 - imported lazily: topologies may be heavy to build
        from paracube.topologies import load_topology

        topo = load_topology(self.cluster, gpus=self.gpus)
        check_dtype_on(self.training.dtype, topo.device.name, topo.device.peak_flops)
        return topo


def workload_from_args(args: argparse.Namespace, partial_layout: bool = False) -> Workload:
    """`partial_layout`: the layout constrains a search (plan, compare): its ranks must divide --gpus and the
    search chooses the rest (dp, ...); otherwise (simulate) it is the whole layout of --gpus ranks."""
    from paracube.layout import Layout
    from paracube.layout_parse import parse_layout

    model = with_routing(with_seq_len(resolve_model(args.model), args.seq), args)
    layout = parse_layout(args.layout, pin=partial_layout) if args.layout else None
    if args.micro_batch is not None:
        layout = (layout or Layout()).with_(micro_batch=args.micro_batch) if layout or partial_layout else None
    gpus = args.gpus or (layout.world_size if layout else DEFAULT_GPUS)
    if layout is not None and partial_layout:
        check(gpus % layout.world_size == 0, f"layout {layout} uses {layout.world_size} ranks, which do not divide "
              f"--gpus {gpus}; valid: a layout of {gpus} ranks or of a divisor of {gpus} (the search sets dp)")
        _check_pinned_fold(layout, gpus)
    elif layout is not None and layout.world_size != gpus:
        raise ParacubeError(f"layout {layout} uses {layout.world_size} ranks but --gpus is {gpus}")
    default_batch = 512 if model.num_parameters() >= 100e6 else 8
    training = TrainingSpec(global_batch=args.global_batch or default_batch, seq_len=args.seq,
                            dtype=args.dtype or ("fp32" if args.cluster == "local-cpu" else "bf16"),
                            recompute=args.recompute or "none", activations=args.activations)
    if layout is not None:
        check_micro_batch(layout, training.global_batch, args.layout or "")
    runtime = runtime_from_args(args, layout, model, training.dtype)
    return Workload(model, training, args.cluster, gpus, layout, args.recompute is None, runtime)


def _check_pinned_fold(pins: Layout, gpus: int) -> None:
    """Pinned ep x etp without dp (Layout.pin) must divide a pipeline stage's dp x cp x tp ranks for some dp: at most
    --gpus / pp of them (pp as pinned, else 1), so ep x etp divides that."""
    folded = pins.ep * pins.etp
    if folded == 1 or not pins.fold_open:
        return
    stage = gpus // pins.pp
    if stage % folded:
        valid = ", ".join(str(n) for n in range(1, stage + 1) if stage % (n * pins.etp) == 0) or "none"
        raise ParacubeError(f"ep={pins.ep} x etp={pins.etp} must divide the dp x cp x tp ranks of a pipeline stage, "
                            f"at most {stage} with --gpus {gpus} and pp={pins.pp}; valid ep: {valid}")


def runtime_from_args(args: argparse.Namespace, layout: Layout | None, model: ModelSpec, dtype: str,
                      all_ok: bool = False) -> str:
    """--runtime NAME (default paracube), checked: a layout it cannot run is refused in one line."""
    from paracube.runtimes import DEFAULT_RUNTIME, get_runtime, model_refusal_line

    name = getattr(args, "runtime", None) or DEFAULT_RUNTIME
    if all_ok and name == "all":
        return name
    runtime = get_runtime(name)
    why_chunk = chunk_refusal(model, model.seq_len, runtime)  # Llama 4 beyond one chunk: before any search
    if why_chunk:
        raise ParacubeError(why_chunk)
    why_model = model_refusal_line(runtime, model)  # the model's blocks, whatever the layout
    if why_model:
        raise ParacubeError(why_model)
    if layout is not None:
        why = runtime.refusal(layout, model.family, model.tied_embeddings, dtype, moe=model.moe is not None,
                              windowed=model.sliding_window is not None, sinks=model.attention_sinks, model=model)
        if why:
            raise ParacubeError(f"layout {layout}: {why}")
    elif dtype not in runtime.dtypes:
        raise ParacubeError(f"runtime {name} ({runtime.title}) does not train in {dtype}; valid: "
                            f"--dtype {'/'.join(runtime.dtypes)}")
    return name


def check_micro_batch(layout: Layout, global_batch: int, text: str) -> None:
    """dp (where pinned) must divide the global batch, and mb the sequences each replica gets."""
    mb = int(layout.micro_batch or 1)
    dp_pinned = layout.dp > 1 or "dp=" in text.replace(" ", "")
    per_replica = global_batch // layout.dp if dp_pinned and global_batch % layout.dp == 0 else global_batch
    if dp_pinned and global_batch % layout.dp:
        raise ParacubeError(f"dp={layout.dp} does not divide the global batch of {global_batch} sequences "
                            f"({global_batch} % {layout.dp} = {global_batch % layout.dp}); give --global-batch "
                            f"a multiple of {layout.dp}")
    if per_replica % mb:
        valid = divisors_text(per_replica)
        whose = (f"the {per_replica} sequences per replica (global batch {global_batch} / dp={layout.dp})"
                 if dp_pinned else f"the global batch of {global_batch} sequences")
        raise ParacubeError(f"mb={mb} does not divide {whose}: {per_replica} % {mb} = {per_replica % mb}; "
                            f"valid mb: {valid} (or --global-batch a multiple of {mb})")


def console() -> Console:
    """Wide enough for the layout tables even when stdout is a pipe (rich would assume 80 columns)."""
    con = Console(soft_wrap=True)  # lines longer than the terminal are not broken mid-word; tables still fit
    return con if con.is_terminal else Console(width=160, soft_wrap=True)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def human_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"
