"""The executor: a mesh of process groups, recorded collectives, 1D/2D/3D parallel layers, the GPT and
one training step (docs/algorithms.md is the contract for their algorithms and traffic)."""

from paracube.executor.comm import CommRecorder, all_gather, all_reduce, reduce_scatter
from paracube.executor.gpt import ParallelGPT, build_model, serial_reference
from paracube.executor.mesh import Mesh
from paracube.executor.shards import ShardSpec
from paracube.executor.step import StepResult, check_divisibility, train_step

__all__ = ["CommRecorder", "Mesh", "ParallelGPT", "ShardSpec", "StepResult", "all_gather", "all_reduce",
           "build_model", "check_divisibility", "reduce_scatter", "serial_reference", "train_step"]
