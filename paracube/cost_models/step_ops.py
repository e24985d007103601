"""Ops (torch dispatches: kernels, views, collectives) one rank of the executor launches per training step.

The count the per-op overhead is priced on (compute.GemmModel.op_cost seconds per op; the analytic model adds
ops_per_step x op_cost to a stage's compute, event_compute.add_op_overhead spreads the same over a program):
    ops = N * (Ls * ops_layer + (F + H) / 2 * ops_edge + n_tensors * OPS_GRAD_MICRO) + n_tensors * OPS_TENSOR
          + OPS_STEP (+ 3 with a tensor group) + (dp > 1) * (n_tensors * OPS_DP_TENSOR + OPS_DP)
N micro-batches, Ls blocks of the stage, F / H: the stage holds the embedding / the head (their ops and the
loss's are ops_edge, split evenly between first and last stage: exact without pipelining), n_tensors the
rank's parameter tensors (12 per block, 2 embedding, 3 final norm + head). Per tensor and step: AdamW's 10
(step += 1, decay, lerp, mul + addcmul, item, sqrt, div, add eps, addcdiv), the grad norm's 3 (pow, sum,
add) on the tensor's norm leader, its reduced gradient's view into its bucket (slice, view); per tensor
and micro-batch OPS_GRAD_MICRO: accumulating the gradient into its fp32 bucket (slice, view, add_;
executor/data_parallel/grad_sync.py). Per step: zeros, stack, item, metrics and norm all-reduces (detach, clone,
collective), the bucket's zero_; with dp > 1 the bucket's one all_reduce (one bucket assumed: tiny
models; each further bucket adds 2 ops). The per-block and edge counts
are each mode's forward + backward dispatch sequence (executor/layers/one_d.py, two_d.py, three_d.py); all of them
were counted with validation/ops.py on tiny (L = 2, 3; N = 1, 2; dp = 1, 2); the formula reproduces those
counts exactly for none/1D and within 4 ops for 2D/3D (whose ranks differ by a stray dispatch or two);
tests/test_cost_model.py re-counts configurations the constants were not read from.
2.5D dispatches like 2D plus one slice of the ids per micro-batch (counted on tiny 2x2x2) and the gradient
sync over (dp, dep) at any dp; 1D with sequence parallelism is assumed to dispatch like 1D.
ops_layer / ops_edge: the mode's own counts (TensorMode.ops_layer / ops_edge, paracube/modes).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch
from paracube.modes.stages import stage_layers

Arr = np.ndarray

OPS_TENSOR, OPS_STEP, OPS_TENSOR_GROUP, OPS_DP_TENSOR, OPS_DP, OPS_GRAD_MICRO = 15, 17, 3, 0, 1, 3


def ops_per_step(d: Dims, mode: str, b: LayoutBatch, first: Arr, last: Arr) -> Arr:
    """Dispatched ops of one step on one rank of a stage (module docstring), as an array over configurations."""
    m = MODES[mode]
    N = d.global_batch // (b.dp * b.mb)
    Ls = stage_layers(d.L, b.pp, b.v, first, last)
    tensors = 12 * Ls + 2 * first + 3 * last
    micro = Ls * m.ops_layer + (first + last) / 2 * m.ops_edge + tensors * OPS_GRAD_MICRO
    step = tensors * OPS_TENSOR + OPS_STEP + (OPS_TENSOR_GROUP if m.axes else 0)
    grad_group = b.dp
    for axis in m.grad_axes[1:]:  # 2.5D: dp x dep
        grad_group = grad_group * m.axis_sizes(b.q, b.t, b.depth)[axis]
    dp_sync = (grad_group > 1) * (tensors * OPS_DP_TENSOR + OPS_DP)
    return (N * micro + step + dp_sync).astype(float)
