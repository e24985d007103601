"""Qwen3-style attention (a head width d with heads x d != hidden, per-head q / k RMSNorms) priced one way everywhere.

Equivalence checks, each a reference against the candidate:
- parameters: ModelSpec.num_parameters (workload.py's own count of q, k, v, o at heads x d and the two gammas) equals
  the shard-by-shard count of one unsplit rank (local_parameters.local_parameter_count), and in every mode the
  closed form (dims.local_params) equals that shard count, stage by stage (exact: integers);
- communication: in every mode and recomputation the vectorized closed form (comm.comm_entries, the analytic engine)
  equals the explicit event list (traffic.stage_events, what the executor is compared with in
  tests/test_qk_norm_run.py), per (kind, axes, dtype), calls and bytes (exact: integers);
- the two engines on a topology where no link carries two groups' hops (tests/test_event_engine.py's
  no-contention check and its bounds: the same compute to 1e-6, steps within 5%; here the same events and memory).
The executor's own collectives and saved bytes against these counts: tests/test_qk_norm_run.py.
"""

from __future__ import annotations

import pytest
from test_cost_model import MODES, _check_closed_form

from paracube.cost_models.analytic import estimate
from paracube.cost_models.dims import dims_of, local_params
from paracube.cost_models.event import estimate_event
from paracube.cost_models.local_parameters import local_parameter_count
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.modes.stages import stage_layers
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

# hidden 64, 4 heads of 32 (q width 128), 2 kv heads, q / k norms; vocab a multiple of 128 x every split (no padding)
QWEN3 = ModelSpec("qwen3-small", layers=6, hidden=64, heads=4, ffn_hidden=192, vocab=1024, seq_len=8, family="llama",
                  kv_heads=2, head_size=32, qk_norm=True)
SHAPES = {"none": (), "1d": (2,), "1d-sp": (2,), "2d": (2, 2), "2.5d": (2, 2, 2), "3d": (2, 2, 2)}


def _layout(mode: str, pp: int, v: int) -> Layout:
    return Layout(dp=2, pp=pp, mode=mode.removesuffix("-sp"), shape=SHAPES[mode], micro_batch=8,  # type: ignore[arg-type]
                  interleave=v, sequence_parallel=mode == "1d-sp")


def test_unsplit_parameters_are_the_models() -> None:
    d = dims_of(QWEN3, TrainingSpec(global_batch=16))
    assert local_parameter_count(Layout(dp=2), d) == QWEN3.num_parameters()


@pytest.mark.parametrize("mode", MODES)
def test_closed_form_parameters_equal_the_shards(mode: str) -> None:
    d = dims_of(QWEN3, TrainingSpec(global_batch=2 * 8 * 6))
    for pp, v, stages in ((3, 2, ("first", "middle", "last")), (1, 1, ("first",))):
        layout = _layout(mode, pp, v)
        for stage in stages:
            first, last = pp == 1 or stage == "first", pp == 1 or stage == "last"
            layers = int(stage_layers(d.L, pp, v, int(first), int(last)))
            closed = local_params(d, layout.mode, layout.tensor_size, layout.q, layers, first, last)
            assert closed == local_parameter_count(layout, d, stage), (mode, pp, stage)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_closed_form_traffic_equals_the_event_list(mode: str, recompute: str) -> None:
    training = TrainingSpec(global_batch=2 * 8 * 6, dtype="bf16", recompute=recompute)  # type: ignore[arg-type]
    for pp, v, stages in ((3, 2, ("first", "middle", "last")), (1, 1, ("first",))):
        for stage in stages:
            _check_closed_form((QWEN3, training, _layout(mode, pp, v), 8), stage)


@pytest.mark.parametrize("text", ["dp=16", "dp=2,tp=1d:8", "dp=2,tp=1d:8,sp", "dp=4,tp=2d:2x2", "dp=2,tp=2.5d:2x2x2",
                                  "dp=2,tp=3d:2x2x2", "dp=8,cp=2"])
def test_both_engines_price_qwen3_alike(text: str) -> None:
    """Two DGX A100 nodes (tests/test_event_engine.py: tensor groups inside a node, data-parallel groups across it on
    per-GPU rail NICs): Qwen3-4B's widths (hidden 2560, 32 heads of 128, 8 kv heads, q / k norms), 4 blocks."""
    model = ModelSpec("qwen3-4b-4", layers=4, hidden=2560, heads=32, ffn_hidden=9728, vocab=151936, seq_len=512,
                      family="llama", kv_heads=8, head_size=128, qk_norm=True)
    topo, training, layout = load_topology("dgx-a100", gpus=16), TrainingSpec(global_batch=16), parse_layout(text)
    ev, an = estimate_event(model, training, layout, topo), estimate(model, training, layout, topo)
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.05)
    assert ev.memory == an.memory and ev.events == an.events
    assert any(e.label.endswith("qk_norm") for e in an.events) == (layout.tensor_size > 1)
