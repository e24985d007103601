"""A layout's placement on ranks: `RankGrid`, the rank-grid queries of layout.Layout (a mixin).

The rank grid is one `arange(world).reshape(...)`; every process group is a slice of it. Mesh axes:

| mode | tensor axes (outer -> inner) | sizes | activations [T, h]: tokens split over | hidden split over |
|------|------------------------------|-------|----------------------------------------|-------------------|
| none | -                            | -     | -                                      | -                 |
| 1d   | tp                           | p     | - (replicated)                         | - (replicated)    |
| 2d   | row, col                     | q, q  | row                                    | col               |
| 2.5d | dep, row, col                | d,q,q | dep (major), row                       | col               |
| 3d   | z, y, x                      | q,q,q | x (major), y                           | z                 |

An axis is named after the coordinate that varies along it: the group of axis `col` is the q ranks of one
grid row. `placement` lists every axis from innermost (consecutive ranks, i.e. the same node) to outermost;
the default keeps the tensor axes innermost, then dp, then pp (Megatron's order).
Expert parallelism folds every pipeline stage's dp x cp x tp ranks, in rank order, as (edp, ep, etp), etp
innermost (layout.py's docstring); HSDP splits dp into (dp_replicate, dp_shard), dp_shard innermost.
"""

from __future__ import annotations

import math

import numpy as np

from paracube.errors import check


class RankGrid:
    """Ranks by mesh coordinates, and the process groups of mesh axes (the sizes are Layout's)."""

    def rank_grid(self) -> np.ndarray:
        """Ranks indexed by canonical coordinates (pp, dp, cp, *tensor axes)."""
        outer_first = tuple(reversed(self.effective_placement))
        grid = np.arange(self.world_size).reshape([self.axis_size(a) for a in outer_first])
        return grid.transpose([outer_first.index(a) for a in self.axis_names])

    def groups(self, axes: tuple[str, ...] | str) -> np.ndarray:
        """[n_groups, group_size]: every group of ranks that differ only along `axes` (first axis major)."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        grid, names = self.rank_grid(), self.axis_names
        if any(a in ("dp_shard", "dp_replicate") for a in axes):  # HSDP: dp split into (replicate, shard)
            i = names.index("dp")
            grid = grid.reshape(grid.shape[:i] + (self.axis_size("dp_replicate"), self.shard_size) + grid.shape[i + 1:])
            names = names[:i] + ("dp_replicate", "dp_shard") + names[i + 1:]
        src = [names.index(a) for a in axes]
        moved = np.moveaxis(grid, src, list(range(grid.ndim - len(axes), grid.ndim)))
        return moved.reshape(-1, math.prod(self.axis_size(a) for a in axes))

    def coords(self, rank: int) -> dict[str, int]:
        where = np.argwhere(self.rank_grid() == rank)
        check(len(where) == 1, f"rank {rank} is outside world size {self.world_size}")
        out = dict(zip(self.axis_names, (int(c) for c in where[0]), strict=True))
        out["dp_replicate"], out["dp_shard"] = divmod(out["dp"], self.shard_size)
        return out

    def expert_groups(self, axis: str) -> np.ndarray:
        """[n_groups, size] ranks of the folded expert axis `axis` (etp, ep, edp, or ep.etp: an expert shard's
        all-to-all peers with their etp ranks), every pipeline stage's dp x cp x tp ranks in rank order
        regrouped as (edp, ep, etp), etp innermost (layout.py's docstring)."""
        sizes = {"edp": self.expert_data, "ep": self.ep, "etp": self.etp}
        axes = tuple(axis.split("."))
        check(all(a in sizes for a in axes), f"expert axis {axis!r}; valid: edp, ep, etp, ep.etp")
        grid = self.rank_grid()  # (pp, dp, cp, *tensor)
        stages = np.sort(grid.reshape(self.pp, -1), axis=1).reshape(self.pp, self.expert_data, self.ep, self.etp)
        names = ("pp", "edp", "ep", "etp")
        src = [names.index(a) for a in axes]
        moved = np.moveaxis(stages, src, list(range(4 - len(axes), 4)))
        return moved.reshape(-1, math.prod(sizes[a] for a in axes))

