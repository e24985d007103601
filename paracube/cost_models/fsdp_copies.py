"""FSDP's copies around its per-unit collectives: memory-bound kernels on the compute stream, both engines alike.

How the stacks run them (torch FSDP2 as torchtitan applies it, torch/distributed/fsdp/_fully_shard; paracube's
executor/data_parallel/fsdp.py copies the same way):
- after a unit's parameter all_gather, the gathered flat buffer is copied out into the unit's parameters
  (FSDP2's foreach_all_gather_copy_out, in wait_for_unshard, on the current stream): each gathered byte read and
  written once, 2 x the gather's payload (c bytes per element);
- before a unit's gradient reduce_scatter, its gradients (c bytes per element) are copied into the reduce-scatter
  input in the reduce dtype (foreach_reduce_scatter_copy_in, on the current stream, before the reduce-scatter
  stream waits for it; fp32: the payload's 4 bytes per element written), (c + 4) / 4 x the payload.
Both at HBM bandwidth x mem_eff (compute.GemmModel: the model's memory-bound rate), on the compute side of the unit
whose collective they serve: the copy-out at the start of the unit, the copy-in at its end, before its
reduce-scatter is issued. Priced where fsdp_overlap.py prices the unit collectives by their issue and wait points
(pp = 1, prefetched or overlapped): the analytic recursion's units (`prefetched_micro`) and the event engine's ops
(`prefetch_program`); in line (pp > 1, or neither) the unit collectives stay priced as before, without them.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]
RS_BYTES = 4  # the reduce-scatter payload's bytes per element (traffic.py: fp32 unit gradients)


def gather_copy(payload: Arr | float, bandwidth: float) -> Arr | float:
    """Seconds of the copy-out after a gather of `payload` bytes (read and written once)."""
    return 2.0 * np.asarray(payload, dtype=np.float64) / bandwidth if bandwidth > 0 else 0.0 * np.asarray(payload)


def scatter_copy(payload: Arr | float, c: int, bandwidth: float) -> Arr | float:
    """Seconds of the copy-in before a reduce-scatter of `payload` bytes (RS_BYTES per element): the c-byte
    gradients read, the payload written."""
    p = np.asarray(payload, dtype=np.float64)
    return (c + RS_BYTES) / RS_BYTES * p / bandwidth if bandwidth > 0 else 0.0 * p


__all__ = ["RS_BYTES", "gather_copy", "scatter_copy"]
