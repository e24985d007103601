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


# Commands whose modules import torch: registered only when asked for, so planning stays fast.
HEAVY_COMMANDS = {
    "calibrate": ("paracube.cli.fidelity_cmd", "measure this machine and fit the cost model"),
    "validate": ("paracube.cli.fidelity_cmd", "run a plan and compare predicted with measured"),
}
LIGHT_MODULES = ("paracube.cli.planning_cmd", "paracube.cli.info_cmd", "paracube.cli.sweep_cmd", "paracube.cli.run_cmd")


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
    for module_name in LIGHT_MODULES:
        module = _import(module_name)
        if module is not None:
            module.register(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    registered: set[str] = set()
    for command, (module_name, _help) in HEAVY_COMMANDS.items():
        if command == wanted and module_name not in registered:
            module = _import(module_name)
            if module is not None:
                module.register(sub)
                registered.add(module_name)
    for command, (module_name, help_text) in HEAVY_COMMANDS.items():
        if module_name not in registered and _import_spec_exists(module_name):
            sub.add_parser(command, help=help_text, add_help=False)
    return parser


def _import_spec_exists(module_name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module_name) is not None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv)
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
