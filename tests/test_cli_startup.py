"""The command line starts fast: planning and listing commands never import torch (issue 11 part 6).

Each command runs in a fresh interpreter with `-X importtime`, which lists every module imported; none may
be torch or one of its submodules (torch alone takes seconds to import). `run --help` too: registering
`paracube run` imports no torch, only its handler does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _imported(argv: list[str], cwd: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "paracube", *argv], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]


@pytest.mark.parametrize("argv", [["topologies"], ["models"], ["plan", "--help"], ["run", "--help"],
                                  ["plan", "--top", "3"], ["compare"], ["simulate"]],
                         ids=lambda a: " ".join(a))
def test_command_imports_no_torch(argv: list[str], tmp_path: Path) -> None:
    imported = _imported(argv, tmp_path)
    assert "paracube.cli.main" in imported  # the importtime listing was read
    assert [m for m in imported if m == "torch" or m.startswith("torch.")] == []
    if argv == ["plan", "--top", "3"]:
        assert (tmp_path / "plan.json").exists()  # it did plan


@pytest.mark.parametrize("argv", [["topologies"], ["topologies", "--json"], ["models"]], ids=" ".join)
def test_listing_imports_no_graph_or_validation_library(argv: list[str], tmp_path: Path) -> None:
    # The listings derive everything from the presets' constants (topologies/listing.py): no networkx
    # (graphs), pydantic (file validation) or numpy, the bulk of their start-up time.
    imported = _imported(argv, tmp_path)
    assert "paracube.cli.info_cmd" in imported
    heavy = ("networkx", "pydantic", "numpy")
    assert [m for m in imported if m.split(".")[0] in heavy] == []
