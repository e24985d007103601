"""The executor: a mesh of process groups, recorded collectives, 1D/2D/2.5D/3D parallel layers, the GPT and
one training step (docs/algorithms.md is the contract for their algorithms and traffic).

Names are loaded on first use (PEP 562): importing a torch-free submodule (run_args.py, the CLI's options
of `paracube run`) must not import torch, so that every command starts fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "CommRecorder": "paracube.executor.recorder",
    "Mesh": "paracube.executor.mesh",
    "ParallelGPT": "paracube.executor.model.gpt",
    "ShardSpec": "paracube.executor.layers.shards",
    "StepResult": "paracube.executor.training.step",
    "TrainHooks": "paracube.executor.training.hooks",
    "all_gather": "paracube.executor.comm",
    "all_reduce": "paracube.executor.comm",
    "build_model": "paracube.executor.model.gpt",
    "check_divisibility": "paracube.executor.sizes",
    "reduce_scatter": "paracube.executor.comm",
    "serial_reference": "paracube.executor.model.gpt",
    "train_step": "paracube.executor.training.step",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'paracube.executor' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


__all__ = sorted(_WHERE)
