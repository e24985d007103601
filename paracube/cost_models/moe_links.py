"""The folded expert groups' links (moe.py's decomposition): where a layout's etp, ep and edp ranks sit (Layout's
MoE Parallel Folding, innermost first) and the (bandwidth, latency) each group's collectives run at, the all_to_all's
with its dispatcher's bytes (moe_a2a.py, moe_dispatch.py)."""

from __future__ import annotations

from paracube.cost_models.links import LinkCache, placement_of
from paracube.cost_models.moe_a2a import A2A, PLAIN, a2a_link
from paracube.cost_models.moe_dispatch import Dispatch
from paracube.layout import Layout
from paracube.modes.experts import aux_count_axes


def expert_placement(layout: Layout) -> tuple[tuple[str, int], ...]:
    """The folded axes innermost first (etp, ep, edp within a stage, then pp): Layout.expert_groups' order,
    exact where pp is the outermost axis of the placement (the default); otherwise each stage's ranks are
    taken as if consecutive (the estimate notes it)."""
    return (("etp", layout.etp), ("ep", layout.ep), ("edp", layout.expert_data), ("pp", layout.pp))


def expert_links(layout: Layout, cache: LinkCache,
                 dispatch: Dispatch = PLAIN) -> dict[tuple[str, ...], tuple[float, float]]:
    """The folded groups' links, the tensor group's and the aux loss's counts' group (moe_counts.py: with cp, cp x
    tensor); the all_to_all's with the dispatcher's bytes (moe_dispatch.py)."""
    place = expert_placement(layout)
    links = {axes: cache.get(place, axes) for axes in (("ep",), ("etp",), ("edp",))}
    links[A2A + ("ep",)] = a2a_link(cache, place, ("ep",), dispatch)  # dispatch / combine / counts (moe_a2a.py)
    tensor = tuple(layout.tensor_axes)
    if tensor:
        links[tensor] = cache.get(placement_of(layout), tensor)
    aux = aux_count_axes(layout)  # with cp: (cp, *tensor), a sequence's ranks (moe_counts.py)
    if aux and aux not in links:
        links[aux] = cache.get(placement_of(layout), aux)
    return links
