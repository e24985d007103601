"""The whole GPT in every layout against the serial reference: loss, every gradient, parameters after 3
AdamW steps through train_step (serial and sharded copies in fp64, relative 1e-5: dist_helpers.TOL_FP64), and the
collectives one fp32 train_step records (docs/algorithms.md). In bf16
(parameters in bf16, fp32 master weights in the optimizer) every tensor-parallel layout tracks the serial
bf16 model with fp32 masters loosely (bf16 rounding in other orders) and moves matmul operands in bf16.

One process pool per layout runs every check; the tests below assert on its results.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
import torch
from dist_helpers import F64, TOL_FP64, fp64_optimizer, rel_err, run_distributed

from paracube.cost_models.dims import padded_vocab
from paracube.errors import ParacubeError
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference, train_step
from paracube.executor.comm import all_reduce
from paracube.executor.data_parallel.optim import MasterAdamW, build_optimizer
from paracube.executor.model.gpt import ParallelGPT
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.workload import ModelSpec

SPEC = ModelSpec("test", layers=2, hidden=32, heads=8, ffn_hidden=128, vocab=100, seq_len=16)  # padded in every mode
B = 4  # sequences per micro-batch per replica (3D splits them q^2 = 4 ways, 2.5D 2x2x2 q d = 4 ways)
N_MICRO = 2
STEPS = 3
MAX_NORM = 0.3  # below every layout's first gradient norm, so clipping is exercised
TOL = TOL_FP64  # serial and sharded copies in fp64 (fp32 buckets and masters): dist_helpers.TOL_FP64 says why
LAYOUTS = ["dp=1", "dp=1,tp=1d:2", "dp=1,tp=1d:4", "dp=1,tp=1d:8", "dp=1,tp=2d:2x2", "dp=2,tp=2d:2x2",
           "dp=1,tp=2.5d:2x2x2", "dp=1,tp=3d:2x2x2", "dp=8"]


def global_batch(layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    n = layout.dp * B * N_MICRO
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, SPEC.vocab, (n, SPEC.seq_len), generator=gen)
    labels = torch.randint(0, SPEC.vocab, (n, SPEC.seq_len), generator=gen)
    return ids, labels


def replica_micro_batches(layout: Layout, dp_index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ids, labels = global_batch(layout)
    start = dp_index * B * N_MICRO
    return [(ids[start + m * B:start + (m + 1) * B], labels[start + m * B:start + (m + 1) * B])
            for m in range(N_MICRO)]


def serial_token_losses(ref: ParallelGPT, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    x = ref.embed(ids)
    for block in ref.blocks:
        x = block(x)
    return ref.token_losses(x, labels)


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    # eps well above fp32 noise: the key bias has an exactly-zero true gradient (softmax ignores a shift
    # of all scores), and with a tiny eps Adam would turn its rounding noise into lr-sized updates.
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-6)



def check_model(rank: int, world: int, layout_text: str) -> dict[str, Any]:
    torch.manual_seed(0)
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank) if world > 1 else Mesh.single(layout)
    out: dict[str, Any] = {"errors": {}}
    errs = out["errors"]
    model = build_model(SPEC, mesh, seed=7, dtype=F64)  # fp64 copies: TOL
    ref = serial_reference(SPEC, seed=7, vocab=model.vocab, dtype=F64)  # padded as the model it checks
    dp_index = mesh.coord("dp")
    micro = replica_micro_batches(layout, dp_index)
    tokens_per_step = layout.dp * B * N_MICRO * SPEC.seq_len

    # Initial parameters: gathered full tensors equal the serial initialization exactly.
    full = model.full_state_dict()
    out["init_exact"] = all(torch.equal(full[n], p) for n, p in ref.full_state_dict().items())

    # Forward: this rank's loss sum equals the serial per-token losses of the tokens it computes.
    ids, labels = micro[0]
    local_sum, count = model(ids, labels)
    ref_losses = serial_token_losses(ref, ids, labels)
    mine = model.mode.split_tokens(ref_losses)
    errs["loss_sum"] = rel_err(local_sum, mine.sum())
    out["count_ok"] = float(count) == mine.numel()

    # Gradients of one micro-batch (no dp sync): every shard equals its block of the serial gradient.
    (local_sum / tokens_per_step).backward()
    (ref_losses.sum() / tokens_per_step).backward()
    ref_params = dict(ref.named_parameters())
    depth_axes = tuple(a for a in layout.tensor_mode.grad_axes if a != "dp")  # 2.5D: the depth layers' shares
    for name, p in model.named_parameters():
        grad = all_reduce(p.grad, mesh, depth_axes) if depth_axes else p.grad
        errs[f"grad:{name}"] = rel_err(grad, model.block_of(name, ref_params[name].grad))

    # Three AdamW steps through train_step (fp64 copies), against serial steps over the whole global batch.
    model = build_model(SPEC, mesh, seed=7, dtype=F64)
    ref = serial_reference(SPEC, seed=7, vocab=model.vocab, dtype=F64)  # padded as the model it checks
    opt, ref_opt = fp64_optimizer(model), fp64_optimizer(ref)
    all_micro = [mb for d in range(layout.dp) for mb in replica_micro_batches(layout, d)]
    for step in range(STEPS):
        res = train_step(model, opt, mesh, micro, tokens_per_step, MAX_NORM)
        ref_res = train_step(ref, ref_opt, ref.mesh, all_micro, tokens_per_step, MAX_NORM)
        if step == 0:
            out["clipped"] = ref_res.grad_norm > MAX_NORM
        errs[f"step{step}.loss"] = abs(res.loss - ref_res.loss) / ref_res.loss
        errs[f"step{step}.grad_norm"] = abs(res.grad_norm - ref_res.grad_norm) / ref_res.grad_norm
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errs[f"param:{name}"] = rel_err(p, model.block_of(name, ref_params[name]))
    out["local_params"] = sum(p.numel() for p in model.parameters())
    # The collectives of one fp32 step (fp32 payloads, as the byte checks below and the cost model count them).
    model32 = build_model(SPEC, mesh, seed=7)
    mesh.recorder.reset()
    train_step(model32, adamw(model32), mesh, micro, tokens_per_step, MAX_NORM)
    out["events"] = list(mesh.recorder.events)
    # Export and re-import: full tensors from the shards, then shards from the full tensors.
    exported = model.full_state_dict()
    fresh = build_model(SPEC, mesh, seed=8, dtype=F64)
    fresh.load_full_state_dict(exported)
    out["reload_exact"] = all(torch.equal(p, q) for p, q in zip(fresh.parameters(), model.parameters(), strict=True))
    if layout.tensor_size > 1:
        out.update(check_recompute_and_bf16(mesh, micro, all_micro, tokens_per_step))
    return out


def fwd_bwd_events(spec: ModelSpec, mesh: Mesh, micro: tuple[torch.Tensor, torch.Tensor], tokens: int,
                   recompute: str) -> tuple[list, dict[str, torch.Tensor]]:
    """Events and gradients of one micro-batch's forward and backward."""
    model = build_model(spec, mesh, seed=7, recompute=recompute)
    mesh.recorder.reset()
    with mesh.recorder.phase("fwd"):
        local_sum, _ = model(*micro)
    with mesh.recorder.phase("bwd"):
        (local_sum / tokens).backward()
    return list(mesh.recorder.events), {n: p.grad for n, p in model.named_parameters()}


def bf16_adamw(model: torch.nn.Module, mesh: Mesh) -> torch.optim.Optimizer:
    """The executor's optimizer for a bf16 model (fp32 masters), with adamw()'s settings."""
    return build_optimizer(model, mesh, 0, 2**30, lr=1e-3, weight_decay=0.1, eps=1e-6)


def check_recompute_and_bf16(mesh: Mesh, micro: list, all_micro: list, tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    plain, grads = fwd_bwd_events(SPEC, mesh, micro[0], tokens, "none")
    again, grads_rc = fwd_bwd_events(SPEC, mesh, micro[0], tokens, "full")
    one_layer, _ = fwd_bwd_events(replace(SPEC, layers=1), mesh, micro[0], tokens, "none")

    def keys(events: list, phase: str) -> Counter:
        return Counter(e.key() for e in events if e.phase == phase)

    block = keys(plain, "fwd") - keys(one_layer, "fwd")  # one block's forward collectives
    out["recompute_events_ok"] = (keys(again, "recompute") == Counter({k: SPEC.layers * n for k, n in block.items()})
                                  and keys(again, "fwd") == keys(plain, "fwd")
                                  and keys(again, "bwd") == keys(plain, "bwd") and sum(block.values()) > 0)
    out["recompute_grad_err"] = max(rel_err(grads_rc[n], g) for n, g in grads.items())

    # bf16 parameters with fp32 masters: matmul operands travel in bf16, statistics and the priced fp32
    # gathers stay fp32; 3 steps track the serial bf16 model with fp32 masters, and the fp32 model loosely.
    model = build_model(SPEC, mesh, seed=7, dtype=torch.bfloat16)
    ref = serial_reference(SPEC, 7, dtype=torch.bfloat16, vocab=model.vocab)  # padded as the model it checks
    opt, ref_opt = bf16_adamw(model, mesh), bf16_adamw(ref, ref.mesh)
    out["bf16_masters"] = isinstance(opt, MasterAdamW) and all(m.dtype == torch.float32 for m in opt.masters)
    model32 = build_model(SPEC, mesh, seed=7)
    opt32 = adamw(model32)
    losses = []
    for step in range(STEPS):
        mesh.recorder.reset()
        res16 = train_step(model, opt, mesh, micro, tokens, MAX_NORM)
        if step == 0:
            out["bf16_dtypes"] = sorted({(e.label.rsplit(".", 1)[-1], e.dtype) for e in mesh.recorder.events})
        ref16 = train_step(ref, ref_opt, ref.mesh, all_micro, tokens, MAX_NORM)
        res32 = train_step(model32, opt32, mesh, micro, tokens, MAX_NORM)
        losses.append((res16.loss, ref16.loss, res32.loss))
    out["bf16_loss_err"] = max(abs(a - b) / b for a, b, _ in losses)
    out["bf16_vs_fp32_loss_err"] = max(abs(a - c) / c for a, _, c in losses)
    # Over all local parameters at once: a zero-initialized bias whose true gradient is ~0 (the key bias)
    # moves by Adam-normalized bf16 rounding noise, so tensor by tensor its relative error is not small.
    names = [n for n, _ in model.named_parameters()]
    ref_params = dict(ref.named_parameters())
    ref_masters = dict(zip([n for n, _ in ref.named_parameters()], ref_opt.masters, strict=True))

    def flat(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).double() for t in ts])

    out["bf16_param_err"] = rel_err(flat(list(model.parameters())),
                                    flat([model.block_of(n, ref_params[n]) for n in names]))
    out["bf16_master_err"] = rel_err(flat(opt.masters),
                                     flat([model.block_of(n, ref_masters[n]) for n in names]))
    return out


@pytest.fixture(scope="module", params=LAYOUTS)
def layout_results(request: pytest.FixtureRequest) -> tuple[Layout, list[dict[str, Any]]]:
    layout = parse_layout(request.param)
    if layout.world_size == 1:
        return layout, [check_model(0, 1, request.param)]
    return layout, run_distributed(check_model, layout.world_size, request.param)


def test_initial_parameters_are_the_serial_ones(layout_results: tuple[Layout, list[dict]]) -> None:
    _, results = layout_results
    assert all(r["init_exact"] for r in results)


def test_loss_gradients_and_parameters_match_serial(layout_results: tuple[Layout, list[dict]]) -> None:
    _, results = layout_results
    for rank, r in enumerate(results):
        assert r["count_ok"], f"rank {rank}: token count"
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL}
        assert not bad, f"rank {rank}: relative errors above {TOL}: {bad}"
        assert any(k.startswith("grad:blocks.1.mlp.fc2") for k in r["errors"])  # every parameter compared
    # The step really clips (norm > 1), so the global norm across shards is exercised.
    assert results[0]["clipped"]


def test_parameters_are_stored_once_across_the_tensor_group(layout_results: tuple[Layout, list[dict]]) -> None:
    layout, results = layout_results
    # The vocabulary padded as Megatron pads it for this layout's vocab split (128 x split).
    total = replace(SPEC, vocab=padded_vocab(SPEC.vocab, layout.tensor_mode.vocab_split(layout.tensor_size,
                                                                                            layout.q))).num_parameters()
    if layout.mode in ("2d", "3d"):
        # Every parameter is split over the whole tensor group: per-rank count = total / group size.
        assert all(r["local_params"] * layout.tensor_size == total for r in results)
    if layout.mode == "2.5d":
        # Once per q x q grid, replicated over depth.
        assert all(r["local_params"] * layout.q**2 == total for r in results)


def expected_counts(layout: Layout) -> Counter:
    """(kind, axes) -> number of collectives in one train_step, from docs/algorithms.md.
    L layers, n = N_MICRO micro-batches; each block has 2 LayerNorms and 4 biased linears."""
    L, n = SPEC.layers, N_MICRO
    c: Counter = Counter()
    t = layout.tensor_axes
    if layout.mode == "1d":
        # per micro: embedding 1 + g 2L (fwd) + CE 2 (fwd) + f 2L (bwd) + head f 1 (bwd)
        c["all_reduce", ("tp",)] = n * (4 * L + 4)
    elif layout.mode in ("2d", "2.5d"):  # 2.5D: each depth layer runs 2D; nothing over dep per micro-batch
        lns, linears = 2 * L + 1, 4 * L  # LayerNorms; biased linears (the head has no bias)
        c["all_gather", ("col",)] = n * (linears + 1)  # X of every linear and the head
        c["reduce_scatter", ("col",)] = n * (linears + 1)  # dX
        # A and bias of each linear, head A, gamma+beta per LN, pos_emb fwd; tok_emb bwd
        c["all_gather", ("row",)] = n * (2 * linears + 1 + 2 * lns + 1 + 1)
        c["reduce_scatter", ("row",)] = n * (2 * linears + 1 + 2 * lns + 1 + 1)
        c["all_reduce", ("col",)] = n * (2 * lns + 2)  # LN stats fwd+bwd, CE max+sum
    elif layout.mode == "3d":
        lns = 2 * L + 1
        a_role, b_role = 2 * L + 1, 2 * L  # (y, x, z): qkv, fc, head; (z, x, y): proj, fc2
        lines = a_role + b_role
        for axis in ("x", "y", "z"):  # every linear: one all_gather and one reduce_scatter per role axis
            # tok_emb: reduce_scatter over x, all_gather over y (fwd), the reverse (bwd)
            c["all_gather", (axis,)] = n * (lines + (axis != "z"))
            c["reduce_scatter", (axis,)] = n * (lines + (axis != "z"))
        c["all_gather", ("x", "z")] = c["reduce_scatter", ("x", "z")] = n * 2 * L  # qkv, fc biases
        # proj/fc2 biases, gamma+beta per LN, pos_emb (fwd gather, bwd scatter)
        c["all_gather", ("x", "y")] = c["reduce_scatter", ("x", "y")] = n * (2 * L + 2 * lns + 1)
        c["all_reduce", ("z",)] = n * 2 * lns
        c["all_reduce", ("y",)] = n * 2
    if t:
        c["all_reduce", t] += 1  # gradient norm
    if layout.world_size > 1:
        c["all_reduce", ("dp", *t)] += 1  # metrics
    grad_axes = layout.tensor_mode.grad_axes  # ("dp",); 2.5D ("dp", "dep")
    if math.prod(layout.axis_size(a) for a in grad_axes) > 1:
        c["all_reduce", grad_axes] += 1  # gradient sum
    return c


def test_recorded_collectives_of_one_step(layout_results: tuple[Layout, list[dict]]) -> None:
    layout, results = layout_results
    T = B * SPEC.seq_len  # tokens of one micro-batch
    h, q = SPEC.hidden, layout.q
    for r in results:
        events = r["events"]
        assert Counter((e.kind, e.axes) for e in events) == expected_counts(layout)
        by_label = {e.label: e for e in events}
        if layout.world_size > 1:
            assert by_label["metrics"].payload_bytes == 8 and by_label["metrics"].phase == "metrics"
        if layout.tensor_size > 1:
            assert by_label["grad_norm"].payload_bytes == 4 and by_label["grad_norm"].phase == "optimizer"
        if ("all_reduce", layout.tensor_mode.grad_axes) in expected_counts(layout):
            # one flat fp32 buffer of all local gradients
            assert by_label["grads"].payload_bytes == 4 * r["local_params"]
            assert by_label["grads"].phase == "grad_sync"
        if layout.mode == "1d":
            assert by_label["tok_emb"].payload_bytes == T * h * 4  # [T, h] fp32
            assert by_label["ce.max"].payload_bytes == T * 4 and by_label["ce.sum"].payload_bytes == 2 * T * 4
        if layout.mode in ("2d", "2.5d"):
            Tq = T // layout.token_split  # 2.5D: T / (d q)
            assert by_label["qkv.X"].payload_bytes == Tq * h * 4  # [T/q, h_in] gathered over col
            assert by_label["qkv.A"].payload_bytes == h * (3 * h // q) * 4  # [h_in, h_out/q] over row
        if layout.mode == "3d":
            assert by_label["tok_emb"].payload_bytes == T * (h // q**2) * 4  # [T, h/q^2] over x
            assert by_label["tok_emb.h"].payload_bytes == (T // q) * (h // q) * 4  # [T/q, h/q] over y
            assert by_label["qkv.X"].payload_bytes == (T // q) * (h // q) * 4  # [T/q, h_in/q] over y
            assert by_label["fc2.Y"].payload_bytes == (T // q) * (h // q) * 4  # [T/q, h_out/q] over y
        assert {e.phase for e in events} <= {"fwd", "bwd", "grad_sync", "optimizer", "metrics"}


def test_recompute_repeats_block_forward_collectives(layout_results: tuple[Layout, list[dict]]) -> None:
    layout, results = layout_results
    if layout.tensor_size == 1:
        pytest.skip("no tensor-parallel collectives to repeat")
    for r in results:
        assert r["recompute_events_ok"]
        assert r["recompute_grad_err"] <= TOL


def test_bf16_with_fp32_masters_tracks_serial_bf16(layout_results: tuple[Layout, list[dict]]) -> None:
    layout, results = layout_results
    if layout.tensor_size == 1:
        pytest.skip("no tensor-parallel collectives")
    for r in results:
        dtypes = dict(r["bf16_dtypes"])
        assert r["bf16_masters"]
        # bf16 rounding in another order, not a different model: loss, masters and bf16 copies stay close
        assert r["bf16_loss_err"] < 1e-2 and r["bf16_master_err"] < 1e-2 and r["bf16_param_err"] < 1e-2, r
        assert r["bf16_vs_fp32_loss_err"] < 2e-2
        if layout.mode in ("2d", "2.5d", "3d"):
            assert dtypes["X"] == "bfloat16" and dtypes["A"] == "bfloat16" and dtypes["dX"] == "bfloat16"
            assert dtypes["stats"] == "float32" and dtypes["gamma"] == "float32"  # LayerNorm stays fp32
        else:
            assert dtypes["g"] == "bfloat16" and dtypes["f"] == "bfloat16" and dtypes["tok_emb"] == "float32"
        assert dtypes["max"] == "float32" and dtypes["sum"] == "float32"  # cross-entropy in fp32


def test_reload_from_full_state_dict_restores_every_shard(layout_results: tuple[Layout, list[dict]]) -> None:
    _, results = layout_results
    assert all(r["reload_exact"] for r in results)


@pytest.mark.parametrize(("layout", "micro", "global_", "message"), [
    ("tp=1d:3", 4, 8, "heads=8 is not divisible by 3"),
    ("tp=2.5d:2x2x3", 1, 6, "micro_batch=1: its 1 x 16 = 16 tokens do not split 6 ways"),
    ("dp=2,tp=2d:2x2", 4, 12, "global_batch=12 is not divisible by 8"),
    ("tp=3d:4x4x4", 16, 16, "hidden=32 is not divisible by 64"),
])
def test_sizes_that_do_not_divide_are_refused_up_front(layout: str, micro: int, global_: int, message: str) -> None:
    with pytest.raises(ParacubeError, match=message):
        check_divisibility(SPEC, parse_layout(layout), micro, global_, SPEC.seq_len)


def test_sizes_that_divide_pass() -> None:
    for text in LAYOUTS:
        check_divisibility(SPEC, parse_layout(text), B, parse_layout(text).dp * B * N_MICRO, SPEC.seq_len)
