"""DCP planners that save and load each rank's ShardSpec block of a tensor (public planner API only).

A checkpoint state dict maps a key to this rank's local block (a plain tensor) and the planners to the
block's place in the full tensor (ShardSpec: offsets, sizes, global shape):
  save  every replica leader emits one WriteItem whose chunk (ChunkStorageMetadata) is its block; other
        replicas emit nothing, so each element is written once. DCP's coordinator builds the global
        metadata from these chunks in the one plan gather of every dcp.save, and its global-plan check
        refuses blocks that overlap, leave the tensor or do not cover it.
  load  every rank (replicas too) asks for its block: `create_read_items_for_chunk_list` reads the saved
        chunks that overlap it, whatever layout saved them (resharding), into views of the local tensor.
Classes used: DefaultSavePlanner/DefaultLoadPlanner (their documented extension points create_local_plan,
lookup_object, lookup_tensor), WriteItem, TensorWriteData, ChunkStorageMetadata, TensorProperties,
MetadataIndex and planner_helpers.create_read_items_for_chunk_list: all in torch.distributed.checkpoint's
public API (torch 2.13, https://pytorch.org/docs/stable/distributed.checkpoint.html).

Why not DTensor: every block here is an even split of each tensor dim over an ordered tuple of mesh axes,
so DTensor `Shard` placements could express it over a DeviceMesh whose dims are ordered like that tuple
(3D weights split dim 0 over (O, W), i.e. a mesh per role order). But ShardSpec records the block, not the
axes that cut it, and DTensor would need, per tensor, the axis order and a DeviceMesh for it, and would
recompute the block by torch.chunk: a second description of the layout that could silently disagree with
the one the model computes with. The planners take the block the model holds, with no extra state.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from paracube.errors import ParacubeError
from paracube.executor.layers.shards import ShardSpec


def _chunk(spec: ShardSpec) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(spec.offsets), sizes=torch.Size(spec.sizes))


def check_blocks(state_dict: dict[str, torch.Tensor], specs: dict[str, ShardSpec]) -> None:
    """Every key has a spec and its local tensor has the spec's block shape."""
    for key, t in state_dict.items():
        if key not in specs:
            raise ParacubeError(f"{key}: no ShardSpec for this checkpoint entry")
        if tuple(t.shape) != tuple(specs[key].sizes):
            raise ParacubeError(f"{key}: local shard shape {tuple(t.shape)} != ShardSpec sizes "
                                f"{tuple(specs[key].sizes)}")


class BlockSavePlanner(DefaultSavePlanner):
    """Writes, on replica leaders, each local tensor as the chunk `specs[key]` of its full tensor."""

    def __init__(self, specs: dict[str, ShardSpec]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.specs = specs

    def create_local_plan(self) -> SavePlan:
        check_blocks(self.state_dict, self.specs)
        items = []
        for key, t in self.state_dict.items():
            spec = self.specs[key]
            if not spec.replica_leader:
                continue
            data = TensorWriteData(chunk=_chunk(spec), properties=TensorProperties.create_from_tensor(t),
                                   size=torch.Size(spec.global_shape))
            items.append(WriteItem(index=MetadataIndex(key, torch.Size(spec.offsets)), type=WriteItemType.SHARD,
                                   tensor_data=data))
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        return self.state_dict[index.fqn]  # the local block itself (the default looks for offset 0)


class BlockLoadPlanner(DefaultLoadPlanner):
    """Reads into each local tensor the block `specs[key]` of its full tensor, from whatever chunks hold it."""

    def __init__(self, specs: dict[str, ShardSpec]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.specs = specs

    def create_local_plan(self) -> LoadPlan:
        if self.metadata is None:  # set_up_planner passes the checkpoint's metadata on every load
            raise ParacubeError("the checkpoint's metadata was not read")
        check_blocks(self.state_dict, self.specs)
        saved = self.metadata.state_dict_metadata
        requests = []
        for key in self.state_dict:
            md, spec = saved.get(key), self.specs[key]
            if not isinstance(md, TensorStorageMetadata):
                raise ParacubeError(f"the checkpoint has no tensor {key!r}")
            if tuple(md.size) != tuple(spec.global_shape):
                raise ParacubeError(f"{key}: shape {tuple(md.size)} in the checkpoint, {spec.global_shape} here")
            requests += create_read_items_for_chunk_list(key, md, [_chunk(spec)])
        return LoadPlan(requests)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.state_dict[index.fqn]  # read items carry offsets into this local block


__all__ = ["BlockLoadPlanner", "BlockSavePlanner", "check_blocks"]
