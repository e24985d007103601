"""1D sequence parallelism, selective / full recomputation in every tensor mode, and a vocabulary that no split
divides (GPT-2's 50,257), against the serial reference (equivalence template): the loss and every gradient of one
micro-batch, losses and parameters after 3 AdamW steps through train_step (relative 1e-5, serial and sharded
copies in fp64: dist_helpers.TOL_FP64 says why), the collectives of one fp32 step equal to the model's
(`traffic.stage_events`, zero difference) and the bytes autograd saves for backward equal to
cost_models/activations.py (2%). Offloaded layouts (off=N) run the same equivalence, and the blocks' offload hooks
pack exactly the tensors (count and bytes) those blocks save without offloading, into host ('cpu') tensors, and no
other block packs any.

One rank launch per world size runs every case of that size; the tests assert on the results.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from dist_helpers import F64, TOL_FP64, fp64_optimizer, one_step_events, rel_err, run_distributed, saved_bytes

from paracube.cost_models import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.errors import ParacubeError
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference, train_step
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.executor.model.gpt import ParallelGPT, _resize
from paracube.executor.model.offload import BlockOffload
from paracube.layout_parse import parse_layout
from paracube.modes.buckets import BUCKET_BYTES
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("test", layers=2, hidden=32, heads=8, ffn_hidden=128, vocab=256, seq_len=16)  # vocab as tiny's
GPT2_VOCAB = replace(SPEC, name="gpt2-vocab", vocab=50257)
B, N_MICRO, STEPS, TOL = 4, 2, 3, TOL_FP64
CASES = [  # (layout, recompute, model)
    ("tp=1d:4,sp", "none", "test"),
    ("dp=2,tp=1d:2,sp", "none", "test"),
    ("dp=2,tp=1d:2,sp,zero=1", "none", "test"),  # the distributed optimizer on sequence-parallel params
    ("tp=1d:4,sp", "selective", "llama"),  # llama (GQA kv_heads < heads) on sequence shards
    ("tp=1d:4,sp", "none", "tied"),  # tied embeddings: the head is the sequence-parallel column linear of E^T
    ("tp=1d:4,sp", "selective", "test"),
    ("tp=1d:4,sp", "full", "test"),
    ("tp=1d:4", "selective", "test"),
    ("tp=1d:4", "full", "test"),
    ("tp=2d:2x2", "selective", "test"),
    ("tp=2d:2x2", "full", "test"),
    ("tp=2d:2x2", "none", "gpt2-vocab"),
    ("tp=3d:2x2x2", "selective", "test"),
    ("tp=3d:2x2x2", "full", "test"),
    ("tp=3d:2x2x2", "none", "gpt2-vocab"),
    # Megatron's unfused core attention (fa=0): the s x s softmax output kept
    ("tp=1d:4,sp,fa=0", "none", "test"),
    ("tp=2d:2x2,fa=0", "none", "test"),
    ("tp=3d:2x2x2,fa=0", "none", "test"),
    # activation offloading (off=N, executor/model/offload.py): the first N blocks under save_on_cpu
    ("dp=2,tp=1d:2,sp,off=1", "none", "test"),
    ("tp=1d:4,sp,off=2", "selective", "llama"),
]
PRICED = [c for c in CASES if "off=" not in c[0]]  # local-cpu has no host link to price offloading on
LLAMA = ModelSpec("llama", layers=2, hidden=32, heads=8, ffn_hidden=64, vocab=64, seq_len=16, family="llama",
                  kv_heads=4, rope_theta=500.0)
SPECS = {"test": SPEC, "gpt2-vocab": GPT2_VOCAB, "llama": LLAMA,
         "tied": replace(SPEC, name="tied", tied_embeddings=True)}


def _micro_batches(spec: ModelSpec, dp: int, dp_index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234)
    n = dp * B * N_MICRO
    ids = torch.randint(0, spec.vocab, (n, spec.seq_len), generator=gen)
    labels = torch.randint(0, spec.vocab, (n, spec.seq_len), generator=gen)
    start = dp_index * B * N_MICRO
    return [(ids[start + m * B:start + (m + 1) * B], labels[start + m * B:start + (m + 1) * B])
            for m in range(N_MICRO)]


ADAMW = {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}


def _block_of(model: ParallelGPT, ref: ParallelGPT, name: str, grad: bool = False) -> torch.Tensor:
    """This rank's block of the serial parameter (or gradient), the vocabulary zero-padded as the model pads."""
    full = ref.get_parameter(name)
    return model.shard_specs[name].take(_resize(full.grad if grad else full, name, model.vocab))


# The serial fp64 reference's side of a case depends only on the model and the data (dp, and the rank's dp index
# for the one-micro-batch gradient), not on the layout, recompute or attention: computed once per launch and
# rank for each, and shared by every case of that launch (15 cases on 4 ranks use 5). Read only after that.
_SERIAL: dict[tuple, tuple[ParallelGPT, Any]] = {}


def _serial_gradients(model_name: str, dp: int, dp_index: int) -> tuple[ParallelGPT, torch.Tensor]:
    """The serial model after one backward of micro-batch 0 of replica `dp_index`, and its token losses."""
    key = ("grad", model_name, dp, dp_index)
    if key not in _SERIAL:
        spec = SPECS[model_name]
        ids, labels = _micro_batches(spec, dp, dp_index)[0]
        ref = serial_reference(spec, seed=7, dtype=F64)
        x = ref.embed(ids)
        for blk in ref.blocks:
            x = blk(x)
        ref_losses = ref.token_losses(x, labels)
        (ref_losses.sum() / (dp * B * N_MICRO * spec.seq_len)).backward()
        _SERIAL[key] = (ref, ref_losses.detach())
    return _SERIAL[key]


def _serial_steps(model_name: str, dp: int) -> tuple[ParallelGPT, list[float]]:
    """The serial model after STEPS AdamW steps over every replica's micro-batches, and each step's loss."""
    key = ("steps", model_name, dp)
    if key not in _SERIAL:
        spec = SPECS[model_name]
        ref = serial_reference(spec, seed=7, dtype=F64)
        ref_opt = fp64_optimizer(ref, **ADAMW)
        all_micro = [mb for d in range(dp) for mb in _micro_batches(spec, dp, d)]
        losses = [train_step(ref, ref_opt, ref.mesh, all_micro, dp * B * N_MICRO * spec.seq_len, 0.3).loss
                  for _ in range(STEPS)]
        _SERIAL[key] = (ref, losses)
    return _SERIAL[key]


def _one_case(rank: int, layout_text: str, recompute: str, model_name: str) -> dict[str, Any]:
    spec, layout = SPECS[model_name], parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    micro = _micro_batches(spec, layout.dp, mesh.coord("dp"))
    tokens = layout.dp * B * N_MICRO * spec.seq_len
    errs: dict[str, float] = {}
    _, saved16 = saved_bytes(build_model(spec, mesh, seed=7, recompute=recompute, dtype=torch.bfloat16), *micro[0])
    _, saved = saved_bytes(build_model(spec, mesh, seed=7, recompute=recompute), *micro[0])  # fp32, as priced
    model32 = build_model(spec, mesh, seed=7, recompute=recompute)
    events = one_step_events(model32, micro, tokens, 0.3, build_optimizer(model32, mesh, layout.zero, BUCKET_BYTES))
    # the equivalence: fp64 copies (TOL)
    model = build_model(spec, mesh, seed=7, recompute=recompute, dtype=F64)
    ref, ref_losses = _serial_gradients(model_name, layout.dp, mesh.coord("dp"))
    local_sum, _ = model(*micro[0])
    errs["loss_sum"] = rel_err(local_sum, model.mode.split_tokens(ref_losses).sum())
    (local_sum / tokens).backward()
    model.reduce_sequence_parallel_grads()
    for name, p in model.named_parameters():
        errs[f"grad:{name}"] = rel_err(p.grad, _block_of(model, ref, name, grad=True))

    model = build_model(spec, mesh, seed=7, recompute=recompute, dtype=F64)
    opt = build_optimizer(model, mesh, layout.zero, BUCKET_BYTES, **ADAMW)
    ref, ref_step_losses = _serial_steps(model_name, layout.dp)
    for step in range(STEPS):
        res = train_step(model, opt, mesh, micro, tokens, 0.3)
        errs[f"step{step}.loss"] = abs(res.loss - ref_step_losses[step]) / ref_step_losses[step]
    for name, p in model.named_parameters():
        errs[f"param:{name}"] = rel_err(p, _block_of(model, ref, name))
    packs = _offload_packs(spec, mesh, recompute, *micro[0]) if layout.offload else None
    return {"errors": errs, "events": events, "activations": {"fp32": saved, "bf16": saved16}, "packs": packs}


def _offload_packs(spec: ModelSpec, mesh: Mesh, recompute: str, ids: torch.Tensor, labels: torch.Tensor
                   ) -> dict[str, dict[int, tuple[int, int, list[str]]]]:
    """Per block, (tensors, bytes, devices) that the offloaded model's hooks packed in one forward, and (tensors,
    bytes) that the same model's blocks save with offloading turned off (counted by a saved-tensors hook)."""
    model = build_model(spec, mesh, seed=7, recompute=recompute, dtype=F64)
    model(ids, labels)
    packed = {i: (c.tensors, c.bytes, sorted(c.devices)) for i, c in model.offload.packed.items()}
    plain = build_model(spec, mesh, seed=7, recompute=recompute, dtype=F64)
    plain.offload = BlockOffload(0, False)  # this copy offloads nothing
    saved: dict[int, tuple[int, int, list[str]]] = {}
    x = plain.embed(plain.context_tokens(ids), ids.shape[1])
    for i in plain.chunks[0]:
        count = [0, 0]

        def pack(t: torch.Tensor, count: list[int] = count) -> torch.Tensor:
            count[0] += 1
            count[1] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x = plain.run_block(plain.blocks[i], x, ids.shape[1])
        saved[i] = (count[0], count[1], ["cpu"])
    return {"packed": packed, "saved": saved}


def run_cases(rank: int, world: int, cases: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
    torch.manual_seed(0)
    return {case: _one_case(rank, *case) for case in cases}


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    by_world: dict[int, list[tuple[str, str, str]]] = {}
    for case in CASES:
        by_world.setdefault(parse_layout(case[0]).world_size, []).append(case)
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for world, cases in by_world.items():
        per_rank = run_distributed(run_cases, world, cases, timeout=600.0)
        for case in cases:
            out[case] = [r[case] for r in per_rank]
    return out


def _training(layout_text: str, recompute: str) -> TrainingSpec:
    return TrainingSpec(global_batch=parse_layout(layout_text).dp * B * N_MICRO, recompute=recompute)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_matches_serial(results, case) -> None:
    for rank, r in enumerate(results[case]):
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL}
        assert not bad, f"rank {rank}: relative errors above {TOL}: {bad}"
        assert any(k.startswith("param:blocks.1.mlp.fc2") for k in r["errors"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_traffic_equals_prediction(results, case) -> None:
    layout = parse_layout(case[0]).with_(micro_batch=B)
    predicted = stage_events(layout, dims_of(SPECS[case[2]], _training(case[0], case[1])), B)
    for rank, r in enumerate(results[case]):
        diff = traffic_difference(predicted, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)


@pytest.mark.parametrize("case", [c for c in CASES if c not in PRICED], ids=lambda c: "-".join(c))
def test_offloaded_blocks_pack_their_saved_tensors_to_the_host(results, case) -> None:
    """Exactly the first N blocks pack, each what it saves without offloading (tensors and bytes equal), into
    host tensors (on CPU ranks save_on_cpu keeps the tensor itself: the count, not the copy, is the evidence)."""
    n = parse_layout(case[0]).offload
    for rank, r in enumerate(results[case]):
        packed, saved = r["packs"]["packed"], r["packs"]["saved"]
        assert sorted(packed) == list(range(n)), (rank, sorted(packed))
        for i in range(n):
            assert packed[i][0] > 0 and packed[i] == saved[i], (rank, i, packed[i], saved[i])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", PRICED, ids=lambda c: "-".join(c))
def test_saved_activations_equal_the_model(results, case, dtype) -> None:
    layout = parse_layout(case[0]).with_(micro_batch=B)
    training = replace(_training(case[0], case[1]), dtype=dtype)
    est = estimate(SPECS[case[2]], training, layout, load_topology("local-cpu", gpus=layout.world_size),
                   with_events=False)
    measured = results[case][0]["activations"][dtype]
    assert measured == pytest.approx(est.memory.activations, rel=0.02), (measured, est.memory.activations)


def test_sequence_parallel_needs_seq_divisible_by_tp() -> None:
    with pytest.raises(ParacubeError, match="seq_len"):
        check_divisibility(replace(SPEC, seq_len=18), parse_layout("tp=1d:4,sp"), B, B, 18)
