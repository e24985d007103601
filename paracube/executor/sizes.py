"""Sizes a layout must divide, checked before any rank starts (docs/algorithms.md "Sizes that must divide")."""

from __future__ import annotations

from paracube.errors import ParacubeError
from paracube.layout import Layout
from paracube.modes import MODES, runnable_modes
from paracube.workload import ModelSpec


def check_divisibility(spec: ModelSpec, layout: Layout, micro_batch: int | None, global_batch: int,
                       seq_len: int) -> None:
    """Raise ParacubeError naming the first size the layout cannot split (before any rank starts).
    micro_batch None checks the model's sizes only."""
    mode, q = layout.mode, layout.q
    support = MODES[mode].executor  # what the executor runs: paracube/modes (ExecutorSupport)
    if support is None:
        raise ParacubeError(f"tensor mode {mode!r} is not supported by the executor; "
                            f"valid: {', '.join(runnable_modes())}")
    if layout.sequence_parallel and not support.sequence_parallel:
        raise ParacubeError(f"sequence parallelism (sp) is not implemented by the executor; drop sp from {layout}")
    if layout.zero == 3:
        raise ParacubeError(f"zero=3 (sharded parameters) is not implemented by the executor; use zero=0 or zero=1 "
                            f"in {layout}, or export the plan (`paracube export`)")
    if layout.zero == 1 and tuple(MODES[mode].grad_axes) != ("dp",):
        raise ParacubeError(f"zero=1 with tensor mode {mode!r} (gradients summed over {MODES[mode].grad_axes}) is "
                            f"not implemented by the executor; use zero=0 in {layout}")
    if layout.pp != 1 and not support.pipeline:
        raise ParacubeError(f"pp={layout.pp}: the executor runs pp=1 only")
    if seq_len > spec.seq_len:
        raise ParacubeError(f"seq_len={seq_len} exceeds the model's positions ({spec.seq_len})")
    s, h, f, V, H = spec.seq_len, spec.hidden, spec.ffn_hidden, spec.vocab, spec.heads
    rules = MODES[mode].executor_rules(s, h, f, V, H, q, micro_batch)
    if micro_batch is not None:
        rules.append(("global_batch", global_batch, layout.dp * micro_batch))
    for name, value, divisor in rules:
        if value % divisor:
            raise ParacubeError(f"{name}={value} is not divisible by {divisor} (needed by {layout}); "
                                f"use a multiple of {divisor}")


__all__ = ["check_divisibility"]
