"""What a layout cannot do with a model's experts, MLA or recompute modules, one clause each naming the valid values
(`violations`; analytic.prepare and the search's pin check raise them in one line)."""

from __future__ import annotations

from paracube.cost_models.moe import priced
from paracube.errors import divisors
from paracube.layout import Layout
from paracube.recompute_modules import violations as rcm_violations
from paracube.workload import ModelSpec


def violations(model: ModelSpec, layout: Layout, fused_norms: bool = False) -> list[str]:
    """What a layout's ep / etp (and off, rcm) cannot do with this model (one clause each, naming the valid values);
    `fused_norms`: the runtime's (Runtime.fused_norms: rcm=layernorm re-runs no norm of a dense block)."""
    moe = model.moe
    if layout.recompute_modules:  # a module that re-runs nothing in this model (recompute_modules.py)
        bad = rcm_violations(layout.recompute_modules, model, fused_norms)
        if bad:
            return bad
    if layout.offload and priced(model):  # the search never offers it there (planner/experts.py): refused alike
        return [f"off={layout.offload}: activation offloading is priced for dense blocks of hidden / heads attention "
                f"only (cost_models/offload.py), not {model.name}'s; valid: off=0"]
    if layout.ep * layout.etp == 1:
        return []
    if moe is None:
        return [f"ep={layout.ep},etp={layout.etp} split experts: model {model.name} has none (use ep=1,etp=1)"]
    bad = []
    if moe.experts % layout.ep:
        folded, found = layout.dp * layout.cp * layout.tensor_size, divisors(moe.experts)
        fits = [n for n in found if layout.fold_open or folded % (n * layout.etp) == 0] if found is not None else None
        valid = ", ".join(map(str, fits)) if fits is not None else f"a divisor of {moe.experts}"
        bad.append(f"ep={layout.ep} must divide the {moe.experts} experts of {model.name}; valid: {valid}")
    if moe.expert_ffn % layout.etp:
        bad.append(f"etp={layout.etp} must divide the expert width {moe.expert_ffn}")
    return bad


__all__ = ["violations"]
