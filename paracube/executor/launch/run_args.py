"""The options every rank of `paracube run` needs: declared once for the CLI and for the worker entry
(run.py), and forwarded from one to the other. No torch here: `paracube --help` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

SOURCES_HELP = "synthetic, text (Python's pydoc topics) or text:PATH"  # = paracube.executor.training.data.SOURCES_HELP


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum, else a message naming the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def add_train_args(p: argparse.ArgumentParser) -> None:
    """What every rank needs; forwarded verbatim to the workers (worker_args)."""
    at_least_0, at_least_1 = int_at_least(0), int_at_least(1)
    p.add_argument("plan", nargs="?", default=None, help="plan JSON (default: the embedded default plan)")
    p.add_argument("--steps", type=at_least_1, default=20, help="train up to this step (default 20)")
    p.add_argument("--metrics", default=None, help="write per-step metrics as JSON lines to this file")
    p.add_argument("--checkpoint-dir", default=None, help="directory of sharded checkpoints")
    p.add_argument("--save-every", type=at_least_0, default=0, help="save every K steps and at the end (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir "
                   "(trusted input only: DCP reads it with pickle; refused unless its checksummed manifest "
                   "matches every file)")
    p.add_argument("--data", default="text", help=f"training data: {SOURCES_HELP} (default text)")
    p.add_argument("--seed", type=at_least_0, default=0, help="initialization and data seed (default 0)")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="peak learning rate (default 3e-3)")
    p.add_argument("--warmup", type=at_least_0, default=None, help="warmup steps (default 10%% of --steps)")
    p.add_argument("--on-nonfinite", choices=["stop", "skip"], default="stop",
                   help="NaN/inf loss: stop (default; the last good checkpoint stays) or skip the step")
    p.add_argument("--comm-timeout", type=positive_float, default=120.0,
                   help="collective timeout in seconds (default 120)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-overlap", action="store_true",
                   help="reduce gradient buckets after the backward even where the plan's layout says `overlap`, "
                        "and gather zero=1's parameters in the optimizer step (same result)")


def worker_args(args: argparse.Namespace) -> list[str]:
    """The workers' argv for the options of add_train_args (paths made absolute)."""
    out = [str(Path(args.plan).resolve())] if args.plan else []
    out += ["--steps", str(args.steps), "--save-every", str(args.save_every), "--data", args.data,
            "--seed", str(args.seed), "--lr", repr(args.lr), "--on-nonfinite", args.on_nonfinite,
            "--comm-timeout", repr(args.comm_timeout)]
    for flag, value in (("--metrics", args.metrics), ("--checkpoint-dir", args.checkpoint_dir)):
        if value:
            out += [flag, str(Path(value).resolve())]
    if args.warmup is not None:
        out += ["--warmup", str(args.warmup)]
    out += ["--resume"] if args.resume else []
    out += ["--no-progress"] if args.no_progress else []
    out += ["--no-overlap"] if args.no_overlap else []
    return out


__all__ = ["SOURCES_HELP", "add_train_args", "int_at_least", "positive_float", "worker_args"]
