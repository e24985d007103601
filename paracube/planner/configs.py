"""Enumeration for the search: a mode's structures the runtime runs (`_mode_structures`, with why none) and each
structure's configurations (`_configs`: micro-batch, interleave v, sp). The search's contract: planner/search.py."""

from __future__ import annotations

import numpy as np

from paracube.layout import Layout
from paracube.modes import MODES
from paracube.modes.base import divisors
from paracube.modes.stages import split_ok
from paracube.planner.enumerate import NO_SHAPE, Structure, structures
from paracube.planner.search_state import _Search
from paracube.runtimes import RUNTIMES, Runtime
from paracube.workload import ModelSpec


def _configs(st: Structure, d_global: int, layers: int, micro_batches: list[int] | None,
             fixed: Layout | None = None, runtime: Runtime = RUNTIMES["paracube"]) -> list[tuple[int, ...]]:
    """(dp, pp, t, q, depth, mb, v, sp) rows (LayoutBatch order) of one structure (sp where the mode has it
    and the runtime runs it; v > 1 where it interleaves; a v only where the runtime builds its split of the
    blocks, Runtime.pipeline_split)."""
    m = MODES[st.mode]
    per_replica = d_global // st.dp if d_global % st.dp == 0 else 0
    mbs = micro_batches or (divisors(per_replica) if per_replica else [1])
    vs = [v for v in divisors(-(-layers // st.pp)) if split_ok(layers, st.pp, v)] if st.pp > 1 else [1]
    if not runtime.interleave or (fixed is not None and fixed.forbid_interleave):
        vs = [1]
    vs = [v for v in vs if runtime.split_refusal(layers, st.pp, v) is None]  # splits the stack cannot build
    with_sp = m.sequence_parallel and runtime.runs(st.mode, sequence_parallel=True)
    sps = (0, 1) if with_sp else (0,)
    if fixed is not None and fixed.forbid_sp:
        sps = (0,)
    q = st.shape[0] if st.shape else 1
    t = int(np.prod(st.shape)) if st.shape else 1
    depth = m.depth(st.shape)
    return [(st.dp, st.pp, t, q, depth, mb, v, sp) for mb in mbs for v in vs for sp in sps]


def _runnable(st: Structure, model: ModelSpec, runtime: Runtime) -> bool:
    """The runtime runs it (paracube: modes.executor_runs: the mode, its pipelines, the model's family; tied
    embeddings with pipelines in the modes that tie them; any vocabulary: the executor pads it)."""
    return runtime.runs(st.mode, st.pp, tied_embeddings=model.tied_embeddings, family=model.family)


def _not_run_because(st: Structure, model: ModelSpec, runtime: Runtime) -> str:
    """Why the runtime does not run a structure (paracube: executor/sizes.py refuses it with the same cause)."""
    if runtime.mode_check is None:
        why = runtime.refusal(Layout(dp=st.dp, pp=st.pp, mode=st.mode, shape=st.shape), model.family,
                              model.tied_embeddings, windowed=model.sliding_window is not None,
                              sinks=model.attention_sinks)
        return why or f"runtime {runtime.name} does not run {st.mode}"
    support = MODES[st.mode].executor
    if support is None:
        return f"paracube's executor does not run {st.mode}"
    if model.family not in support.families:
        return f"paracube's executor does not run the {model.family} family in {st.mode}"
    if model.tied_embeddings and support.pipeline and not MODES[st.mode].ties_embeddings:
        return f"paracube's executor does not tie embeddings in {st.mode} (its head is not laid out as the embedding)"
    return f"paracube's executor runs {st.mode} with pp = 1 only"


def _mode_structures(s: _Search, mode: str, gpus: int) -> list[Structure]:
    """The structures of `mode` to score; none (and an explanation) when the mode has no candidate."""
    sts = structures(mode, gpus, s.d.L, s.d.cp)  # cp: this pass's context parallelism (search)
    if not sts:
        s.explanations[mode] = NO_SHAPE.get(mode, "no layout").format(n=gpus)
        return []
    fixed = s.fixed
    if fixed is not None:
        # Filter on the structure first, so the reasons below speak of the layouts asked for.
        sts = [st for st in sts if (not fixed.shape or st.shape == fixed.shape)
               and (fixed.dp == 1 or st.dp == fixed.dp) and (fixed.pp == 1 or st.pp == fixed.pp)]
        if not sts:  # a pass that matched the pinned layout (another cp degree) keeps its reason (memory, ...)
            s.explanations.setdefault(mode, f"no {mode} layout of {gpus} GPUs matches {fixed} (layers % pp, shape)")
            return []
    why_fp8 = s.runtime.dtype_check(mode, "fp8") if s.d.fp8 and s.runtime.dtype_check else None
    if why_fp8:  # the runtime trains fp8 in some modes only (paracube: none / 1D, executor/layers/fp8.py)
        s.explanations[mode] = f"runtime {s.runtime.name}: {why_fp8}"
        return []
    # Every plan the search emits runs (the executor's preflight accepts it; tests/test_planner_runs.py).
    runs = [st for st in sts if _runnable(st, s.model, s.runtime)]
    if not runs:
        s.explanations[mode] = _not_run_because(sts[0], s.model, s.runtime)
    return runs
