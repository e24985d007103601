"""The forward collectives a block's backward issues again under selective recomputation by module (rcm=mlp,
rcm=layernorm; recompute_modules_cost.py prices the rest of rcm=), and the attention core's cp exchange where the
runtime re-runs the core with it (Runtime.cp_core_recompute): one list the explicit traffic (traffic.py), the closed
form (comm.py) and the event engine (event_program.py) read, phase "recompute"."""

from __future__ import annotations

from paracube.cost_models.dims import Dims
from paracube.cost_models.recompute_modules_cost import core_recomputed, modules

MLP_LABELS = ("mlp.", "fc.", "fc2.")  # a block's MLP collectives (modes: 1D's half "mlp", 2D / 3D's fc, fc2 linears)
NORM_LABELS = ("ln1.", "ln2.")  # a block's two norms' (2D / 2.5D / 3D: statistics all-reduced, gamma / beta gathered)
# The MLP's last linear's collectives the executor issues after the op that saves fc2's GEMM inputs: 1D's output
# reduce-scatter (sp) / all-reduce, 2D / 3D's bias gather. torch.utils.checkpoint (non-reentrant) stops the
# recomputation once the region's last saved tensor is made again, so they are not issued again
# (executor/layers/discard.py). 3D's output reduce-scatter (fc2.Y) runs inside the GEMM's own autograd Function, whose
# tensors are saved when it returns: issued again. With tpo, a tpo collective of these (1D + sp's output
# reduce-scatter, mlp.out) is a ring inside its GEMM's Function too (executor/layers/collective_matmul.py
# RingLinearScatter): issued again (tests/test_recompute_modules_run.py records it); the bias gathers are no rings.
AFTER_LAST_SAVED = ("mlp.out", "mlp.g", "fc2.bias")


def mlp_again(colls: list, tpo: bool = False) -> list:
    """Of a block's forward collectives, those a checkpointed MLP region issues again in backward (its forward's up
    to its last saved tensor: AFTER_LAST_SAVED not, unless run as a tpo ring inside its GEMM's Function)."""
    return [c for c in colls if c.label.startswith(MLP_LABELS)
            and (c.label not in AFTER_LAST_SAVED or (tpo and bool(c.tpo)))]


def again_collectives(d: Dims, colls: list, tpo: bool = False) -> list:
    """The forward collectives of a block (modes' layer_fwd) the backward issues again (traffic.py, comm.py,
    event_program.py): under mlp the MLP's up to its region's last saved tensor (`mlp_again`; `tpo`: the layout's);
    under layernorm the two norms' (their forward re-runs alone: 2D / 2.5D / 3D's statistics all-reduce and gamma /
    beta gathers; none in none / 1D). On a model with MoE blocks the dense engines' `d` holds only DENSE's modules:
    the dense blocks' mlp and the shared experts' are moe_mlp_again.py's."""
    mods = modules(d)
    again = set(map(id, mlp_again(colls, tpo))) if "mlp" in mods else set()
    core = d.cp > 1 and core_recomputed(d)  # the core's cp exchange, re-run with it (Runtime.cp_core_recompute)
    return [c for c in colls if id(c) in again or ("layernorm" in mods and c.label.startswith(NORM_LABELS))
            or (core and c.axes == ("cp",))]


__all__ = ["AFTER_LAST_SAVED", "MLP_LABELS", "NORM_LABELS", "again_collectives", "mlp_again"]
