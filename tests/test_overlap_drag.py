"""The overlap drag (cost_models/overlap_drag.py): the NVLink share of a data-parallel ring in closed form, both
engines pricing the drag alike, and what it adds bounded by the stream it runs beside."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event
from paracube.cost_models.overlap_drag import nvlink_share, owed
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.topologies.calibration import as_calibration
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("mid", layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=32000, seq_len=1024)


@pytest.mark.parametrize("ranks,per_node,share", [
    (range(8), 8, 1.0),  # one node: every hop on NVLink
    (range(32), 8, 28 / 32),  # 4 nodes of 8: one hop per node crosses
    (range(0, 64, 8), 8, 0.0),  # one rank per node: every hop crosses
    (range(0, 16, 2), 8, 6 / 8),  # 2 nodes of 4
    (range(8), 0, 0.0),  # no node structure
    (range(1), 8, 0.0),  # one rank: no ring
])
def test_nvlink_share_is_the_ring_hops_inside_a_node(ranks: range, per_node: int, share: float) -> None:
    assert nvlink_share(np.array(list(ranks)), per_node) == pytest.approx(share, rel=1e-12)


def test_owed_is_absorbed_by_idle_time() -> None:
    """The event engine's debt: D (dur - idle) - idle, never negative (module docstring)."""
    assert owed(0.25, 1.0, 0.0) == pytest.approx(0.25)
    assert owed(0.25, 1.0, 0.1) == pytest.approx(0.25 * 0.9 - 0.1)
    assert owed(0.25, 1.0, 0.5) == 0.0


def _topo(gpus: int, drag: float | None):
    topo = load_topology("dgx-a100", gpus=gpus)
    if drag is not None:  # the same preset with its calibration's drag replaced
        cal = as_calibration(topo.calibration)
        topo.calibration = replace(cal, gemm=replace(cal.gemm, overlap_drag=drag))
    return topo


# gradient buckets under the last backward (layouts whose engines agree to 0.5% without the drag: with one or two
# sequences per micro-batch they are 2-4% apart before it), zero=1 gathers under the first forward (partly
# exposed with mb=1, hidden with mb=4), FSDP's prefetched gathers and reduce-scatters, one and several nodes
CASES = [(64, "dp=16,mb=4,overlap", {}), (128, "dp=16,mb=8,overlap", {}), (128, "dp=8,tp=1d:2,mb=8,overlap", {}),
         (32, "dp=16,zero=1,mb=1", {"param_overlap": True}), (64, "dp=16,zero=1,mb=4", {"param_overlap": True}),
         (32, "dp=16,zero=3,overlap", {"fsdp_prefetch": True}), (64, "dp=32,zero=3,overlap", {"fsdp_prefetch": True}),
         (64, "dp=8,zero=3,mb=2,overlap", {"fsdp_prefetch": True})]


@pytest.mark.parametrize("gb,text,opts", CASES)
def test_engines_agree_with_the_drag(gb: int, text: str, opts: dict) -> None:
    """Within 2% (the two engines' bound) on the A100 preset, whose generation has a drag; and the drag the
    analytic engine adds is at most D f x the data-parallel stream's seconds (it slows the compute beside them)."""
    layout = parse_layout(text)
    training = TrainingSpec(global_batch=gb, dtype="bf16", recompute="none")
    topo, free = _topo(layout.world_size, None), _topo(layout.world_size, 0.0)
    assert gemm_model(topo, "bf16").overlap_drag > 0 and gemm_model(free, "bf16").overlap_drag == 0
    a = estimate(SPEC, training, layout, topo, with_events=False, **opts)
    e = estimate_event(SPEC, training, layout, topo, **opts)
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.02), (a.step_time_s, e.step_time_s)
    a0 = estimate(SPEC, training, layout, free, with_events=False, **opts)
    e0 = estimate_event(SPEC, training, layout, free, **opts)
    f = nvlink_share(layout.groups(layout.zero_axes)[0], topo.devices_per_node)
    stream = sum(a0.comm_time_by_axis.get(k, 0.0) for k in ("dp", "dp.tp", "tp.dp"))
    bound = gemm_model(topo, "bf16").overlap_drag * f * max(stream, a0.comm_time_s) * (1 + 1e-9)
    assert 0.0 <= a.step_time_s - a0.step_time_s <= bound
    assert 0.0 <= e.step_time_s - e0.step_time_s <= bound + 0.02 * e0.step_time_s
