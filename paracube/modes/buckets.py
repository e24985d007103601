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
With overlap (`release_counts`, read by both cost engines) a bucket is issued once the backward has produced all
of its elements, counted at block boundaries: the head's gradients come with the first block's (the head's
backward runs before it), a bucket that straddles two blocks waits for the second, and the embedding's (first
stage), whose backward has no GEMM, leave with whatever the last block left.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

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


def release_counts(units: Sequence[Sequence[int]], first: bool, last: bool, dp: int = 1,
                   bucket_bytes: int = BUCKET_BYTES) -> list[int]:
    """Buckets (plan_buckets' issue order) issued at the end of each block's backward, blocks in backward order
    (the stage's last block first), then those issued when the stage's backward ends (the embedding's, on the
    first stage; on the others the last block's remainder): len(blocks) + 1 counts. `units`: the stage's
    parameter numels per unit in registration order (embedding if `first`, blocks, final norm + head if
    `last`); `dp`: the zero=1 shard group each bucket is padded to (1: no padding)."""
    buckets = [padded_numel(n, dp) for n in bucket_numels([n for u in units for n in u], bucket_bytes)]
    blocks = units[int(first):len(units) - int(last)]
    head = sum(units[-1]) if last else 0  # the head's, complete before the first block's backward ends
    return _issued(buckets, [sum(block) for block in reversed(blocks)], head)


def _issued(buckets: Sequence[int], block_totals: Sequence[int], produced: int) -> list[int]:
    """release_counts' walk: buckets issued as each block's gradients (`block_totals`, backward order) complete,
    `produced` elements already done before the first; then the rest, at the stage's end."""
    issued, out = 0, []
    for block in block_totals:
        produced += block
        n = 0
        while issued + n < len(buckets) and buckets[issued + n] <= produced:
            produced -= buckets[issued + n]
            n += 1
        issued += n
        out.append(n)
    return [*out, len(buckets) - issued]


def bucket_plan(units: Sequence[Sequence[int]], first: bool, last: bool, dp: int = 1,
                bucket_bytes: int = BUCKET_BYTES) -> tuple[list[int], list[int]]:
    """(each bucket's elements padded to a multiple of dp, in issue order; release_counts) in one pass: the same
    numbers as `padded_numel` over `bucket_numels` and `release_counts`, the greedy packing walked unit by unit
    (reverse order) with each unit's result memoized on the bucket it enters with (a stage's blocks are equal, so
    the packing of one block repeats): what the cost models read per stage shape (grad_overlap.py)."""
    sizes, totals = bucket_sizes(units, bucket_bytes)
    buckets = [padded_numel(n, dp) for n in sizes] if dp > 1 else sizes
    blocks = totals[int(last):len(units) - int(first)]  # reverse order, as release_counts walks them
    return buckets, _issued(buckets, blocks, totals[0] if last else 0)


def bucket_sizes(units: Sequence[Sequence[int]], bucket_bytes: int = BUCKET_BYTES) -> tuple[list[int], list[int]]:
    """(bucket_numels of the flattened units, each unit's elements in reverse order): bucket_plan's packing."""
    sizes: list[int] = []
    totals: list[int] = []  # each unit's elements, reverse order
    open_, filled = False, 0  # the bucket being filled: has a parameter, its elements
    for unit in reversed(units):
        closed, open_, filled, total = _pack(unit if type(unit) is tuple else tuple(int(n) for n in unit), open_,
                                             filled, bucket_bytes)
        sizes += closed
        totals.append(total)
    if open_:
        sizes.append(filled)
    return sizes, totals


@lru_cache(maxsize=65536)
def _pack(unit: tuple[int, ...], open_: bool, filled: int,
          bucket_bytes: int) -> tuple[tuple[int, ...], bool, int, int]:
    """plan_buckets' greedy rule over one unit's parameters (reverse order), entering with a bucket that holds
    `filled` elements (`open_`: at least one parameter): (the buckets it closes, the bucket left open, the unit's
    elements)."""
    closed: list[int] = []
    for n in reversed(unit):
        if open_ and GRAD_BYTES * (filled + n) > bucket_bytes:
            closed.append(filled)
            filled = 0
        filled += n
        open_ = True
    return tuple(closed), open_, filled, sum(unit)


def padded_numel(n: int, dp: int) -> int:
    """A bucket's length rounded up to a multiple of dp (zero=1: equal shards for reduce_scatter)."""
    return -(-n // dp) * dp


__all__ = ["BUCKET_BYTES", "GRAD_BYTES", "bucket_numels", "bucket_plan", "bucket_sizes", "padded_numel", "plan_buckets",
           "plan_units", "release_counts"]
