"""`paracube` entry point: one sub-command per module; a user error prints one line and exits 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from paracube import __version__
from paracube.errors import ParacubeError

Handler = Callable[[argparse.Namespace], int | None]


class _Parser(argparse.ArgumentParser):
    """argparse, but bad arguments name the command and exit 2 with one line (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"paracube: error: {self.prog}: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from paracube.cli import info_cmd, planning_cmd

    parser = _Parser(prog="paracube", description=__doc__)
    parser.add_argument("--version", action="version", version=f"paracube {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    planning_cmd.register(sub)
    info_cmd.register(sub)
    for module_name in ("paracube.executor.run", "paracube.cli.fidelity_cmd", "paracube.cli.sweep_cmd"):
        try:
            module = __import__(module_name, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        return int(handler(args) or 0)
    except ParacubeError as exc:
        print(f"paracube: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("paracube: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
