"""The llama family (RMSNorm, rotary positions, grouped-query attention with kv_heads < heads, SwiGLU) and
tied embeddings in every tensor mode the executor runs, against the serial reference: loss, every
gradient, parameters after 3 AdamW steps through train_step (relative 1e-5, fp32), and the collectives of
one train_step equal to the cost model's `traffic.stage_events` (zero difference), parameters per rank
equal to the model's, activations within 2% of it. One rank launch per layout checks every model of that layout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from dist_helpers import rel_err, run_distributed, saved_bytes

from paracube.cost_models import estimate
from paracube.cost_models.dims import dims_of, padded_vocab
from paracube.cost_models.traffic import stage_events
from paracube.errors import ParacubeError
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference, train_step
from paracube.executor.comm import all_reduce
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.executor.layers.llama import gqa_attention, rotary, rotary_tables, swiglu
from paracube.layout_parse import parse_layout
from paracube.modes.buckets import BUCKET_BYTES
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

LLAMA = ModelSpec("llama-test", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=16,
                  family="llama", kv_heads=2, rope_theta=500.0)
B, N_MICRO, STEPS, MAX_NORM, TOL = 4, 2, 3, 0.3, 1e-5
CASES = {  # layout -> models it runs (tied embeddings in 2D / 2.5D / 3D: tests/test_tied.py)
    "dp=1": [LLAMA, replace(LLAMA, tied_embeddings=True)],
    "dp=1,tp=1d:2": [LLAMA, replace(LLAMA, tied_embeddings=True),
                     ModelSpec("gpt-tied", 2, 32, 4, 64, 64, 16, tied_embeddings=True)],
    "dp=1,tp=2d:2x2": [LLAMA],
    "dp=1,tp=3d:2x2x2": [LLAMA],
    "dp=1,tp=2.5d:2x2x2": [LLAMA],
}


def _batches(spec: ModelSpec) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234)
    return [(torch.randint(0, spec.vocab, (B, spec.seq_len), generator=gen),
             torch.randint(0, spec.vocab, (B, spec.seq_len), generator=gen)) for _ in range(N_MICRO)]


def _adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-6)


def _check(mesh: Mesh, spec: ModelSpec) -> dict[str, Any]:
    errs: dict[str, float] = {}
    micro = _batches(spec)
    tokens = B * N_MICRO * spec.seq_len
    model, ref = build_model(spec, mesh, seed=7), serial_reference(spec, seed=7)
    full = model.full_state_dict()
    init_exact = all(torch.equal(full[n], p) for n, p in ref.full_state_dict().items())
    local_sum, saved = saved_bytes(model, *micro[0])
    ref_sum, _ = ref(*micro[0])
    ref_losses = ref.token_losses(_serial_blocks(ref, micro[0][0]), micro[0][1])
    errs["loss"] = rel_err(local_sum, model.mode.split_tokens(ref_losses).sum())
    (local_sum / tokens).backward()
    (ref_sum / tokens).backward()
    ref_params = dict(ref.named_parameters())
    depth_axes = tuple(a for a in mesh.layout.tensor_mode.grad_axes if a != "dp")  # 2.5D: each depth's share
    for name, p in model.named_parameters():
        grad = all_reduce(p.grad, mesh, depth_axes) if depth_axes else p.grad
        errs[f"grad:{name}"] = rel_err(grad, model.block_of(name, ref_params[name].grad))
    model, ref = build_model(spec, mesh, seed=7), serial_reference(spec, seed=7)
    opt, ref_opt = _adamw(model), _adamw(ref)
    events: list = []
    for step in range(STEPS):
        mesh.recorder.reset()
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM)
        ref_res = train_step(ref, ref_opt, ref.mesh, micro, tokens, MAX_NORM)
        events = events or [e.key() for e in mesh.recorder.events]
        errs[f"step{step}.loss"] = abs(res.loss - ref_res.loss) / ref_res.loss
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errs[f"param:{name}"] = rel_err(p, model.block_of(name, ref_params[name]))
    return {"errors": errs, "init_exact": init_exact, "events": events, "names": sorted(ref_params),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "activations": saved}


def _serial_blocks(ref: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    x = ref.embed(ids)
    for block in ref.blocks:
        x = block(x)
    return x


def _run_layout(rank: int, world: int, layout_text: str) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank) if world > 1 else Mesh.single(layout)
    results = [_check(mesh, spec) for spec in CASES[layout_text]]
    if layout.tensor_size > 1:  # bf16 (fp32 masters) with full recomputation: the same zero traffic difference
        model = build_model(LLAMA, mesh, seed=7, recompute="full", dtype=torch.bfloat16)
        mesh.recorder.reset()
        train_step(model, build_optimizer(model, mesh, 0, BUCKET_BYTES, lr=1e-3), mesh, _batches(LLAMA),
                   B * N_MICRO * LLAMA.seq_len, MAX_NORM)
        results[0]["bf16_full_events"] = [e.key() for e in mesh.recorder.events]
    # bf16 activations without recomputation (RMSNorm saves its bf16 input and fp32 rstd), serial included
    results[0]["bf16_activations"] = saved_bytes(build_model(LLAMA, mesh, seed=7, dtype=torch.bfloat16),
                                                  *_batches(LLAMA)[0])[1]
    return results


@pytest.fixture(scope="module", params=list(CASES))
def layout_results(request: pytest.FixtureRequest) -> tuple[str, list[list[dict[str, Any]]]]:
    world = parse_layout(request.param).world_size
    if world == 1:
        return request.param, [_run_layout(0, 1, request.param)]
    return request.param, run_distributed(_run_layout, world, request.param)


def test_llama_matches_the_serial_reference(layout_results) -> None:
    layout_text, ranks = layout_results
    for rank, per_model in enumerate(ranks):
        for spec, r in zip(CASES[layout_text], per_model, strict=True):
            assert r["init_exact"], (rank, spec.name)
            bad = {k: v for k, v in r["errors"].items() if not v <= TOL}
            assert not bad, f"rank {rank} {spec.name} tied={spec.tied_embeddings}: errors above {TOL}: {bad}"
            assert ("head.weight" in r["names"]) != spec.tied_embeddings
            if spec.family == "llama":
                assert "pos_emb.weight" not in r["names"] and "blocks.0.ln1.bias" not in r["names"]


def test_llama_traffic_and_parameters_equal_the_model(layout_results) -> None:
    layout_text, ranks = layout_results
    layout = parse_layout(layout_text).with_(micro_batch=B)
    for n, spec in enumerate(CASES[layout_text]):
        training = TrainingSpec(global_batch=B * N_MICRO)
        predicted = stage_events(layout, dims_of(spec, training), B)
        est = estimate(spec, training, layout, load_topology("local-cpu", gpus=layout.world_size), with_events=False)
        for rank, per_model in enumerate(ranks):
            diff = traffic_difference(predicted, per_model[n]["events"])
            assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, spec.name, diff)
            assert per_model[n]["parameter_bytes"] == est.memory.parameters, (rank, spec.name)
            assert per_model[n]["activations"] == pytest.approx(est.memory.activations, rel=0.02), (rank, spec.name)
        if layout.tensor_size == 1:
            # the serial model pads its vocabulary as Megatron does at tp=1 (to a multiple of 128)
            padded = replace(spec, vocab=padded_vocab(spec.vocab, 1))
            assert ranks[0][n]["parameter_bytes"] == 4 * padded.num_parameters()
    if layout.tensor_size > 1:
        training = TrainingSpec(global_batch=B * N_MICRO, dtype="bf16", recompute="full")
        predicted = stage_events(layout, dims_of(LLAMA, training), B)
        for rank, per_model in enumerate(ranks):
            diff = traffic_difference(predicted, per_model[0]["bf16_full_events"])
            assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, "bf16 full", diff)
    est = estimate(LLAMA, TrainingSpec(global_batch=B * N_MICRO, dtype="bf16"), layout,
                   load_topology("local-cpu", gpus=layout.world_size), with_events=False)
    assert ranks[0][0]["bf16_activations"] == pytest.approx(est.memory.activations, rel=0.02)


@pytest.mark.parametrize(("spec", "layout", "message"), [
    (replace(LLAMA, kv_heads=1), "tp=1d:2", "kv_heads=1 is not divisible by 2"),
    (replace(LLAMA, kv_heads=1), "tp=2d:2x2", "kv_heads=1 is not divisible by 2"),
])
def test_llama_layouts_the_executor_cannot_split_are_refused_up_front(spec, layout, message) -> None:
    with pytest.raises(ParacubeError, match=message):
        check_divisibility(spec, parse_layout(layout), B * 4, B * 4, spec.seq_len)


def test_bad_llama_shapes_and_unknown_families_are_refused() -> None:
    with pytest.raises(ParacubeError, match="heads=4 is not divisible by kv_heads=3"):
        replace(LLAMA, kv_heads=3)
    with pytest.raises(ParacubeError, match="family='mamba'; valid: gpt, llama"):
        replace(LLAMA, family="mamba")
    with pytest.raises(ParacubeError, match="grouped-query attention needs family llama"):
        replace(LLAMA, family="gpt")


def test_rotary_is_a_rotation_relative_in_position() -> None:
    """Rotary embeddings keep norms, and q_m . k_n depends on m - n only (Su et al. 2021)."""
    d, s = 8, 6
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(d, generator=gen, dtype=torch.float64), torch.randn(d, generator=gen, dtype=torch.float64)
    cos, sin = rotary_tables(s, d, 10000.0, q)
    rq = rotary(q.expand(1, 1, s, d), cos, sin)[0, 0]
    rk = rotary(k.expand(1, 1, s, d), cos, sin)[0, 0]
    assert torch.allclose(rq.norm(dim=-1), q.norm().expand(s))
    scores = rq @ rk.t()
    for m in range(1, s):
        for n in range(1, s):
            assert torch.allclose(scores[m, n], scores[m - 1, n - 1])
    assert not torch.allclose(scores[1, 0], scores[0, 0])


def test_gqa_attention_reads_the_kv_head_of_each_query_group() -> None:
    """Query head j attends with kv head j // group (transformers' repeat_kv), written out head by head."""
    b, s, kv, group, d = 2, 5, 2, 3, 4
    qkv = torch.randn(b, s, kv * (group + 2) * d, generator=torch.Generator().manual_seed(1))
    out = gqa_attention(qkv, kv, group, 10000.0)
    g = qkv.view(b, s, kv, group + 2, d)
    cos, sin = rotary_tables(s, d, 10000.0, qkv)
    for j in range(kv * group):
        q = rotary(g[:, :, j // group, j % group, :].unsqueeze(1), cos, sin)
        k = rotary(g[:, :, j // group, group, :].unsqueeze(1), cos, sin)
        v = g[:, :, j // group, group + 1, :].unsqueeze(1)
        scores = (q @ k.transpose(-1, -2)) / d**0.5
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        expected = (scores.softmax(-1) @ v)[:, 0]
        assert torch.allclose(out[..., j * d:(j + 1) * d], expected, atol=1e-6)


def test_swiglu_pairs_gate_and_up_and_its_gradient() -> None:
    y = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(swiglu, (y,))
    gate, up = y[:, 0::2], y[:, 1::2]
    assert torch.allclose(swiglu(y), torch.nn.functional.silu(gate) * up)
