"""Activation offloading (Layout off=N, pp = 1; runtimes/offload.py): device memory, host memory and exposed time,
priced alike by both engines (memory.stage_memory; compute.block_compute_time, which the analytic engine and the
event engine's per-unit compute both read).

A stage of Ls blocks offloads its first n = round(Dims.offload_frac x Ls) (Megatron-core's / Transformer Engine's
first N layers, paracube's executor's first N blocks); B = block_acts.saved_block_bytes (one block, one micro-batch,
one rank: what it keeps for backward under the run's recomputation); fl = the stage's micro-batches in flight
(memory.in_flight; 1 at pp = 1, the only depth offloaded).

Device memory (`resident_blocks`): blocks of saved activations on the device at the peak,
    resident = fl Ls - max(0, fl n - min(n, 2))
every offloaded block's tensors leave the device but two blocks' worth of buffers: in forward the block whose copy
out is still running while the next block computes, in backward the block being differentiated and the one reloaded
ahead of it (Transformer Engine's offload handler reloads one group ahead, as we know it: it is not installed here;
Megatron-core's cpu_offloading_double_buffering, model_parallel_config.py:389, off by default, changes how those
buffers are reused, not their count; paracube's in-line copies need one: two is an upper bound there). The last
block's stay whatever N (Megatron-core refuses N = layers, transformer_config.py:1137-1141: its backward follows its
forward at once).
Host memory (`host_bytes`): fl n B per device at the end of the forward, at most DeviceSpec.host_memory_bytes (the
host's memory over the GPUs it hosts, topologies/host_link.py): planner/offload_passes.py refuses a layout past it.

Time (`with_transfers`), per offloaded block and micro-batch: its tensors go out in forward and come back in
backward, B / W each way (W = DeviceSpec.host_bandwidth per direction, GemmModel.host_bw; the two directions are
separate lanes, PCIe and NVLink-C2C alike). Where the runtime copies on its own stream (Dims.offload_overlap:
Transformer Engine's and DeepSpeed's offload engines), block i's copy out runs while block i+1 computes its forward
and block i-1's reload while block i runs its backward (prefetch one ahead), so only what the transfer takes beyond
one block's compute is exposed:
    exposed forward = max(0, B / W - f),   exposed backward = max(0, B / W - b)
f, b the block's forward / backward compute (block_compute_time without the transfers). Transformer Engine spreads
its offload waits over several layers (its layer_window_map, as we know it: it is not installed here), which hides
more: this is an upper bound. In line (paracube's save_on_cpu: its copies on the compute stream) B / W each way.
A block carries offload_frac = n / Ls of its offloaded block's exposed seconds (the stage's total is n times the
exposed seconds; the event engine, which prices one block per stage, spreads them over the blocks alike). Not
priced: the host link shared by two GPUs behind one PCIe switch (DGX) and the copies' HBM traffic (B per direction,
under 3% of a block's at the presets' rates).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.block_acts import saved_block_bytes
from paracube.cost_models.dims import Dims
from paracube.errors import ParacubeError
from paracube.modes import LayoutBatch

Arr = np.ndarray


def offloaded(d: Dims, Ls: Arr) -> Arr:
    """Blocks of a stage of Ls blocks whose activations go to the host (the first n)."""
    return np.round(d.offload_frac * np.asarray(Ls, dtype=float))


def resident_blocks(d: Dims, Ls: Arr, fl: Arr) -> Arr:
    """Blocks' worth of saved activations on the device at the peak (module docstring): fl Ls without offloading."""
    if not d.offload_frac:
        return fl * Ls
    n = offloaded(d, Ls)
    return fl * Ls - np.maximum(0.0, fl * n - np.minimum(n, 2.0))


def host_bytes(d: Dims, mode: str, b: LayoutBatch, Ls: Arr, fl: Arr) -> Arr:
    """Bytes one device keeps in host memory at the end of the forward: fl n B."""
    if not d.offload_frac:
        return np.zeros(len(b))
    return fl * offloaded(d, Ls) * saved_block_bytes(d, mode, b)


def with_transfers(d: Dims, mode: str, b: LayoutBatch, host_bw: float, fwd: Arr, bwd: Arr) -> tuple[Arr, Arr]:
    """One block's (forward, backward) seconds with its share of the offloaded blocks' exposed copies (module
    docstring); unchanged without offloading. `host_bw`: GemmModel.host_bw (bytes/s per direction)."""
    if not d.offload_frac:
        return fwd, bwd
    if host_bw <= 0:
        raise ParacubeError(f"off={d.offload_frac * d.L:.0f} offloads activations to the host, but the device has no "
                            "host link figure (DeviceSpec.host_bandwidth, topologies/host_link.py); valid: off=0")
    copy = saved_block_bytes(d, mode, b) / host_bw
    if d.offload_overlap:
        out, back = np.maximum(0.0, copy - fwd), np.maximum(0.0, copy - bwd)
    else:
        out = back = copy
    return fwd + d.offload_frac * out, bwd + d.offload_frac * back


__all__ = ["host_bytes", "offloaded", "resident_blocks", "with_transfers"]
