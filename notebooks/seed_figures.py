"""Runs notebook 05_seed_experiment with its figures written to docs/img/. Run: python notebooks/seed_figures.py"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    os.environ["PARACUBE_FIG_DIR"] = str(ROOT / "docs" / "img")
    nb = nbformat.read(ROOT / "notebooks" / "05_seed_experiment.ipynb", as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": scratch}}).execute()
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                print(out["text"], end="")
