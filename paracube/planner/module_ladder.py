"""The selective-recomputation-by-module ladder (rcm=; dimensions.RCM, RCM_LADDER) as both searches walk it.

The ladder's rungs each keep a superset of the one before's modules (memory never more), the modules a model lacks
dropped (recompute_modules.applies; a runtime's fused norms are no module to re-run). Models with MoE blocks or MLA
(experts.py) climb it per layout only where nothing fits without modules (`ladder`: per zero stage, the first rung
that fits). The dense search (search.py) makes each rung a pass of its own (`recompute_passes`), its layouts ranked
only where faster than the same layout of an earlier pass (scoring.py), so a rung is chosen where it buys a fit, a
larger micro-batch or a lower zero stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.layout_checks import RECOMPUTES
from paracube.planner.dimensions import RCM, values
from paracube.recompute_modules import applies
from paracube.runtimes import Runtime
from paracube.workload import ModelSpec, TrainingSpec


def module_rungs(model: ModelSpec, training: TrainingSpec, rt: Runtime, fixed: Layout | None
                 ) -> list[tuple[str, ...]]:
    """The rcm= ladder's rungs to try (dimensions.RCM): none with a pinned rcm= or a recomputation other than none /
    selective pinned or trained; each rung less the modules the model lacks, empty and repeated rungs dropped."""
    rc = fixed.recompute if fixed is not None and fixed.recompute else training.recompute
    if (fixed is not None and (fixed.recompute_modules or fixed.recompute == "none")) or rc not in ("none",
                                                                                                  "selective"):
        return []
    out: list[tuple[str, ...]] = []
    for rung in values(RCM, rt, fixed):
        kept = tuple(m for m in rung if applies(m, model, rt.fused_norms))  # type: ignore[union-attr]
        if kept and kept not in out:
            out.append(kept)
    return out


def ladder(lay: Layout, zeros: list[int], rungs: list[tuple[str, ...]], price: Callable, mem_cap: float
           ) -> list[tuple[Layout, StepEstimate]]:
    """Per zero stage of `zeros` where one does, the first rung of `rungs` under which `lay` fits (dimensions.RCM): a
    higher stage holds less and may fit under a lighter rung, which re-runs less, so each is ranked (as the searches
    rank each zero stage that fits). The last rung (the most it saves) at the highest zero stage (the least memory)
    first: where even that does not fit, nothing else is priced (one estimate for a layout the ladder cannot save);
    then per zero stage a bisection (each rung keeps a superset of the one before's modules: its memory is never
    more)."""
    def fits(z: int, rung: tuple[str, ...]) -> tuple[Layout, StepEstimate] | None:
        zl = replace(lay, zero=z, recompute=None, recompute_modules=rung)
        est = price(zl)
        return (zl, est) if est is not None and est.memory.total <= mem_cap else None

    most = fits(zeros[-1], rungs[-1])
    if most is None:
        return []
    out = []
    for z in zeros:
        top = most if z == zeros[-1] else fits(z, rungs[-1])
        if top is None:
            continue
        lo, hi = 0, len(rungs) - 1  # rungs[hi] fits
        while lo < hi:
            mid = (lo + hi) // 2
            found = fits(z, rungs[mid])
            if found is not None:
                hi, top = mid, found
            else:
                lo = mid + 1
        out.append(top)
    return out


def recompute_passes(rcs: list[str], model: ModelSpec, training: TrainingSpec, rt: Runtime,
                     fixed: Layout | None) -> list[tuple[str, tuple[str, ...] | None]]:
    """The dense search's recomputation passes: each searched recomputation (rcs, as given), then, where the search
    chooses the recomputation and includes selective, one pass per rung of the rcm= ladder the runtime runs on this
    model (module_rungs, dimensions.RCM; the modules a model lacks dropped) other than selective's own
    default set, before full recomputation: the memory ladder between re-running the attention core and re-running
    every block; the searched recomputations in RECOMPUTES' order (none, selective, full), so the search ranks a
    heavier pass's layout only where the same layout of a lighter one is slower or does not fit (scoring.py). A
    pinned rcm= or recomputation keeps its one pass."""
    rungs = module_rungs(model, training, rt, fixed) if len(rcs) > 1 and "selective" in rcs else []
    default = (("core_attn",),)  # rc=selective's modules (Megatron-core's default; recompute_modules.py)
    extra = [("selective", r) for r in rungs if r not in default]
    plain = [(rc, None) for rc in sorted(rcs, key=RECOMPUTES.index)]  # the least re-run first (scoring.py)
    at = next((i for i, (rc, _) in enumerate(plain) if rc == "full"), len(plain))
    return [*plain[:at], *extra, *plain[at:]]


__all__ = ["ladder", "module_rungs", "recompute_passes"]
