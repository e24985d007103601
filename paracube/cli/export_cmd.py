"""`paracube export PLAN --to TARGET [-o FILE]`: the plan as a Megatron-LM / torchtitan / DeepSpeed launch
script, or paracube's own torchrun / Slurm script. Nothing is written unless the whole export succeeds;
every user error is one line (exit 2). No torch import (see paracube/export/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from paracube.cli.options import positive_int
from paracube.cli.outputs import add_force_option, writable
from paracube.errors import ParacubeError, unknown

if TYPE_CHECKING:
    from paracube.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    from paracube.export import TARGETS

    p = sub.add_parser("export", help="write a plan as a Megatron-LM / torchtitan / DeepSpeed / torchrun / Slurm "
                       "script")
    p.add_argument("plan", help="plan file (from `paracube plan -o FILE`)")
    p.add_argument("--to", required=True, metavar="TARGET", help=f"one of: {', '.join(TARGETS)}")
    p.add_argument("-o", "--out", default=None, metavar="FILE", help="file to write (default: print)")
    p.add_argument("--steps", type=positive_int, default=20, help="torchrun/slurm: steps to train (default 20)")
    add_force_option(p)
    p.set_defaults(handler=export_cmd)


def _check_runtime(plan: Plan, target: str, source: str) -> None:
    """Every plan, whatever runtime it was made for (paracube's own too), is re-checked against the runtime of
    `target` (torchrun / slurm: paracube's) and refused in one line naming what that runtime cannot run (and,
    made for another runtime, how to plan for this one)."""
    from paracube.runtimes import DEFAULT_RUNTIME, for_target, get_runtime

    made_for = get_runtime(plan.runtime)
    runtime = for_target(target) or get_runtime(DEFAULT_RUNTIME)
    why = runtime.refusal(plan.layout, plan.model.family, plan.model.tied_embeddings, plan.training.dtype,
                          windowed=plan.model.sliding_window is not None, sinks=plan.model.attention_sinks,
                          model=plan.model)  # rcm= modules the model has no block for on this runtime
    if why:
        made = "" if made_for is runtime else f" (made for runtime {made_for.name}; plan with --runtime {runtime.name})"
        raise ParacubeError(f"{source}: cannot export to {target}: layout {plan.layout}: {why}{made}")


def export_cmd(args: argparse.Namespace) -> int:
    from paracube.export import TARGETS, export_plan
    from paracube.plan import load_plan

    if args.to not in TARGETS:
        raise unknown("export target", args.to, TARGETS)
    out = writable(args.out, "-o", args.force)
    plan = load_plan(args.plan)
    # The exporter's own refusals first (they name the targets that run the plan), then the runtime's.
    result = export_plan(plan, args.to, plan_path=str(Path(args.plan).resolve()), steps=args.steps)
    _check_runtime(plan, args.to, args.plan)
    for note in result.notes:
        print(f"paracube export: note: {note}", file=sys.stderr)
    if out is None:
        sys.stdout.write(result.text)
        return 0
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(result.text)
        tmp.chmod(0o755)
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ParacubeError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {out} ({args.to})", file=sys.stderr)
    return 0
