"""The mesh-axis groups comm.py's closed forms use: the data-parallel axes with context parallelism (`cp_after_dp`,
Layout.data_axes' order) and every group a mode's entries may name (`axes_used`: the planner asks the topology for
each one's link once per mode)."""

from __future__ import annotations

from paracube.modes import MODES


def cp_after_dp(axes: tuple[str, ...], cp: int) -> tuple[str, ...]:
    """`axes` with "cp" after its dp axis (dp or dp_shard) where cp > 1 (Layout.data_axes)."""
    if cp == 1:
        return axes
    i = next(k for k, a in enumerate(axes) if a in ("dp", "dp_shard")) + 1
    return (*axes[:i], "cp", *axes[i:])


def axes_used(mode: str, hybrid: bool = False, cp: bool = False) -> list[tuple[str, ...]]:
    """Every group (mesh axes) the closed forms of `mode` may use: the planner asks the topology for these
    (`hybrid`: an HSDP layout's zero groups too, dp split into dp_shard and dp_replicate; `cp`: a context-parallel
    layout's cp group and its data-parallel groups over dp x cp)."""
    m = MODES[mode]
    if cp:
        base = axes_used(mode, hybrid)
        grown = [cp_after_dp(ax, 2) if any(a in ("dp", "dp_shard") for a in ax) else ax for ax in base]
        return list(dict.fromkeys([*base, *grown, ("cp",)]))
    tensor = m.axes
    extra = [tensor] if tensor else []
    zero = [("dp_shard",), ("dp_replicate",), ("dp_shard", *tensor), ("pp", "dp_shard", *tensor),
            tuple("dp_shard" if a == "dp" else a for a in m.grad_axes)] if hybrid else []  # pp: HSDP's grad norm
    return list(dict.fromkeys([*m.collective_axes, m.grad_axes, *extra, ("pp", *tensor), ("dp", *tensor), ("pp",),
                                ("dp",), ("pp", "dp", *tensor), *zero]))
