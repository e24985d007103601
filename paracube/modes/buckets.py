"""Gradient buckets: which local parameters one data-parallel collective carries (WAVE2 shared rule).

The executor (executor/data_parallel/grad_sync.py) reduces gradients in buckets and the cost model
(cost_models/traffic.py, comm.py, memory.py) prices the same buckets, both through `plan_buckets`:
- parameters in REVERSE registration order (the order backward produces their gradients);
- flattened in fp32 (4 bytes per element) into buckets of at most `bucket_bytes` (default 25 MiB, DDP's
  `bucket_cap_mb`); a parameter is never split across buckets, a parameter larger than the limit gets a
  bucket of its own;
- zero=0: one all_reduce of the bucket over dp; zero=1 (distributed optimizer): the bucket is padded to a
  multiple of dp (`padded_numel`, Megatron pads its buckets the same way), reduce-scattered over dp, and
  after the optimizer step each rank's updated shard is all-gathered back (one all_gather per bucket).
With one bucket and zero=0 this is one flat all_reduce of every gradient, byte for byte.
zero=2 and zero=3 bucket by FSDP unit instead (`plan_units`; FSDP2 / torchtitan wrap each transformer block,
Zhao et al. 2023): the embedding (token + position tables), each block, the final norm + head, one bucket
each, in reverse order (the order backward completes them), each unit's parameters in reverse registration
order, padded to a multiple of the shard group (`padded_numel`). At zero=3 the same flat layout is the unit's
parameter buffer: shard k of a unit's parameters, of its gradient and of its optimizer state is the same
element range, so the optimizer steps a shard without any gather.
"""

from __future__ import annotations

from collections.abc import Sequence

BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb = 25
GRAD_BYTES = 4  # buckets hold fp32 gradients


def plan_buckets(numels: Sequence[int], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices into `numels` (given in REGISTRATION order) per bucket, buckets in issue order: each
    bucket lists its parameters in reverse registration order."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(numels))):
        nbytes = GRAD_BYTES * int(numels[i])
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def plan_units(units: Sequence[Sequence[int]]) -> list[list[int]]:
    """zero=2/3: indices into the flattened parameter list (units given in registration order, each unit's
    parameter numels in registration order) per bucket: one bucket per unit, last unit first, each in reverse
    registration order."""
    starts = [sum(len(u) for u in units[:k]) for k in range(len(units))]
    return [[starts[k] + i for i in reversed(range(len(units[k])))] for k in reversed(range(len(units)))]


def bucket_numels(numels: Sequence[int], bucket_bytes: int = BUCKET_BYTES) -> list[int]:
    """Elements of every bucket, in issue order."""
    return [sum(int(numels[i]) for i in b) for b in plan_buckets(numels, bucket_bytes)]


def padded_numel(n: int, dp: int) -> int:
    """A bucket's length rounded up to a multiple of dp (zero=1: equal shards for reduce_scatter)."""
    return -(-n // dp) * dp


__all__ = ["BUCKET_BYTES", "GRAD_BYTES", "bucket_numels", "padded_numel", "plan_buckets", "plan_units"]
