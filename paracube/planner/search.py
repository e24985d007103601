"""Search every valid layout of N GPUs and rank them by predicted step time (analytic model).

Per mode: structures (tensor shape x dp x pp), then configurations (micro-batch, interleave v for pp > 1,
sequence parallelism for 1d) checked against the size rules (cost_models/validity.py) and device memory
(placement does not change either, so these are checked before placements are expanded), then every
distinct placement. Scoring is vectorized (cost_models.analytic.evaluate). Unless a placement is pinned, a
configuration's placements are scored only where its lower bound (analytic.step_lower_bound on each axis set's
best link over the structure's placements) is within the mode's top_k-th best step time among the
configurations' first placements (those the pins allow): the top_k found is exact, and configurations that
lose whatever their placement are not expanded (`pruned`). A rejected or pruned configuration counts once per
placement of its structure, so `scored + pruned + sum(rejected) == enumerated layouts`.
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
configurations with its own Dims, and a layout found so carries it (`rc=`). Distributed optimizer:
`zeros` (default (0,)) lists the zero stages allowed; a configuration takes the lowest allowed stage of 0 and 1
under which it fits in memory (zero=1 changes memory only here: its reduce_scatter + all_gather send the bytes
of the all_reduce they replace, so its step time is that of zero=0, except that overlapped only the
reduce_scatter half hides under backward: analytic.evaluate); zero=2 and 3 change the step time (per
micro-batch reduce-scatters, zero=3's per-unit gathers), so each of them that fits (pp = 1, untied, as the
executor runs them) is a configuration of its own, priced with its stage: the ranking chooses by step time.
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
the best layout's fa=0 variant joins the ranking.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from paracube.cost_models.analytic import estimate, evaluate, step_lower_bound
from paracube.cost_models.comm import axes_used, unit_totals
from paracube.cost_models.compute import GemmModel, gemm_model
from paracube.cost_models.dims import Dims, dims_of, with_pins
from paracube.cost_models.links import LinkCache
from paracube.cost_models.memory import stage_memory, total, with_zero, zero_shards
from paracube.cost_models.moe import priced
from paracube.cost_models.moe import violations as moe_violations
from paracube.cost_models.validity import first_violation, rules
from paracube.errors import ParacubeError, check
from paracube.estimate import StepEstimate
from paracube.layout import RECOMPUTES, TENSOR_MODES, Layout
from paracube.modes import MODES, LayoutBatch, runnable_modes
from paracube.modes.stages import split_ok
from paracube.planner.dimensions import OVERLAP, PARAM_OVERLAP, PRICED_ZEROS, RC, TPO, ZERO, chosen, values
from paracube.planner.enumerate import NO_SHAPE, Structure, divisors, structures
from paracube.planner.experts import search_experts
from paracube.runtimes import RUNTIMES, Runtime
from paracube.workload import ModelSpec, TrainingSpec

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
    runtime: Runtime = RUNTIMES["paracube"]  # what runs the plans: the layouts it runs, its overlaps
    overlap_chosen: bool = False  # the runtime overlaps the gradient reduction by default (dimensions.OVERLAP)
    tpo_pinned: bool = False  # the fixed layout's tpo: every tensor-parallel layout has it
    tpo_chosen: bool = False  # the runtime overlaps tensor-parallel collectives with GEMMs (dimensions.TPO)
    rejected: Counter = field(default_factory=Counter)
    explanations: dict[str, str] = field(default_factory=dict)
    best: list[tuple[float, Layout]] = field(default_factory=list)
    per_mode_best: dict[str, tuple[float, Layout]] = field(default_factory=dict)
    scored: int = 0
    pruned: int = 0


def _configs(st: Structure, d_global: int, layers: int, micro_batches: list[int] | None,
             fixed: Layout | None = None, runtime: Runtime = RUNTIMES["paracube"]) -> list[tuple[int, ...]]:
    """(dp, pp, t, q, depth, mb, v, sp) rows (LayoutBatch order) of one structure (sp where the mode has it
    and the runtime runs it; v > 1 where it interleaves)."""
    m = MODES[st.mode]
    per_replica = d_global // st.dp if d_global % st.dp == 0 else 0
    mbs = micro_batches or (divisors(per_replica) if per_replica else [1])
    vs = [v for v in divisors(-(-layers // st.pp)) if split_ok(layers, st.pp, v)] if st.pp > 1 else [1]
    if not runtime.interleave:
        vs = [1]
    with_sp = m.sequence_parallel and runtime.runs(st.mode, sequence_parallel=True)
    sps = (0, 1) if with_sp else (0,)
    if fixed is not None and fixed.forbid_sp:
        sps = (0,)
    q = st.shape[0] if st.shape else 1
    t = int(np.prod(st.shape)) if st.shape else 1
    depth = m.depth(st.shape)
    return [(st.dp, st.pp, t, q, depth, mb, v, sp) for mb in mbs for v in vs for sp in sps]


def _matches(layout: Layout, fixed: Layout | None) -> bool:
    if fixed is None:
        return True
    base = Layout()
    for name in ("dp", "pp", "micro_batch", "interleave", "sequence_parallel"):
        if getattr(fixed, name) != getattr(base, name) and getattr(fixed, name) != getattr(layout, name):
            return False
    if fixed.forbid_sp and layout.sequence_parallel:
        return False
    if fixed.mode != "none" and (fixed.mode, fixed.shape) != (layout.mode, layout.shape):
        return False
    return not fixed.placement or fixed.effective_placement == layout.effective_placement


def _layout(st: Structure, row: tuple[int, ...], place: tuple[tuple[str, int], ...], zero: int = 0,
            recompute: str | None = None, overlap: bool = False, kw: int | None = None,
            flash: int | None = None, tpo: bool = False, shard: int | None = None) -> Layout:
    full = tuple(a for a, _ in place)
    return Layout(
        tpo=tpo and bool(MODES[st.mode].axes),
        shard=shard if zero else None,
        keep_weights=kw if MODES[st.mode].keeps_weights else None,
        flash=flash,
        overlap=overlap and st.dp > 1,
        zero=zero,
        recompute=recompute,
        dp=st.dp,
        pp=st.pp,
        mode=st.mode,
        shape=st.shape,
        placement=full,
        micro_batch=int(row[5]),
        interleave=int(row[6]),
        sequence_parallel=bool(row[7]),
    )


def _runnable(st: Structure, model: ModelSpec, runtime: Runtime) -> bool:
    """The runtime runs it (paracube: modes.executor_runs: the mode, its pipelines, the model's family; tied
    embeddings with pipelines in the modes that tie them; any vocabulary: the executor pads it)."""
    return runtime.runs(st.mode, st.pp, tied_embeddings=model.tied_embeddings, family=model.family)


def _not_run_because(st: Structure, model: ModelSpec, runtime: Runtime) -> str:
    """Why the runtime does not run a structure (paracube: executor/sizes.py refuses it with the same cause)."""
    if runtime.mode_check is None:
        return runtime.refusal(Layout(dp=st.dp, pp=st.pp, mode=st.mode, shape=st.shape), model.family,
                               model.tied_embeddings) or f"runtime {runtime.name} does not run {st.mode}"
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
    sts = structures(mode, gpus, s.d.L)
    if not sts:
        s.explanations[mode] = NO_SHAPE.get(mode, "no layout").format(n=gpus)
        return []
    fixed = s.fixed
    if fixed is not None:
        # Filter on the structure first, so the reasons below speak of the layouts asked for.
        sts = [st for st in sts if (not fixed.shape or st.shape == fixed.shape)
               and (fixed.dp == 1 or st.dp == fixed.dp) and (fixed.pp == 1 or st.pp == fixed.pp)]
        if not sts:
            s.explanations[mode] = f"no {mode} layout of {gpus} GPUs matches {fixed} (layers % pp, shape)"
            return []
    # Every plan the search emits runs (the executor's preflight accepts it; tests/test_planner_runs.py).
    runs = [st for st in sts if _runnable(st, s.model, s.runtime)]
    if not runs:
        s.explanations[mode] = _not_run_because(sts[0], s.model, s.runtime)
    return runs


def _valid(s: _Search, mode: str, batch: LayoutBatch, n_places: np.ndarray, rejected: Counter
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the configurations that pass the size rules and fit in device memory (placement changes
    neither), each one's zero stage (the lowest of `s.zeros` that fits) and kept weights (kw: 1 where the
    mode keeps weights, the step has several micro-batches and the kept weights fit too, unless pinned);
    each rejection counts once per placement of its structure."""
    viol = first_violation(mode, s.d, batch)
    for i, (text, _) in enumerate(rules(mode)):
        cnt = int(n_places[viol == i].sum())
        if cnt:
            rejected[text] += cnt
    idx = np.nonzero(viol < 0)[0]
    if not len(idx):
        return idx, idx, idx
    zeros = [z for z in sorted(s.zeros) if s.runtime.runs(mode, zero=z)]
    if not zeros:  # a pinned zero stage the runtime does not run in this mode
        rejected[f"runtime {s.runtime.name} does not run zero={s.zeros[0]} in {mode}"] += int(n_places[idx].sum())
        return idx[:0], idx[:0], idx[:0]
    sub = batch.take(idx)
    keeps = MODES[mode].keeps_weights
    base_kw = int(keeps and s.kw_pin == 1)

    def mems(kw: int) -> list[dict[str, np.ndarray]]:
        return [stage_memory(s.d, mode, sub, True, False, kw=kw), stage_memory(s.d, mode, sub, False, True, kw=kw)]

    shards = zero_shards(mode, sub)  # ranks zero shards the optimizer over (2.5D: dp x depth)
    ones = np.ones_like(sub.dp)
    flags = [(ones, np.where(sub.pp == 1, 1, 0)), (np.where(sub.pp == 1, 1, 0), ones)]  # (first, last) of mems
    units = [unit_totals(s.d, mode, sub, f, h, shards)[1::2] for f, h in flags] if max(zeros) >= 2 else [None] * 2

    def peak(ms: list[dict[str, np.ndarray]], z: np.ndarray) -> np.ndarray:
        return np.maximum(*(total(with_zero(m, shards, z, u)) for m, u in zip(ms, units, strict=True)))

    base = mems(base_kw)
    zero = np.full(len(idx), -1)
    tied_pp = s.d.tied & (sub.pp > 1) & s.runtime.tied_pp_zero0  # tied + pp > 1: zero=0 (paracube's executor)
    extra: list[tuple[int, np.ndarray]] = []  # zero=2/3: a configuration of its own where it fits
    runs = np.zeros(len(idx), dtype=bool)  # some allowed stage runs there (memory aside)
    for z in zeros:
        if z and not np.any(shards > 1):
            continue
        mem = peak(base, z * ones)
        ok = (z == 0) | ((shards > 1) & ~tied_pp)
        if z >= 2:  # zero=2/3 change the step time: the search prices each stage that fits
            # with pipelines where the runtime runs it; with tied embeddings where it runs them at this stage
            tied_ok = not s.d.tied or s.runtime.runs(mode, zero=z, tied_embeddings=True)
            ok = (shards > 1) & ((sub.pp == 1) | (z in s.runtime.zeros_with_pp)) & tied_ok
            extra.append((z, (mem <= s.mem_cap) & ok))
        else:
            zero = np.where((zero < 0) & (mem <= s.mem_cap) & ok, z, zero)
        runs = runs | ok
    unrun = ~runs if min(zeros) >= 2 else np.zeros(len(idx), dtype=bool)  # only zero=2/3 allowed, none runs
    if unrun.any():
        pps = ", pp=1" if not {2, 3} & set(s.runtime.zeros_with_pp) else ""
        rejected[f"runtime {s.runtime.name} runs zero=2/3 with dp > 1{pps}"
                 + (" and untied embeddings" if s.d.tied else "")] += int(n_places[idx[unrun]].sum())
    fits = zero >= 0
    for _, f in extra:
        fits = fits | f
    kw = np.full(len(idx), base_kw)
    if keeps and s.kw_pin is None:  # keep where it saves traffic (several micro-batches) and memory allows
        several = sub.micro_batches(s.d.global_batch) > 1
        kw = (fits & several & (peak(mems(1), np.maximum(zero, 0)) <= s.mem_cap)).astype(np.int64)
    tied_zero1 = ~fits & tied_pp if 0 not in zeros else np.zeros(len(idx), dtype=bool)
    if tied_zero1.any():  # a pinned zero=1 with tied embeddings and pipelines (executor/sizes.py refuses it)
        rejected[f"runtime {s.runtime.name} runs tied embeddings with pp > 1 at zero=0 only"] += int(
            n_places[idx[tied_zero1]].sum())
    over = int(n_places[idx[~fits & ~tied_zero1 & ~unrun]].sum())
    if over:
        rejected[f"memory > {s.mem_cap / 2**30:.0f} GiB per device"] += over
    low = zero >= 0
    out_idx = [idx[low]] + [idx[f] for _, f in extra]
    out_zero = [zero[low]] + [np.full(int(f.sum()), z) for z, f in extra]
    out_kw = [kw[low]] + [kw[f] for _, f in extra]
    return np.concatenate(out_idx), np.concatenate(out_zero), np.concatenate(out_kw)


def _structure_links(s: _Search, mode: str, owners: list[Structure], places: dict[Structure, Placements]
                     ) -> dict[Structure, np.ndarray]:
    """[placements, axes, (bw, lat)] per structure of `owners` (cached topology queries)."""
    axes_list = axes_used(mode)
    return {st: np.array([[s.cache.get_keyed(k, place, ax) for k, ax in zip(keys, axes_list, strict=True)]
                          for place, keys in places[st]])
            for st in dict.fromkeys(owners)}


def _within_bound(s: _Search, mode: str, batch: LayoutBatch, owners: list[Structure],
                  places: dict[Structure, Placements], st_links: dict[Structure, np.ndarray],
                  zero: np.ndarray | None, kw: np.ndarray, overlap: np.ndarray, tpo: np.ndarray) -> np.ndarray:
    """Which configurations of `batch` may still hold one of the mode's best `top_k` layouts: those whose
    lower bound over all placements (analytic.step_lower_bound on each axis set's best link over the
    structure's placements) is within the top_k-th best step time of the configurations' first placements
    (real layouts, so the bar is met). Exact: no layout skipped here beats the top_k that scoring the rest
    finds; it spares the placements of configurations that lose whatever their placement."""
    n = len(batch)
    best = {st: np.stack([m[:, :, 0].max(axis=0), m[:, :, 1].min(axis=0)], axis=1) for st, m in st_links.items()}
    # One evaluation: each configuration on its first placement's links, then on its structure's best links.
    mat = np.array([st_links[st][0] for st in owners] + [best[st] for st in owners])
    links = {ax: (mat[:, k, 0], mat[:, k, 1]) for k, ax in enumerate(axes_used(mode))}
    rows = np.concatenate([np.arange(n), np.arange(n)])
    res = evaluate(s.d, mode, batch, links, s.g, rows=rows, zero=zero, overlap=overlap[rows], kw=kw, tpo=tpo[rows])
    found = res.step_time[:n]
    if s.fixed is not None:  # the bar counts only layouts the pins allow (no placement pin: any placement)
        allowed = [_matches(_layout(st, batch.row(i), places[st][0][0]), s.fixed) for i, st in enumerate(owners)]
        found = np.where(allowed, found, np.inf)
    bar = np.partition(found, s.top_k - 1)[s.top_k - 1]
    bound = step_lower_bound(res, s.d, batch, rows, overlap[rows])[n:]
    return bound <= bar * (1 + 1e-9)  # the bar's own configuration stays despite rounding


def _overlaps(s: _Search, mode: str, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per configuration: the gradient reduction overlapped with backward (pinned or `overlap` given: every
    layout with dp > 1; else where the runtime overlaps it by default: pp = 1, or any pp where it overlaps under
    pipelines), and tpo (pinned, or where the runtime runs it: its tensor modes, with sp where it needs sp)."""
    many = batch.dp > 1
    ovs = many if s.overlap else many & s.overlap_chosen & ((batch.pp == 1) | s.runtime.grad_overlap_pp)
    if s.tpo_pinned:
        tpos = np.full(len(batch), bool(MODES[mode].axes))
    elif s.tpo_chosen:
        on, off = s.runtime.offers_tpo(mode, True), s.runtime.offers_tpo(mode, False)
        tpos = np.where(batch.sp > 0, on, off).astype(bool)
    else:
        tpos = np.zeros(len(batch), dtype=bool)
    return np.asarray(ovs, dtype=bool), tpos


def _search_mode(s: _Search, mode: str, sts: list[Structure]) -> None:
    """Score every valid layout of one mode and keep its best `top_k` (matching `fixed`)."""
    places = {st: st.placements() for st in sts}
    owners: list[Structure] = []
    rows: list[tuple[int, ...]] = []
    for st in sts:
        for cfg in _configs(st, s.d.global_batch, s.d.L, s.micro_batches, s.fixed, s.runtime):
            rows.append(cfg)
            owners.append(st)
    batch = LayoutBatch.of_rows(rows)
    n_places = np.array([len(places[st]) for st in owners])
    mode_rej: Counter = Counter()
    idx, zeros, kws = _valid(s, mode, batch, n_places, mode_rej)
    s.rejected.update(mode_rej)
    # From here on only the valid configurations: `batch`, `owners`, `n_places`, `zeros`, `kws` are theirs.
    batch, owners, n_places = batch.take(idx), [owners[i] for i in idx], n_places[idx]
    st_links = _structure_links(s, mode, owners, places)
    zero_arg = zeros if s.zeros != (0,) else None
    ovs, tpos = _overlaps(s, mode, batch)
    ovs = ovs & (zeros < 2)  # zero=2/3 reduce every micro-batch's gradients during its backward (traffic.py)
    # zero=2/3 rows are priced exactly only with their own stage (_evaluate): the bound's single evaluation
    # would price them as zero=0, so their configurations are not pruned.
    if (s.prune and (s.fixed is None or not s.fixed.placement) and len(batch) > s.top_k
            and not np.any(zeros >= 2)):
        keep = _within_bound(s, mode, batch, owners, places, st_links, zero_arg, kws, ovs, tpos)
        s.pruned += int(n_places[~keep].sum())
        kept = np.nonzero(keep)[0]
        batch, owners, n_places, zeros, kws, ovs, tpos = (batch.take(kept), [owners[i] for i in kept],
                                                          n_places[kept], zeros[kept], kws[kept], ovs[kept],
                                                          tpos[kept])
        zero_arg = zeros if s.zeros != (0,) else None
    if not len(batch):
        top = mode_rej.most_common(2)
        s.explanations[mode] = "; ".join(f"{r} ({n} layouts)" for r, n in top) or "no configuration"
        return
    layout_rows = np.repeat(np.arange(len(batch)), n_places)  # each configuration once per placement
    place_idx = np.concatenate([np.arange(c) for c in n_places])
    link_mat = np.concatenate([st_links[st] for st in owners])
    links = {ax: (link_mat[:, k, 0], link_mat[:, k, 1]) for k, ax in enumerate(axes_used(mode))}
    step_time = _evaluate(s, mode, batch, links, layout_rows, zeros, zero_arg, kws, ovs, tpos)
    s.scored += len(layout_rows)
    taken = 0
    for j in np.argsort(step_time, kind="stable"):
        row = int(layout_rows[j])
        st = owners[row]
        lay = _layout(st, batch.row(row), places[st][place_idx[j]][0], int(zeros[row]),
                      s.d.recompute if s.rc_pin else None, bool(ovs[row]), int(kws[row]),
                      s.fixed.flash if s.fixed else None, bool(tpos[row]), s.fixed.shard if s.fixed else None)
        if not _matches(lay, s.fixed):
            continue
        s.best.append((float(step_time[j]), lay))
        if mode not in s.per_mode_best or s.best[-1][0] < s.per_mode_best[mode][0]:
            s.per_mode_best[mode] = s.best[-1]
        taken += 1
        if taken >= s.top_k:
            break
    if not taken:  # layouts fit, but only ones the pins exclude (e.g. with sp where sp=0 is pinned)
        top = mode_rej.most_common(2)
        s.explanations[mode] = "; ".join(f"{r} ({n} layouts)" for r, n in top) or f"no layout matches {s.fixed}"


def _evaluate(s: _Search, mode: str, batch: LayoutBatch, links: dict, rows: np.ndarray, zeros: np.ndarray,
              zero_arg: np.ndarray | None, kws: np.ndarray, ovs: np.ndarray, tpos: np.ndarray) -> np.ndarray:
    """Step time per layout: zero=0/1 rows in one evaluation (the same time: search docstring), each zero=2/3
    stage in its own (its per-unit traffic is priced for one zero stage at a time: comm.StepTraffic)."""
    high = zeros[rows] >= 2
    if not np.any(high):
        return evaluate(s.d, mode, batch, links, s.g, rows=rows, zero=zero_arg, overlap=ovs[rows], kw=kws,
                        tpo=tpos[rows]).step_time
    out = np.zeros(len(rows))
    for z in [None, *sorted(set(zeros[zeros >= 2].tolist()))]:
        sel = ~high if z is None else zeros[rows] == z
        if not np.any(sel):
            continue
        sub = {ax: (bw[sel], lat[sel]) for ax, (bw, lat) in links.items()}
        arg = (np.where(zeros >= 2, 0, zeros) if zero_arg is not None else None) if z is None else int(z)
        out[sel] = evaluate(s.d, mode, batch, sub, s.g, rows=rows[sel], zero=arg, overlap=ovs[rows[sel]], kw=kws,
                            tpo=tpos[rows[sel]]).step_time
    return out


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
    # A pinned zero the cost models do not price is searched as the unpinned ones (the CLI carries the pin).
    pin = fixed is not None and fixed.zero in PRICED_ZEROS and fixed.zero > 0
    zs = tuple(int(z) for z in values(ZERO, runtime, fixed if pin else None, list(zeros) if zeros else None))
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
) -> SearchResult:
    """Rank every valid layout of `gpus` devices that the runtime runs (default paracube: each mode's
    ExecutorSupport, modes.executor_runs) by predicted step time; raise ParacubeError if none fits. The zero
    stages, recomputations, overlap and tpo come from the runtime (planner/dimensions.py) within `zeros` /
    `recomputes` where given; `overlap=True` overlaps the gradient reduction in every layout. `prune=False`
    scores every placement of every configuration (the same result, slower: for tests and benchmarks).
    `memory_headroom`: the fraction of device memory held back (allocator, NCCL buffers, fragmentation); a
    layout fits in the rest."""
    t0 = time.perf_counter()
    rt = RUNTIMES[runtime] if isinstance(runtime, str) else runtime
    bad_experts = moe_violations(model, fixed) if fixed is not None else []
    check(not bad_experts, f"layout {fixed}: {'; '.join(bad_experts)}")
    if priced(model):  # MoE blocks / MLA: ep x etp x tp x pp x dp priced layout by layout (planner/experts.py)
        cap = float(topo.device.memory_bytes) * (1.0 - memory_headroom)  # type: ignore[attr-defined]
        ranked, scored, rejected = search_experts(model, training, topo, gpus, rt, fixed, micro_batches, cap, top_k)
        check(bool(ranked), f"no layout of {gpus} GPUs fits {model.name} (global batch {training.global_batch}) "
              f"with runtime {rt.name}: " + (f"rejected {dict(rejected)}" if rejected else
                                             "no candidate matches the pins (blocks split over pp x v, ep dividing "
                                             "the experts and dp x tp, tp a divisor of the heads)"))
        return SearchResult(ranked, scored, rejected, {}, time.perf_counter() - t0)
    modes = _modes(modes, gpus, fixed, rt)
    d = with_pins(dims_of(model, training), fixed)  # fa= pinned: that kernel (the search's is flash)
    rcs, zs = _choices(training, fixed, recomputes, zeros, rt)
    check(0.0 <= memory_headroom < 1.0, f"memory headroom {memory_headroom!r} must be a fraction in [0, 1)")
    mem_cap = float(topo.device.memory_bytes) * (1.0 - memory_headroom)  # type: ignore[attr-defined]
    s = _Search(model, d, gemm_model(topo, training.dtype), mem_cap,  # type: ignore[arg-type]
                LinkCache(topo), fixed, micro_batches, top_k, zs,
                len(rcs) > 1 or (fixed is not None and fixed.recompute is not None) or rcs[0] != training.recompute,
                overlap or (fixed is not None and fixed.overlap), fixed.keep_weights if fixed is not None else None,
                prune, runtime=rt, overlap_chosen=chosen(OVERLAP, rt, fixed),
                tpo_pinned=fixed is not None and fixed.tpo, tpo_chosen=chosen(TPO, rt, fixed))
    for rc in rcs:
        s.d = replace(d, recompute=rc)
        for mode in modes:
            sts = _mode_structures(s, mode, gpus)
            if sts:
                _search_mode(s, mode, sts)
    s.d = d
    if not s.best:
        lines = "; ".join(f"{m}: {why}" for m, why in s.explanations.items())
        raise ParacubeError(
            f"no layout of {gpus} GPUs fits {model.name} (global batch {d.global_batch}): {lines}"
        )
    s.best.sort(key=lambda x: x[0])

    estimates: dict[str, StepEstimate] = {}
    # zero=1's parameter gather overlapped with the next forward where the runtime does it (dimensions.py);
    # priced by `estimate` only (the search's per-configuration zero prices zero=1 as zero=0's all_reduce).
    param_overlap = chosen(PARAM_OVERLAP, rt, fixed)

    def score(lay: Layout) -> StepEstimate:  # a mode's best is often in the ranking too: estimated once
        key = repr(lay)  # every field
        if key not in estimates:
            estimates[key] = estimate(model, training, lay, topo, with_events=False, cache=s.cache,
                                      param_overlap=param_overlap)
        return estimates[key]

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
    if fixed is None or fixed.flash is None:
        # Unfused attention (fa=0) is never faster nor smaller than flash in the model (compute.py: the flash
        # kernel computes the causal half and no s x s traffic; activations.py: no s x s tensors kept), so the
        # search runs with flash; the best layout's fa=0 variant, where it fits, is priced as its runner-up.
        alt = ranked[0][0].with_(flash=0)
        alt_est = score(alt)
        if alt_est.memory.total <= s.mem_cap:
            ranked = sorted([*ranked, (alt, alt_est)], key=lambda r: r[1].step_time_s)
    per_mode = {m: (lay, score(lay)) for m, (_, lay) in s.per_mode_best.items()}
    return SearchResult(ranked, s.scored, s.rejected, per_mode, time.perf_counter() - t0, s.explanations,
                        s.cache.queries, s.pruned)
