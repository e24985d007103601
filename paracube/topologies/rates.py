"""Link rates (bytes/s, one direction) and rough per-link latencies (s) of the presets, from spec sheets.

`paracube calibrate` replaces both with measured values; the presets scale the NVLink / InfiniBand rates by
the fabric efficiencies of efficiency.py.
"""

from __future__ import annotations

# --- link rates (bytes/s, one direction) ------------------------------------------------------------------
NVLINK2_BRICK = 25e9  # NVLink 2.0: 25 GB/s per direction per brick (V100 whitepaper)
PCIE3_X16 = 8e9 * 16 * 128 / 130 / 8  # 8 GT/s x16, 128b/130b -> 15.75 GB/s
PCIE4_X16 = 2 * PCIE3_X16  # 31.5 GB/s
PCIE5_X16 = 4 * PCIE3_X16  # 63 GB/s
FDR_IB = 56e9 * 64 / 66 / 8  # FDR 4x: 56 Gb/s signalling, 64b/66b -> 6.79 GB/s
EDR_IB = 100e9 / 8  # 12.5 GB/s
HDR_IB = 200e9 / 8  # 25 GB/s
NDR_IB = 400e9 / 8  # 50 GB/s (ConnectX-7)
XDR_IB = 800e9 / 8  # 100 GB/s (ConnectX-8 SuperNIC, Quantum-X800)
NVLINK2_X3 = 3 * NVLINK2_BRICK  # AC922: 3 bricks GPU-CPU and GPU-GPU (75 GB/s each way)
NVLINK3_GPU = 300e9  # A100: 12 NVLink 3 links, 600 GB/s bidirectional per GPU
NVLINK4_GPU = 450e9  # H100 / H200: 18 NVLink 4 links, 900 GB/s bidirectional per GPU
NVLINK5_GPU = 900e9  # B200: 18 NVLink 5 links, 1.8 TB/s bidirectional per GPU
XBUS = 32e9  # AC922 POWER9 X-bus: 64 GB/s quoted, 32 each way
LEAF_NODES_36 = 18  # 36-port EDR / FDR leaf: 18 nodes down, 18 up

# --- rough latencies per link (s) ---------------------------------------------------------------------------
NVLINK_LAT = 0.5e-6
PCIE_LAT = 1.0e-6
SMP_LAT = 0.5e-6  # CPU-CPU socket link
NIC_LAT = 1.0e-6  # NIC + cable + leaf port
SPINE_LAT = 0.3e-6  # leaf-spine hop

GiB = 2**30
