"""What a checkpoint holds of a model and its optimizer: each rank's local blocks and where they lie.

`checkpoint_state` maps `model.NAME`, `optim.NAME.exp_avg[_sq]` (and `optim.NAME.master`, the fp32 masters of a
16-bit model: the optimizers' checkpoint views, data_parallel/) and `fp8.LINEAR.*` (executor/layers/fp8.py) to the
rank's local tensor (no copy: loads land in it) and to the block's ShardSpec (offsets, sizes, global shape),
which planners.py hands to DCP. The vocabulary parameters (gpt.VOCAB_DIMS) are saved without their padding,
which depends on the layout (Megatron's multiple of 128 x the vocab split) and is always zero, so a checkpoint
of one layout loads into another. The shapes recorded in `paracube.json` are every rank's (`all_shapes`:
pipeline stages hold different parameters). store.py saves and loads these.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from paracube.errors import ParacubeError
from paracube.executor.layers.shards import ShardSpec
from paracube.executor.model.gpt import VOCAB_DIMS

MOMENTS = ("exp_avg", "exp_avg_sq")


def sharded_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The model's parameters by name; every one must have a ShardSpec (its block in the full tensor)."""
    params = dict(model.named_parameters())
    specs = model.shard_specs  # type: ignore[attr-defined]
    missing = sorted(set(params) - set(specs))
    if missing:
        raise ParacubeError(f"model parameters without a ShardSpec: {missing[:3]}")
    return params


def unpadded_spec(name: str, spec: ShardSpec, vocab: int | None) -> ShardSpec | None:
    """The block of the parameter as saved: the vocabulary parameters (gpt.VOCAB_DIMS) without the padding,
    which depends on the layout (Megatron's multiple of 128 x the vocab split) and is always zero (weights,
    gradients, moments), so a checkpoint of one layout loads into another. None: the block is all padding."""
    dim = VOCAB_DIMS.get(name)
    if dim is None or vocab is None or spec.global_shape[dim] == vocab:
        return spec
    keep = max(0, min(spec.offsets[dim] + spec.sizes[dim], vocab) - spec.offsets[dim])
    if keep == 0:
        return None
    shape, sizes = list(spec.global_shape), list(spec.sizes)
    shape[dim], sizes[dim] = vocab, keep
    return replace(spec, global_shape=tuple(shape), sizes=tuple(sizes))


def saved_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """This rank's parameters' full shapes as saved (vocabulary dims without the padding)."""
    vocab = getattr(getattr(model, "spec", None), "vocab", None)
    shapes = {}
    for n, s in model.shard_specs.items():  # type: ignore[attr-defined]
        dim = VOCAB_DIMS.get(n)
        shape = list(s.global_shape)
        if dim is not None and vocab is not None:
            shape[dim] = vocab
        shapes[n] = tuple(shape)
    return shapes


def all_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Collective: the saved shapes of every rank's parameters (each pipeline stage holds its own)."""
    ours = saved_shapes(model)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ours
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, ours)
    return {n: s for shapes in every for n, s in shapes.items()}


def checkpoint_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, for_load: bool,
                     masters: bool = False, fp8: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, ShardSpec]]:
    """`model.NAME`, `optim.NAME.exp_avg[_sq]` (and `optim.NAME.master`) -> the local block (no copy: loads
    land in it), and the same keys -> the block's ShardSpec. A load creates missing moments (fp32 zeros) to
    receive the saved ones, and the masters where `masters` (the checkpoint has them); vocabulary parameters
    without their padding (`unpadded_spec`). `fp8`: with the FP8 scaling state of an fp8 model (`fp8.NAME.*`,
    executor/layers/fp8.py Fp8Scaling.checkpoint_entries; a load takes it where the checkpoint has it)."""
    specs = model.shard_specs  # type: ignore[attr-defined]
    vocab = getattr(getattr(model, "spec", None), "vocab", None)
    sd: dict[str, torch.Tensor] = {}
    where: dict[str, ShardSpec] = {}
    for name, p in sharded_parameters(model).items():
        spec = unpadded_spec(name, specs[name], vocab)  # None: all padding here, nothing to save or load

        def real(t: torch.Tensor, spec: ShardSpec | None = spec, name: str = name) -> torch.Tensor:
            if spec is None or spec is specs[name]:
                return t
            dim = VOCAB_DIMS[name]
            return t.narrow(dim, 0, spec.sizes[dim])  # a view: loads land in the parameter

        if spec is not None:
            sd[f"model.{name}"], where[f"model.{name}"] = real(p.data), spec
        if optimizer is None:
            continue
        state = optimizer.state.get(p)
        if not state and not for_load:
            continue
        names = (*MOMENTS, "master") if (masters if for_load else "master" in (state or {})) else MOMENTS
        for m in names:
            if for_load and m not in (state or {}):
                optimizer.state[p][m] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            if spec is not None:
                sd[f"optim.{name}.{m}"], where[f"optim.{name}.{m}"] = real(optimizer.state[p][m]), spec
    scaling = getattr(model, "fp8", None)
    for key, (t, spec) in (scaling.checkpoint_entries(model.mesh).items() if scaling is not None and fp8 else ()):
        sd[key], where[key] = t, spec  # type: ignore[attr-defined]
    return sd, where


def adam_step(optimizer: torch.optim.Optimizer | None) -> float | None:
    """AdamW's step count (any parameter's: they step together); None without an optimizer or before a step."""
    if optimizer is None:
        return None
    for state in optimizer.state.values():
        if "step" in state:
            return float(state["step"])
    return None


def wants_masters(model: torch.nn.Module) -> bool:
    """A 16-bit model's optimizer (a checkpoint view) takes fp32 masters; an fp32 model's has none."""
    return next(model.parameters()).dtype != torch.float32


__all__ = ["MOMENTS", "adam_step", "all_shapes", "checkpoint_state", "saved_shapes", "sharded_parameters",
           "unpadded_spec", "wants_masters"]
