"""The process groups of one layout, and this rank's place in them.

Every process group is a slice of `Layout.rank_grid()`. torch orders a group's ranks by global rank,
which need not match our index order (first axis major), so `order(axes)` maps index -> group rank.
"""

from __future__ import annotations

import math

import numpy as np
import torch.distributed as dist
from torch.distributed import ProcessGroup

from paracube.errors import check
from paracube.executor.recorder import CommRecorder
from paracube.layout import Layout
from paracube.modes.experts import EXPERT_AXES


def group_axes(layout: Layout) -> list[tuple[str, ...]]:
    """Every axis combination the algorithms use, in one fixed order (all ranks create them alike)."""
    tensor = layout.tensor_axes
    combos: list[tuple[str, ...]] = [(a,) for a in layout.axis_names]
    if len(tensor) > 1:
        combos.append(tensor)
    combos += list(layout.tensor_mode.mesh_groups)  # the mode's extra groups (3D: its planes)
    combos.append(layout.tensor_mode.grad_axes)  # the gradient sync (2.5D: dp and dep)
    combos.append(layout.data_axes)  # cp > 1: the gradient sync over dp x cp (cp ranks hold replicas)
    if layout.zero:  # zero's shard group (HSDP: dp_shard), its replicas, and the grad norm over its shards
        combos += [layout.zero_axes, *([layout.replica_axes] if layout.replica_axes else []),
                   tuple(dict.fromkeys((*layout.zero_axes, *tensor)))]
    if tensor or layout.cp > 1:
        combos.append(metrics_axes(layout, ()))
    if layout.cp > 1 and tensor and layout.sequence_parallel:  # a sequence's ranks (MoE aux counts: moe_sequence.py)
        combos.append(("cp", *tensor))
    if layout.pp > 1:  # pipeline: grad norm over (pp, *tensor), metrics over every rank
        combos += [("pp", *tensor), metrics_axes(layout, ("pp",))]
        if layout.zero:  # the grad norm over the stages and zero's shards (HSDP: pp, dp_shard)
            combos.append(tuple(dict.fromkeys(("pp", *layout.zero_axes, *tensor))))
    return list(dict.fromkeys(combos))


def metrics_axes(layout: Layout, stages: tuple[str, ...]) -> tuple[str, ...]:
    """The group the step's (loss sum, token count) is summed over: every rank holding loss terms (`stages`:
    ("pp",) with pipelines, the loss being on the last stage), cp included (each cp rank holds its own tokens)."""
    return (*stages, "dp", *(("cp",) if layout.cp > 1 else ()), *layout.tensor_axes)


class Mesh:
    def __init__(self, layout: Layout, rank: int, recorder: CommRecorder | None = None):
        check(0 <= rank < layout.world_size, f"rank {rank} is outside world size {layout.world_size}")
        self.layout = layout
        self.rank = rank
        self.recorder = recorder if recorder is not None else CommRecorder()
        self._coords = layout.coords(rank)
        self._groups: dict[tuple[str, ...], ProcessGroup | None] = {}
        self._order: dict[tuple[str, ...], list[int]] = {}
        for axes in group_axes(layout):
            self._add_group(axes)
        self._expert_sizes = {"ep": layout.ep, "etp": layout.etp, "edp": layout.expert_data}
        self._add_expert_groups(layout.ep * layout.etp > 1)  # MoE Parallel Folding (layout.expert_groups)
        self.embedding_group: ProcessGroup | None = None  # pp > 1: {first, last stage} (tied embeddings)
        if layout.pp > 1:
            self._add_embedding_group()

    def _add_group(self, axes: tuple[str, ...], groups: np.ndarray | None = None) -> None:
        groups = self.layout.groups(axes) if groups is None else groups
        if groups.shape[1] == 1:
            self._groups[axes] = None
            return
        mine = None
        for ranks in groups.tolist():
            # Every rank calls new_group for every group, in the same order (torch requires it).
            pg = dist.new_group(sorted(ranks))
            if self.rank in ranks:
                mine = pg
                by_rank = sorted(ranks)
                self._order[axes] = [by_rank.index(r) for r in ranks]
        self._groups[axes] = mine

    def _add_expert_groups(self, folded: bool) -> None:
        """This rank's coordinate along the folded expert axes (etp, ep, edp: each stage's dp x cp x tp ranks
        regrouped, layout.expert_groups; its place in its group's row) and, where they fold (ep etp > 1), their
        process groups (every rank creates them, in the same order)."""
        for axis in EXPERT_AXES:
            rows = self.layout.expert_groups(axis)
            self._coords[axis] = int(np.argwhere(rows == self.rank)[0][1])
            if folded:
                self._add_group((axis,), rows)

    def _add_embedding_group(self) -> None:
        """Megatron's embedding group: the first and last stage's ranks with the same other coordinates (the
        pp group itself when pp = 2); every rank creates every group, in the same order."""
        if self.layout.pp == 2:
            self.embedding_group = self._groups[("pp",)]
            return
        for row in self.layout.groups(("pp",)).tolist():
            pg = dist.new_group(sorted((row[0], row[-1])))
            if self.rank in (row[0], row[-1]):
                self.embedding_group = pg

    @classmethod
    def single(cls, layout: Layout | None = None) -> Mesh:
        """A one-rank mesh: no process group, nothing communicated (serial runs)."""
        layout = layout or Layout()
        check(layout.world_size == 1, f"Mesh.single needs a layout of world size 1, not {layout}")
        return cls(layout, 0)

    # --- queries ---------------------------------------------------------------------------------------
    def _known(self, axes: tuple[str, ...]) -> None:
        check(axes in self._groups, f"no process group for axes {axes}; known: {sorted(self._groups)}")

    def group(self, axes: tuple[str, ...]) -> ProcessGroup | None:
        axes = tuple(axes)
        if self.size(axes) == 1:
            return None
        self._known(axes)
        return self._groups[axes]

    def order(self, axes: tuple[str, ...]) -> list[int]:
        """order[k] = group rank (torch's numbering) of the member with index k."""
        self._known(tuple(axes))
        return self._order[tuple(axes)]

    def size(self, axes: tuple[str, ...]) -> int:
        return math.prod(self._expert_sizes[a] if a in EXPERT_AXES else self.layout.axis_size(a) for a in axes)

    def index(self, axes: tuple[str, ...]) -> int:
        """This rank's index in the group of `axes`, first axis major."""
        idx = 0
        for a in axes:
            idx = idx * self.size((a,)) + self._coords[a]
        return idx

    def pp_peer(self, offset: int) -> int:
        """Global rank of the stage `offset` stages after this one (cyclic), same other coordinates."""
        return self.axis_peer("pp", offset)

    def axis_peer(self, axis: str, offset: int) -> int:
        """Global rank `offset` places after this one along `axis` (cyclic), same other coordinates (the cp ring)."""
        row = self.layout.groups((axis,))
        mine = row[(row == self.rank).any(axis=1)][0]
        return int(mine[(self._coords[axis] + offset) % self.layout.axis_size(axis)])

    def coord(self, axis: str) -> int:
        return self._coords[axis]

    @property
    def tensor_axes(self) -> tuple[str, ...]:
        return self.layout.tensor_axes

    def __repr__(self) -> str:
        return f"Mesh({self.layout}, rank={self.rank}, coords={self._coords})"


