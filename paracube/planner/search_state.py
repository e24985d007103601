"""What every pass of the search shares: its state (`_Search`), the result (`SearchResult`), and the Layout a
scored row stands for (`_layout`, `_matches` against a fixed layout). The search's contract: planner/search.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from paracube.cost_models.compute import GemmModel
from paracube.cost_models.dims import Dims
from paracube.cost_models.links import LinkCache
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.modes import MODES, runnable_modes
from paracube.planner.enumerate import Structure
from paracube.runtimes import RUNTIMES, Runtime
from paracube.workload import ModelSpec

RUNNABLE_MODES = runnable_modes()  # what paracube.executor implements (paracube/modes: ExecutorSupport)
Placements = list[tuple[tuple[tuple[str, int], ...], list[bytes]]]


@dataclass
class SearchResult:
    ranked: list[tuple[Layout, StepEstimate]]
    scored: int
    rejected: Counter
    best_per_mode: dict[str, tuple[Layout, StepEstimate]]
    elapsed_s: float
    explanations: dict[str, str] = field(default_factory=dict)  # per mode with no valid layout: why
    topology_queries: int = 0
    pruned: int = 0  # valid layouts not scored: their configuration's lower bound loses to found layouts
    # parts of a layout whose other values the search does not enumerate though a layout may take them, with why
    # (explain.py never calls such a part's value the only valid one)
    unsearched: dict[str, str] = field(default_factory=dict)

    @property
    def enumerated(self) -> int:
        return self.scored + self.pruned + sum(self.rejected.values())

    @property
    def layouts_per_s(self) -> float:
        return self.enumerated / max(self.elapsed_s, 1e-9)


@dataclass
class _Search:
    """What every mode's search shares, and what it accumulates."""

    model: ModelSpec
    d: Dims
    g: GemmModel
    mem_cap: float
    cache: LinkCache
    fixed: Layout | None
    micro_batches: list[int] | None
    top_k: int
    zeros: tuple[int, ...] = (0,)
    rc_pin: bool = False  # the layouts found carry their recomputation (rc=): it was searched or pinned
    overlap: bool = False  # gradient reduction overlapped with backward (Layout.overlap) in every layout
    kw_pin: int | None = None  # the fixed layout's kw (None: searched in modes that keep weights)
    prune: bool = True  # skip configurations whose lower bound loses (_within_bound)
    mode_bests: bool = True  # each mode's best exact (the bar keeps it: scoring._mode_best); False: the ranking only
    runtime: Runtime = RUNTIMES["paracube"]  # what runs the plans: the layouts it runs, its overlaps
    overlap_chosen: bool = False  # the runtime overlaps the gradient reduction by default (dimensions.OVERLAP)
    tpo_pinned: bool = False  # the fixed layout's tpo: every tensor-parallel layout has it
    tpo_chosen: bool = False  # the runtime overlaps tensor-parallel collectives with GEMMs (dimensions.TPO)
    fsdp_prefetch: bool = False  # zero=2/3 priced with prefetch (dimensions.FSDP_PREFETCH)
    host_cap: float = float("inf")  # host memory per device for offloaded activations (planner/offload_passes.py)
    offload: int = 0  # the pass's offloaded blocks (Layout off=N; offload_passes.py)
    # per mode, the layouts (but for the micro-batch) an offloading ladder's passes found valid so far (None: no ladder)
    offload_fitted: dict[str, set[tuple[int, ...]]] | None = None
    # per mode, the configurations refused for memory that offloading may make fit (offload_passes.valid)
    offload_pending: dict[str, dict[tuple[int, ...], Structure]] | None = None  # each with its structure
    # per mode, each pending configuration's (least peak without offloading, one block's saved bytes): what count
    # may fit it (offload_passes.pending_configs)
    offload_need: dict[str, dict[tuple[int, ...], tuple[float, float]]] | None = None
    offload_probe: bool = False  # the pass at the ladder's most blocks that only prunes offload_pending
    by_modules: bool = False  # the pass recomputes selectively by module (rcm=: the layouts carry d's modules)
    rejected: Counter = field(default_factory=Counter)
    explanations: dict[str, str] = field(default_factory=dict)
    best: list[tuple[float, Layout]] = field(default_factory=list)
    ranked_as: dict[str, float] = field(default_factory=dict)  # per layout but its recomputation: its best step
    per_mode_best: dict[str, tuple[float, Layout]] = field(default_factory=dict)
    scored: int = 0
    pruned: int = 0
    links: dict = field(default_factory=dict)  # (structure, cp > 1) -> its placements' links (scoring.py)
    distinct: dict = field(default_factory=dict)  # (structure, cp > 1) -> its distinct link rows (scoring.py)


def _matches(layout: Layout, fixed: Layout | None) -> bool:
    if fixed is None:
        return True
    base = Layout()
    for name in ("dp", "pp", "micro_batch", "interleave", "sequence_parallel"):
        if getattr(fixed, name) != getattr(base, name) and getattr(fixed, name) != getattr(layout, name):
            return False
    if (fixed.forbid_sp and layout.sequence_parallel) or (fixed.forbid_interleave and layout.interleave > 1):
        return False
    if (fixed.cp != 1 and fixed.cp != layout.cp) or (fixed.cp_comm is not None and fixed.cp_comm != layout.cp_comm):
        return False
    if fixed.mode != "none" and (fixed.mode, fixed.shape) != (layout.mode, layout.shape):
        return False
    return not fixed.placement or fixed.effective_placement == layout.effective_placement


def _layout(st: Structure, row: tuple[int, ...], place: tuple[tuple[str, int], ...], zero: int = 0,
            recompute: str | None = None, overlap: bool = False, kw: int | None = None,
            flash: int | None = None, tpo: bool = False, shard: int | None = None,
            cp_comm: str | None = None, offload: int = 0, modules: tuple[str, ...] | None = None) -> Layout:
    full = tuple(a for a, _ in place)
    return Layout(
        cp=st.cp,
        cp_comm=cp_comm if st.cp > 1 else None,
        offload=offload or None,  # off=N only where blocks are offloaded: other layouts' text unchanged
        tpo=tpo and bool(MODES[st.mode].axes),
        shard=shard if zero else None,
        keep_weights=kw if MODES[st.mode].keeps_weights else None,
        flash=flash,
        overlap=overlap and st.dp > 1,
        zero=zero,
        recompute=recompute,
        recompute_modules=modules if recompute in (None, "selective") else None,  # a pinned rcm= (Dims)
        dp=st.dp,
        pp=st.pp,
        mode=st.mode,
        shape=st.shape,
        placement=full,
        micro_batch=int(row[5]),
        interleave=int(row[6]),
        sequence_parallel=bool(row[7]),
    )
