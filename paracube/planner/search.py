"""Search every valid layout of N GPUs and rank them by predicted step time (analytic model).

Per mode: structures (tensor shape x dp x pp), then configurations (micro-batch, interleave v for pp > 1,
sequence parallelism for 1d) checked against the size rules (cost_models/validity.py) and device memory
(placement does not change either, so these are checked before placements are expanded), then every
distinct placement. Scoring is vectorized (cost_models.analytic.evaluate). Unless a placement is pinned, a
configuration's placements are scored only where its lower bound (analytic.step_lower_bound on each axis set's
best link over the structure's placements) is within the larger of the top_k-th best step time so far (the
layouts kept by earlier passes and modes, and the configurations' first placements, those the pins allow) and
the mode's best so far (in a cp=1 pass also the best cp=1 step so far: a cp > 1 layout's runner-up); zero=2/3
configurations, which that single evaluation cannot price, by their compute and in-line communication (analytic.
compute_lower_bound), against that bar and again, before each zero=2/3 stage is scored, against the bar the
zero=0/1 layouts scored first set (scoring._staged_times): the top_k found and each mode's best are exact, and
configurations that lose whatever their placement are not expanded (`pruned`). `mode_bests=False` (paracube plan,
which shows the ranking only): no mode's best is kept, the bar has no mode part, and only the ranking is exact.
Placements whose groups see the same links on every axis set price alike; the ranking holds the first of them only
(scoring.py: the default placement where it is one of them). A rejected or pruned configuration counts once per
placement of its structure, so
`scored + pruned + sum(rejected) == enumerated layouts`.
Runtime (`runtime`, paracube/runtimes; default paracube): only what it runs is enumerated (its tensor modes,
pipelines, interleaving, sp, zero stages), and the searched dimensions take its values (planner/dimensions.py):
recomputations and zero stages it runs; `overlap` (gradient reduction overlapped with backward) and `tpo`
(tensor-parallel collectives overlapped with their GEMMs) are never slower in the model, so every layout takes
them wherever the runtime does them by default (overlap: dp > 1, and pp = 1 unless it overlaps under pipelines;
tpo: its tensor modes, with sp where it needs sp), and the best layout without each is priced as its runner-up.
`fixed`: a Layout whose non-default fields (mode and shape, dp, pp, micro_batch, interleave, sp, placement)
every result must match; its pins `sp=0` (no sequence parallelism), `rc=` (recomputation) and `zero=` are
respected too; `overlap` (or a fixed layout's) prices every layout with the gradient reduction overlapped
with backward (analytic.py). Recomputation: `recomputes` lists the choices to search (default: TrainingSpec.recompute
only; `paracube plan` without --recompute passes none, selective, full); each choice is a pass over the
configurations with its own Dims, and a layout found so carries it (`rc=`); with selective among several, the
rcm= ladder's rungs are passes too (module_ladder.recompute_passes, dimensions.RCM). Distributed optimizer:
`zeros` (default: the runtime's) lists the zero stages allowed; a configuration takes the lowest allowed stage of 0
and 1 under which it fits in memory, and where that is zero=0, zero=1 too where it fits, as a configuration of its own
(its reduce_scatter + all_gather send the bytes of the all_reduce they replace, but overlapped only the
reduce_scatter half hides under backward, and its optimizer step updates a shard: analytic.evaluate prices both, so
either may be the faster; before 2026-12-04 zero=1 was searched only where zero=0 did not fit); zero=2 and 3
change the step time (per micro-batch reduce-scatters, zero=3's per-unit gathers), so each of them that fits (pp =
1, or pipelines where the runtime runs them untied: Runtime.zeros_with_pp) is a configuration of its own, priced
with its stage: the ranking chooses by step time.
A pinned HSDP `shard=N` (zero=2/3 only) is carried into every layout found; the vectorized pass prices it as
sharding over all of dp, the final ranking by `estimate` with its own shard and replica groups.
Kept weights (`kw`, 2d / 2.5d / 3d): unless the layout pins it, a configuration keeps its gathered weights for
the step (kw=1: one weight gather and gradient reduce-scatter per step instead of per micro-batch) where it
has several micro-batches and still fits in memory with them (memory.kept_bytes), else kw=0.
Only what paracube's executor runs is searched (modes.executor_runs, each mode's ExecutorSupport): every
plan the search emits passes the executor's preflight (tests/test_planner_runs.py); tied embeddings are run
in every mode, with and without pipelines and zero=1 (a mode declaring ties_embeddings = False would be left
out). zero=1 shards over the mode's
gradient group (memory.zero_shards: dp; 2.5D dp x depth), so it is searched wherever that group has several
ranks (2.5D too at dp=1). Attention: flash unless the layout pins `fa=0` (unfused is dominated in the model);
the best layout's fa=0 variant joins the ranking. Activation offloading (`off=N`): a pass per offloaded block count
where nothing fits with fewer, only for what did not fit (planner/offload_passes.py).
"""

from __future__ import annotations

import time
from dataclasses import replace

from paracube.cost_models.analytic import estimate, layout_links
from paracube.cost_models.context_dims import context_local
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of, with_options, with_pins
from paracube.cost_models.estimate_batch import estimate_many
from paracube.cost_models.links import LinkCache
from paracube.cost_models.moe import priced
from paracube.cost_models.moe_violations import violations as moe_violations
from paracube.errors import ParacubeError, check
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.layout_checks import RECOMPUTES, TENSOR_MODES
from paracube.modes import MODES
from paracube.planner.configs import _mode_structures
from paracube.planner.dimensions import (
    FSDP_PREFETCH,
    OVERLAP,
    PARAM_OVERLAP,
    PRICED_ZEROS,
    RC,
    TPO,
    ZERO,
    chosen,
    values,
)
from paracube.planner.enumerate import context_degrees, cp_unsearched
from paracube.planner.experts import cp_exchanges, experts_unsearched, search_experts
from paracube.planner.module_ladder import recompute_passes
from paracube.planner.offload_passes import offload_passes, offload_rungs, pending_configs, skips
from paracube.planner.scoring import _search_mode
from paracube.planner.search_state import RUNNABLE_MODES, SearchResult, _Search
from paracube.runtimes import RUNTIMES, Runtime, model_refusal_line
from paracube.workload import ModelSpec, TrainingSpec

__all__ = ["RUNNABLE_MODES", "SearchResult", "search"]


def _modes(modes: list[str] | None, gpus: int, fixed: Layout | None, runtime: Runtime | None = None) -> list[str]:
    check(isinstance(gpus, int) and gpus >= 1, f"gpus={gpus!r} must be a positive integer")
    # baselines (2D SUMMA) only on request
    modes = list(modes or [m for m in (runtime.modes if runtime is not None else TENSOR_MODES) if MODES[m].searched])
    for m in modes:
        check(m in TENSOR_MODES, f"tensor mode {m!r} is not valid; valid: {', '.join(TENSOR_MODES)}")
    if fixed is not None:
        check(
            gpus % fixed.world_size == 0,
            f"fixed layout {fixed} needs a multiple of {fixed.world_size} GPUs; {gpus} is not one",
        )
        if fixed.mode != "none":
            modes = [fixed.mode]
    return modes


def _choices(training: TrainingSpec, fixed: Layout | None, recomputes: list[str] | None,
             zeros: list[int] | None, runtime: Runtime) -> tuple[list[str], tuple[int, ...]]:
    """Recomputations and zero stages to search (planner/dimensions.py): the layout's pins first, then the
    caller's lists (default: the training's recomputation; every priced zero stage), what the runtime runs."""
    for rc in [*(recomputes or []), *([fixed.recompute] if fixed is not None and fixed.recompute else [])]:
        check(rc in RECOMPUTES, f"recompute {rc!r} is not valid; valid: {', '.join(RECOMPUTES)}")
    rcs = [str(r) for r in values(RC, runtime, fixed, list(recomputes or [training.recompute]))]
    check(bool(rcs), f"runtime {runtime.name} runs none of recompute {', '.join(recomputes or [training.recompute])}; "
          f"valid: {', '.join(runtime.recomputes)}")
    for z in zeros or []:
        check(z in PRICED_ZEROS, f"zero={z!r} is not searched; valid: {', '.join(map(str, PRICED_ZEROS))} "
              "(zero=2/3 are not priced yet)")
    pin = fixed is not None and (fixed.zero > 0 or fixed.forbid_zero)  # zero=0 given explicitly pins it too
    zs = tuple(int(z) for z in values(ZERO, runtime, fixed if pin else None, list(zeros) if zeros else None))
    if training.dtype == "fp8" and runtime.fp8_zeros is not None:  # the stages it trains fp8 with
        zs = tuple(z for z in zs if z in runtime.fp8_zeros)
    check(fixed is None or not fixed.hybrid or fixed.zero >= 2,
          f"shard={fixed.shard if fixed else None} (hybrid sharding) is priced with zero=2 or 3; pin zero=2 or zero=3")
    return rcs, tuple(sorted(zs)) or (0,)


def search(
    model: ModelSpec,
    training: TrainingSpec,
    topo: object,
    gpus: int,
    modes: list[str] | None = None,
    fixed: Layout | None = None,
    micro_batches: list[int] | None = None,
    top_k: int = 10,
    recomputes: list[str] | None = None,
    zeros: list[int] | None = None,
    overlap: bool = False,
    prune: bool = True,
    runtime: Runtime | str = "paracube",
    memory_headroom: float = 0.0,
    bucket_bytes: int | None = None,
    grad_bytes: int | None = None,
    mode_bests: bool = True,
) -> SearchResult:
    """Rank every valid layout of `gpus` devices that the runtime runs (default paracube: each mode's
    ExecutorSupport, modes.executor_runs) by predicted step time; raise ParacubeError if none fits. The zero
    stages, recomputations, overlap and tpo come from the runtime (planner/dimensions.py) within `zeros` /
    `recomputes` where given; `overlap=True` overlaps the gradient reduction in every layout. `prune=False`
    scores every placement of every configuration (the same result, slower: for tests and benchmarks).
    `memory_headroom`: the fraction of device memory held back (allocator, NCCL buffers, fragmentation); a
    layout fits in the rest. `bucket_bytes`: the gradient bucket limit the ranked layouts are priced with
    (None: the executor's, modes/buckets.py; calibration/run_prediction.py prices a published run with its stack's);
    `grad_bytes` likewise the gradient element (None: the runtime's, Runtime.grad_bytes). `mode_bests=False`: no
    mode's best is kept exact nor returned (`best_per_mode` empty; for callers that show only the ranking, as
    `paracube plan`): the bar is then the top_k-th best (and the best cp=1 step in cp=1 passes) only, which prunes
    every configuration that cannot enter the ranking; the ranking is the same."""
    t0 = time.perf_counter()
    rt = RUNTIMES[runtime] if isinstance(runtime, str) else runtime
    bad_experts = moe_violations(model, fixed, rt.fused_norms) if fixed is not None else []
    check(not bad_experts, f"layout {fixed}: {'; '.join(bad_experts)}")
    why_model = model_refusal_line(rt, model)  # the model's blocks, once, not every layout's refusal
    check(why_model is None, str(why_model))
    grad_bytes = rt.grad_bytes if grad_bytes is None else grad_bytes
    unpriced = [] if fixed is None or not priced(model) else \
        [p for p, on in (("tpo", fixed.tpo and model.mla is not None),
                         (f"place={'.'.join(fixed.placement)}", bool(fixed.placement))) if on]
    check(not unpriced, f"layout {fixed}: {model.name} is searched layout by layout (MoE blocks, MLA or heads of "
          f"their own width: planner/experts.py), priced at the default placement, and MLA without tpo (its latent "
          f"has no collective-matmul form here); valid: drop {', '.join(unpriced)}")
    if priced(model):  # MoE blocks / MLA: ep x etp x tp x pp x dp priced layout by layout (planner/experts.py)
        cap = float(topo.device.memory_bytes) * (1.0 - memory_headroom)  # type: ignore[attr-defined]
        # the run's gradients, bucket and the runtime's overlaps and fp8 experts, as the dense path prices them
        opts = rt.engine_options().with_(param_overlap=chosen(PARAM_OVERLAP, rt, fixed), grad_bytes=grad_bytes,
                                         **({} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}))
        ranked, scored, rejected, pruned, per_mode = search_experts(model, training, topo, gpus, rt, fixed,
                                                                    micro_batches, cap, top_k, opts, mode_bests)
        check(bool(ranked), f"no layout of {gpus} GPUs fits {model.name} (global batch {training.global_batch}) "
              f"with runtime {rt.name}: " + ("; ".join(f"{why} ({n} layouts)" for why, n in rejected.most_common())
                                             if rejected else "no candidate layout (dp dividing the global batch, "
                                             "blocks split over pp x v, ep dividing the experts and dp x tp, tp a "
                                             "divisor of the heads" + (", and the pins" if fixed is not None else "")
                                             + ")"))
        # the tensor modes the experts fold over are searched; each other mode the runtime runs is told why not
        folds = ", ".join(m for m in rt.modes if MODES[m].context_parallel)
        unfolded = {m: f"{model.name} is searched layout by layout (MoE blocks, MLA or heads of their own width: "
                       f"planner/experts.py) in the tensor modes whose groups hold whole tokens ({folds})"
                    for m in rt.modes if MODES[m].searched and not MODES[m].context_parallel} if mode_bests else {}
        return SearchResult(ranked, scored, rejected, per_mode if mode_bests else {}, time.perf_counter() - t0,
                            unfolded, pruned=pruned,
                            unsearched=experts_unsearched(model, training, gpus, rt, fixed, micro_batches))
    modes = _modes(modes, gpus, fixed, rt)
    # the runtime's per-element choices and the run's gradient element; fa= pinned: that kernel
    d = with_options(with_pins(dims_of(model, training), fixed), rt.engine_options().with_(grad_bytes=grad_bytes))
    rcs, zs = _choices(training, fixed, recomputes, zeros, rt)
    check(0.0 <= memory_headroom < 1.0, f"memory headroom {memory_headroom!r} must be a fraction in [0, 1)")
    mem_cap = float(topo.device.memory_bytes) * (1.0 - memory_headroom)  # type: ignore[attr-defined]
    s = _Search(model, d, gemm_model(topo, training.dtype), mem_cap,  # type: ignore[arg-type]
                LinkCache(topo), fixed, micro_batches, top_k, zs,
                len(rcs) > 1 or (fixed is not None and fixed.recompute is not None) or rcs[0] != training.recompute,
                overlap or (fixed is not None and fixed.overlap), fixed.keep_weights if fixed is not None else None,
                prune, runtime=rt, overlap_chosen=chosen(OVERLAP, rt, fixed),
                tpo_pinned=fixed is not None and fixed.tpo, tpo_chosen=chosen(TPO, rt, fixed),
                fsdp_prefetch=chosen(FSDP_PREFETCH, rt, fixed), mode_bests=mode_bests)
    check(fixed is None or fixed.cp == 1 or bool(rt.cp_comms),
          f"runtime {rt.name} does not run context parallelism (cp={fixed.cp if fixed else 1}); valid: cp=1")
    # Context parallelism: a structural axis (enumerate.context_degrees), each degree a pass with a cp rank's dims,
    # and per degree > 1 a pass per exchange the runtime offers (dimensions.CPC), in modes that take cp.
    # sliding windows: only the exchanges the runtime runs them with (Runtime.window_cp_comms)
    cpcs = cp_exchanges(model, rt, fixed)
    # Activation offloading: per pass, offloaded block counts where nothing fits with fewer (offload_passes.py)
    host_link = float(getattr(topo.device, "host_bandwidth", 0.0)) > 0  # type: ignore[attr-defined]
    s.host_cap = float(getattr(topo.device, "host_memory_bytes", 0.0)) * (1.0 - memory_headroom)  # type: ignore[attr-defined]
    for rc, modules in recompute_passes(rcs, model, training, rt, fixed):
        # selective recomputation by module (dimensions.RCM): its own pass, never offloaded (rcm= with off=N is
        # refused: recompute_modules.check_recompute_modules)
        rungs = offload_rungs(rt, fixed, d.L, rc, host_link) if modules is None else [0]
        s.by_modules = modules is not None
        rc_dims = replace(d, recompute=rc) if modules is None else replace(d, recompute=rc, recompute_modules=modules)
        for cp in context_degrees(d.s, gpus, fixed.cp if fixed else 1, bool(cpcs)):
            for cpc in cpcs if cp > 1 else [None]:
                for _ in offload_passes(s, context_local(rc_dims, cp, cpc), rungs):
                    for mode in modes:
                        runs = (cp == 1 or MODES[mode].context_parallel) and not skips(s, mode)
                        # a ladder's offloading pass looks only at its pending configurations (offload_passes.py)
                        rung = pending_configs(s, mode) if runs else None
                        sts = _mode_structures(s, mode, gpus) if runs and rung is None else []
                        if sts or (rung is not None and rung[0]):
                            _search_mode(s, mode, sts, rung)
    s.d, s.by_modules = d, False
    if not s.best:
        lines = "; ".join(f"{m}: {why}" for m, why in s.explanations.items())
        raise ParacubeError(
            f"no layout of {gpus} GPUs fits {model.name} (global batch {d.global_batch}): {lines}"
        )
    s.best.sort(key=lambda x: x[0])

    estimates: dict[object, StepEstimate] = {}
    # zero=1's parameter gather overlapped with the next forward where the runtime does it (dimensions.py);
    # priced by `estimate` only (the search's per-configuration zero prices zero=1 as zero=0's all_reduce).
    param_overlap = chosen(PARAM_OVERLAP, rt, fixed)
    options = rt.engine_options().with_(param_overlap=param_overlap, fsdp_prefetch=s.fsdp_prefetch,
                                        grad_bytes=grad_bytes,  # a run's own gradient element and bucket
                                        **({} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}))

    def score(lay: Layout) -> StepEstimate:  # a mode's best is often in the ranking too: estimated once
        # Placements enter an estimate only through the links of its groups: layouts equal but for a placement
        # whose groups see the same links (the pool holds many) share one estimate, their own layout named in it.
        key = repr(lay)  # every field
        if key not in estimates:
            own = known_links.get(key) or layout_links(lay, s.cache)  # estimate_many's, where it priced it
            shared = (repr(lay.with_(placement=())), tuple((ax, float(bw[0]), float(lat[0])) for ax, (bw, lat)
                                                           in own.items()))
            if shared in estimates and lay.micro_batch is not None:
                estimates[key] = replace(estimates[shared], layout=str(lay))
            else:
                estimates[key] = estimates[shared] = fresh.pop(key, None) or estimate(
                    model, training, lay, topo, with_events=False, cache=s.cache, options=options)
        return estimates[key]

    # the ranking's estimates in a few vectorized evaluations (estimate_batch.py: the same results as estimate)
    known_links: dict = {}
    fresh = estimate_many(model, training, [lay for _, lay in s.best[:top_k]], topo, s.cache, options, known_links)
    ranked = [(lay, score(lay)) for _, lay in s.best[:top_k]]
    # HSDP, and zero=1 with its gather overlapped, are priced exactly by `estimate` only: rank by its prices.
    if (fixed is not None and fixed.hybrid) or (param_overlap and any(lay.zero == 1 for lay, _ in ranked)):
        ranked.sort(key=lambda r: r[1].step_time_s)
    for dim, off in ((OVERLAP, {"overlap": False}), (TPO, {"tpo": False})):
        # A dominant overlap the search chose: its runner-up is the best layout without it (dimensions.py).
        best = ranked[0][0]
        if getattr(best, dim.name) and (fixed is None or dim.pin(fixed) is None):
            alt = best.with_(**off)
            # Where the overlap hides nothing (a ring of 2: one step) the two tie up to rounding: keep the choice.
            ranked = sorted([*ranked, (alt, score(alt))],
                            key=lambda r: (float(f"{r[1].step_time_s:.12g}"), r[0] is alt))
    if ranked[0][0].cp > 1 and (fixed is None or fixed.cp == 1):  # its runner-up: the best layout without cp
        alt = next((lay for _, lay in s.best if lay.cp == 1), None)
        if alt is not None and all(lay.cp > 1 for lay, _ in ranked):
            ranked = sorted([*ranked, (alt, score(alt))], key=lambda r: r[1].step_time_s)
    if fixed is None or fixed.flash is None:
        # Unfused attention (fa=0) is never faster nor smaller than flash in the model (compute.py: the flash
        # kernel computes the causal half and no s x s traffic; activations.py: no s x s tensors kept), so the
        # search runs with flash; the best layout's fa=0 variant, where it fits, is priced as its runner-up.
        alt = ranked[0][0].with_(flash=0)
        alt_est = score(alt)
        if alt_est.memory.total <= s.mem_cap:
            ranked = sorted([*ranked, (alt, alt_est)], key=lambda r: r[1].step_time_s)
    per_mode = {m: (lay, score(lay)) for m, (_, lay) in s.per_mode_best.items()} if mode_bests else {}
    why_cp = cp_unsearched(d.s, gpus, fixed, bool(cpcs))
    return SearchResult(ranked, s.scored, s.rejected, per_mode, time.perf_counter() - t0, s.explanations,
                        s.cache.queries, s.pruned, {"cp": why_cp} if why_cp else {})
