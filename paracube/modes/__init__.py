"""The tensor modes, one module each, registered here (one line per mode, in display order).

`MODES[name]` is the mode's declaration (paracube/modes/base.py: TensorMode): mesh axes, shape rule, size
rules, token / vocabulary splits, local parameters, the collectives of every layer, compute and memory
terms, and whether and how paracube's executor runs it. Adding a mode = one module + one line below.
Torch-free and cost-model-free: paracube.layout reads it.
"""

from __future__ import annotations

from paracube.modes import none, one_d, three_d, two_d, two_d_summa, two_half_d
from paracube.modes.base import TensorMode
from paracube.modes.batch import LayoutBatch

MODES: dict[str, TensorMode] = {
    none.MODE.name: none.MODE,
    one_d.MODE.name: one_d.MODE,
    two_d.MODE.name: two_d.MODE,
    two_d_summa.SUMMA.name: two_d_summa.SUMMA,  # 2D's SUMMA baseline: `tp=2d:QxQ,summa`, priced, not run
    two_half_d.MODE.name: two_half_d.MODE,
    three_d.MODE.name: three_d.MODE,
}
COMPARE_BASELINE = one_d.MODE.name  # `paracube compare` reports speedups over this mode


def runnable_modes() -> tuple[str, ...]:
    """Modes paracube's executor runs (see each mode's ExecutorSupport for the options)."""
    return tuple(name for name, m in MODES.items() if m.executor is not None)


def executor_runs(mode: str, pp: int = 1, sequence_parallel: bool = False, zero: int = 0,
                  tied_embeddings: bool = False, family: str = "gpt") -> bool:
    """paracube's executor runs this mode with these options (the zero stages of its ExecutorSupport, zero=2 / 3
    at pp = 1 tied or untied, with pipelines untied; tied embeddings: in the modes that tie them (ties_embeddings:
    every mode the executor runs), with and without pipelines and zero=1; every dtype, fp16 loss scaling
    included); executor/sizes.py refuses the same before any rank starts, and the planner's search emits only
    what this accepts (planner/search.py)."""
    support = MODES[mode].executor
    return (support is not None and (pp == 1 or support.pipeline)
            and (not sequence_parallel or support.sequence_parallel)
            and zero in support.zero_stages and (zero < 2 or pp == 1 or not tied_embeddings)
            and family in support.families
            and not (tied_embeddings and not MODES[mode].ties_embeddings))


__all__ = ["COMPARE_BASELINE", "MODES", "LayoutBatch", "TensorMode", "executor_runs", "runnable_modes"]
