"""What the executor runs of mixture-of-experts (executor/model/moe.py), checked before any rank starts: one
ParacubeError line naming the value and what is valid (executor/sizes.py calls it; the layout rules are
modes/experts.executor_refusal, which paracube's runtime declaration reads too)."""

from __future__ import annotations

from paracube.attention_chunk import check_chunk
from paracube.errors import ParacubeError, divisors_text
from paracube.layout import Layout
from paracube.modes.experts import executor_refusal
from paracube.workload import ModelSpec


def check_moe(spec: ModelSpec, layout: Layout) -> None:
    where = f"model {spec.name} in {layout}"
    moe = spec.moe
    # chunked attention over sequences up to one chunk is plain causal attention, which the executor runs
    check_chunk(spec, spec.seq_len)
    llama4 = [what for what, on in (("NoPE blocks (rope_pattern)", spec.rope_pattern is not None),
                                    ("the L2 q / k norm (qk_l2_norm)", spec.qk_l2_norm),
                                    ("router scores on the experts' input (moe.probs_on_input)",
                                     bool(spec.moe and spec.moe.probs_on_input))) if on]
    if llama4:  # Llama 4's attention (attention_chunk.py): priced and exported, not built by executor/layers
        raise ParacubeError(f"{where}: the executor does not run {', '.join(llama4)} yet; plan and export it "
                            "(--runtime megatron)")
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


__all__ = ["check_moe"]
