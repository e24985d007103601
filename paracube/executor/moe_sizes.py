"""What the executor runs of mixture-of-experts (executor/model/moe.py), checked before any rank starts: one
ParacubeError line naming the value and what is valid (executor/sizes.py calls it)."""

from __future__ import annotations

from paracube.errors import ParacubeError
from paracube.layout import Layout
from paracube.workload import ModelSpec

MOE_MODES = ("none", "1d")  # whole sequences, or 1D's sequence shards (sp)
MOE_ZEROS = (0,)  # expert buckets reduced over edp are zero=0 buckets (data_parallel/grad_sync.py)


def check_moe(spec: ModelSpec, layout: Layout) -> None:
    where = f"model {spec.name} in {layout}"
    if spec.mla is not None or spec.head_size is not None:
        raise ParacubeError(f"{where}: the executor does not run MLA or a head width other than hidden / heads yet "
                            "(issue #25 item 4); plan and export it (--runtime megatron)")
    moe = spec.moe
    if moe is None:
        if layout.ep * layout.etp > 1:
            raise ParacubeError(f"{where}: ep={layout.ep},etp={layout.etp} needs a model with MoE blocks; valid: "
                                "ep=1,etp=1")
        return
    if layout.etp > 1:
        raise ParacubeError(f"{where}: etp={layout.etp} (tensor parallelism inside an expert) is not run by the "
                            "executor; valid: etp=1 (export it: --runtime megatron)")
    if layout.mode not in MOE_MODES:
        raise ParacubeError(f"{where}: MoE blocks run in tp={'/'.join(MOE_MODES)}, not tp={layout.mode}")
    if layout.tensor_size > 1 and not layout.sequence_parallel:
        raise ParacubeError(f"{where}: MoE blocks with tp={layout.mode}:{layout.tensor_size} run with sp (each "
                            "tensor rank routes its sequence shard); valid: add sp")
    if layout.cp > 1:
        raise ParacubeError(f"{where}: MoE blocks with cp={layout.cp} are not run by the executor; valid: cp=1")
    if layout.zero not in MOE_ZEROS:
        raise ParacubeError(f"{where}: MoE blocks with zero={layout.zero} are not run by the executor (the experts' "
                            f"gradients reduce over edp); valid: zero={'/'.join(map(str, MOE_ZEROS))}")
    if moe.experts % layout.ep:
        raise ParacubeError(f"{where}: ep={layout.ep} does not divide the {moe.experts} experts; valid ep: "
                            f"{', '.join(str(n) for n in range(1, moe.experts + 1) if moe.experts % n == 0)}")


__all__ = ["MOE_MODES", "MOE_ZEROS", "check_moe"]
