"""Multi-head latent attention run by the executor (executor/layers/mla.py) in tensor modes none and 1D (+ sp),
with dp, pp and zero=1/2/3, against the serial reference.

The model: `tiny-mla` with dense MLPs (`tiny-mla` itself, with its MoE block, runs in tests/test_moe_run.py's
launch), so every block is MLA attention (q_lora_rank 32, kv_lora_rank 32, rope 8,
nope 16, v 16) + SwiGLU. One 4-rank launch runs every case: per case, losses and gradient norms of 3 AdamW steps
and the parameters after them equal the serial model's (rel 1e-5, both copies in fp64: dist_helpers.TOL_FP64 says
why); the collectives of one fp32 step equal the cost model's `traffic.stage_events` of the same layout as a
multiset (zero difference: the latent's f / gather of width r_q + r_kv + d_r, the output's g / reduce-scatter, the
down projections in the sequence-parallel all_reduce, the gradient buckets of MLA's parameters); the parameters
a rank holds equal the model's count. Plus the refusals, one line each before any rank starts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from dist_helpers import (
    F64,
    TOL_FP64,
    fp64_optimizer,
    one_step_events,
    run_distributed,
    sharded_memory,
    steps_against_serial,
)

from paracube.cost_models.dims import dims_of
from paracube.cost_models.local_parameters import local_parameter_count
from paracube.cost_models.traffic import stage_events
from paracube.errors import ParacubeError
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.buckets import BUCKET_BYTES
from paracube.workload import TrainingSpec

SPEC = replace(PRESETS["tiny-mla"], name="tiny-mla-dense", moe=None, seq_len=16)  # short sequences: CI time
ADAMW = {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}  # dist_helpers.fp64_optimizer's
MB, N_MICRO, STEPS, MAX_NORM = 2, 2, 3, 0.3  # MAX_NORM below the first gradient norm: clipping is exercised
CASES = [  # (layout, recompute)
    ("tp=1d:2", "none"),  # f on the latent (backward all_reduce), g on the output; ranks 2.. idle
    ("dp=2,tp=1d:2,sp,zero=1", "selective"),  # the latent all-gathered over the sequence; distributed optimizer
    ("pp=2,tp=1d:2,sp,fa=0", "full"),  # two stages; the unfused core; every forward collective recomputed
    # zero=2 / zero=3 (data_parallel/sharded.py, fsdp.py): MLA's parameters in the blocks' units, the replicated
    # down projections and norms whole in every tensor rank's unit
    ("dp=2,tp=1d:2,sp,zero=3", "selective"),
    ("dp=4,zero=2", "none"),
    ("dp=2,pp=2,zero=3", "full"),  # per-micro-batch gathers of each stage's units; the recompute finds them gathered
]


def training(layout_text: str, recompute: str) -> TrainingSpec:
    return TrainingSpec(global_batch=parse_layout(layout_text).dp * MB * N_MICRO, dtype="fp32", recompute=recompute)


def _stage(mesh: Mesh) -> str:
    s, pp = mesh.coord("pp"), mesh.layout.pp
    return "first" if s == 0 else ("last" if s == pp - 1 else "middle")


def _one_case(rank: int, layout_text: str, recompute: str) -> dict[str, Any]:
    layout = parse_layout(layout_text)
    if rank >= layout.world_size:
        Mesh(layout, 0)  # the same new_group calls as the case's ranks (every rank must make every group)
        return {}
    mesh = Mesh(layout, rank)
    gen = torch.Generator().manual_seed(31)
    batches = [[(torch.randint(0, SPEC.vocab, (MB, SPEC.seq_len), generator=gen),
                 torch.randint(0, SPEC.vocab, (MB, SPEC.seq_len), generator=gen)) for _ in range(N_MICRO)]
               for _ in range(layout.dp)]
    micro = batches[mesh.coord("dp")]
    tokens = layout.dp * MB * N_MICRO * SPEC.seq_len
    model = build_model(SPEC, mesh, seed=7, recompute=recompute)  # fp32: the priced payloads
    out: dict[str, Any] = {"stage": _stage(mesh), "params": sum(p.numel() for p in model.parameters())}
    opt32 = build_optimizer(model, mesh, layout.zero, BUCKET_BYTES, **ADAMW)
    out["events"] = one_step_events(model, micro, tokens, MAX_NORM, opt32)
    if layout.zero >= 2:  # the fp32 step's shards and peaks, as the memory model prices them
        out["memory"] = sharded_memory(model, opt32)
    model = build_model(SPEC, mesh, seed=7, recompute=recompute, dtype=F64)
    ref = serial_reference(SPEC, seed=7, vocab=model.vocab, dtype=F64)
    # zero=1: the distributed optimizer (its fp32 masters sharded over dp) against the serial one
    opt, ref_opt = build_optimizer(model, mesh, layout.zero, BUCKET_BYTES, **ADAMW), fp64_optimizer(ref)
    out["errors"], _ = steps_against_serial(model, opt, ref, ref_opt, micro, [m for r in batches for m in r], tokens,
                                            STEPS, MAX_NORM)
    return out


FP8_LAYOUT = "dp=2,tp=1d:2,sp"  # --dtype fp8 with MLA: every MLA linear's GEMMs in FP8 (executor/layers/mla.py)


def _fp8_case(rank: int) -> dict[str, Any]:
    """fp8: one bf16 step's collectives and FP8 state held; the fp64 fp8 model against the serial fp64 fp8 model."""
    layout = parse_layout(FP8_LAYOUT)
    mesh = Mesh(layout, rank)
    gen = torch.Generator().manual_seed(37)
    batches = [[(torch.randint(0, SPEC.vocab, (MB, SPEC.seq_len), generator=gen),
                 torch.randint(0, SPEC.vocab, (MB, SPEC.seq_len), generator=gen)) for _ in range(N_MICRO)]
               for _ in range(layout.dp)]
    micro, tokens = batches[mesh.coord("dp")], layout.dp * MB * N_MICRO * SPEC.seq_len
    bf = build_model(SPEC, mesh, seed=7, dtype=torch.bfloat16, fp8=True)
    out: dict[str, Any] = {"events": one_step_events(bf, micro, tokens, MAX_NORM,
                                                     build_optimizer(bf, mesh, 0, BUCKET_BYTES, **ADAMW))}
    out["held"], out["linears"] = bf.fp8.held_bytes(), len(bf.fp8.gemms)
    model = build_model(SPEC, Mesh(layout, rank), seed=7, dtype=F64, fp8=True)
    ref = serial_reference(SPEC, seed=7, vocab=model.vocab, dtype=F64, fp8=True)
    out["errors"], _ = steps_against_serial(model, build_optimizer(model, model.mesh, 0, BUCKET_BYTES, **ADAMW), ref,
                                            fp64_optimizer(ref), micro, [m for r in batches for m in r], tokens,
                                            STEPS, MAX_NORM)
    out["scales"] = [g.scale.tolist() for g in model.fp8.gemms]
    return out


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_case(rank, *case) for case in CASES] + [_fp8_case(rank)]


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return run_distributed(_all_cases, 4, timeout=600.0)  # [rank][case]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_mla_matches_serial_and_its_traffic_is_priced(results, case: int) -> None:
    text, rc = CASES[case]
    layout = parse_layout(text).with_(micro_batch=MB)
    d = dims_of(SPEC, training(text, rc))
    assert d.attn_in_width == 32 + 32 + 8 != d.h  # the latent, not x, enters the heads' group
    for rank, per_case in enumerate(results[:layout.world_size]):
        r = per_case[case]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
        assert not bad, f"rank {rank}: relative errors above {TOL_FP64}: {bad}"
        assert any(k.startswith("param:blocks.") and ".attn.kv_b." in k for k in r["errors"])
        diff = traffic_difference(stage_events(layout, d, MB, r["stage"]), r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
        assert r["params"] == local_parameter_count(layout, d, r["stage"])


@pytest.mark.parametrize("case", [i for i, (text, _) in enumerate(CASES) if parse_layout(text).zero >= 2],
                         ids=[text for text, _ in CASES if parse_layout(text).zero >= 2])
def test_mla_memory_at_zero_2_3_is_priced(results, case: int) -> None:
    """zero=2/3: the parameter, gradient and optimizer bytes each rank holds (fp32, measured on its shards) equal the
    memory model's (`estimate`'s at pp = 1; with pipelines the heaviest stage's, estimate's),
    MLA's true widths in the blocks' FSDP units, the replicated down projections whole in every tensor rank's unit
    (before, `estimate` added MLA's correction to the units' sizes again); and the unit buffers it peaks at equal
    the temporaries the model adds to zero=0's."""
    from paracube.cost_models import estimate
    from paracube.topologies import load_topology

    text, rc = CASES[case]
    layout = parse_layout(text).with_(micro_batch=MB)
    topo = load_topology("local-cpu", gpus=layout.world_size)
    est = estimate(SPEC, training(text, rc), layout, topo, with_events=False).memory
    plain = estimate(SPEC, training(text, rc), layout.with_(zero=0), topo, with_events=False).memory
    held = [(m["parameters"], m["gradients"], m["optimizer"])
            for m in (per_case[case]["memory"] for per_case in results[:layout.world_size])]
    want = (est.parameters, est.gradients, est.optimizer)
    if layout.pp > 1:  # estimate's are the heaviest stage's: the last (its head), here
        assert max(held, key=sum) == want
        return
    for rank, per_case in enumerate(results[:layout.world_size]):
        m = per_case[case]["memory"]
        assert held[rank] == want, rank
        assert m["gradient_buffers"] + m["gathered_params"] == est.temporaries - plain.temporaries, rank


def test_fp8_with_mla_matches_the_serial_fp8_model_and_is_priced(results) -> None:
    """--dtype fp8 with MLA in 1D + sp with dp (dist_helpers.TOL_FP64 and tests/test_fp8_run.py say why fp64 FP8
    copies match within it): losses, gradient norms and parameters after 3 steps equal the serial fp8 model's; the
    collectives of one bf16 step equal stage_events (the amax all_reduce of MLA's 7 linears per block included:
    zero difference); the FP8 copies and scales held equal cost_models/fp8.copy_bytes within 2% (fp8.py's copy
    bytes count each weight's two FP8 layouts, the executor holds them: equal up to the 1-element scale rounding)."""
    import numpy as np

    from paracube.cost_models import fp8 as fp8_cost
    from paracube.cost_models.validity import layout_arrays

    layout = parse_layout(FP8_LAYOUT).with_(micro_batch=MB)
    d = dims_of(SPEC, TrainingSpec(global_batch=layout.dp * MB * N_MICRO, dtype="fp8", recompute="none"))
    assert fp8_cost.block_linears(d) == 7
    for rank, per_case in enumerate(results):
        r = per_case[-1]
        assert r["linears"] == 7 * SPEC.layers
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
        assert not bad, f"rank {rank}: relative errors above {TOL_FP64}: {bad}"
        assert all(s != [1.0, 1.0, 1.0] for s in r["scales"])  # every linear's scales moved off their initial 1
        events = stage_events(layout, d, MB)
        assert any(e.label == "fp8_amax" for e in events)
        diff = traffic_difference(events, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
        predicted = float(fp8_cost.copy_bytes(d, layout.mode, layout_arrays(layout, MB), np.array([1]),
                                              np.array([1]))[0])
        assert r["held"] == pytest.approx(predicted, rel=0.02), (rank, r["held"], predicted)


@pytest.mark.parametrize(("layout", "expect"), [
    ("tp=2d:2x2", "multi-head latent attention with tensor mode 2d is not run by the executor; valid there: "
                  "tp=none/1d"),
    ("tp=3d:2x2x2", "with tensor mode 3d is not run"),
    ("tp=1d:2,sp,tpo", "multi-head latent attention with tpo is not run"),
])
def test_what_mla_does_not_run_is_refused_in_one_line(layout: str, expect: str) -> None:
    with pytest.raises(ParacubeError) as err:
        check_divisibility(SPEC, parse_layout(layout), 2, 8, SPEC.seq_len)
    assert "\n" not in str(err.value) and expect in str(err.value)


def test_mla_parameters_per_rank_are_priced() -> None:
    """The count the buckets are built from (local_parameters.parameter_units) is the model's own on one rank, and in
    1D the replicated down projections are whole on every rank (ModelSpec.num_parameters: the serial count);
    the memory model counts the same (cost_models/attention_correction.attention_delta)."""
    d = dims_of(SPEC, TrainingSpec(global_batch=8))
    one = local_parameter_count(parse_layout("dp=1"), d)
    assert one == SPEC.num_parameters()  # its vocabulary (256) needs no padding
    two = local_parameter_count(parse_layout("tp=1d:2"), d)
    replicated = SPEC.layers * (d.attn_replicated + 2 * SPEC.hidden) + SPEC.hidden  # + block and final norms
    assert two == replicated + (one - replicated) // 2
    from paracube.cost_models import estimate
    from paracube.topologies import load_topology

    for text, n in (("dp=1", one), ("tp=1d:2", two)):  # the memory model's parameters (fp32: 4 bytes each)
        est = estimate(SPEC, TrainingSpec(global_batch=8), parse_layout(text), load_topology("local-cpu", gpus=2),
                       with_events=False)
        assert est.memory.parameters == 4 * n



def test_the_engines_price_the_collectives_mla_runs() -> None:
    """The analytic estimate's events (what `paracube plan` prices) are the recorded-equal list above, and the
    dense part's attention traffic is not: the latent's width differs from h."""
    from paracube.cost_models import estimate
    from paracube.topologies import load_topology

    text = "dp=2,tp=1d:2,sp"
    layout, train = parse_layout(text).with_(micro_batch=MB), training(text, "none")
    est = estimate(SPEC, train, layout, load_topology("local-cpu", gpus=4))
    want = stage_events(layout, dims_of(SPEC, train), MB)
    diff = traffic_difference(want, est.events)
    assert not diff["missing_in_executor"] and not diff["unpredicted"], diff
    gqa = stage_events(layout, dims_of(replace(SPEC, mla=None), train), MB)
    assert traffic_difference(want, gqa)["missing_in_executor"]


def test_paracube_plans_mla_with_dense_mlps_and_with_moe() -> None:
    """With dense MLPs and with MoE blocks (tiny-mla: MLA + MoE, run by tests/test_moe_run.py) paracube's runtime
    plans layouts its executor runs."""
    from paracube.planner.search import search
    from paracube.topologies import load_topology

    topo = load_topology("local-cpu", gpus=4)
    for spec in (SPEC, PRESETS["tiny-mla"]):
        res = search(spec, TrainingSpec(global_batch=8), topo, 4, runtime="paracube", top_k=3)
        assert res.ranked and all(lay.mode in ("none", "1d") for lay, *_ in res.ranked)
        best = res.ranked[0][0]
        check_divisibility(spec, best, best.micro_batch, 8, spec.seq_len)  # what it plans, the executor runs


def test_the_serial_block_computes_latent_attention() -> None:
    """Block 0's attention of the serial model against MLA written out head by head (DeepSeek-V2 section 2.1:
    q = W_uq norm(W_dq x), [c_kv, k_r] = W_dkv x, [k_n, v] = W_ukv norm(c_kv), the rotary key shared by the heads),
    in fp64: rel 1e-10 (the same products summed in another order), also without q_lora_rank (q = W_q x)."""
    from paracube.executor.layers.llama import rotary, rotary_tables

    for spec in (SPEC, replace(SPEC, mla=replace(SPEC.mla, q_lora_rank=None))):
        m = spec.mla
        attn = serial_reference(spec, seed=3, dtype=F64).blocks[0].attn
        x = torch.randn(2, spec.seq_len, spec.hidden, generator=torch.Generator().manual_seed(5), dtype=F64)

        def norm(t: torch.Tensor, g: torch.Tensor, eps: float = spec.rms_eps) -> torch.Tensor:
            return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * g

        c_q = norm(x @ attn.q_a.weight, attn.q_norm.weight) if m.q_lora_rank else x
        c_kv, k_r = (x @ attn.kv_a.weight).split([m.kv_lora_rank, m.qk_rope_head_dim], -1)
        q_all, kv_all = c_q @ attn.q_b.weight, norm(c_kv, attn.kv_norm.weight) @ attn.kv_b.weight
        cos, sin = rotary_tables(spec.seq_len, m.qk_rope_head_dim, spec.rope_theta, x)
        k_r = rotary(k_r, cos, sin)
        causal = torch.ones(spec.seq_len, spec.seq_len, dtype=torch.bool).tril()
        heads = []
        for i in range(spec.heads):
            q = q_all[..., i * m.qk_head_dim:(i + 1) * m.qk_head_dim]
            kv = kv_all[..., i * (m.qk_nope_head_dim + m.v_head_dim):(i + 1) * (m.qk_nope_head_dim + m.v_head_dim)]
            q = torch.cat([q[..., :m.qk_nope_head_dim], rotary(q[..., m.qk_nope_head_dim:], cos, sin)], -1)
            k = torch.cat([kv[..., :m.qk_nope_head_dim], k_r], -1)
            scores = (q @ k.transpose(1, 2) / m.qk_head_dim ** 0.5).masked_fill(~causal, float("-inf"))
            heads.append(scores.softmax(-1) @ kv[..., m.qk_nope_head_dim:])
        want = torch.cat(heads, -1) @ attn.proj.weight
        got = attn(x)
        assert (got - want).norm() / want.norm() < 1e-10
