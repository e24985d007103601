"""The search of a model with MoE blocks (or MLA): expert x tensor x pipeline x data layouts, each priced by
`estimate` (cost_models/moe.py added to the dense part).

Why not the vectorized search (search.py): its LayoutBatch has no expert axes, and the MoE terms depend on the
folded expert groups' placement (in-node or not) and the per-stage expert memory, which `estimate` prices for
one layout. The space is small: tensor modes none / 1d (the modes that fold, Layout), t <= the GPUs of a node,
cp as the dense search takes it (enumerate.context_degrees: long sequences only; each exchange the runtime runs
the model's attention with, written as cpc=), pp with a valid block split, dp
the rest, ep among the divisors of the experts that divide dp cp t, etp in {1, t}
(Megatron-core's etp = 1 or tp; torchtitan's the same) where the runtime runs it, mb in {1, 2}, each of the
runtime's searched zero stages (searched_zeros: 0 and its first sharding one) it runs the layout at and that fits
(zero=1 shards the optimizer step and gathers the parameters after it: either may be the faster; torchtitan runs ep
over dp at zero=3 only), sp with tp > 1 where the runtime runs it, the gradient overlap as the runtime
does it by default, and a2ao (dimensions.A2AO) where chosen and the runtime runs it on the layout; v = 1, then
the interleaved variants (v > 1) of the pipelines that fit, where the runtime interleaves (`interleaved`: those
whose lower bound beats the ranking's last), and the rcm= ladder where its bound does too (`search_experts`).
Every layout a phase may price (the candidates at each zero stage, the ladder's rungs of those the bar keeps, the
interleaved variants of each fitted pipeline) is added to one estimate_batch.Batch beforehand: the dense parts of
alike layouts in one vectorized evaluation, each finished with its expert terms when `price` asks for it (the same
estimate as analytic.estimate, tests/test_search_speed.py). DeepSeek-V3 on 1024 H100s (batch 512): 2,578 layouts
scored in 5.9 s (16.0 s priced one by one), 210 pruned.
Pins of `fixed` (dp, pp, v, tp, cp, cpc, ep, etp, mb, zero, rc, rcm, fa, a2ao, overlap=0, tpo) are respected (a
pinned v the only one; tpo where a tensor group with sp runs it, as the dense search takes it; not searched
unpinned); search.py refuses the pins this search does not price (place=; tpo with MLA) in one line rather than
drop them. The dimensions ep / etp are declared in dimensions.py (EP, ETP).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

from paracube.cost_models.analytic import estimate
from paracube.cost_models.estimate_batch import Batch
from paracube.cost_models.links import LinkCache
from paracube.cost_models.pipeline_replay import uneven
from paracube.cost_models.validity import RuleError
from paracube.engine_options import EngineOptions
from paracube.errors import ParacubeError, divisors
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.modes import MODES
from paracube.modes.stages import split_ok
from paracube.planner.dimensions import A2AO, CPC, EP, ETP, chosen, values
from paracube.planner.enumerate import context_degrees, cp_unsearched
from paracube.planner.fits import memory_line
from paracube.planner.module_ladder import ladder, module_rungs
from paracube.runtimes import Runtime
from paracube.workload import ModelSpec, TrainingSpec


def _divisors(n: int) -> list[int]:
    return divisors(n, most=n) or []


def candidates(model: ModelSpec, training: TrainingSpec, gpus: int, per_node: int, rt: Runtime,
               fixed: Layout | None, micro_batches: list[int] | None) -> list[Layout]:
    moe = model.moe
    experts = moe.experts if moe is not None else 1
    # The modes that fold (Layout: whole-token tensor groups), as the runtime runs them; a pinned tp= only.
    modes = [m for m, spec in MODES.items() if spec.context_parallel and m in rt.modes
             and (fixed is None or not fixed.shape or fixed.mode == m)]
    eps, etps = values(EP, rt, fixed), values(ETP, rt, fixed)
    a2ao = chosen(A2AO, rt, fixed)  # where the runtime runs it on the layout (Runtime.a2a_overlap_refusal)
    # cp as the dense search takes it (enumerate.context_degrees: the pin, else 1 and, for long sequences where
    # the runtime runs cp, the powers of two that leave >= MIN_CP_TOKENS per rank); the experts fold over dp x cp x t.
    # Each degree > 1 with each exchange the runtime runs the model's attention with (the pin, else every one it
    # offers; windowed models: Runtime.window_cp_comms), written into the layout: an unpinned cpc is priced as the
    # ring (modes/context.DEFAULT_COMM), which torchtitan and windowed Megatron-core do not run.
    cpcs = cp_exchanges(model, rt, fixed)
    cps = context_degrees(training.sequence_length(model), gpus, fixed.cp if fixed is not None else 1, bool(cpcs))
    off = fixed is not None and fixed.forbid_overlap  # overlap=0: the gradients reduced after the backward
    tpo = fixed is not None and fixed.tpo
    out = []
    for mode, cp in ((m, c) for m in modes for c in cps):
        shapes = MODES[mode].shapes(min(gpus // cp, per_node)) if MODES[mode].axes else [()]
        for shape in shapes:
            t = math.prod(shape) if shape else 1
            if gpus % (t * cp) or model.heads % t or (fixed is not None and fixed.shape and fixed.tensor_size != t):
                continue
            for pp in _divisors(gpus // (t * cp)):
                v = fixed.interleave if fixed is not None and rt.interleave and pp > 1 else 1
                if not (pp == 1 or rt.pipeline) or not split_ok(model.layers, pp, v):
                    continue
                dp = gpus // (t * cp * pp)
                if (fixed is not None and ((fixed.dp > 1 and fixed.dp != dp) or (fixed.pp > 1 and fixed.pp != pp))
                        or training.global_batch % dp):
                    continue
                mbs = micro_batches or [mb for mb in (1, 2) if (training.global_batch // dp) % mb == 0]
                if fixed is not None and fixed.micro_batch:
                    mbs = [fixed.micro_batch]
                sp = (t > 1 and MODES[mode].sequence_parallel and rt.sequence_parallel
                      and not (fixed is not None and fixed.forbid_sp))
                for ep in eps:
                    for etp in etps:
                        if experts % int(ep) or (dp * cp * t) % (int(ep) * int(etp)) or int(etp) not in (1, t):
                            continue
                        if moe is None and int(ep) * int(etp) > 1:
                            continue
                        for mb, cpc in ((m, c) for m in mbs for c in (cpcs if cp > 1 else [None])):
                            lay = Layout(dp=dp, pp=pp, cp=cp, mode=mode, shape=shape, micro_batch=mb,
                                         interleave=v, sequence_parallel=sp, ep=int(ep), etp=int(etp),
                                         overlap=dp > 1 and rt.overlaps_grad(pp) and not off,
                                         tpo=tpo and sp,  # pinned: where a tensor group with sp runs it (as search.py)
                                         cp_comm=cpc,
                                         flash=fixed.flash if fixed is not None else None,
                                         recompute=fixed.recompute if fixed is not None else None,
                                         recompute_modules=fixed.recompute_modules if fixed is not None else None)
                            on = replace(lay, a2ao=True) if a2ao else lay
                            out.append(on if a2ao and not rt.a2a_overlap_refusal(on, training.dtype) else lay)
    return out


def searched_zeros(rt: Runtime) -> list[int]:
    """The zero stages the search prices each layout at: none, and the first sharding stage the runtime runs, without
    and with pipelines (zero=1 where it has it; torchtitan's FSDP: zero=3, and zero=1 with pipelines); a layout is
    priced at those its pipeline depth runs (`_runs`)."""
    firsts = {min((z for z in zs if z > 0), default=0) for zs in (rt.zeros, rt.zeros_with_pp)} - {0}
    return [z for z in rt.all_zeros if z == 0] + sorted(firsts)


def cp_exchanges(model: ModelSpec, rt: Runtime, fixed: Layout | None) -> list[str]:
    """The context-parallel exchanges searched (the pin, else each the runtime runs the model's attention with; the
    dense search's rule, search.py)."""
    return [str(c) for c in values(CPC, rt, fixed) if c in rt.cp_comms_for(model.sliding_window is not None)]


def experts_unsearched(model: ModelSpec, training: TrainingSpec, gpus: int, rt: Runtime, fixed: Layout | None,
                       micro_batches: list[int] | None) -> dict[str, str]:
    """The parts whose other values this search does not enumerate though a layout may take them, with why
    (SearchResult.unsearched): flash attention, the default placement, the micro-batches 1 and 2 (unless the caller
    lists them), the runtime's zero stages beyond searched_zeros (unless pinned) and cp as the dense search takes
    it."""
    out = {"attention": "flash attention only: fa=0 is never faster nor smaller in the model",
           "placement": "the default placement only"}
    if micro_batches is None:
        out["mb"] = "micro-batches of 1 and 2 sequences; --layout mb=N prices another"
    searched = searched_zeros(rt)
    others = [z for z in rt.all_zeros if z not in searched]
    if others and not (fixed is not None and (fixed.zero or fixed.forbid_zero)):
        out["zero"] = (f"zero={'/'.join(map(str, searched))} only; --layout zero=N prices "
                       f"{' or '.join(f'zero={z}' for z in others)}")
    why = cp_unsearched(training.sequence_length(model), gpus, fixed, bool(cp_exchanges(model, rt, fixed)))
    return out | ({"cp": why} if why else {})


class ExpertsResult(NamedTuple):
    ranked: list[tuple[Layout, StepEstimate]]  # the best top_k, fastest first
    scored: int
    rejected: Counter  # by reason
    pruned: int
    per_mode: dict[str, tuple[Layout, StepEstimate]]  # each tensor mode's best (exact with mode_bests)


def search_experts(model: ModelSpec, training: TrainingSpec, topo: object, gpus: int, rt: Runtime,
                   fixed: Layout | None, micro_batches: list[int] | None, mem_cap: float, top_k: int,
                   options: EngineOptions | None = None, mode_bests: bool = False) -> ExpertsResult:
    """The ranked (layout, estimate) pairs, layouts scored, rejections by reason, layouts pruned and each tensor mode's
    best; `options`: analytic.estimate's (the runtime's engine options, the run's gradient element and bucket:
    search.py); `mode_bests`: no layout that may beat its tensor mode's best so far is pruned (`compare`'s table).
    Pruned: a layout refused for memory at every zero stage climbs the rcm= ladder (module_ladder.ladder) only where
    its lower bound beats the ranking's last so far: modules re-run work and save none, so its step at a zero stage is
    at least that stage's step without them, less the whole bubble where interleaving may follow (`interleaved`);
    none is pruned where a2ao is chosen (interleaving may turn it on)."""
    per_node = int(getattr(topo, "devices_per_node", None) or gpus)
    cache = LinkCache(topo)
    pinned_zero = fixed is not None and (fixed.zero or fixed.forbid_zero)
    zeros = [fixed.zero] if pinned_zero else searched_zeros(rt)
    rejected: Counter = Counter()
    fits: list[tuple[Layout, StepEstimate]] = []
    scored = 0
    rungs = module_rungs(model, training, rt, fixed)

    memory = memory_line(mem_cap)  # the dense search's line (fits._valid)
    least: list[tuple[float, Layout]] = []  # the least memory of a layout refused for it (the no-fit message)

    def price(zl: Layout) -> StepEstimate | None:
        nonlocal scored
        try:  # from the batch where it was added (`prefetch`), else here (and refused with its reason)
            est = batch.estimate(zl) or estimate(model, training, zl, topo, with_events=False, cache=cache,
                                                 options=options)
        except RuleError as e:  # counted by rule (every layout, and a cp rank's sequence, names its own message)
            rejected["; ".join(e.rules)] += 1
            return None
        except ParacubeError as e:  # counted by the message less its layout
            rejected[str(e).removeprefix(f"layout {zl}: ")] += 1
            return None
        scored += 1
        return est

    interleaves = rt.interleave and (fixed is None or (fixed.interleave <= 1 and not fixed.forbid_interleave))
    # (lower bound, layout, its least memory, its least parameters + gradients + optimizer state)
    pending: list[tuple[float, Layout, tuple[float, Layout], float, list[int]]] = []  # + the zero stages it runs at
    layouts = candidates(model, training, gpus, per_node, rt, fixed, micro_batches)
    # The layouts each phase below may price, added to one batch beforehand (estimate_batch.Batch: their dense parts
    # in a few vectorized evaluations, each finished when `price` asks for it: the same results as estimate).
    batch = Batch(model, training, topo, cache, options)

    def prefetch(more: list[Layout]) -> None:
        batch.add([zl for zl in more if _runs(zl, rt, model, training)])

    prefetch([replace(lay, zero=z) for lay in layouts for z in zeros])
    for lay in layouts:
        memory_only = True  # refused at every zero stage it runs at for memory alone: the rcm ladder's candidates
        over: tuple[float, Layout] | None = None
        low = static = math.inf
        # the zero stages the runtime runs it at: a refusal may be one stage's (torchtitan folds experts over
        # dp_shard, so ep over dp needs FSDP), counted where it runs at none
        runs = [z for z in zeros if _runs(replace(lay, zero=z), rt, model, training)]
        if not runs:
            zl = replace(lay, zero=zeros[0])
            rejected[rt.refusal(zl, model.family, model.tied_embeddings, training.dtype, moe=model.moe is not None,
                                windowed=model.sliding_window is not None, sinks=model.attention_sinks,
                                model=model)] += 1
            continue
        for z in runs:
            zl = replace(lay, zero=z)
            est = price(zl)
            if est is None:
                memory_only = False
                break
            if est.memory.total <= mem_cap:  # each zero stage that fits: neither is the faster everywhere (zero=1
                fits.append((zl, est))       # shards the optimizer step, and gathers the parameters after it)
                memory_only = False
                continue
            rejected[memory] += 1
            over = min(over or (est.memory.total, zl), (est.memory.total, zl), key=lambda m: m[0])
            low = min(low, est.step_time_s - (est.bubble_time_s if interleaves and lay.pp > 1 else 0.0))
            static = min(static, est.memory.parameters + est.memory.gradients + est.memory.optimizer)
        if memory_only and over is not None:
            pending.append((low, lay, over, static, runs))
    a2ao, pruned = chosen(A2AO, rt, fixed), 0
    bars = _Bars(fits, top_k)

    def may_beat(low: float, lay: Layout) -> bool:  # its lower bound beats the bar (none is pruned under a2ao)
        return a2ao or low < bars.bar(lay.mode if mode_bests else None)

    if rungs:  # the ladder's probes of every layout the bar so far (it only falls) leaves it (module_ladder.ladder)
        prefetch([replace(lay, zero=z, recompute=None, recompute_modules=r) for low, lay, _, static, runs in pending
                  if may_beat(low, lay) and static <= mem_cap for z in runs for r in rungs])
    for low, lay, over, static, runs in sorted(pending, key=lambda p: p[0]):
        if rungs and not may_beat(low, lay):
            pruned += 1
            rejected[memory] -= len(runs)
            continue
        # a rung re-runs modules to drop activations: the weights, gradients and optimizer state stay, so where they
        # alone exceed the cap at every zero stage no rung fits (nothing priced)
        saved = ladder(lay, runs, rungs, price, mem_cap) if rungs and static <= mem_cap else []
        fits += saved
        bars.add(saved)
        rejected[memory] -= len(runs) * bool(saved)  # refused only where no rung fits it (as offloading's)
        if not saved and (not least or over[0] < least[0][0]):
            least[:] = [over]
    if interleaves:
        fits += interleaved(model, training, rt, fits, price, mem_cap, top_k, zeros, a2ao, rungs, mode_bests,
                            prefetch)
    if least and rejected[memory] > 0:  # the closest miss, so a user sees how far off the fit is
        rejected[f"{memory} (the least: {least[0][0] / 2**30:.1f} GiB, {least[0][1]})"] = rejected.pop(memory)
    fits.sort(key=lambda r: r[1].step_time_s)
    per_mode: dict[str, tuple[Layout, StepEstimate]] = {}
    for lay, est in fits:
        per_mode.setdefault(lay.mode, (lay, est))
    return ExpertsResult(fits[:top_k], scored, +rejected, pruned, per_mode)


class _Bars:
    """The step a layout must beat to enter the ranking, kept as layouts are found: the top_k-th best so far (inf
    with fewer) and, asked for a mode (mode_bests), at least that mode's best so far (inf with none)."""

    def __init__(self, fits: list[tuple[Layout, StepEstimate]], top_k: int) -> None:
        self.top_k, self.best, self.modes = top_k, [], {}
        self.add(fits)

    def add(self, found: list[tuple[Layout, StepEstimate]]) -> None:
        self.best = sorted([*self.best, *(e.step_time_s for _, e in found)])[:self.top_k]
        for lay, e in found:
            self.modes[lay.mode] = min(self.modes.get(lay.mode, math.inf), e.step_time_s)

    def bar(self, mode: str | None = None) -> float:
        bar = self.best[-1] if len(self.best) >= self.top_k else math.inf
        return max(bar, self.modes.get(mode, math.inf)) if mode is not None else bar


def interleaved(model: ModelSpec, training: TrainingSpec, rt: Runtime, fits: list[tuple[Layout, StepEstimate]],
                price: Callable[[Layout], StepEstimate | None], mem_cap: float, top_k: int, zeros: list[int],
                a2ao: bool, rungs: list[tuple[str, ...]] | None = None, mode_bests: bool = False,
                prefetch: Callable[[list[Layout]], None] | None = None) -> list[tuple[Layout, StepEstimate]]:
    """The interleaved (v > 1) variants of the fitted pipelines (Megatron-core's virtual stages, where the runtime
    runs them and no v is pinned), each at the lowest zero stage from its v = 1 layout's up where it fits, else (a
    variant holds more chunks in flight) at the first rung of the rcm= ladder above its layout's own (every rung for
    a layout without rcm=) that fits (`rungs`: module_ladder.ladder).
    Pruning: interleaving changes a layout's step in the model only by its bubble (the other devices' work over v N
    where the blocks split evenly over the virtual stages, at least 1 / v of the v = 1 bubble: pipeline_bubble.py;
    an uneven split's replayed bubble can be less, down to 0: pipeline_replay.py), its pipeline
    sends (v times as many) and the expert and gradient tails (later, not earlier); the slowest device keeps at least
    the blocks it held at v = 1. So a variant's step is at least the v = 1 step less (1 - 1 / v) of its bubble (an
    uneven split's: less all of it): a variant whose bound is no better than the top_k-th best is not priced
    (unless interleaving turns `a2ao` on: Megatron-core overlaps the all_to_alls with pipelines interleaved only,
    Runtime.a2a_overlap_refusal). Every v whose virtual
    stages each keep a block (modes/stages.split_ok) is tried: neither memory nor step is monotone in v, the blocks
    splitting over the devices otherwise for each. `mode_bests`: nor is one priced whose bound may beat its tensor
    mode's best so far. `prefetch`: told, per fitted layout, the variants it may price (those its bound keeps at
    the bar so far, which only falls) at each zero stage it may try."""
    out: list[tuple[Layout, StepEstimate]] = []
    bars = _Bars(fits, top_k)

    def variant(lay: Layout, v: int) -> Layout:  # with a2ao where it is chosen and the runtime runs it there
        var = replace(lay, interleave=v)
        if not a2ao:
            return var
        on = replace(var, a2ao=True)
        return var if rt.a2a_overlap_refusal(on, training.dtype) else on

    def kept(var: Layout, est: StepEstimate) -> bool:  # its bound may beat the bar (a larger v's is lower: it may)
        bar = bars.bar(var.mode if mode_bests else None)
        saved = 1.0 if uneven(model.layers, var.pp, var.interleave) else 1.0 - 1.0 / var.interleave
        return var.a2ao or est.step_time_s - est.bubble_time_s * saved < bar

    for lay, est in sorted(fits, key=lambda r: r[1].step_time_s):
        if lay.pp == 1 or (training.global_batch // (lay.dp * lay.micro_batch)) % lay.pp:  # interleaved 1F1B's rule
            continue
        variants = [variant(lay, v) for v in range(2, model.layers // lay.pp + 1) if split_ok(model.layers, lay.pp, v)]
        higher = [z for z in zeros if z >= lay.zero]
        # a variant's rcm= and recomputation are its layout's: the rungs above its own (all without one)
        above = _above(rungs, lay.recompute_modules) if rungs and lay.recompute in (None, "none", "selective") else []
        if prefetch is not None:  # each variant at each zero stage, then at each rung it may climb to
            prefetch([replace(var, zero=z, **rcm) for var in variants if kept(var, est)
                      for rcm in [{}, *({"recompute": None, "recompute_modules": r} for r in above)] for z in higher])
        for var in variants:
            if not kept(var, est):
                continue  # loses whatever it prices at
            found = _fit(var, higher, rt, model, training, price, mem_cap)
            if found is None and above and _runs(var, rt, model, training):
                found = next(iter(ladder(var, higher, above, price, mem_cap)), None)
            if found is None:  # (a larger v may fit: its blocks split over the devices otherwise)
                continue
            out.append(found)
            bars.add([found])
    return out


def _above(rungs: list[tuple[str, ...]], own: tuple[str, ...] | None) -> list[tuple[str, ...]]:
    """The ladder's rungs above a layout's own rcm= (every rung for a layout without one; none for one off it)."""
    return rungs if not own else rungs[rungs.index(own) + 1:] if own in rungs else []


def _runs(lay: Layout, rt: Runtime, model: ModelSpec, training: TrainingSpec) -> bool:
    """The runtime runs `lay` (Runtime.refusal, as the candidates were checked)."""
    return rt.refusal(lay, model.family, model.tied_embeddings, training.dtype, moe=model.moe is not None,
                      windowed=model.sliding_window is not None, sinks=model.attention_sinks, model=model) is None


def _fit(lay: Layout, zeros: list[int], rt: Runtime, model: ModelSpec, training: TrainingSpec,
         price: Callable[[Layout], StepEstimate | None], mem_cap: float) -> tuple[Layout, StepEstimate] | None:
    """`lay` at the lowest of `zeros` where the runtime runs it and it fits, priced; None where none does."""
    for z in zeros:
        zl = replace(lay, zero=z)
        if not _runs(zl, rt, model, training):
            continue  # a stage's refusal (search_experts)
        est = price(zl)
        if est is None:
            return None
        if est.memory.total <= mem_cap:
            return zl, est
    return None


__all__ = ["ExpertsResult", "candidates", "interleaved", "search_experts"]
