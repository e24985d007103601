"""FSDP's copy-out after each unit gather and copy-in before each unit reduce-scatter (cost_models/fsdp_copies.py):
the event engine's copy ops move the elements the analytic recursion's units hold, and the two engines price the
step alike with them."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate, prepare
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event
from paracube.cost_models.event_program import build_stage
from paracube.cost_models.fsdp_copies import RS_BYTES
from paracube.cost_models.fsdp_overlap import unit_sizes
from paracube.cost_models.validity import layout_arrays
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("mid", layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=8192, seq_len=1024)
LAYOUTS = ["dp=8,zero=3,mb=1,overlap", "dp=16,zero=3,mb=2,overlap", "dp=8,zero=2,mb=1,overlap",
           "dp=8,tp=1d:2,sp,zero=3,mb=1,overlap"]


@pytest.mark.parametrize("text", LAYOUTS)
def test_copy_ops_move_the_recursions_unit_elements(text: str) -> None:
    """Per micro-batch, the event program's copy-out seconds x rate / (2 c) are the gathered elements (every unit in
    the forward, all but the head again in the backward: zero=3 only) and its copy-in seconds x rate / (c + 4) the
    reduce-scattered ones (every unit), counted from fsdp_overlap.unit_sizes (the analytic recursion's units)."""
    layout = parse_layout(text)
    training = TrainingSpec(global_batch=32, dtype="bf16", recompute="none")
    topo = load_topology("dgx-a100", gpus=layout.world_size)
    d, mb, _ = prepare(SPEC, training, layout)
    g = gemm_model(topo, "bf16")
    prog = build_stage(layout, d, mb, 0, g, grad_overlap=True, fsdp_prefetch=True)
    rate = g.mem_bw * g.mem_eff
    ops = prog.fwd[0] + prog.bwd[0]
    out = sum(op.seconds for op in ops if op.kind == "compute" and op.name.endswith(".gather.copy")) * rate
    cin = sum(op.seconds for op in ops if op.kind == "compute" and op.name.endswith(".rs.copy")) * rate
    one = np.ones(1, dtype=np.int64)
    emb, block, head = unit_sizes(d, layout.mode, layout_arrays(layout, mb), one, one,
                                  np.array([layout.axis_size_of(layout.zero_axes)]))[0]
    units = emb + SPEC.layers * block + head
    gathered = (2 * units - head) if layout.zero == 3 else 0
    assert out == pytest.approx(2 * d.c * gathered, rel=1e-9)
    assert cin == pytest.approx((d.c + RS_BYTES) * units, rel=1e-9)


@pytest.mark.parametrize("text", LAYOUTS)
def test_engines_agree_with_the_copies(text: str) -> None:
    """Within 2% (the two engines' bound), prefetched as torchtitan runs it."""
    layout = parse_layout(text)
    training = TrainingSpec(global_batch=32, dtype="bf16", recompute="none")
    topo = load_topology("dgx-a100", gpus=layout.world_size)
    a = estimate(SPEC, training, layout, topo, with_events=False, fsdp_prefetch=True)
    e = estimate_event(SPEC, training, layout, topo, fsdp_prefetch=True)
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.02), (a.step_time_s, e.step_time_s)
