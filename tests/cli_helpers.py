"""Running the `paracube` command line inside a test: its exit code and what it printed."""

from __future__ import annotations

import pytest

from paracube.cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `paracube argv...`; argparse's exits (exit 2 on a bad flag) included."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
