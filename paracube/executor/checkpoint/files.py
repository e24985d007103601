"""A checkpoint directory on disk: finding the complete one, its metadata, and the checksums of its files.

`root/step_N/` is complete once it holds DCP's `.metadata` and our `paracube.json` and its name has no
`.tmp` (checkpoint.py renames a finished save into place); `root/latest` names the newest. `paracube.json`
records the size and sha256 of every other file at save time: DCP itself does not notice flipped bytes, so
loads and exports verify them first (ranks of a job split the hashing) and name the first bad file.

A checkpoint is trusted input: DCP reads its `.metadata` with `pickle`, which can run code. So before DCP
reads anything, `verify_checkpoint` refuses a directory whose manifest is absent, whose own checksum
(`files_sha256`, the sha256 of the manifest's canonical JSON) does not match it, that leaves a file DCP would
read (`.metadata`, `*.distcp`) unlisted, or whose files differ from it. This catches corruption, a mixed-up
or edited directory, and files dropped into it; it cannot make a checkpoint from an untrusted source safe
(whoever wrote its pickle can write a matching manifest): load only checkpoints you made or trust.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from paracube.errors import ParacubeError

FORMAT_VERSION = 1
META_FILE = "paracube.json"
LATEST_FILE = "latest"


# --- finding checkpoints ------------------------------------------------------------------------------
def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step}"


def is_complete(path: Path) -> bool:
    """A checkpoint counts only once its metadata and ours are both in a directory without `.tmp`."""
    return (not path.name.endswith(".tmp") and (path / META_FILE).is_file()
            and (path / ".metadata").is_file())


def has_checkpoint(root: Path) -> bool:
    root = Path(root)
    return (root / LATEST_FILE).exists() or any(is_complete(p) for p in root.glob("step_*"))


def find_checkpoint(path: str | Path) -> Path:
    """A complete checkpoint: `path` itself if it is one, else the one `path/latest` names, else the
    highest complete `path/step_N`. Partial (`.tmp`) directories are never taken."""
    path = Path(path)
    if is_complete(path):
        return path
    if not path.is_dir():
        raise ParacubeError(f"checkpoint directory {str(path)!r} does not exist")
    latest = path / LATEST_FILE
    if latest.exists():
        try:
            name = latest.read_text().strip()
        except OSError as exc:
            raise ParacubeError(f"cannot read checkpoint pointer {str(latest)!r}: {exc.strerror}") from None
        target = path / name
        if not name or "/" in name or not is_complete(target):
            raise ParacubeError(f"checkpoint pointer {str(latest)!r} names {name!r}, which is not a complete "
                                f"checkpoint (missing {META_FILE} or .metadata)")
        return target
    steps = [(int(p.name[5:]), p) for p in path.glob("step_*") if p.name[5:].isdigit() and is_complete(p)]
    if not steps:
        raise ParacubeError(f"no checkpoint in {str(path)!r} (no {LATEST_FILE!r} file and no complete step_N "
                            "directory); run without --resume to start fresh")
    return max(steps)[1]


def read_meta(ckpt: Path) -> dict[str, Any]:
    meta_path = Path(ckpt) / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise ParacubeError(f"checkpoint file {str(meta_path)!r} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParacubeError(f"checkpoint file {str(meta_path)!r} is corrupt ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION or not isinstance(meta.get("step"), int):
        raise ParacubeError(f"checkpoint file {str(meta_path)!r} is not a paracube checkpoint of format "
                            f"{FORMAT_VERSION}")
    return meta


# --- integrity ------------------------------------------------------------------------------------------
TRUST = "load only checkpoints you made or trust: DCP reads .metadata with pickle, which can run code"


def manifest_digest(files: dict[str, Any]) -> str:
    """The manifest's own checksum: sha256 of its canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _dcp_reads(ckpt: Path) -> list[str]:
    """The files of the directory that DCP's FileSystemReader opens: its metadata and the shard files."""
    return sorted(p.name for p in ckpt.iterdir() if p.is_file() and (p.name == ".metadata" or p.suffix == ".distcp"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_manifest(ckpt: Path, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """name -> {bytes, sha256} of `names` (default: every file of the directory but our own metadata)."""
    ckpt = Path(ckpt)
    if names is None:
        names = sorted(p.name for p in ckpt.iterdir() if p.is_file() and p.name != META_FILE)
    return {n: {"bytes": (ckpt / n).stat().st_size, "sha256": _sha256(ckpt / n)} for n in names}


def shared_manifest(tmp: Path, rank: int) -> dict[str, dict[str, Any]] | None:
    """Collective, after dcp.save: each rank hashes the files it wrote (`__RANK_*`, in parallel, on its own
    node); rank 0 adds the rest (DCP's `.metadata`) and gets the whole manifest, the others None."""
    mine = file_manifest(tmp, sorted(p.name for p in tmp.glob(f"__{rank}_*") if p.is_file()))
    everyone: list[Any] = [None] * dist.get_world_size() if rank == 0 else None  # type: ignore[assignment]
    dist.gather_object(mine, everyone, dst=0)
    if rank != 0:
        return None
    files = {k: v for part in everyone for k, v in part.items()}
    rest = sorted(p.name for p in tmp.iterdir() if p.is_file() and p.name != META_FILE and p.name not in files)
    return dict(sorted({**files, **file_manifest(tmp, rest)}.items()))


def verify_checkpoint(ckpt: str | Path, meta: dict[str, Any] | None = None, hashes: bool = True,
                      share: tuple[int, int] = (0, 1)) -> None:
    """Raise ParacubeError naming the first file that is missing, truncated/extended or (with `hashes`)
    altered since the save, or a manifest that is absent, does not match its checksum or leaves a file DCP
    reads unlisted (module docstring). `share=(i, n)`: hash only every n-th file from the i-th (ranks split
    the work)."""
    ckpt = Path(ckpt)
    meta = meta if meta is not None else read_meta(ckpt)
    files = meta.get("files")
    where = str(ckpt / META_FILE)
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise ParacubeError(f"checkpoint {str(ckpt)!r}: {where!r} has no file manifest, so its files cannot be "
                            f"checked before they are read; refusing it ({TRUST})")
    digest = meta.get("files_sha256")
    if digest is not None and digest != manifest_digest(files):
        raise ParacubeError(f"checkpoint {str(ckpt)!r}: the file manifest in {where!r} does not match its "
                            f"checksum (edited or corrupt); refusing it ({TRUST})")
    unlisted = [n for n in _dcp_reads(ckpt) if n not in files]
    if unlisted:
        raise ParacubeError(f"checkpoint {str(ckpt)!r}: file {unlisted[0]!r} is not in the manifest of "
                            f"{where!r} (added after the save?); refusing it ({TRUST})")
    for name, want in sorted(files.items())[share[0]::share[1]]:
        path = ckpt / name
        if not path.is_file():
            raise ParacubeError(f"checkpoint file {str(path)!r} is missing; the checkpoint is incomplete")
        size = path.stat().st_size
        if size != want.get("bytes"):
            raise ParacubeError(f"checkpoint file {str(path)!r} is corrupt: {size} bytes, {want.get('bytes')} "
                                "were saved (truncated or overwritten)")
        if hashes and _sha256(path) != want.get("sha256"):
            raise ParacubeError(f"checkpoint file {str(path)!r} is corrupt: its sha256 differs from the one "
                                "recorded at save time")


def verify_everywhere(ckpt: Path, meta: dict[str, Any]) -> None:
    """Collective: each rank hashes a share of the files; every rank raises the same (first) error."""
    rank, world = dist.get_rank(), dist.get_world_size()
    error = None
    try:
        verify_checkpoint(ckpt, meta, share=(rank, world))
    except ParacubeError as exc:
        error = str(exc)
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise ParacubeError(first)


__all__ = ["FORMAT_VERSION", "LATEST_FILE", "META_FILE", "TRUST", "file_manifest", "find_checkpoint",
           "has_checkpoint", "is_complete", "manifest_digest", "read_meta", "shared_manifest", "step_dir",
           "verify_checkpoint", "verify_everywhere"]
