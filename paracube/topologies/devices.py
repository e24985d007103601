"""The presets' devices from their datasheets: dense peaks per dtype, memory, HBM bandwidth, generation.

Peaks are dense (no 2:4 sparsity): NVIDIA's datasheets quote tensor-core rates "with sparsity", twice the dense
rate; the dense figure is half of it. A device with FP8 tensor cores carries a "fp8" peak (the FP8 GEMM rate,
e4m3 and e5m2 alike); without one `--dtype fp8` is refused (paracube.workload.check_dtype_on). Memory: the
datasheet's "N GB" taken as N GiB, as nvidia-smi reports these parts (an "80GB" A100 / H100 has 80 GiB).
The generation keys the fitted efficiencies (efficiency.py). Each preset GPU's host link and host memory share:
host_link.py (NOT FITTED datasheet figures).
"""

from __future__ import annotations

from dataclasses import replace

from paracube.topologies.device import DeviceSpec
from paracube.topologies.host_link import host_link
from paracube.topologies.rates import GiB

# A GPU's idle per host wait (DeviceSpec.sync_s, cost_models/host_sync.py), NOT FITTED (no fit row exercises it):
# an estimate of the host's wake-up on the finished device-to-host copy (~10 us) and of the eager ops it issues
# before the next long kernel (the split sizes read, the permute, the all_to_all or dispatch launch: ~4 ops at
# ~10 us of PyTorch dispatch and launch each), the same for every GPU generation (a host figure, not a device's).
HOST_SYNC_S = 50e-6
# A GPU host's seconds per op it issues (cost_models/host_issue.py: between two host waits the GPU runs no faster than
# its host issues the ops), NOT FITTED (no fit row exercises it): measured on a server CPU (the 2-core Intel Xeon this
# package is developed on, torch 2.13 eager, nice -20) by benchmarks/host_ops.py: one Megatron-core 0.16.1 transformer
# layer with a MoE MLP (its Python, PyTorch's dispatch and autograd; 8 tokens, the ops' work negligible), time over its
# aten op count at 2 / 4 / 8 / 16 local experts, four runs on 2026-12-03: forward 9.2-10.1 us an op (169 / 193 / 241 /
# 337 ops), backward 5.4-5.8 us (209 / 249 / 329 / 489 ops: the autograd engine's C++ loop); the slopes against the
# op count alike (8.9-10.1 / 5.2-5.6 us). No CUDA launch is in them: a lower bound on a GPU host.
HOST_OP_S = 10e-6
HOST_BWD_OP_S = 5.6e-6
# How much slower a GPU training host issues those ops than the measurement above, FITTED on ONE row,
# qwen3-30b-16-fp8 (benchmarks/data/published_runs_moe.csv: Megatron-Bridge 26.04 on 2 DGX H100, pp = 1, 8 local
# experts, no CUDA graphs; `published_runs.py --refit`): one factor on both directions, what the measurement leaves
# out (each kernel's CUDA launch and the caching allocator's device path, Transformer Engine's per-module Python and
# FP8 quantizers, the dispatcher's own ops). Held out: gpt-oss-120b-64 (bf16, 16 local experts, pp = 4) and the
# Blackwell Mixtral rows (benchmarks/published_runs.py). Only the DGX H100's host (2 x Xeon 8480C) was fitted; every
# other GPU host (the DGX B200's Xeon, the GB200's Grace) borrows it. Held out, gpt-oss-120b-64 prices -0.3% (its
# experts' bias ops counted, MoEHostOps.bias; -11.9% without them); fitted on it instead, the factor is 2.15 and the
# fit row +0.3%; an added launch per op instead of a factor (8.5 us fitted on the same row) gives gpt-oss +0.6%.
HOST_ISSUE_SCALE = 2.14

# V100 SXM2 datasheet: 125 TF tensor fp16, 15.7 TF fp32, 900 GB/s HBM2. No bf16 hardware: bf16 at fp32 speed.
V100_SXM2_16GB = DeviceSpec("V100-SXM2-16GB", {"fp32": 15.7e12, "fp16": 125e12, "bf16": 15.7e12},
                            16 * GiB, 900e9, generation="volta", sync_s=HOST_SYNC_S)
# V100 SXM3 32GB (DGX-2 datasheet: 2 PFLOPS fp16 tensor over 16 GPUs = 125 TF each), 900 GB/s HBM2.
V100_SXM3_32GB = DeviceSpec("V100-SXM3-32GB", {"fp32": 15.7e12, "fp16": 125e12, "bf16": 15.7e12},
                            32 * GiB, 900e9, generation="volta", sync_s=HOST_SYNC_S)
# Quadro RTX 5000 datasheet: 89.2 TF tensor fp16, 11.2 TF fp32, 448 GB/s GDDR6. No bf16 (Turing).
RTX5000_16GB = DeviceSpec("Quadro-RTX-5000-16GB", {"fp32": 11.2e12, "fp16": 89.2e12, "bf16": 11.2e12},
                          16 * GiB, 448e9, generation="turing", sync_s=HOST_SYNC_S)
# A100 SXM 80GB datasheet: 312 TF bf16/fp16 dense, 156 TF tf32, 19.5 TF fp32, 2039 GB/s HBM2e. No FP8.
A100_SXM_80GB = DeviceSpec("A100-SXM-80GB", {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
                           80 * GiB, 2039e9, generation="ampere", sync_s=HOST_SYNC_S)
# H100 SXM 80GB datasheet: 1979 TF fp8 dense (3958 sparse), 989 TF bf16/fp16 dense, 494.7 TF tf32, 67 TF fp32,
# 3.35 TB/s HBM3.
H100_SXM_80GB = DeviceSpec("H100-SXM-80GB", {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989e12, "bf16": 989e12,
                                             "fp8": 1979e12}, 80 * GiB, 3.35e12, generation="hopper",
                                             sync_s=HOST_SYNC_S)
# H200 SXM datasheet (NVIDIA H200 Tensor Core GPU, 2024): the H100's compute (fp8 3958 / bf16 1979 / tf32 989
# TF with sparsity: 1979 / 989 / 494.7 dense, fp32 67 TF), 141 GB HBM3e at 4.8 TB/s.
H200_SXM_141GB = DeviceSpec("H200-SXM-141GB", {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989e12, "bf16": 989e12,
                                               "fp8": 1979e12}, 141 * GiB, 4.8e12, generation="hopper",
                                               sync_s=HOST_SYNC_S)
# B200 in DGX B200 / HGX B200 (DGX B200 datasheet, 2024: 72 PF fp8 training for 8 GPUs = 9 PF each with
# sparsity; HGX B200: 36 PF fp16/bf16, 18 PF tf32, 600 TF fp32 for 8 GPUs, sparse where tensor cores): dense fp8
# 4.5 PF, bf16/fp16 2.25 PF, tf32 1.125 PF, fp32 75 TF; 1,440 GB HBM3e for 8 = 180 GB each, 64 TB/s = 8 TB/s.
B200_SXM_180GB = DeviceSpec("B200-SXM-180GB", {"fp32": 75e12, "tf32": 1.125e15, "fp16": 2.25e15, "bf16": 2.25e15,
                                               "fp8": 4.5e15}, 180 * GiB, 8e12, generation="blackwell",
                                               sync_s=HOST_SYNC_S)
# B200 of a GB200 superchip (GB200 NVL72 datasheet, 2024, for 72 GPUs: fp8 720 PF, fp16/bf16 360 PF, tf32
# 180 PF with sparsity, fp32 5,760 TF; HBM3e up to 13.4 TB at 576 TB/s): per GPU dense fp8 5 PF, bf16/fp16
# 2.5 PF, tf32 1.25 PF, fp32 80 TF, 186 GB at 8 TB/s.
B200_GB200_186GB = DeviceSpec("B200-GB200-186GB", {"fp32": 80e12, "tf32": 1.25e15, "fp16": 2.5e15, "bf16": 2.5e15,
                                                   "fp8": 5e15}, 186 * GiB, 8e12, generation="blackwell",
                                                   sync_s=HOST_SYNC_S)



def _hosted(d: DeviceSpec) -> DeviceSpec:
    """`d` with its host link and host memory share (host_link.py), where the table has them."""
    bandwidth, memory = host_link(d.name)
    return replace(d, host_bandwidth=bandwidth, host_memory_bytes=memory) if bandwidth else d


V100_SXM3_32GB, A100_SXM_80GB, H100_SXM_80GB, H200_SXM_141GB, B200_SXM_180GB, B200_GB200_186GB = map(_hosted, (
    V100_SXM3_32GB, A100_SXM_80GB, H100_SXM_80GB, H200_SXM_141GB, B200_SXM_180GB, B200_GB200_186GB))

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (
    V100_SXM2_16GB, V100_SXM3_32GB, RTX5000_16GB, A100_SXM_80GB, H100_SXM_80GB, H200_SXM_141GB, B200_SXM_180GB,
    B200_GB200_186GB)}
