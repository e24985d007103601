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


def bucket_numels(numels: Sequence[int], bucket_bytes: int = BUCKET_BYTES) -> list[int]:
    """Elements of every bucket, in issue order."""
    return [sum(int(numels[i]) for i in b) for b in plan_buckets(numels, bucket_bytes)]


def padded_numel(n: int, dp: int) -> int:
    """A bucket's length rounded up to a multiple of dp (zero=1: equal shards for reduce_scatter)."""
    return -(-n // dp) * dp


__all__ = ["BUCKET_BYTES", "GRAD_BYTES", "bucket_numels", "padded_numel", "plan_buckets"]
