"""Sharded, atomic, reshardable checkpoints with torch.distributed.checkpoint (DCP).

Layout on disk (`root/`):
  step_N/            one complete checkpoint: DCP files (`*.distcp`, `.metadata`) + `paracube.json`
  step_N.tmp/        a save in progress (or killed): never read
  latest             one line, `step_N`: written last, by atomic rename
Parameters and AdamW moments are ShardedTensors whose shards are each rank's rectangular block
(ShardSpec offsets/sizes). Replicas that are not `replica_leader` contribute no shard, so each element
is written once. On load DCP reads, for every local block, the saved chunks that overlap it: a checkpoint
of one layout loads into any other (3D 2x2x2 -> 1D 4 -> back). Non-leader replicas receive their copy
from the leader by a sum over the replica group (the others contribute zeros: exact).
Small state (step, LR schedule, data position, RNG, plan, layout) lives in `paracube.json`, with the size
and sha256 of every other file: DCP does not notice flipped bytes, so loads verify them first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from paracube.errors import ParacubeError

FORMAT_VERSION = 1
META_FILE = "paracube.json"
LATEST_FILE = "latest"
MOMENTS = ("exp_avg", "exp_avg_sq")
SAVE_KILL_ENV = "PARACUBE_FAULT_KILL_SAVE"  # "RANK:STEP": that rank dies mid-save, after writing its shard file


@contextmanager
def _quiet() -> Iterator[None]:
    # ShardedTensor is deprecated in favour of DTensor, whose even placements cannot express 3D blocks.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")
        yield


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


def _shared_manifest(tmp: Path, rank: int) -> dict[str, dict[str, Any]] | None:
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
    altered since the save. `share=(i, n)`: check only every n-th file from the i-th (ranks split the work).
    Checkpoints written before manifests existed (no `files` entry) are not checked."""
    ckpt = Path(ckpt)
    files = (meta if meta is not None else read_meta(ckpt)).get("files")
    if not isinstance(files, dict):
        return
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


def _verify_everywhere(ckpt: Path, meta: dict[str, Any]) -> None:
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


# --- building the sharded state dict -------------------------------------------------------------------
def _sharded_tensors(entries: list[tuple[str, torch.Tensor, Any]], rank: int) -> dict[str, Any]:
    """key -> ShardedTensor over the world whose only local shard, on replica leaders, is the tensor itself
    (no copy: loads land in it). One all_gather_object of every rank's blocks builds every tensor's global
    metadata; init_from_local_shards would gather once per tensor (90 collectives for the tiny GPT)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    mine = []
    for key, t, spec in entries:
        if tuple(t.shape) != tuple(spec.sizes):
            raise ParacubeError(f"{key}: local shard shape {tuple(t.shape)} != ShardSpec sizes {tuple(spec.sizes)}")
        if spec.replica_leader:
            mine.append((key, list(spec.offsets), list(spec.sizes), str(t.device)))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    blocks: dict[str, list[ShardMetadata]] = {key: [] for key, _, _ in entries}
    for r, items in enumerate(everyone):
        for key, offsets, sizes, device in items:
            blocks[key].append(ShardMetadata(offsets, sizes, f"rank:{r}/{device}"))
    out: dict[str, Any] = {}
    for key, t, spec in entries:
        meta = ShardedTensorMetadata(blocks[key], torch.Size(spec.global_shape), TensorProperties(dtype=t.dtype))
        local = [Shard(t, m) for m in blocks[key] if m.placement.rank() == rank]
        out[key] = ShardedTensor._init_from_local_shards_and_global_metadata(local, meta)
    return out


def _named(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    params = dict(model.named_parameters())
    specs = model.shard_specs  # type: ignore[attr-defined]
    missing = sorted(set(params) - set(specs))
    if missing:
        raise ParacubeError(f"model parameters without a ShardSpec: {missing[:3]}")
    return params


def _state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, rank: int,
                for_load: bool) -> dict[str, Any]:
    """`model.NAME` and `optim.NAME.exp_avg[_sq]` -> ShardedTensor. On load every local block takes part
    except non-leader replicas (they are filled afterwards from their leader)."""
    specs = model.shard_specs  # type: ignore[attr-defined]
    entries: list[tuple[str, torch.Tensor, Any]] = []
    for name, p in _named(model).items():
        spec = specs[name]
        entries.append((f"model.{name}", p.data, spec))
        if optimizer is None:
            continue
        state = optimizer.state.get(p)
        if not state and not for_load:
            continue
        for m in MOMENTS:
            if for_load and m not in (state or {}):
                optimizer.state[p][m] = torch.zeros_like(p.data, memory_format=torch.contiguous_format)
            entries.append((f"optim.{name}.{m}", optimizer.state[p][m], spec))
    with _quiet():
        return _sharded_tensors(entries, rank)


def _adam_step(optimizer: torch.optim.Optimizer | None) -> float | None:
    if optimizer is None:
        return None
    for state in optimizer.state.values():
        if "step" in state:
            return float(state["step"])
    return None


# --- save ----------------------------------------------------------------------------------------------
def _writer(tmp: Path, rank: int, step: int) -> dcp.FileSystemWriter:
    """DCP's file writer; under SAVE_KILL_ENV="RANK:STEP" (fault-injection tests) that rank SIGKILLs itself
    right after writing its own shard file, while the others are still inside the save."""
    if os.environ.get(SAVE_KILL_ENV, "") != f"{rank}:{step}":
        return dcp.FileSystemWriter(str(tmp))

    class _DyingWriter(dcp.FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            written = super().write_data(plan, planner)
            written.wait()
            print(f"[paracube] rank {rank}: killed by {SAVE_KILL_ENV} while saving step {step}", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            return written

    return _DyingWriter(str(tmp))


def _fsync_write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(root: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    meta: dict[str, Any]) -> Path:
    """Collective (every rank). Writes `root/step_N.tmp/`, renames it to `root/step_N/`, then points `latest`
    at it. A crash at any point leaves the previous checkpoint as `latest`."""
    root = Path(root)
    rank = dist.get_rank()
    final, tmp = step_dir(root, step), root / f"step_{step}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a killed save: never complete, safe to drop
            shutil.rmtree(tmp)
    dist.barrier()
    sd = _state_dict(model, optimizer, rank, for_load=False)
    with _quiet():
        dcp.save(sd, checkpoint_id=str(tmp), storage_writer=_writer(tmp, rank, step))
    files = _shared_manifest(tmp, rank)  # dcp.save returned: every rank's files are written
    if rank == 0:
        record = {
            "format": FORMAT_VERSION,
            "step": step,
            "adam_step": _adam_step(optimizer),
            "has_optimizer": any(k.startswith("optim.") for k in sd),
            "params": {n: list(s.global_shape) for n, s in model.shard_specs.items()},  # type: ignore[attr-defined]
            "rng": {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()},
            **meta,
            "files": files,
        }
        _fsync_write(tmp / META_FILE, json.dumps(record, indent=1) + "\n")
        old = root / f"step_{step}.old"
        if final.exists():  # a checkpoint of the same step from an earlier run: replace it
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_write(root / f"{LATEST_FILE}.tmp", final.name + "\n")
        os.replace(root / f"{LATEST_FILE}.tmp", root / LATEST_FILE)
    dist.barrier()
    return final


# --- load ----------------------------------------------------------------------------------------------
def _check_shapes(ckpt: Path, meta: dict[str, Any], model: torch.nn.Module) -> None:
    saved = {n: tuple(s) for n, s in (meta.get("params") or {}).items()}
    ours = {n: tuple(s.global_shape) for n, s in model.shard_specs.items()}  # type: ignore[attr-defined]
    if saved != ours:
        bad = sorted(n for n in set(saved) | set(ours) if saved.get(n) != ours.get(n))
        raise ParacubeError(f"checkpoint {str(ckpt)!r} does not fit this model: parameter {bad[0]!r} has shape "
                            f"{saved.get(bad[0])} there and {ours.get(bad[0])} here")


def _fill_replicas(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, mesh: Any) -> None:
    """Non-leader replicas got nothing from DCP. Zero them, then sum over each replicated axis in turn
    (tensor axes, then dp): only the leader holds non-zeros, so every sum is exact and ends on all copies.
    One axis at a time because every single-axis group exists in the mesh, whatever the combination."""
    specs = model.shard_specs  # type: ignore[attr-defined]
    for name, p in _named(model).items():
        spec = specs[name]
        if spec.replica_leader and not spec.replicated_axes and mesh.layout.dp == 1:
            continue
        axes = [a for a in (*spec.replicated_axes, "dp") if mesh.size((a,)) > 1]
        tensors = [p.data] + ([optimizer.state[p][m] for m in MOMENTS] if optimizer and p in optimizer.state else [])
        for t in tensors:
            if not spec.replica_leader:
                t.zero_()
            for axis in axes:
                dist.all_reduce(t, group=mesh.group((axis,)))


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    mesh: Any) -> dict[str, Any]:
    """Collective. Loads the checkpoint (`path` a step directory or a root with `latest`) into the model's
    local blocks and the optimizer's moments, whatever layout saved it; returns its `paracube.json`.
    Every rank validates the files first, so a bad checkpoint fails everywhere alike, before any collective."""
    ckpt = find_checkpoint(path)
    meta = read_meta(ckpt)
    _check_shapes(ckpt, meta, model)
    _verify_everywhere(ckpt, meta)
    load_optim = optimizer is not None and bool(meta.get("has_optimizer"))
    sd = _state_dict(model, optimizer if load_optim else None, dist.get_rank(), for_load=True)
    try:
        with _quiet():
            dcp.load(sd, checkpoint_id=str(ckpt))
    except Exception as exc:  # DCP gathers every rank's failure into one CheckpointException
        first = str(exc).strip().splitlines()
        raise ParacubeError(f"checkpoint {str(ckpt)!r} is corrupt or unreadable: "
                            f"{first[-1] if first else type(exc).__name__}") from None
    if load_optim and optimizer is not None:
        for p in _named(model).values():
            optimizer.state[p]["step"] = torch.tensor(float(meta["adam_step"] or meta["step"]), dtype=torch.float32)
    _fill_replicas(model, optimizer if load_optim else None, mesh)
    rng = (meta.get("rng") or {}).get("torch")
    if rng:
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(rng)), dtype=torch.uint8))
    return meta


# --- export --------------------------------------------------------------------------------------------
def export_full_state_dict(checkpoint_dir: str | Path) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) parameters from a checkpoint, in one process without torch.distributed:
    the serial model's state dict. `checkpoint_dir`: a step directory or a root with `latest`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    ckpt = find_checkpoint(checkpoint_dir)
    verify_checkpoint(ckpt, read_meta(ckpt))
    try:
        md = FileSystemReader(str(ckpt)).read_metadata()
    except Exception as exc:
        raise ParacubeError(f"checkpoint file {str(ckpt / '.metadata')!r} is corrupt ({type(exc).__name__}: "
                            f"{exc})") from None
    full = {k[len("model."):]: torch.empty(tuple(v.size), dtype=v.properties.dtype)
            for k, v in md.state_dict_metadata.items()
            if k.startswith("model.") and isinstance(v, TensorStorageMetadata)}
    sd = {f"model.{k}": v for k, v in full.items()}
    try:
        with _quiet():
            dcp.load(sd, checkpoint_id=str(ckpt), no_dist=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        raise ParacubeError(f"checkpoint {str(ckpt)!r} is corrupt or unreadable: "
                            f"{first[-1] if first else type(exc).__name__}") from None
    return full


__all__ = ["FORMAT_VERSION", "LATEST_FILE", "META_FILE", "SAVE_KILL_ENV", "export_full_state_dict", "file_manifest",
           "find_checkpoint", "has_checkpoint", "is_complete", "load_checkpoint", "read_meta", "save_checkpoint",
           "step_dir", "verify_checkpoint"]
