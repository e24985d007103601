"""The YAML topology file's structure as pydantic models (topologies/loader.py reads a file with them; its
docstring shows both forms). Apart from the loader so that a preset, built in code, imports no pydantic."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceModel(_Model):
    name: str
    peak_flops: dict[str, float]
    memory_bytes: float = Field(gt=0)
    memory_bandwidth: float = Field(gt=0)
    op_overhead_s: float = Field(default=0.0, ge=0)
    call_overhead_s: float = Field(default=0.0, ge=0)
    ring_wait_s: float = Field(default=0.0, ge=0)
    send_wait_s: float = Field(default=0.0, ge=0)
    gemm_half_dim: float = Field(default=0.0, ge=0)
    generation: str = ""
    ranks_per_core: float = Field(default=1.0, ge=1)
    sync_s: float = Field(default=0.0, ge=0)
    host_bandwidth: float = Field(default=0.0, ge=0)  # bytes/s per direction to the host (topologies/host_link.py)
    host_memory_bytes: float = Field(default=0.0, ge=0)  # the device's share of its host's memory

    @field_validator("peak_flops")
    @classmethod
    def _dtypes(cls, value: dict[str, float]) -> dict[str, float]:
        missing = [k for k in ("fp32", "fp16", "bf16") if k not in value]
        if missing:
            raise ValueError(f"missing keys {missing}; expected fp32, fp16, bf16 (FLOP/s)")
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"{bad} must be positive FLOP/s")
        return value


class LinkModel(_Model):
    bandwidth: float = Field(gt=0)
    latency: float = Field(gt=0)


class InterNodeModel(LinkModel):
    nics_per_node: int = Field(default=1, ge=1)
    nodes_per_leaf: int | None = Field(default=None, ge=1)
    oversubscription: float = Field(default=1.0, ge=1.0)
    spine_latency: float = Field(default=3e-7, gt=0)
    pcie_bandwidth: float = Field(default=31.5e9, gt=0)
    pcie_latency: float = Field(default=1e-6, gt=0)


class GraphNodeModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    kind: Literal["gpu", "nic", "switch", "cpu"]
    node_index: int | None = None
    local_rank: int | None = None


class GraphLinkModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: str
    b: str
    bandwidth: float  # positivity is checked by Topology, which names the link
    latency: float


class GraphModel(_Model):
    nodes: list[GraphNodeModel]
    links: list[GraphLinkModel]


class TopologyFile(_Model):
    name: str
    device: DeviceModel | str
    nodes: int = Field(ge=1)
    devices_per_node: int = Field(ge=1)
    intra_node: LinkModel | None = None
    inter_node: InterNodeModel | None = None
    graph: GraphModel | None = None
    calibration: dict[str, Any] | None = None


__all__ = ["DeviceModel", "GraphModel", "InterNodeModel", "LinkModel", "TopologyFile"]
