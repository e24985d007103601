"""Fidelity: what the executor really does equals what the analytic cost model predicts.

For every layout the executor runs, one training step (2 micro-batches, AdamW, clipping) on gloo ranks:
- traffic: the executor's recorded collectives equal `traffic.stage_events` of the same plan, as a multiset of
  (kind, mesh axes, payload bytes, dtype) -- zero difference, not a tolerance;
- memory: parameter (compute copy), gradient (fp32 buckets) and optimizer (AdamW moments, plus fp32 masters for
  bf16) bytes per rank equal the model's exactly; activation memory
  (bytes of the tensors autograd saves during one micro-batch's forward, measured with saved_tensors_hooks)
  is within 10% of the model's (the issue's bound; the model is counted from the executor's code and in
  practice agrees to 0.1%, so the test holds it to 2%).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import run_distributed, saved_bytes

from paracube.cost_models import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, train_step
from paracube.executor.comm import CommRecorder
from paracube.executor.data_parallel.grad_sync import grad_sync_for
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.executor.layers.functional import COMPUTE_DTYPES
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.modes.buckets import BUCKET_BYTES
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("fidelity", layers=2, hidden=64, heads=8, ffn_hidden=256, vocab=128, seq_len=32)
MB = 4  # sequences per micro-batch per replica
N_MICRO = 2
CASES = [  # (layout, dtype, recompute)
    ("dp=1", "fp32", "none"),
    ("dp=1,tp=1d:2", "fp32", "none"),
    ("dp=1,tp=1d:4", "fp32", "none"),
    ("dp=1,tp=1d:8", "fp32", "none"),
    ("dp=1,tp=2d:2x2", "fp32", "none"),
    ("dp=2,tp=2d:2x2", "fp32", "none"),
    ("dp=1,tp=3d:2x2x2", "fp32", "none"),
    ("dp=1,tp=2.5d:2x2x2", "fp32", "none"),
    ("dp=8", "fp32", "none"),
    ("dp=1,tp=1d:4", "bf16", "none"),
    ("dp=1,tp=3d:2x2x2", "bf16", "none"),
    ("dp=2,tp=1d:4", "bf16", "full"),
    ("dp=1,tp=3d:2x2x2", "bf16", "full"),
    ("dp=1,tp=2.5d:2x2x2", "bf16", "none"),
]


def training_for(layout: Layout, dtype: str, recompute: str) -> TrainingSpec:
    return TrainingSpec(global_batch=layout.dp * MB * N_MICRO, dtype=dtype, recompute=recompute)


def _one_step(rank: int, world: int, layout_text: str, dtype: str, recompute: str) -> dict[str, Any]:
    layout = parse_layout(layout_text)
    recorder = CommRecorder()
    mesh = Mesh(layout, rank, recorder)
    model = build_model(SPEC, mesh, seed=0, recompute=recompute, dtype=COMPUTE_DTYPES[dtype])
    optimizer = build_optimizer(model, mesh, layout.zero, BUCKET_BYTES, lr=1e-3)
    gen = torch.Generator().manual_seed(7 + mesh.coord("dp"))
    batches = [(torch.randint(0, SPEC.vocab, (MB, SPEC.seq_len), generator=gen),
                torch.randint(0, SPEC.vocab, (MB, SPEC.seq_len), generator=gen)) for _ in range(N_MICRO)]
    tokens = layout.dp * MB * N_MICRO * SPEC.seq_len

    # Activation memory: the distinct storages autograd saves for backward during one micro-batch's forward.
    loss, activations = saved_bytes(model, *batches[0])
    loss.backward()
    model.zero_grad(set_to_none=True)
    recorder.reset()
    train_step(model, optimizer, mesh, batches, tokens, max_grad_norm=1.0)
    masters = getattr(optimizer, "masters", [])
    return {
        "events": [e.key() for e in recorder.events],
        "parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": sum(b.buffer.numel() * b.buffer.element_size() for b in grad_sync_for(model, mesh).buckets),
        "optimizer": sum(m.numel() * m.element_size() for m in masters)
        + sum(s[k].numel() * s[k].element_size() for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")),
        "activations": activations,
        "state_dtypes": sorted({str(t.dtype) for s in optimizer.state.values() for t in s.values()
                                if t.dim() > 0} | {str(m.dtype) for m in masters}),
    }


def _cases_on_ranks(rank: int, world: int, cases: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    return [_one_step(rank, world, *case) for case in cases]


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Every case, run in one launch per world size (4 launches instead of 14: a launch's fixed cost, forking
    the ranks and joining the rendezvous, is paid once per world size)."""
    by_world: dict[int, list[tuple[str, str, str]]] = {}
    for case in CASES:
        by_world.setdefault(parse_layout(case[0]).world_size, []).append(case)
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for world, cases in by_world.items():
        per_rank = run_distributed(_cases_on_ranks, world, cases, timeout=600.0)
        out.update({case: [r[i] for r in per_rank] for i, case in enumerate(cases)})
    return out


def predicted(case: tuple[str, str, str]):  # noqa: ANN201
    layout = parse_layout(case[0]).with_(micro_batch=MB)
    training = training_for(layout, case[1], case[2])
    events = stage_events(layout, dims_of(SPEC, training), MB)
    est = estimate(SPEC, training, layout, load_topology("local-cpu", gpus=layout.world_size), with_events=False)
    return events, est


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_traffic_equals_prediction(runs, case) -> None:
    events, _ = predicted(case)
    assert events or case[0] == "dp=1"
    for rank, out in enumerate(runs[case]):
        diff = traffic_difference(events, out["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_memory_equals_prediction(runs, case) -> None:
    _, est = predicted(case)
    out = runs[case][0]
    assert out["parameters"] == est.memory.parameters
    assert out["gradients"] == est.memory.gradients
    assert out["optimizer"] == est.memory.optimizer
    assert out["state_dtypes"] == ["torch.float32"]  # moments (and bf16's masters) in fp32
    print(case, "activations measured", out["activations"], "predicted", est.memory.activations)
    assert out["activations"] == pytest.approx(est.memory.activations, rel=0.02)
