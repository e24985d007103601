"""Sharded, atomic, reshardable checkpoints with torch.distributed.checkpoint (DCP).

Layout on disk (`root/`):
  step_N/            one complete checkpoint: DCP files (`*.distcp`, `.metadata`) + `paracube.json`
  step_N.tmp/        a save in progress (or killed): never read
  latest             one line, `step_N`: written last, by atomic rename
Parameters (the compute copy, in its dtype), AdamW moments (fp32) and, with a 16-bit compute dtype, the fp32
master weights (`optim.NAME.master`, optim.py's checkpoint views) and, with `--dtype fp8`, every linear's
amax history and scales (`fp8.LINEAR.*`, whole, written by its stage's first rank) are plain local tensors, each rank's
rectangular block of the full tensor (ShardSpec offsets/sizes; state.py builds that state dict); planners.py
tells DCP where each block lies. Replicas that are not
`replica_leader` write nothing, so each element is written once (the last pipeline stage's copy of a tied
embedding, gpt.py `tied_copy`, is not a leader: the first stage's is saved, a load sets both). The
recorded parameter shapes are every rank's (pipeline stages hold different parameters). On load every
rank (replicas too) reads,
for each local block, the saved chunks that overlap it: a checkpoint of one layout loads into any other
(3D 2x2x2 -> 1D 4 -> back).
Small state (step, LR schedule, data position, RNG, plan, layout) lives in `paracube.json`, with the size
and sha256 of every other file (files.py: finding checkpoints, verifying them; re-exported here).
Fault injection (tests) goes through `after_shard_written`, called on a rank once its files are written
while the other ranks may still be inside the save.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from paracube.errors import ParacubeError
from paracube.executor.checkpoint.files import (
    FORMAT_VERSION,
    LATEST_FILE,
    META_FILE,
    file_manifest,
    find_checkpoint,
    has_checkpoint,
    is_complete,
    manifest_digest,
    read_meta,
    shared_manifest,
    step_dir,
    verify_checkpoint,
    verify_everywhere,
)
from paracube.executor.checkpoint.planners import BlockLoadPlanner, BlockSavePlanner, check_blocks
from paracube.executor.checkpoint.state import (
    adam_step,
    all_shapes,
    checkpoint_state,
    sharded_parameters,
    wants_masters,
)

ShardWrittenHook = Callable[[int, int], None]
"""(rank, step): called on that rank right after its shard files of `step` are written, before the save
completes (the other ranks may still be writing). Tests use it to kill a rank mid-save."""


# --- save ----------------------------------------------------------------------------------------------
class _HookedWriter(dcp.FileSystemWriter):
    """DCP's file writer that calls `hook` once this rank's files are written (the save is not complete)."""

    def __init__(self, path: Path, hook: Callable[[], None]) -> None:
        super().__init__(str(path))
        self._hook = hook

    def write_data(self, plan: Any, planner: Any) -> Any:
        written = super().write_data(plan, planner)
        written.wait()
        self._hook()
        return written


def _writer(tmp: Path, rank: int, step: int, hook: ShardWrittenHook | None) -> dcp.FileSystemWriter:
    if hook is None:
        return dcp.FileSystemWriter(str(tmp))
    return _HookedWriter(tmp, lambda: hook(rank, step))


def _fsync_write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(root: str | Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    meta: dict[str, Any], after_shard_written: ShardWrittenHook | None = None) -> Path:
    """Collective (every rank). Writes `root/step_N.tmp/`, renames it to `root/step_N/`, then points `latest`
    at it. A crash at any point leaves the previous checkpoint as `latest`."""
    root = Path(root)
    rank = dist.get_rank()
    final, tmp = step_dir(root, step), root / f"step_{step}.tmp"
    sd, specs = checkpoint_state(model, optimizer, for_load=False)
    shapes = all_shapes(model)
    check_blocks(sd, specs)  # before anything is written (the planner checks again, inside DCP)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a killed save: never complete, safe to drop
            shutil.rmtree(tmp)
    dist.barrier()
    dcp.save(sd, checkpoint_id=str(tmp), storage_writer=_writer(tmp, rank, step, after_shard_written),
             planner=BlockSavePlanner(specs))
    files = shared_manifest(tmp, rank)  # dcp.save returned: every rank's files are written
    if rank == 0:
        record = {
            "format": FORMAT_VERSION,
            "step": step,
            "adam_step": adam_step(optimizer),
            "has_optimizer": any(k.startswith("optim.") for k in sd),
            "has_masters": any(k.endswith(".master") for k in sd),
            "has_fp8": any(k.startswith("fp8.") for k in sd),
            "params": {n: list(s) for n, s in shapes.items()},
            "rng": {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()},
            **meta,
            "files": files,
            "files_sha256": manifest_digest(files or {}),
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
    ours = all_shapes(model)
    if saved != ours:
        bad = sorted(n for n in set(saved) | set(ours) if saved.get(n) != ours.get(n))
        raise ParacubeError(f"checkpoint {str(ckpt)!r} does not fit this model: parameter {bad[0]!r} has shape "
                            f"{saved.get(bad[0])} there and {ours.get(bad[0])} here")


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    mesh: Any = None) -> dict[str, Any]:
    """Collective. Loads the checkpoint (`path` a step directory or a root with `latest`) into the model's
    local blocks and the optimizer's moments, whatever layout saved it; returns its `paracube.json`.
    Every rank reads its own blocks, replicas included (`mesh` is not needed; kept for callers).
    Every rank validates the files first, so a bad checkpoint fails everywhere alike, before any collective."""
    ckpt = find_checkpoint(path)
    meta = read_meta(ckpt)
    _check_shapes(ckpt, meta, model)
    verify_everywhere(ckpt, meta)
    load_optim = optimizer is not None and bool(meta.get("has_optimizer"))
    sd, specs = checkpoint_state(model, optimizer if load_optim else None, for_load=True,
                            masters=bool(meta.get("has_masters")) and wants_masters(model),
                            fp8=bool(meta.get("has_fp8")))
    check_blocks(sd, specs)
    try:
        dcp.load(sd, checkpoint_id=str(ckpt), planner=BlockLoadPlanner(specs))
    except Exception as exc:  # DCP gathers every rank's failure into one CheckpointException
        first = str(exc).strip().splitlines()
        raise ParacubeError(f"checkpoint {str(ckpt)!r} is corrupt or unreadable: "
                            f"{first[-1] if first else type(exc).__name__}") from None
    if load_optim and optimizer is not None:
        for p in sharded_parameters(model).values():
            optimizer.state[p]["step"] = torch.tensor(float(meta["adam_step"] or meta["step"]), dtype=torch.float32)
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
        with warnings.catch_warnings():  # DCP warns that it assumes one process even when told so (no_dist)
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(sd, checkpoint_id=str(ckpt), no_dist=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        raise ParacubeError(f"checkpoint {str(ckpt)!r} is corrupt or unreadable: "
                            f"{first[-1] if first else type(exc).__name__}") from None
    return full


__all__ = ["FORMAT_VERSION", "LATEST_FILE", "META_FILE", "ShardWrittenHook", "export_full_state_dict",
           "file_manifest", "find_checkpoint", "has_checkpoint", "is_complete", "load_checkpoint", "read_meta",
           "save_checkpoint", "step_dir", "verify_checkpoint"]
