"""`paracube run PLAN --model M --gpus G`: the plan's layout scaled down to another model on fewer ranks.

A plan for 64 GPUs cannot run on a laptop, but its parallel structure can: the scaled plan keeps the
plan's tensor mode, the interleave v of its pipeline schedule, zero, sequence parallelism, recomputation (and its
rcm= modules that apply to the new model: recompute_modules.applies; the others are dropped, said in the notes),
overlap, tpo (collective matmul), cpc, dtype and placement order, and shrinks dp, pp, cp and the tensor shape to
G ranks within the same shape family (each of dp, pp, cp and the tensor group stays > 1 exactly where the plan's
is; no factor grows). Among the candidates it takes the one closest to the plan's proportions: each factor x's target
is x ** (log G / log N), N the plan's rank count, and the distance sum((log x' - log target)^2) (ties:
the smaller pp, which needs fewer layers). Sizes follow from the new model: the plan's micro-batch where
it divides (else the smallest valid), 2 x pp micro-batches per replica (a full 1F1B / interleaved
schedule; 2 without pipeline), so the global batch is dp x mb x that. If the model's layers do not split
over pp x v virtual stages, it gets the fewest layers that do (said in the notes): the interleaved
schedule runs as the plan says rather than silently falling back to v = 1.
Every candidate passes the executor's preflight checks (executor/sizes.py) or is skipped.
"""

from __future__ import annotations

import math
from dataclasses import replace

from paracube.errors import ParacubeError, divisors
from paracube.executor.sizes import check_divisibility
from paracube.layout import Layout
from paracube.modes import MODES
from paracube.modes.base import tokens_split_ok
from paracube.modes.stages import split_ok
from paracube.plan import LaunchSpec, Plan
from paracube.recompute_modules import applies
from paracube.workload import ModelSpec, TrainingSpec


def _divisors(n: int) -> list[int]:
    return divisors(n, most=n) or []


def _candidates(layout: Layout, gpus: int) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """(dp, pp, cp, shape) of `gpus` ranks in the layout's shape family, closest to its proportions first."""
    mode = MODES[layout.mode]
    shapes = [s for s in mode.shapes(gpus) if math.prod(s) <= layout.tensor_size] if mode.axes else [()]
    scale = math.log(gpus) / math.log(layout.world_size) if layout.world_size > 1 else 1.0
    out = []
    for shape in shapes:
        t = math.prod(shape) if shape else 1
        for pp in _divisors(gpus // t):
            for cp in _divisors(gpus // t // pp):  # context parallelism: a factor like dp and pp
                dp = gpus // t // pp // cp
                if any((new > 1) != (old > 1) or new > old
                       for new, old in ((dp, layout.dp), (pp, layout.pp), (cp, layout.cp))):
                    continue
                dist = sum((math.log(new) - scale * math.log(old)) ** 2 for new, old in
                           ((dp, layout.dp), (pp, layout.pp), (cp, layout.cp), (t, layout.tensor_size)))
                out.append((dist, pp, cp, dp, shape))
    return [(dp, pp, cp, shape) for _, pp, cp, dp, shape in sorted(out)]


def _with_experts(candidates: list[tuple[int, int, int, tuple[int, ...]]], layout: Layout,
                  model: ModelSpec) -> list[tuple[int, int, int, tuple[int, ...], int]]:
    """Each candidate with the largest ep (> 1 where the plan's is, none larger) dividing the model's experts and the
    dp x cp x tp ranks it folds over; ep = 1 for a dense model (candidates without such an ep are dropped)."""
    out = []
    for dp, pp, cp, shape in candidates:
        dense = dp * cp * (math.prod(shape) if shape else 1)
        experts = model.moe.experts if model.moe is not None else 1
        eps = [e for e in range(min(layout.ep, dense, experts), 0, -1)
               if dense % e == 0 and experts % e == 0 and (e > 1) == (layout.ep > 1)] if model.moe else [1]
        out += [(dp, pp, cp, shape, eps[0])] if eps else []
    return out


def _layers_for(model: ModelSpec, pp: int, v: int) -> int:
    layers = model.layers
    while pp > 1 and not split_ok(layers, pp, v):
        layers += 1
    return layers


def _placement(layout: Layout, **changes: object) -> Layout:
    try:
        return layout.with_(**changes)
    except ParacubeError:  # the plan's placement names axes the smaller layout orders otherwise
        return layout.with_(**changes, placement=())


def scale_down(plan: Plan, model: ModelSpec, gpus: int) -> tuple[Plan, list[str]]:
    """The plan's layout on `gpus` ranks for `model` (see the module docstring), and notes saying what changed.
    Raises ParacubeError (one line) when no layout of the family fits."""
    lay = plan.layout
    tried: list[str] = []
    for dp, pp, cp, shape, ep in _with_experts(_candidates(lay, gpus), lay, model):
        v = lay.interleave if pp > 1 else 1
        spec = replace(model, layers=_layers_for(model, pp, v))
        sp = lay.sequence_parallel and bool(shape)
        base = Layout(mode=lay.mode, shape=shape, dp=dp, pp=pp, cp=cp, cp_comm=lay.cp_comm if cp > 1 else None,
                      interleave=v, sequence_parallel=sp,
                      zero=lay.zero if dp > 1 else 0, recompute=lay.recompute, overlap=lay.overlap and dp > 1,
                      recompute_modules=_modules(lay, model),
                      keep_weights=lay.keep_weights, tpo=lay.tpo and bool(shape), ep=ep)
        split = base.token_split
        n_micro = 2 * pp if pp > 1 else 2
        s = replace(plan.training, seq_len=None).sequence_length(spec)
        # The plan's micro-batch if its tokens still split over the tensor group, else the smallest
        # that does (modes.base.tokens_split_ok).
        mbs = [lay.micro_batch] if lay.micro_batch and tokens_split_ok(lay.micro_batch, s, split) else []
        for mb in [*mbs, *(m for m in range(1, 8 * split + 1) if tokens_split_ok(m, s, split))]:
            new = _placement(base, micro_batch=mb, placement=lay.placement)
            training = replace(plan.training, global_batch=dp * mb * n_micro, seq_len=None)
            try:
                check_divisibility(spec, new, mb, training.global_batch, training.sequence_length(spec))
            except ParacubeError as exc:
                tried.append(f"{new}: {exc}")
                continue
            return _plan(plan, spec, training, new, gpus), _notes(plan, model, spec, new, training)
    why = f" ({tried[0]})" if tried else ""
    raise ParacubeError(f"no layout of {gpus} ranks keeps the shape family of {lay} (dp, pp and the {lay.mode} "
                        f"tensor group > 1 where the plan's are, none larger) for {model.name}{why}; "
                        "try another --gpus or --model")


def _modules(layout: Layout, model: ModelSpec) -> tuple[str, ...] | None:
    """The layout's rcm= modules that re-run something in `model` (None: none given, or none applies)."""
    kept = tuple(m for m in layout.recompute_modules or () if applies(m, model))
    return kept or None


def _plan(plan: Plan, spec: ModelSpec, training: TrainingSpec, layout: Layout, gpus: int) -> Plan:
    return Plan(model=spec, training=training, layout=layout, cluster="local-cpu", gpus=gpus,
                launch=LaunchSpec(nproc_per_node=gpus, backend=plan.launch.backend),
                notes=(f"scaled down from {plan.model.name} {plan.layout} on {plan.gpus} GPUs",))


def _notes(plan: Plan, model: ModelSpec, spec: ModelSpec, layout: Layout, training: TrainingSpec) -> list[str]:
    notes = [f"scaled {plan.model.name} {plan.layout} ({plan.gpus} GPUs) -> {spec.name} {layout} "
             f"({layout.world_size} ranks), global batch {training.global_batch} x "
             f"{training.sequence_length(spec)} tokens, {training.dtype}"]
    dropped = [m for m in plan.layout.recompute_modules or () if m not in (layout.recompute_modules or ())]
    if dropped:
        notes.append(f"rcm= drops {'+'.join(dropped)}: {model.name} has nothing they recompute")
    if spec.layers != model.layers:
        notes.append(f"{model.name} has {model.layers} layers; runs {spec.layers} so that pp={layout.pp} x "
                     f"v={layout.interleave} virtual stages each hold a block")
    return notes


__all__ = ["scale_down"]
