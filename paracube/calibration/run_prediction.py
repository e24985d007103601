"""A run's predicted step time: the planner's best layout matching the row's layout (search with `fixed`), priced
by the analytic engine on the row's cluster preset, for the row's runtime (else the caller's), with its gradient
bucket, gradient dtype and MoE dispatcher (runs_csv.py reads them).
"""

from __future__ import annotations

from dataclasses import replace

from paracube.calibration.runs_csv import Run
from paracube.errors import check
from paracube.estimate import StepEstimate
from paracube.layout import Layout
from paracube.runtimes import Runtime, get_runtime
from paracube.topologies.loader import preset_sizes
from paracube.topologies.presets import PRESETS, Fit


def preset_topology(run: Run, fit: Fit | None = None) -> object:
    """The run's cluster preset at its GPU count, with `fit`'s efficiencies (default: the shipped ones)."""
    preset = PRESETS[run.cluster]
    # As the CLI builds it (loader.preset_sizes): 128 GPUs of GB200 NVL72 racks run as 2 x 64
    nodes, per = preset_sizes(preset, run.gpus)
    if fit is None:
        return preset.build(nodes, per)
    return preset.build(nodes, per, fit=fit)


def step_time(run: Run, layout: Layout, topo: object, runtime: str = "paracube") -> float:
    """Analytic step time of a fully specified layout (mb, v chosen) of the run, priced as `predict` prices it
    for the runtime (the row's own, else `runtime`): its parameter-gather overlap and FP8 scaling, the run's
    gradient bucket."""
    return run_estimate(run, layout, topo, runtime).step_time_s


def run_runtime(run: Run, runtime: str = "paracube") -> Runtime:
    """The runtime a row is priced for: its own (else `runtime`), with the row's MoE dispatcher where it names one."""
    rt = get_runtime(run.runtime or runtime)
    return rt if run.dispatcher is None else replace(rt, moe_dispatch=run.dispatcher)


def run_estimate(run: Run, layout: Layout, topo: object, runtime: str = "paracube") -> StepEstimate:
    """`step_time`'s whole analytic estimate (compute, exposed communication, bubble, time per mesh axis)."""
    from paracube.cost_models.analytic import estimate  # local: calibration sits above cost_models
    from paracube.planner.dimensions import PARAM_OVERLAP, chosen

    rt = run_runtime(run, runtime)
    param_overlap = chosen(PARAM_OVERLAP, rt, layout)
    options = rt.engine_options().with_(param_overlap=param_overlap, grad_bytes=run.grad_bytes,
                                        **({} if run.bucket_bytes is None else {"bucket_bytes": run.bucket_bytes}))
    return estimate(run.model, run.training, layout, topo, with_events=False, options=options)


def predict(run: Run, topo: object, runtime: str = "paracube") -> tuple[Layout, float]:
    """The planner's best layout matching the run's (its open fields chosen by the search for `runtime`: its
    overlaps, micro-batch, interleaving, placement) and its step time (analytic engine). The row's own runtime
    column, where given, overrides `runtime`. The run's recomputation and zero stage are pinned; sequence
    parallelism only where the layout asks.
    A layout the runtime cannot run: ParacubeError (one line)."""
    from paracube.planner.search import search  # local: calibration sits above the planner in the layers

    rt = run_runtime(run, runtime)
    why = rt.refusal(run.layout, run.model.family, run.model.tied_embeddings, run.training.dtype,
                     moe=run.model.moe is not None, windowed=run.model.sliding_window is not None,
                     sinks=run.model.attention_sinks)
    check(why is None, f"run {run.name}: layout {run.layout}: {why}")
    fixed = run.layout if run.layout.sequence_parallel else run.layout.with_(forbid_sp=True)
    # the row's zero stage: a layout without one ran plain data parallelism (every such row predates the
    # distributed optimizer: Megatron-LM 2020-21)
    res = search(run.model, run.training, topo, run.gpus, fixed=fixed, top_k=1, zeros=[run.layout.zero], runtime=rt,
                 bucket_bytes=run.bucket_bytes, grad_bytes=None if run.grad_bytes == 4 else run.grad_bytes)
    lay, est = res.ranked[0]
    # A layout axis the cost models do not price yet is dropped by the search's match (cp: context parallelism,
    # priced by the `cp` branch): refuse the row rather than report another layout's time as its prediction.
    check(lay.cp == run.layout.cp, f"run {run.name}: layout {run.layout}: cp={run.layout.cp} is not priced by "
          f"the cost models yet (the planner matched cp={lay.cp})")
    return lay, est.step_time_s
