"""What the executor runs of mixture-of-experts (executor/model/moe.py), checked before any rank starts: one
ParacubeError line naming the value and what is valid (executor/sizes.py calls it; the layout rules are
modes/experts.executor_refusal, which paracube's runtime declaration reads too)."""

from __future__ import annotations

from paracube.errors import ParacubeError, divisors_text
from paracube.layout import Layout
from paracube.modes.experts import executor_refusal
from paracube.workload import ModelSpec


def check_moe(spec: ModelSpec, layout: Layout) -> None:
    where = f"model {spec.name} in {layout}"
    moe = spec.moe
    if moe is None:
        if layout.ep * layout.etp > 1:
            raise ParacubeError(f"{where}: ep={layout.ep},etp={layout.etp} needs a model with MoE blocks; valid: "
                                "ep=1,etp=1")
        return
    why = executor_refusal(layout)
    if why:
        raise ParacubeError(f"{where}: {why}")
    if moe.experts % layout.ep:
        raise ParacubeError(f"{where}: ep={layout.ep} does not divide the {moe.experts} experts; valid ep: "
                            f"{divisors_text(moe.experts)}")
    if moe.expert_ffn % layout.etp:
        raise ParacubeError(f"{where}: etp={layout.etp} does not divide the expert width {moe.expert_ffn}; valid etp: "
                            f"{divisors_text(moe.expert_ffn)}")


__all__ = ["check_moe"]
