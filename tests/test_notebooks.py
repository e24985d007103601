"""Every notebook in notebooks/ executes top to bottom (in a scratch directory for the files it writes).

The kernel talks over Unix sockets in that directory (transport ipc), not TCP: jupyter_client picks free TCP ports
and then binds them, which a concurrent job can take in between (seen with two CI runs at once: "Address already in
use", the kernel never answers)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_notebooks_exist() -> None:
    assert {p.stem[:2] for p in NOTEBOOKS} >= {"01", "02", "03"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
