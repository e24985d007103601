"""Export a plan as paracube's own launch: a torchrun script or an sbatch script (what `paracube launch
--slurm` prints; the same text builder, paracube/launch_text.py). The ranks run paracube's executor, so
the plan must be one it runs: pp = 1, tensor mode none/1d/2d/3d, no sequence parallelism, zero 0 or 1
(the same rules as `paracube run`'s checks before any rank starts, without importing torch here).
"""

from __future__ import annotations

from paracube.export.common import EXPRESSIBLE, Export, header
from paracube.export.common import refuse_unless_expressible as refuse
from paracube.launch_text import slurm_script, torchrun_script
from paracube.plan import Plan

WRITTEN_FOR = "paracube's executor (python -m paracube.executor.run --worker) under torchrun, torch >= 2.4"
EXECUTOR_MODES = ("none", "1d", "2d", "3d")


def why_not(plan: Plan) -> str | None:
    lay = plan.layout
    if lay.mode not in EXECUTOR_MODES:
        return f"paracube's executor runs tensor modes {', '.join(EXECUTOR_MODES)}, not {lay.mode}"
    if lay.pp > 1:
        return f"paracube's executor runs pp=1 only (pp={lay.pp})"
    if lay.sequence_parallel:
        return "paracube's executor does not implement sequence parallelism (sp)"
    if lay.zero == 3:
        return "paracube's executor does not implement zero=3"
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
