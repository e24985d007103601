"""Dynamic loss scaling for fp16 (Micikevicius et al. 2018, "Mixed precision training"; torch.amp.GradScaler's
and Megatron's defaults).

The step multiplies the loss by `scale` before backward and divides the gradients by it before clipping
and the optimizer step. Overflow check: the global gradient norm is all-reduced over every group that
holds a piece of the gradients (tensor axes, pipeline, and dp with zero=1; with zero=0 every dp replica
already holds the dp-summed gradients), so an inf/nan anywhere makes the norm non-finite on every rank and
all ranks skip the same step -- no extra collective. On overflow: skip the step, scale *= backoff; after
`growth_interval` steps in a row without overflow: scale *= growth. `max_skips` overflowing steps in a row
stop the run with one line (TrainingDiverged in train.py).

torch.amp.GradScaler is not used: its inf check is per device (not all-reduced over our groups) and it
unscales through optimizer.param_groups, which with the distributed optimizer are the fp32 master shards
whose gradients the reduce-scatter writes, not the parameters' .grad.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LossScaler:
    scale: float = 2.0 ** 16
    growth: float = 2.0
    backoff: float = 0.5
    growth_interval: int = 1000
    max_skips: int = 20  # overflowing steps in a row before the run stops
    good_steps: int = 0  # steps without overflow since the last overflow or growth
    skips: int = 0  # overflowing steps in a row

    def update(self, overflow: bool) -> None:
        """After a step: back off (overflow) or count a good step and grow every growth_interval."""
        if overflow:
            self.scale *= self.backoff
            self.good_steps = 0
            self.skips += 1
            return
        self.skips = 0
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth
            self.good_steps = 0

    @property
    def exhausted(self) -> bool:
        return self.skips >= self.max_skips


__all__ = ["LossScaler"]
