"""What paracube's executor runs of a tensor mode: its `TensorMode.executor` declaration (None: priced only).

`ExecutorSupport` names the executor's Mode class (impl, "module:Class") and the options it implements: pipelines,
sequence parallelism, zero stages, gradient overlap with pipelines, model families, tpo, context parallelism's
exchanges, training dtypes, multi-head latent attention. Declared once per mode (paracube/modes/*.py), read by
modes.runnable_modes / executor_runs, the paracube runtime's dimensions (runtimes/paracube.py), the planner's
search (only what the executor runs is searched), executor/sizes.py (refused before launch) and export.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExecutorSupport:
    """paracube's executor runs this mode: its Mode class (module:Class) and the options it implements."""

    impl: str
    pipeline: bool = False
    sequence_parallel: bool = False
    zero_stages: tuple[int, ...] = (0,)  # zero stages it runs: 1 distributed optimizer, 2 + gradients, 3 + params
    # with pipelines, gradient buckets overlap each stage's (chunk's) last backward (executor grad_sync.py,
    # tests/test_pipeline.py): the `overlap` dimension is searched at pp > 1 too (runtimes read this)
    grad_overlap_pp: bool = True
    families: tuple[str, ...] = ("gpt", "llama")  # model families it builds and is tested on
    # runs tpo (Layout.tpo): the mode's `tpo`-tagged collectives as rings overlapped with their GEMMs
    # (executor/layers/collective_matmul.py); the paracube runtime offers tpo where this is set
    tpo: bool = False
    # context parallelism's exchanges (modes/context.py: "p2p", "ag") it runs, its default first; () none
    # (executor/layers/context_parallel.py)
    context_parallel: tuple[str, ...] = ()
    # training dtypes it runs (fp8: FP8 GEMMs in the block linears, executor/layers/fp8.py)
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    mla: bool = False  # runs multi-head latent attention (ModelSpec.mla; executor/layers/mla.py)

    @property
    def zero(self) -> bool:
        """It runs the distributed optimizer (zero=1)."""
        return 1 in self.zero_stages


__all__ = ["ExecutorSupport"]
