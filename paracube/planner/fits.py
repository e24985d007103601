"""The fit pass of the search: size rules, device memory, the zero stage and kept weights of each configuration
(`_valid`; placement changes none of them). The search's contract (zero=0..3, kw): planner/search.py."""

from __future__ import annotations

from collections import Counter

import numpy as np

from paracube.cost_models.fsdp_units import memory_units, unit_totals
from paracube.cost_models.memory import stage_memory, total, with_zero, zero_shards
from paracube.cost_models.stage_scores import STAGES, stage_flags
from paracube.cost_models.validity import first_violation, rules
from paracube.modes import MODES, LayoutBatch
from paracube.planner.search_state import _Search


def memory_line(cap: float, what: str = "memory") -> str:
    """The rejection line of a memory cap (bytes): whole GiB from 10 GiB on, two digits below (a local rank's
    0.33 GiB is not "0 GiB")."""
    gib = cap / 2**30
    return f"{what} > {gib:.0f} GiB per device" if gib >= 10 else f"{what} > {gib:.2g} GiB per device"


def _valid(s: _Search, mode: str, batch: LayoutBatch, n_places: np.ndarray, rejected: Counter,
           least: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the configurations that pass the size rules and fit in device memory (placement changes
    neither), each one's zero stage (the lowest of `s.zeros` that fits; where that is 0, the configuration again at
    zero=1 where it fits, and at each zero=2/3 as search.py says) and kept weights (kw: 1 where the
    mode keeps weights, the step has several micro-batches and the kept weights fit too, unless pinned);
    each rejection counts once per placement of its structure. `least` (a list): gets, per configuration of
    `batch`, the least peak memory over the zero stages it may take (inf where the rules or the runtime refuse
    it): it fits exactly where that is within s.mem_cap."""
    viol = first_violation(mode, s.d, batch)
    for i, (text, _) in enumerate(rules(mode)):
        cnt = int(n_places[viol == i].sum())
        if cnt:
            rejected[text] += cnt
    idx = np.nonzero(viol < 0)[0]
    low = np.full(len(idx), np.inf)  # the least peak over the stages that may be taken (`least`)
    if least is not None:
        least.append(np.full(len(batch), np.inf))
    if not len(idx):
        return idx, idx, idx
    # each stage where the runtime runs it in this mode, with or without pipelines (`at_depth`: the rows' own pp)
    zeros = [z for z in sorted(s.zeros) if s.runtime.runs(mode, zero=z) or s.runtime.runs(mode, 2, zero=z)]
    if not zeros:  # a pinned zero stage the runtime does not run in this mode
        rejected[f"runtime {s.runtime.name} does not run zero={s.zeros[0]} in {mode}"] += int(n_places[idx].sum())
        return idx[:0], idx[:0], idx[:0]
    sub = batch.take(idx)
    keeps = MODES[mode].keeps_weights
    base_kw = int(keeps and s.kw_pin == 1)

    def mems(kw: int) -> list[dict[str, np.ndarray]]:
        return [stage_memory(s.d, mode, sub, f, h, kw=kw) for f, h in ((True, False), (False, False), (False, True))]

    shards = zero_shards(mode, sub, s.d.cp)  # ranks zero shards the optimizer over (2.5D: dp x depth; dp x cp)
    ones = np.ones_like(sub.dp)

    def peak(ms: list[dict[str, np.ndarray]], z: np.ndarray) -> np.ndarray:  # zero 0 / 1: no unit totals read
        return np.max([total(with_zero(m, shards, z, None, s.d.grad_bytes)) for m in ms], axis=0)

    def high_peak(ms: list[dict[str, np.ndarray]], z: int, rows: np.ndarray) -> np.ndarray:
        """zero=2/3 peak memory of the configurations `rows` (inf elsewhere): their FSDP unit totals
        (fsdp_units.unit_totals, per distinct stage shape) are computed only where a stage 2/3 can be chosen."""
        out = np.full(len(idx), np.inf)
        if not rows.any():
            return out
        part, n = sub.take(rows), shards[rows]
        flags = [stage_flags(st, part.pp) for st in STAGES]  # (first, last) of ms: first, middle (stage 1), last
        if not units:  # zero=2 and 3 ask for the same rows (`zero` is settled by the stages below 2)
            units.extend(memory_units(unit_totals(s.d, mode, part, f, h, n)) for f, h in flags)
        out[rows] = np.max([total(with_zero({k: v[rows] for k, v in m.items()}, n, z, u, s.d.grad_bytes))
                            for m, u in zip(ms, units, strict=True)], axis=0)
        return out

    units: list[tuple[np.ndarray, ...]] = []  # high_peak's unit totals, computed once
    base = mems(base_kw)
    zero = np.full(len(idx), -1)
    tied_pp = s.d.tied & (sub.pp > 1) & s.runtime.tied_pp_zero0  # tied + pp > 1: zero=0 (paracube's executor)
    extra: list[tuple[int, np.ndarray]] = []  # zero=2/3: a configuration of its own where it fits
    runs = np.zeros(len(idx), dtype=bool)  # some allowed stage runs there (memory aside)
    for z in zeros:
        if z and not np.any(shards > 1):
            continue
        at_depth = np.where(sub.pp == 1, s.runtime.runs(mode, zero=z), s.runtime.runs(mode, 2, zero=z))
        ok = ((z == 0) | ((shards > 1) & ~tied_pp)) & at_depth
        # zero=2/3: only where such a stage may be chosen (below: pp = 1, or pipelines no lower stage fits; ok's rows)
        maybe = (shards > 1) & ((sub.pp == 1) | (zero < 0))
        mem = peak(base, z * ones) if z < 2 else high_peak(base, z, maybe)
        if z >= 2:  # zero=2/3 change the step time: the search prices each stage that fits
            # at pp = 1, and with pipelines where the runtime runs them (Runtime.zeros_with_pp; both engines price
            # them, untied: analytic.estimate refuses tied ones); tied embeddings where it runs them at this stage
            tied_ok = s.runtime.runs(mode, zero=z) and (not s.d.tied or s.runtime.runs(mode, zero=z,
                                                                                   tied_embeddings=True))
            piped = z in s.runtime.zeros_with_pp and (not s.d.tied or s.runtime.runs(mode, 2, zero=z,
                                                                                   tied_embeddings=True))
            # with pipelines only where no lower allowed stage fits: zero=2 there sends zero=1's bytes and keeps
            # unsharded fp32 gradient buffers (data_parallel/sharded.py), zero=3 adds 2 N gathers per unit for its
            # parameter memory; so the search grows by the configurations that need them only
            ok = (shards > 1) & (((sub.pp == 1) & tied_ok) | ((sub.pp > 1) & piped & (zero < 0)))
            extra.append((z, (mem <= s.mem_cap) & ok))
        else:
            fit = (mem <= s.mem_cap) & ok
            if z == 1:  # beside a zero=0 that fits, zero=1 is a configuration of its own: its optimizer step on a shard
                extra.append((1, fit & (zero == 0) & (shards > 1)))  # is faster, its gather after it may be slower
            zero = np.where((zero < 0) & fit, z, zero)
        low = np.minimum(low, np.where(ok, mem, np.inf))
        runs = runs | ok
    if least is not None:
        least[-1][idx] = low
    unrun = ~runs if min(zeros) >= 2 else np.zeros(len(idx), dtype=bool)  # only zero=2/3 allowed, none runs
    if unrun.any():
        pps = "" if any(z in s.runtime.zeros_with_pp for z in zeros) else ", pp=1"  # where it runs them (above)
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
        rejected[memory_line(s.mem_cap)] += over
    low = zero >= 0
    out_idx = [idx[low]] + [idx[f] for _, f in extra]
    out_zero = [zero[low]] + [np.full(int(f.sum()), z) for z, f in extra]
    out_kw = [kw[low]] + [kw[f] for _, f in extra]
    return np.concatenate(out_idx), np.concatenate(out_zero), np.concatenate(out_kw)
