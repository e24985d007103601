"""`paracube export PLAN --to TARGET [-o FILE]`: the plan as a Megatron-LM / torchtitan / DeepSpeed launch
script, or paracube's own torchrun / Slurm script. Nothing is written unless the whole export succeeds;
every user error is one line (exit 2). No torch import (see paracube/export/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paracube.cli.options import positive_int
from paracube.cli.outputs import add_force_option, writable
from paracube.errors import ParacubeError, unknown


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


def export_cmd(args: argparse.Namespace) -> int:
    from paracube.export import TARGETS, export_plan
    from paracube.plan import load_plan

    if args.to not in TARGETS:
        raise unknown("export target", args.to, TARGETS)
    out = writable(args.out, "-o", args.force)
    plan = load_plan(args.plan)
    result = export_plan(plan, args.to, plan_path=str(Path(args.plan).resolve()), steps=args.steps)
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
