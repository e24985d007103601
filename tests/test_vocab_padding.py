"""GPT-2's vocabulary (50,257, padded as Megatron pads it) in 2D and 3D against the serial model padded the
same way: loss, every gradient, parameters after 3 AdamW steps (relative 1e-5 in fp32), and the collectives
one train_step records equal to `traffic.stage_events` of the same layout (issue #13).

The tiny model shape keeps the run short; only the vocabulary is GPT-2's. One process pool per layout.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import rel_err, run_distributed

from paracube.cost_models.dims import dims_of, padded_vocab
from paracube.cost_models.traffic import stage_events
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, serial_reference, train_step
from paracube.executor.model.gpt import ParallelGPT
from paracube.layout_parse import parse_layout
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("gpt2-vocab", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=50257, seq_len=16)
B = 4  # sequences per micro-batch (3D splits them q^2 = 4 ways)
N_MICRO = 2
STEPS = 3
MAX_NORM = 0.3
TOL = 1e-5
# Per parameter tensor after 3 AdamW steps. A few elements of a bias have a near-cancelling gradient: in 2D,
# blocks.0.mlp.fc.bias element 31 of rank 2's block has |g| = 5.5e-7 (the tensor's median is 1.3e-3), where
# fp32 summation order alone moves g by 7.5e-4 relative; with |g| below Adam's eps (1e-6) the update is
# proportional to g, so that one element moves 1.7e-7 away from the serial one and its 64-element block
# 1.3e-5 (every other tensor <= 4.4e-6; 3D: the same tensor at 1.2e-5). All of a rank's parameters at once
# (and the losses, gradient norms and every gradient) stay within TOL.
PARAM_TOL = 1e-4
LAYOUTS = ["dp=1,tp=2d:2x2", "dp=1,tp=3d:2x2x2"]


def micro_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, SPEC.vocab, (B * N_MICRO, SPEC.seq_len), generator=gen)
    labels = torch.randint(0, SPEC.vocab, (B * N_MICRO, SPEC.seq_len), generator=gen)
    return [(ids[m * B:(m + 1) * B], labels[m * B:(m + 1) * B]) for m in range(N_MICRO)]


def serial_token_losses(ref: ParallelGPT, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    x = ref.embed(ids)
    for block in ref.blocks:
        x = block(x)
    return ref.token_losses(x, labels)


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    # eps as in test_equivalence_model: the key bias's true gradient is exactly zero.
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-6)


def check_gpt2_vocab(rank: int, world: int, layout_text: str) -> dict[str, Any]:
    torch.manual_seed(0)
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    out: dict[str, Any] = {"errors": {}}
    errs = out["errors"]
    micro = micro_batches()
    tokens = B * N_MICRO * SPEC.seq_len

    model = build_model(SPEC, mesh, seed=7)
    ref = serial_reference(SPEC, seed=7, vocab=model.vocab)  # padded as the model it checks
    out["vocab"] = model.vocab
    ids, labels = micro[0]
    local_sum, count = model(ids, labels)
    ref_losses = serial_token_losses(ref, ids, labels)
    mine = model.mode.split_tokens(ref_losses)
    errs["loss_sum"] = rel_err(local_sum, mine.sum())
    out["count_ok"] = float(count) == mine.numel()
    (local_sum / tokens).backward()
    (ref_losses.sum() / tokens).backward()
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errs[f"grad:{name}"] = rel_err(p.grad, model.block_of(name, ref_params[name].grad))

    model = build_model(SPEC, mesh, seed=7)
    ref = serial_reference(SPEC, seed=7, vocab=model.vocab)
    opt, ref_opt = adamw(model), adamw(ref)
    for step in range(STEPS):
        mesh.recorder.reset()
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM)
        ref_res = train_step(ref, ref_opt, ref.mesh, micro, tokens, MAX_NORM)
        if step == 0:
            out["events"] = [e.key() for e in mesh.recorder.events]
        errs[f"step{step}.loss"] = abs(res.loss - ref_res.loss) / ref_res.loss
        errs[f"step{step}.grad_norm"] = abs(res.grad_norm - ref_res.grad_norm) / ref_res.grad_norm
    ref_params = dict(ref.named_parameters())
    out["params"] = {n: rel_err(p, model.block_of(n, ref_params[n])) for n, p in model.named_parameters()}
    errs["params (all at once)"] = rel_err(
        torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        torch.cat([model.block_of(n, ref_params[n]).detach().reshape(-1) for n, _ in model.named_parameters()]))
    return out


@pytest.fixture(scope="module", params=LAYOUTS)
def results(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, run_distributed(check_gpt2_vocab, parse_layout(request.param).world_size, request.param)


def test_vocabulary_is_padded_as_megatron_pads_it(results: tuple[str, list[dict[str, Any]]]) -> None:
    text, outs = results
    layout = parse_layout(text)
    split = layout.tensor_mode.vocab_split(layout.tensor_size, layout.q)
    expected = padded_vocab(SPEC.vocab, split)
    assert expected % (128 * split) == 0 and SPEC.vocab < expected < SPEC.vocab + 128 * split
    assert all(o["vocab"] == expected for o in outs)


def test_loss_gradients_and_parameters_match_serial(results: tuple[str, list[dict[str, Any]]]) -> None:
    _, outs = results
    for rank, o in enumerate(outs):
        assert o["count_ok"], f"rank {rank}: token count"
        bad = {k: v for k, v in o["errors"].items() if not v <= TOL}
        assert not bad, f"rank {rank}: relative errors above {TOL}: {bad}"
        bad = {k: v for k, v in o["params"].items() if not v <= PARAM_TOL}
        assert not bad, f"rank {rank}: parameters after {STEPS} steps above {PARAM_TOL}: {bad}"
        assert any(k.startswith("grad:head") for k in o["errors"]) and "tok_emb.weight" in o["params"]


def test_recorded_collectives_equal_the_prediction(results: tuple[str, list[dict[str, Any]]]) -> None:
    text, outs = results
    layout = parse_layout(text).with_(micro_batch=B)
    training = TrainingSpec(global_batch=B * N_MICRO, dtype="fp32", recompute="none")
    events = stage_events(layout, dims_of(SPEC, training), B)
    assert events
    for rank, o in enumerate(outs):
        diff = traffic_difference(events, o["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
