"""The scoring pass of the search: per mode, every valid configuration on every distinct placement in vectorized
batches (analytic.evaluate), pruned exactly by the lower bound (`_within_bound`), its best `top_k` kept.
The search's contract: planner/search.py."""

from __future__ import annotations

import math
from collections import Counter
from itertools import chain

import numpy as np

from paracube.cost_models.analytic_scores import evaluate
from paracube.cost_models.comm_axes import axes_used
from paracube.cost_models.score_bounds import compute_lower_bound, step_lower_bound
from paracube.modes import MODES, LayoutBatch
from paracube.planner.bars import _bar, _cp1_best, _kth
from paracube.planner.configs import _configs
from paracube.planner.enumerate import Structure
from paracube.planner.offload_passes import valid
from paracube.planner.search_state import Placements, _layout, _matches, _Search


def _structure_links(s: _Search, mode: str, owners: list[Structure], places: dict[Structure, Placements]
                     ) -> dict[Structure, np.ndarray]:
    """[placements, axes, (bw, lat)] per structure of `owners` (cached topology queries; each structure's array
    built once per search: its recomputation passes share it; read only)."""
    axes_list = axes_used(mode, cp=s.d.cp > 1)
    cp = s.d.cp > 1
    new = [st for st in dict.fromkeys(owners) if (st, cp) not in s.links]
    keyed, n_axes = s.cache.keyed, len(axes_list)
    flat = {st: [k for _, keys in places[st] for k in keys] for st in new}  # placement-major, axes minor
    # every new query of these structures at once (cost_models/links.py: LinkCache.prefetch)
    s.cache.prefetch((k, place, ax) for st in new for place, keys in places[st]
                     for ax, k in zip(axes_list, keys, strict=True) if k not in keyed)
    for st in new:  # the (bw, lat) floats as they are (fromiter: no tuple-by-tuple array conversion)
        pairs = chain.from_iterable(map(keyed.__getitem__, flat[st]))
        s.links[st, cp] = np.fromiter(pairs, dtype=np.float64, count=2 * len(flat[st])).reshape(
            len(places[st]), n_axes, 2)
    return {st: s.links[st, cp] for st in dict.fromkeys(owners)}


def _distinct_links(s: _Search, st: Structure, links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first placement of each distinct row of `links` ([placements, axes, (bw, lat)]), each placement's
    distinct row): placements whose groups see the same links on every axis set score alike (once per search)."""
    key = (st, s.d.cp > 1)
    if key not in s.distinct:
        _, first, inverse = np.unique(links.reshape(len(links), -1), axis=0, return_index=True, return_inverse=True)
        s.distinct[key] = (first, inverse.reshape(-1))
    return s.distinct[key]


def _within_bound(s: _Search, mode: str, batch: LayoutBatch, owners: list[Structure],
                  places: dict[Structure, Placements], st_links: dict[Structure, np.ndarray],
                  zero: np.ndarray | None, kw: np.ndarray, overlap: np.ndarray, tpo: np.ndarray,
                  high: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(which configurations, their lower bounds, whether the pins allow them). Which configurations of
    `batch` may still hold one of the best `top_k` layouts of the search, or the mode's best: those whose lower
    bound over all placements (analytic.step_lower_bound on each axis set's best link over the structure's
    placements) is within the larger of the top_k-th best step time (the layouts kept by earlier passes and
    modes, and the configurations' first placements) and the mode's best so far (real layouts the pins allow,
    so the bar is met). Exact: no layout skipped here beats the top_k that scoring the rest finds, nor the
    mode's best; it spares the placements of configurations that lose whatever their placement. In a cp=1 pass
    the bar is also at least the best cp=1 step time so far, so that the best cp=1 layout stays too (a cp > 1
    layout's runner-up). `high`: the zero=2/3 configurations, which this single evaluation prices as zero=0
    (not their step time): they set no bar and are bounded by their compute, in-line communication and
    optimizer step only (analytic.compute_lower_bound; _staged_times bounds them again)."""
    n = len(batch)
    best = {st: np.stack([m[:, :, 0].max(axis=0), m[:, :, 1].min(axis=0)], axis=1) for st, m in st_links.items()}
    # One evaluation: each configuration on its first placement's links (not the zero=2/3 ones: they set no bar),
    # then on its structure's best links. Elementwise per row: the rows left out change no other row.
    low = np.arange(n) if high is None else np.nonzero(~high)[0]
    if not s.mode_bests and max(_kth(s), _cp1_best(s, np.zeros(0))) < np.inf:
        # Without mode bests, once top_k layouts are kept the first placements only lower a bar that is already
        # finite: not evaluated (a higher bar prunes less; measured: fewer rows cost less than the few more kept)
        low = low[:0]
    m = len(low)
    mat = np.array([st_links[owners[i]][0] for i in low.tolist()] + [best[st] for st in owners])
    links = {ax: (mat[:, k, 0], mat[:, k, 1]) for k, ax in enumerate(axes_used(mode, cp=s.d.cp > 1))}
    rows = np.concatenate([low, np.arange(n)])
    res = evaluate(s.d, mode, batch, links, s.g, rows=rows, zero=zero, overlap=overlap[rows], kw=kw, tpo=tpo[rows],
                   memory=False)  # memory: checked by _valid
    found = np.full(n, np.inf)
    found[low] = res.step_time[:m]
    allowed = np.ones(n, dtype=bool)
    if s.fixed is not None:  # the bar counts only layouts the pins allow (no placement pin: any placement)
        allowed = np.array([_matches(_layout(st, batch.row(i), places[st][0][0]), s.fixed)
                            for i, st in enumerate(owners)], dtype=bool)
        found = np.where(allowed, found, np.inf)
    bar = _bar(s, mode, found)
    st = s.g.straggler  # the step's wait for its slowest replica (stragglers.py): the bounds carry it
    bound = step_lower_bound(res, s.d, batch, rows, overlap[rows], s.g.ranks_per_core, st)[m:]
    if high is not None and np.any(high):
        bound = np.where(high, compute_lower_bound(res, s.d, batch, rows, s.g.ranks_per_core, st)[m:], bound)
    return bound <= bar * (1 + 1e-9), bound, allowed  # the bar's own configuration stays despite rounding


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


def _search_mode(s: _Search, mode: str, sts: list[Structure],
                 pending: tuple[list[tuple[int, ...]], list[Structure]] | None = None) -> None:
    """Score every valid layout of one mode and keep its best `top_k` (matching `fixed`); `pending`: on an
    offloading ladder's pass, the configurations to look at instead (offload_passes.pending_configs)."""
    owners: list[Structure] = []
    rows: list[tuple[int, ...]] = []
    if pending is not None:
        rows, owners = pending
        sts = list(dict.fromkeys(owners))
    places = {st: st.placements() for st in sts}
    for st in sts if pending is None else []:
        cfgs = _configs(st, s.d.global_batch, s.d.L, s.micro_batches, s.fixed, s.runtime)
        rows.extend(cfgs)
        owners.extend([st] * len(cfgs))
    counts = [len(places[st]) for st in owners]  # each configuration's placements (its structure's)
    batch = LayoutBatch.of_rows(rows)
    n_places = np.array(counts, dtype=np.int64)
    mode_rej: Counter = Counter()
    prunes = s.prune and (s.fixed is None or not s.fixed.placement)
    idx, zeros, kws = valid(s, mode, batch, owners, n_places, mode_rej)  # fits._valid, less what offloading skips
    s.rejected.update(mode_rej)
    # From here on only the valid configurations: `batch`, `owners`, `n_places`, `zeros`, `kws` are theirs.
    batch, owners, n_places = batch.take(idx), [owners[i] for i in idx], n_places[idx]
    n_valid = len(batch)
    st_links = _structure_links(s, mode, owners, places)
    zero_arg = zeros if s.zeros != (0,) else None
    ovs, tpos = _overlaps(s, mode, batch)
    # zero=2/3: `overlap` = each unit's reduce-scatter asynchronous under the backward (fsdp_overlap.py)
    # zero=2/3 rows are priced exactly only with their own stage (_evaluate): the bound's single evaluation
    # prices them as zero=0, so they are pruned by their compute and in-line communication (the zero=0/1 rows by
    # their bound), and again against the zero=0/1 layouts once those are scored (_staged_times).
    bound = allowed = None
    if prunes and len(batch):
        keep, bound, allowed = _within_bound(s, mode, batch, owners, places, st_links, zero_arg, kws, ovs, tpos,
                                             high=zeros >= 2)
        s.pruned += int(n_places[~keep].sum())
        kept = np.nonzero(keep)[0]
        batch, owners, n_places, zeros, kws, ovs, tpos, bound, allowed = (
            batch.take(kept), [owners[i] for i in kept], n_places[kept], zeros[kept], kws[kept], ovs[kept],
            tpos[kept], bound[kept], allowed[kept])
    keep, step_time = _staged_times(s, mode, batch, owners, st_links, zeros, kws, ovs, tpos, bound, allowed)
    if not keep.all():  # zero=2/3 configurations the zero=0/1 layouts scored first beat (_staged_times)
        s.pruned += int(n_places[~keep].sum())
        kept = np.nonzero(keep)[0]
        batch, owners, n_places, zeros, kws, ovs, tpos = (batch.take(kept), [owners[i] for i in kept],
                                                          n_places[kept], zeros[kept], kws[kept], ovs[kept],
                                                          tpos[kept])
    if not len(batch):  # (without mode bests, a mode the bar prunes whole has valid layouts: nothing to explain)
        if (s.mode_bests or not n_valid) and not s.offload:  # an offloading pass: its first pass's explanation stands
            top = mode_rej.most_common(2)
            s.explanations[mode] = "; ".join(f"{r} ({n} layouts)" for r, n in top) or "no configuration"
        return
    layout_rows = np.repeat(np.arange(len(batch)), n_places)  # each configuration once per placement
    place_idx = np.concatenate([np.arange(c) for c in n_places])
    s.scored += len(layout_rows)
    taken = 0
    bar = _kth(s)  # slower layouts cannot enter the ranking: built only for the mode's best (per_mode_best)
    twins: set[tuple[int, int]] = set()  # (configuration, distinct link row) already ranked: _distinct_links
    for j in np.argsort(step_time, kind="stable"):
        if taken and step_time[j] > bar:
            break
        row = int(layout_rows[j])
        st = owners[row]
        lay = _layout(st, batch.row(row), places[st][place_idx[j]][0], int(zeros[row]),
                      s.d.recompute if s.rc_pin and not s.by_modules else None, bool(ovs[row]), int(kws[row]),
                      s.fixed.flash if s.fixed else None, bool(tpos[row]), s.fixed.shard if s.fixed else None,
                      s.d.cp_comm, s.offload, s.d.recompute_modules if s.d.recompute == "selective" else None)
        if not _matches(lay, s.fixed):
            continue
        # a layout no faster than the same layout found by an earlier recomputation pass (the passes go from the
        # least re-run to the most: none, selective, the rcm= rungs, full) re-runs work for memory it does not need:
        # not ranked (a heavier recomputation is ranked where it buys a fit; selective's attention core is free
        # beside fused attention in paracube's runtime, and was ranked twice, as rc=none and rc=selective)
        same = repr(lay.with_(recompute=None, recompute_modules=None))
        if s.ranked_as.get(same, math.inf) <= float(step_time[j]) * (1.0 + 1e-12):
            continue
        s.ranked_as[same] = min(s.ranked_as.get(same, math.inf), float(step_time[j]))
        # another placement of a ranked configuration whose groups see the same links on every axis set is the same
        # layout to the cost models (the same estimate, search.score): ranked once, at the first placement (the
        # default where it is one of them); a placement that changes the links, and so the time, is still ranked
        twin = (row, int(_distinct_links(s, st, st_links[st])[1][place_idx[j]]))
        if twin in twins:
            continue
        twins.add(twin)
        s.best.append((float(step_time[j]), lay))
        if mode not in s.per_mode_best or s.best[-1][0] < s.per_mode_best[mode][0]:
            s.per_mode_best[mode] = s.best[-1]
        taken += 1
        if taken >= s.top_k:
            break
    if not taken:  # layouts fit, but only ones the pins exclude (e.g. with sp where sp=0 is pinned)
        top = mode_rej.most_common(2)
        s.explanations[mode] = "; ".join(f"{r} ({n} layouts)" for r, n in top) or f"no layout matches {s.fixed}"


def _staged_times(s: _Search, mode: str, batch: LayoutBatch, owners: list[Structure],
                  st_links: dict[Structure, np.ndarray], zeros: np.ndarray, kws: np.ndarray, ovs: np.ndarray,
                  tpos: np.ndarray, bound: np.ndarray | None, allowed: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(which configurations of `batch` stay, the step time of each on each placement, as _placement_times, of
    those that stay). Scored in stages, as evaluate prices them apart (_evaluate): zero=0/1, then each zero=2/3
    stage. `bound` (pruning; None: every configuration stays): before a zero=2/3 stage, its configurations whose
    lower bound (compute_lower_bound) exceeds the bar the layouts scored so far set (as _within_bound's, over
    the layouts the pins allow: `allowed`) are dropped. Exact as _within_bound is: the bar is the top_k-th best,
    the mode's best or the best cp=1 step time of real layouts, which a dropped configuration cannot beat."""
    n_places = np.array([len(st_links[st]) for st in owners], dtype=np.int64)
    keep = np.ones(len(batch), dtype=bool)
    times: list[np.ndarray | None] = [None] * len(batch)
    found: list[np.ndarray] = []
    for sel in [zeros < 2, *(zeros == z for z in sorted(set(zeros[zeros >= 2].tolist())))]:
        if bound is not None and allowed is not None and found:
            f = np.concatenate(found)
            bar = _bar(s, mode, f)
            keep &= ~(sel & (bound > bar * (1 + 1e-9)))
            sel = sel & keep
        idx = np.nonzero(sel)[0]
        if not len(idx):
            continue
        sub = zeros[idx]
        t = _placement_times(s, mode, batch.take(idx), [owners[i] for i in idx], st_links, sub,
                             sub if s.zeros != (0,) else None, kws[idx], ovs[idx], tpos[idx])
        counts = n_places[idx]
        for i, part in zip(idx.tolist(), np.split(t, np.cumsum(counts)[:-1]), strict=True):
            times[i] = part
        if allowed is not None:  # each configuration's distinct placements only: its twins are not ranked (above)
            reps = np.concatenate([_representatives(s, owners[i], st_links) for i in idx.tolist()])
            found.append(np.where(np.repeat(allowed[idx], counts) & reps, t, np.inf))
    parts = [times[i] for i in np.nonzero(keep)[0].tolist()]
    return keep, np.concatenate(parts) if parts else np.zeros(0)


def _representatives(s: _Search, st: Structure, st_links: dict[Structure, np.ndarray]) -> np.ndarray:
    """Per placement of `st`, whether it is the first of those whose links are equal (the one the ranking keeps)."""
    first, _ = _distinct_links(s, st, st_links[st])
    rep = np.zeros(len(st_links[st]), dtype=bool)
    rep[first] = True
    return rep


def _placement_times(s: _Search, mode: str, batch: LayoutBatch, owners: list[Structure],
                     st_links: dict[Structure, np.ndarray], zeros: np.ndarray, zero_arg: np.ndarray | None,
                     kws: np.ndarray, ovs: np.ndarray, tpos: np.ndarray) -> np.ndarray:
    """Step time of each configuration of `batch` on each placement of its structure (configurations in order,
    then placements). Placements enter a step time only through their links: each configuration is evaluated
    once per distinct link row of its structure (_distinct_links; evaluate is elementwise per layout, so these
    are the floats every placement's own evaluation gives) and the times are spread to its placements."""
    distinct = {st: _distinct_links(s, st, st_links[st]) for st in dict.fromkeys(owners)}
    n_distinct = np.array([len(distinct[st][0]) for st in owners])
    link_mat = np.concatenate([st_links[st][distinct[st][0]] for st in owners])
    links = {ax: (link_mat[:, k, 0], link_mat[:, k, 1]) for k, ax in enumerate(axes_used(mode, cp=s.d.cp > 1))}
    per_distinct = _evaluate(s, mode, batch, links, np.repeat(np.arange(len(batch)), n_distinct), zeros, zero_arg,
                             kws, ovs, tpos)
    start = np.cumsum(n_distinct) - n_distinct
    n_places = np.array([len(st_links[st]) for st in owners])
    return per_distinct[np.repeat(start, n_places) + np.concatenate([distinct[st][1] for st in owners])]


def _evaluate(s: _Search, mode: str, batch: LayoutBatch, links: dict, rows: np.ndarray, zeros: np.ndarray,
              zero_arg: np.ndarray | None, kws: np.ndarray, ovs: np.ndarray, tpos: np.ndarray) -> np.ndarray:
    """Step time per layout: zero=0/1 rows in one evaluation (the same time: search docstring), each zero=2/3
    stage in its own (its per-unit traffic is priced for one zero stage at a time: comm.StepTraffic)."""
    high = zeros[rows] >= 2
    if not np.any(high):
        return evaluate(s.d, mode, batch, links, s.g, rows=rows, zero=zero_arg, overlap=ovs[rows], kw=kws,
                        tpo=tpos[rows], memory=False).step_time
    out = np.zeros(len(rows))
    for z in [None, *sorted(set(zeros[zeros >= 2].tolist()))]:
        sel = ~high if z is None else zeros[rows] == z
        if not np.any(sel):
            continue
        sub = {ax: (bw[sel], lat[sel]) for ax, (bw, lat) in links.items()}
        # only this zero stage's configurations are evaluated (per-configuration quantities are elementwise)
        cfg, sub_rows = np.unique(rows[sel], return_inverse=True)
        arg = (np.where(zeros >= 2, 0, zeros)[cfg] if zero_arg is not None else None) if z is None else int(z)
        out[sel] = evaluate(s.d, mode, batch.take(cfg), sub, s.g, rows=sub_rows.reshape(-1), zero=arg,
                            overlap=ovs[rows[sel]], kw=kws[cfg], tpo=tpos[rows[sel]],
                            fsdp_prefetch=s.fsdp_prefetch and z is not None, memory=False).step_time
    return out
