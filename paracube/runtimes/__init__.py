"""The runtimes (training stacks a plan is made for), one module each, registered here (one line per runtime).

`RUNTIMES[name]` is the runtime's declaration (paracube/runtimes/base.py: Runtime): what it runs, what it
overlaps and how, and its export target. Adding a runtime = one module + one line below. Pure declarations:
they read paracube.layout and paracube.modes only.
"""

from __future__ import annotations

from paracube.errors import ParacubeError
from paracube.runtimes import deepspeed, megatron, paracube, torchtitan
from paracube.runtimes.base import Runtime
from paracube.runtimes.refusals import model_refusal

RUNTIMES: dict[str, Runtime] = {
    paracube.RUNTIME.name: paracube.RUNTIME,
    megatron.RUNTIME.name: megatron.RUNTIME,
    torchtitan.RUNTIME.name: torchtitan.RUNTIME,
    deepspeed.RUNTIME.name: deepspeed.RUNTIME,
}
DEFAULT_RUNTIME = paracube.RUNTIME.name  # `paracube run` runs its plans as is


def get_runtime(name: str) -> Runtime:
    """The runtime called `name`, else one line naming the valid ones."""
    if name not in RUNTIMES:
        raise ParacubeError(f"unknown runtime {name!r}; valid: {', '.join(RUNTIMES)}")
    return RUNTIMES[name]


def runtimes_training(model: object) -> list[str]:
    """The runtimes that train every block of `model` (workload.ModelSpec; refusals.model_refusal)."""
    return [name for name, rt in RUNTIMES.items() if model_refusal(rt, model) is None]


def model_refusal_line(rt: Runtime, model: object) -> str | None:
    """The one-line refusal of a model whose blocks `rt` does not train, naming the runtimes that do, else None."""
    why = model_refusal(rt, model)
    if why is None:
        return None
    return f"runtime {rt.name} ({rt.title}) {why}; valid: --runtime {', '.join(runtimes_training(model)) or 'none'}"


def for_target(target: str) -> Runtime | None:
    """The runtime whose export target is `target` (None: a launcher such as torchrun / slurm)."""
    return next((r for r in RUNTIMES.values() if r.export_target == target), None)


__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "Runtime", "for_target", "get_runtime", "model_refusal_line",
           "runtimes_training"]
