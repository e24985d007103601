"""Each preset GPU's link to its host CPU and its share of the host's memory, from datasheets: what activation
offloading (Layout off=N, cost_models/offload.py) moves over and fills. DeviceSpec.host_bandwidth (bytes/s, one
direction) and host_memory_bytes (the host's memory over the GPUs it hosts); 0: none priced (no offloading).

NOT FITTED: no published run here offloads activations, so every figure is the nominal datasheet rate, priced as is
(`describe`, printed by `paracube topologies` and benchmarks/published_runs.py beside the fitted figures).
- PCIe: 16 lanes at 8 (Gen3) / 16 (Gen4) / 32 (Gen5) GT/s with 128b/130b encoding, ~16 / 32 / 64 GB/s per
  direction (PCI-SIG PCIe 3.0 / 4.0 / 5.0 base specifications; rates.PCIE3_X16 / PCIE4_X16 / PCIE5_X16). DGX-2
  (V100, Gen3), DGX A100 (Gen4), DGX H100 / H200 and DGX B200 (Gen5; their datasheets: each GPU on a PCIe Gen5 x16
  switch port to the CPUs) take each GPU's x16 link; the switch's uplink shared by two GPUs is not priced.
- GB200 NVL72 (GB200 NVL72 datasheet, 2024; NVIDIA GB200 superchip brief): each superchip joins one Grace CPU and two
  B200 GPUs by NVLink-C2C at 900 GB/s bidirectional: 450 GB/s per direction for the superchip, 225 GB/s per GPU and
  direction when both GPUs copy at once (as every rank of a data-parallel layout does).
- Host memory: DGX-2 1.5 TB / 16 GPUs, DGX A100 (640 GB) 2 TB / 8, DGX H100 2 TB / 8, DGX H200 2 TB / 8, DGX B200
  4 TB / 8 (their datasheets' system memory; DGX B200 "up to 4 TB": the figure the datasheet gives), GB200 NVL72
  17 TB LPDDR5X / 72 GPUs (480 GB per Grace, two GPUs each: 240 GB).
"""

from __future__ import annotations

from paracube.topologies.rates import PCIE3_X16, PCIE4_X16, PCIE5_X16

GB = 1e9
TB = 1e12
# (bytes/s per direction per GPU, host memory bytes per GPU), by DeviceSpec name
HOST_LINKS: dict[str, tuple[float, float]] = {
    "V100-SXM3-32GB": (PCIE3_X16, 1.5 * TB / 16),
    "A100-SXM-80GB": (PCIE4_X16, 2 * TB / 8),
    "H100-SXM-80GB": (PCIE5_X16, 2 * TB / 8),
    "H200-SXM-141GB": (PCIE5_X16, 2 * TB / 8),
    "B200-SXM-180GB": (PCIE5_X16, 4 * TB / 8),
    "B200-GB200-186GB": (900 * GB / 2 / 2, 480 * GB / 2),  # NVLink-C2C, per GPU and direction; Grace LPDDR5X
}


def host_link(name: str) -> tuple[float, float]:
    """(host_bandwidth, host_memory_bytes) of a preset device (module docstring); (0, 0) for another."""
    return HOST_LINKS.get(name, (0.0, 0.0))


def describe(bandwidth: float, memory: float) -> str:
    """The device's host-link line of `sources` (topologies/efficiency.py), marked NOT FITTED."""
    return (f"NOT FITTED: {bandwidth / GB:.0f} GB/s per direction to the host, {memory / GB:.0f} GB host memory per "
            "GPU, datasheet figures (topologies/host_link.py; no run offloads activations)")


__all__ = ["HOST_LINKS", "describe", "host_link"]
