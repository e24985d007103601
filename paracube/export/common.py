"""What every export shares: the header comment, shell formatting, and the refusal of layouts a target
cannot express (one line naming the targets that can run it).

Sizes follow Megatron's conventions (Narayanan et al. 2021): data-parallel size = world / (tp x pp),
gradient-accumulation steps = global batch / (micro-batch x dp), layers per virtual stage = layers / (pp x v).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from paracube import __version__
from paracube.errors import ParacubeError, check
from paracube.plan import Plan
from paracube.runtimes import get_runtime
from paracube.runtimes.offload import offload_refusal

TARGETS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "torchrun", "slurm")
# target -> a function returning why it cannot express a plan (None: it can); filled by each target module.
EXPRESSIBLE: dict[str, Callable[[Plan], str | None]] = {}


@dataclass(frozen=True)
class Export:
    """An export: the file's text, and notes on what the target runs differently (also in the text)."""

    target: str
    text: str
    notes: tuple[str, ...] = ()


def targets_that_run(plan: Plan) -> list[str]:
    return [name for name in TARGETS if name in EXPRESSIBLE and EXPRESSIBLE[name](plan) is None]


def refuse_unless_expressible(target: str, plan: Plan) -> None:
    why = EXPRESSIBLE[target](plan)
    if why is None:
        return
    others = targets_that_run(plan)
    where = f"targets that run it: {', '.join(others)}" if others else "no export target runs it yet"
    raise ParacubeError(f"{target} cannot run layout {plan.layout}: {why}; {where}")


def tensor_size(plan: Plan) -> int:
    """Megatron-style (1D) tensor-parallel size (1 without tensor parallelism); callers have refused the
    other modes."""
    return plan.layout.tensor_size if plan.layout.tensor_mode.megatron_style else 1


def accumulation_steps(plan: Plan) -> int:
    lay, mb, batch = plan.layout, plan.micro_batch, plan.training.global_batch
    check(batch % (mb * lay.dp) == 0, f"global batch {batch} is not divisible by micro-batch {mb} x dp {lay.dp}")
    return batch // (mb * lay.dp)


def one_d_only(plan: Plan) -> str | None:
    mode = plan.layout.mode
    if plan.layout.tensor_mode.megatron_style:
        return None
    return f"its tensor parallelism is 1D (Megatron-style); tensor mode {mode} has no equivalent"


def offload_why(plan: Plan, target: str) -> str | None:
    """Why the target's runtime cannot offload the plan's activations as the layout says (off=N; its Runtime.offload,
    runtimes/offload.py: the stack, the count of the model's blocks, the recomputation), else None."""
    rt = get_runtime(target)
    return offload_refusal(rt.name, rt.offload, plan.layout, plan.model.layers, plan.training.recompute)


def header(plan: Plan, target: str, written_for: str, notes: Sequence[str] = ()) -> list[str]:
    """Comment lines (without '# '): who wrote the file, for which target version, and the plan."""
    lay, m, t = plan.layout, plan.model, plan.training
    lines = [f"written by paracube {__version__} (`paracube export --to {target}`) for {written_for}",
             f"plan: {m.name} on {plan.gpus} x {plan.cluster}, layout {lay}",
             f"global batch {t.global_batch} x {plan.seq_len} tokens, {t.dtype}, recompute {t.recompute}"]
    pred = plan.prediction or {}
    if "step_time_s" in pred and "memory_per_gpu_bytes" in pred:
        lines.append(f"predicted by paracube: {pred['step_time_s']:.3f} s per step, "
                     f"{pred['memory_per_gpu_bytes'] / 2**30:.1f} GiB per GPU")
    lines += [f"note: {n}" for n in notes]
    return lines


def comment(lines: Sequence[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def shell_command(words: Sequence[str], args: Sequence[str]) -> str:
    """`words` (already shell text) then one `args` entry per line; entries are shell text too."""
    return " ".join(words) + "".join(f" \\\n    {a}" for a in args) + "\n"


def quote(text: str) -> str:
    return shlex.quote(text)


__all__ = ["EXPRESSIBLE", "TARGETS", "Export", "accumulation_steps", "comment", "header", "one_d_only", "quote",
           "refuse_unless_expressible", "shell_command", "targets_that_run", "tensor_size"]
