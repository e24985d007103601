"""Search every valid layout of N GPUs and rank them by predicted step time (analytic model).

Per mode: structures (tensor shape x dp x pp), then configurations (micro-batch, interleave v for pp > 1,
sequence parallelism for 1d) checked against the size rules (cost_models/validity.py) and device memory
(placement does not change either, so these are checked before placements are expanded), then every
distinct placement. Scoring is vectorized (cost_models.analytic.evaluate). A rejected configuration counts
once per placement of its structure, so `scored + sum(rejected) == enumerated layouts`.
`fixed`: a Layout whose non-default fields (mode and shape, dp, pp, micro_batch, interleave, sp, placement)
every result must match.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from paracube.cost_models.analytic import estimate, evaluate
from paracube.cost_models.comm import axes_used
from paracube.cost_models.compute import gemm_model
from paracube.cost_models.dims import dims_of
from paracube.cost_models.links import LinkCache
from paracube.cost_models.memory import stage_memory, total
from paracube.cost_models.validity import first_violation, rules
from paracube.errors import ParacubeError, check
from paracube.estimate import StepEstimate
from paracube.layout import TENSOR_MODES, Layout
from paracube.planner.enumerate import NO_SHAPE, Structure, divisors, structures
from paracube.workload import ModelSpec, TrainingSpec

KEYS = ("dp", "pp", "t", "q", "d", "mb", "v", "sp")
RUNNABLE_MODES = ("none", "1d", "2d", "3d")  # what paracube.executor implements (pipeline and sp: cost model only)


@dataclass
class SearchResult:
    ranked: list[tuple[Layout, StepEstimate]]
    scored: int
    rejected: Counter
    best_per_mode: dict[str, tuple[Layout, StepEstimate]]
    elapsed_s: float
    explanations: dict[str, str] = field(default_factory=dict)  # per mode with no valid layout: why
    topology_queries: int = 0

    @property
    def layouts_per_s(self) -> float:
        return (self.scored + sum(self.rejected.values())) / max(self.elapsed_s, 1e-9)


def _configs(st: Structure, d_global: int, layers: int, micro_batches: list[int] | None,
             runnable: bool = False) -> list[tuple]:
    per_replica = d_global // st.dp if d_global % st.dp == 0 else 0
    mbs = micro_batches or (divisors(per_replica) if per_replica else [1])
    vs = [v for v in divisors(layers // st.pp)] if st.pp > 1 else [1]
    sps = (0, 1) if st.mode == "1d" and not runnable else (0,)
    q = st.shape[0] if st.shape else 1
    t = int(np.prod(st.shape)) if st.shape else 1
    d = st.shape[2] if st.mode == "2.5d" else 1
    return [(st.dp, st.pp, t, q, d, mb, v, sp) for mb in mbs for v in vs for sp in sps]


def _matches(layout: Layout, fixed: Layout | None) -> bool:
    if fixed is None:
        return True
    base = Layout()
    for name in ("dp", "pp", "micro_batch", "interleave", "sequence_parallel"):
        if getattr(fixed, name) != getattr(base, name) and getattr(fixed, name) != getattr(layout, name):
            return False
    if fixed.mode != "none" and (fixed.mode, fixed.shape) != (layout.mode, layout.shape):
        return False
    return not fixed.placement or fixed.effective_placement == layout.effective_placement


def _layout(st: Structure, row: np.ndarray, place: tuple[tuple[str, int], ...]) -> Layout:
    full = tuple(a for a, _ in place)
    return Layout(
        dp=st.dp,
        pp=st.pp,
        mode=st.mode,
        shape=st.shape,
        placement=full,  # type: ignore[arg-type]
        micro_batch=int(row[5]),
        interleave=int(row[6]),
        sequence_parallel=bool(row[7]),
    )


def search(
    model: ModelSpec,
    training: TrainingSpec,
    topo: object,
    gpus: int,
    modes: list[str] | None = None,
    fixed: Layout | None = None,
    micro_batches: list[int] | None = None,
    top_k: int = 10,
    runnable: bool = False,
) -> SearchResult:
    """Rank every valid layout of `gpus` devices by predicted step time; raise ParacubeError if none fits.
    `runnable`: only layouts paracube's executor runs (RUNNABLE_MODES, pp = 1, no sequence parallelism)."""
    t0 = time.perf_counter()
    check(isinstance(gpus, int) and gpus >= 1, f"gpus={gpus!r} must be a positive integer")
    modes = list(modes or TENSOR_MODES)
    for m in modes:
        check(m in TENSOR_MODES, f"tensor mode {m!r} is not valid; valid: {', '.join(TENSOR_MODES)}")
    if fixed is not None:
        check(
            gpus % fixed.world_size == 0,
            f"fixed layout {fixed} needs a multiple of {fixed.world_size} GPUs; {gpus} is not one",
        )
        if fixed.mode != "none":
            modes = [fixed.mode]
    d = dims_of(model, training)
    g = gemm_model(topo, training.dtype)
    mem_cap = float(topo.device.memory_bytes)  # type: ignore[attr-defined]
    cache = LinkCache(topo)
    rejected: Counter = Counter()
    explanations: dict[str, str] = {}
    best: list[tuple[float, Layout]] = []
    per_mode_best: dict[str, tuple[float, Layout]] = {}
    scored = 0
    for mode in modes:
        sts = structures(mode, gpus, d.L)
        if not sts:
            explanations[mode] = NO_SHAPE.get(mode, "no layout").format(n=gpus)
            continue
        if runnable:
            # The executor does not pad the vocabulary: its vocab split must divide it exactly.
            split = {"1d": lambda st: st.shape[0], "2d": lambda st: st.shape[0], "3d": lambda st: st.shape[0] ** 2}
            sts = [st for st in sts if st.pp == 1 and mode in RUNNABLE_MODES
                   and (mode == "none" or model.vocab % split[mode](st) == 0)]
            if not sts:
                explanations[mode] = (f"paracube's executor does not run {mode}" if mode not in RUNNABLE_MODES else
                                      f"the executor needs vocab {model.vocab} divisible by its vocab split "
                                      "(pad it, e.g. 50304 for GPT-2/3)")
                continue
        if fixed is not None:
            # Filter on the structure first, so the reasons below speak of the layouts asked for.
            sts = [st for st in sts if (not fixed.shape or st.shape == fixed.shape)
                   and (fixed.dp == 1 or st.dp == fixed.dp) and (fixed.pp == 1 or st.pp == fixed.pp)]
            if not sts:
                explanations[mode] = f"no {mode} layout of {gpus} GPUs matches {fixed} (layers % pp, shape)"
                continue
        mode_rules = rules(mode)
        mode_rej: Counter = Counter()
        rows, owners = [], []
        places = {st: st.placements() for st in sts}
        for st in sts:
            for cfg in _configs(st, d.global_batch, d.L, micro_batches, runnable):
                rows.append(cfg)
                owners.append(st)
        a = {k: np.array([r[i] for r in rows], dtype=np.int64) for i, k in enumerate(KEYS)}
        n_places = np.array([len(places[st]) for st in owners])
        viol = first_violation(mode, d, a)
        for i, (text, _) in enumerate(mode_rules):
            cnt = int(n_places[viol == i].sum())
            if cnt:
                mode_rej[text] += cnt
        ok = viol < 0
        # Memory (placement-independent), on the valid configurations.
        idx = np.nonzero(ok)[0]
        sub = {k: v[idx] for k, v in a.items()}
        if len(idx):
            mem = np.maximum(
                total(stage_memory(d, mode, sub, True, False)), total(stage_memory(d, mode, sub, False, True))
            )
            fits = mem <= mem_cap
            over = int(n_places[idx[~fits]].sum())
            if over:
                mode_rej[f"memory > {mem_cap / 2**30:.0f} GiB per device"] += over
            idx = idx[fits]
        # Expand placements and score: per structure, one link row per placement (cached topology queries).
        axes_list = axes_used(mode)
        st_links: dict[Structure, np.ndarray] = {}
        for st in dict.fromkeys(owners[i] for i in idx):  # only structures with a surviving configuration
            st_links[st] = np.array(
                [[cache.get_keyed(k, place, ax) for k, ax in zip(keys, axes_list, strict=True)]
                 for place, keys in places[st]]
            )
        counts = n_places[idx]
        er = np.repeat(idx, counts)
        place_idx = (
            np.concatenate([np.arange(c) for c in counts]) if len(idx) else np.zeros(0, dtype=np.int64)
        )
        link_mat = (
            np.concatenate([st_links[owners[i]] for i in idx])
            if len(idx)
            else np.zeros((0, len(axes_list), 2))
        )
        rejected.update(mode_rej)
        if not len(er):
            top = mode_rej.most_common(2)
            explanations[mode] = "; ".join(f"{r} ({n} layouts)" for r, n in top) or "no configuration"
            continue
        links = {ax: (link_mat[:, n, 0], link_mat[:, n, 1]) for n, ax in enumerate(axes_list)}
        res = evaluate(d, mode, a, links, g, rows=er)
        scored += len(er)
        order = np.argsort(res["step_time"], kind="stable")
        taken = 0
        for j in order:
            st = owners[er[j]]
            place = places[st][place_idx[j]][0]
            lay = _layout(st, ea_row(a, int(er[j])), place)
            if not _matches(lay, fixed):
                continue
            best.append((float(res["step_time"][j]), lay))
            if mode not in per_mode_best:
                per_mode_best[mode] = best[-1]
            taken += 1
            if taken >= top_k:
                break
    if not best:
        lines = "; ".join(f"{m}: {why}" for m, why in explanations.items())
        raise ParacubeError(
            f"no layout of {gpus} GPUs fits {model.name} (global batch {d.global_batch}): {lines}"
        )
    best.sort(key=lambda x: x[0])
    ranked = [
        (lay, estimate(model, training, lay, topo, with_events=False, cache=cache)) for _, lay in best[:top_k]
    ]
    per_mode = {
        m: (lay, estimate(model, training, lay, topo, with_events=False, cache=cache))
        for m, (_, lay) in per_mode_best.items()
    }
    return SearchResult(
        ranked, scored, rejected, per_mode, time.perf_counter() - t0, explanations, cache.queries
    )


def ea_row(ea: dict[str, np.ndarray], j: int) -> np.ndarray:
    return np.array([ea[k][j] for k in KEYS])
