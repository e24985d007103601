"""`paracube` entry point: one sub-command per module; a user error prints one line and exits 2.

Output into a pipe whose reader has gone (`paracube plan --json | head -3`) ends quietly with exit status 141
(128 + SIGPIPE, what a shell reports for `yes | head`), never a BrokenPipeError traceback: the rest of stdout is
sent to /dev/null so that the interpreter's final flush cannot fail either (the recipe of Python's `signal`
documentation, "Note on SIGPIPE").
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence

from paracube import __version__
from paracube.errors import ParacubeError, did_you_mean

Handler = Callable[[argparse.Namespace], int | None]


class _Parser(argparse.ArgumentParser):
    """argparse, but bad arguments name the command and exit 2 with one line (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:  # argparse lists the choices; add the near miss
            valid = [c.strip(" '") for c in choice.group(3).split(",")]
            message = (f"argument {choice.group(1)}: invalid choice {choice.group(2)!r}; "
                       f"{did_you_mean(choice.group(2), valid)}valid: {', '.join(valid)}")
        self.exit(2, f"paracube: error: {self.prog}: {message} (see `{self.prog} --help`)\n")


# Every command: the module that registers it (and imports what it needs in its handler), and its help line.
# Only the module of the command asked for is imported: `paracube topologies` or `plan` never import torch,
# and the others (listed by `paracube --help`) cost nothing.
COMMANDS = {
    "plan": ("paracube.cli.planning_cmd", "rank every valid layout and write the best as a plan file"),
    "compare": ("paracube.cli.compare_cmd", "the best layout of each tensor mode side by side"),
    "simulate": ("paracube.cli.simulate_cmd", "full breakdown of one layout (a plan file, or options + --layout)"),
    "sweep": ("paracube.cli.sweep_cmd", "time and cost to train over cluster types and sizes, with the Pareto front"),
    "models": ("paracube.cli.info_cmd", "list the model presets"),
    "topologies": ("paracube.cli.info_cmd", "list the cluster presets"),
    "run": ("paracube.cli.run_cmd", "train a plan on local (or several) nodes"),
    "launch": ("paracube.cli.run_cmd", "print a batch script that runs a plan (--slurm)"),
    "calibrate": ("paracube.cli.fidelity_cmd", "measure this machine and fit the cost model"),
    "validate": ("paracube.cli.fidelity_cmd", "run a plan and compare predicted with measured"),
    "export": ("paracube.cli.export_cmd", "a plan as a Megatron-LM / torchtitan / DeepSpeed / torchrun / Slurm script"),
    "schema": ("paracube.cli.schema_cmd", "print the JSON Schema of plan, estimate or validate JSON"),
}


def _import(module_name: str):  # noqa: ANN202
    try:
        return __import__(module_name, fromlist=["register"])
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="paracube", description=__doc__)
    parser.add_argument("--version", action="version", version=f"paracube {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    if wanted in COMMANDS:
        module = _import(COMMANDS[wanted][0])
        if module is not None:
            module.register(sub)
    for command, (_module, help_text) in COMMANDS.items():
        if command not in sub.choices:  # listed by --help; asking for it imports its module
            sub.add_parser(command, help=help_text, add_help=False)
    return parser


PIPE_CLOSED = 141  # 128 + SIGPIPE


def _stdout_to_devnull() -> int:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (tests capture it)
        pass
    return PIPE_CLOSED


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader of stdout has gone: end quietly
        return _stdout_to_devnull()


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        sys.stdout.flush()
        return 0
    try:
        code = int(handler(args) or 0)
        sys.stdout.flush()  # a closed pipe is reported here, inside main, not at interpreter exit
        return code
    except ParacubeError as exc:
        print(f"paracube: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("paracube: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
