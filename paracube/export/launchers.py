"""Export a plan as paracube's own launch: a torchrun script or an sbatch script (what `paracube launch
--slurm` prints; the same text builder, paracube/launch_text.py). The ranks run paracube's executor, so
the plan must be one it runs: a tensor mode with ExecutorSupport and the options it declares (pipeline,
sequence parallelism, zero; paracube/modes), the same rules as `paracube run`'s checks before any rank
starts (executor/sizes.py), without importing torch here.
"""

from __future__ import annotations

from paracube.export.common import EXPRESSIBLE, Export, header
from paracube.export.common import refuse_unless_expressible as refuse
from paracube.launch_text import slurm_script, torchrun_script
from paracube.modes import executor_runs, runnable_modes
from paracube.plan import Plan

WRITTEN_FOR = "paracube's executor (python -m paracube.executor.launch.worker --worker) under torchrun, torch >= 2.4"


def why_not(plan: Plan) -> str | None:
    """Why paracube's executor does not run the plan (modes.executor_runs says the same), or None."""
    lay, model = plan.layout, plan.model
    support = lay.tensor_mode.executor
    if support is None:
        return f"paracube's executor runs tensor modes {', '.join(runnable_modes())}, not {lay.mode}"
    if lay.pp > 1 and not support.pipeline:
        return f"paracube's executor runs pp=1 only for {lay.mode} (pp={lay.pp})"
    if lay.sequence_parallel and not support.sequence_parallel:
        return "paracube's executor does not implement sequence parallelism (sp)"
    if lay.a2ao:
        return "paracube's executor does not overlap the MoE all_to_alls with another micro-batch's compute (a2ao)"
    if lay.cp > 1 and (lay.cp_comm or "p2p") not in support.context_parallel:
        runs = "/".join(support.context_parallel)
        return (f"paracube's executor runs context parallelism with cpc={runs} only" if runs else
                f"paracube's executor does not run context parallelism (cp={lay.cp}) in {lay.mode} yet")
    if lay.zero not in support.zero_stages:
        return f"paracube's executor does not implement zero={lay.zero} for {lay.mode}"
    if lay.zero >= 2 and lay.pp > 1 and model.tied_embeddings:  # as executor/sizes.py refuses
        return f"paracube's executor runs zero={lay.zero} with pipelines with untied embeddings only"
    if model.tied_embeddings and not lay.tensor_mode.ties_embeddings:  # as executor/sizes.py refuses
        return f"paracube's executor does not tie embeddings in {lay.mode} (its head is not laid out as the embedding)"
    if not executor_runs(lay.mode, lay.pp, lay.sequence_parallel, lay.zero,
                         model.tied_embeddings, model.family):
        return f"paracube's executor does not run model family {model.family!r} in tensor mode {lay.mode}"
    return None


EXPRESSIBLE["torchrun"] = why_not
EXPRESSIBLE["slurm"] = why_not


def worker_args(plan_path: str, steps: int) -> list[str]:
    """What `paracube run PLAN --steps N` forwards to every rank (the rest are the worker's defaults)."""
    return [plan_path, "--steps", str(steps)]


def export_torchrun(plan: Plan, plan_path: str, steps: int = 20) -> Export:
    refuse("torchrun", plan)
    return Export("torchrun", torchrun_script(plan, worker_args(plan_path, steps),
                                              header=header(plan, "torchrun", WRITTEN_FOR)))


def export_slurm(plan: Plan, plan_path: str, steps: int = 20) -> Export:
    refuse("slurm", plan)
    return Export("slurm", slurm_script(plan, worker_args(plan_path, steps),
                                        header=header(plan, "slurm", WRITTEN_FOR + " via srun")))


__all__ = ["export_slurm", "export_torchrun", "why_not", "worker_args"]
