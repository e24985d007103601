"""No tensor parallelism: every rank holds the whole model (data and pipeline parallelism only)."""

from __future__ import annotations

from paracube.modes.base import TensorMode
from paracube.modes.executor_support import ExecutorSupport


class NoTensorMode(TensorMode):
    name = "none"
    context_parallel = True
    shape_rule = "no tensor parallelism (omit tp= or write tp=none)"
    executor = ExecutorSupport("paracube.executor.layers.serial:Mode", pipeline=True, zero_stages=(0, 1, 2, 3),
                               context_parallel=("p2p", "ag"), dtypes=("fp32", "fp16", "bf16", "fp8"), mla=True)
    megatron_style = True
    ties_embeddings = True
    ops_layer, ops_edge = 85, 43  # counted with validation/ops.py (see step_ops.ops_per_step)


MODE = NoTensorMode()
