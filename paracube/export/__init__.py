"""Export a plan to where teams run it: Megatron-LM, torchtitan, DeepSpeed (Megatron-DeepSpeed), or
paracube's own torchrun / Slurm launch. Each export is one text file with a header comment naming the
target version it was written for; a layout a target cannot express is refused with one line naming the
targets that can run it (common.refuse_unless_expressible). No torch import: `paracube export` stays light.
"""

from __future__ import annotations

from paracube.errors import unknown
from paracube.export import deepspeed, megatron, torchtitan
from paracube.export.common import TARGETS, Export, targets_that_run
from paracube.export.launchers import export_slurm, export_torchrun
from paracube.plan import Plan


def export_plan(plan: Plan, target: str, plan_path: str = "plan.json", steps: int = 20) -> Export:
    """The export of `plan` for `target`; `plan_path` and `steps` are used by torchrun / slurm only."""
    if target == "megatron":
        return megatron.export(plan)
    if target == "torchtitan":
        return torchtitan.export(plan)
    if target == "deepspeed":
        return deepspeed.export(plan)
    if target == "torchrun":
        return export_torchrun(plan, plan_path, steps)
    if target == "slurm":
        return export_slurm(plan, plan_path, steps)
    raise unknown("export target", target, TARGETS)


__all__ = ["TARGETS", "Export", "export_plan", "targets_that_run"]
