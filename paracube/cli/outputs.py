"""Files the commands write: checked before any work starts, never overwritten without `--force`.

`writable(path, flag, force)` refuses, in one line naming the flag and the file, a missing directory, a
directory given as the file, and an existing file unless `--force` was given; every command then says which
file it wrote. Checking first means a long search or calibration is not lost to a typo in `-o`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paracube.errors import check


def add_force_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="overwrite output files that exist (default: refuse)")


def writable(path: str | Path | None, flag: str, force: bool) -> Path | None:
    """`path` as a Path if the command may write it; None stays None (nothing to write)."""
    if path is None:
        return None
    out = Path(path)
    check(str(path) != "", f"{flag} is empty; give a file name")
    check(not out.is_dir(), f"{flag} {path} is a directory; give a file name")
    check(out.parent.is_dir(), f"{flag} {path}: directory {str(out.parent)!r} does not exist")
    check(force or not out.exists(), f"{flag} {path}: the file exists; add --force to overwrite it, or give "
          "another name")
    return out
