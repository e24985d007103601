"""Collective matmul (tpo) run by the executor: 1D + sp, 2D, 2.5D and 3D against the serial model and the cost model.

ONE launch per world size (4 ranks: 1D + sp tp=4, 2D 2x2, cp=2 with 1D + sp tp=2; 8 ranks: 2.5D 2x2x2, 3D
2x2x2), the cases batched.
Per case:
- equivalence (fp64, dist_helpers.TOL_FP64 and why): losses and gradient norms of 3 AdamW steps of 2
  micro-batches with clipping active, and every parameter after them, equal the serial model's. The ring
  sums its partials in ring order and the chunked GEMMs sum over blocks: the same terms in another order;
- traffic (one fp32 step, the dtype the cost model prices): the recorded collectives equal
  `traffic.stage_events` of the same plan as a multiset (zero difference: the ring is recorded as the
  unoverlapped collective), and the same step without tpo records the same multiset;
- ring steps: exactly the collectives the mode declares overlappable (`Collective.tpo`; in 2D / 2.5D / 3D every
  collective of a block linear but its bias's: the weight's all-gather, dA's reduce-scatter, 3D's Y reduce-scatter
  too, collective_matmul_2d.py / _3d.py) ran as rings, each with n - 1 recorded steps whose bytes sum to its ring
  bytes (CommEvent.sent_bytes), every step with the GEMM chunk that ran while it was in flight, but 2D's forward
  X / A rings off the grid's diagonal (no term has both its blocks before they moved: `two_d.summa_ring`'s 0);
- that step's fp32 loss and gradient norm equal the unoverlapped layout's (rel 1e-5, as tests/test_token_split.py
  in fp32: the same terms summed in another order round to ~1e-7);
- memory: the activation bytes autograd saves on the most loaded rank (dist_helpers.saved_bytes) are those of the
  layout without tpo and the model's (rel 2%).
Plus the refusals before any rank starts (tpo without sp in 1D; tpo in mode none), tpo plans scaled down for
`paracube run` and, in one process, the 3D forward's term schedule at q = 3 and 4 (the launches have q = 2). The
pricing of these rings (both engines, the schedules against the executor's): tests/test_tpo_pricing.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from dist_helpers import TOL_FP64, run_distributed, saved_bytes, steps_against_serial
from test_equivalence_model import MAX_NORM, SPEC, STEPS, adamw
from test_llama import LLAMA

from paracube.cost_models import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.errors import ParacubeError
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference, train_step
from paracube.layout_parse import parse_layout
from paracube.modes import MODES
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

B, N_MICRO, F64 = 4, 2, torch.float64
TOL_FP32 = 1e-5  # fp32 loss and grad norm, ring vs one collective: rounding (~1e-7) of reordered sums
MODELS = {"gpt": SPEC, "llama": LLAMA}
CASES = {  # world size -> (layout, family, recompute)
    4: [("tp=1d:4,sp,tpo", "gpt", "none"), ("tp=1d:4,sp,tpo", "gpt", "full"), ("tp=2d:2x2,tpo", "gpt", "none"),
        ("tp=2d:2x2,tpo,kw=1", "llama", "selective"), ("cp=2,tp=1d:2,sp,tpo", "llama", "none")],
    8: [("tp=2.5d:2x2x2,tpo", "gpt", "none"), ("tp=3d:2x2x2,tpo", "gpt", "none"),
        ("tp=3d:2x2x2,tpo,kw=1", "llama", "full")],
}


def training(rc: str, dtype: str = "fp32") -> TrainingSpec:
    return TrainingSpec(global_batch=B * N_MICRO, dtype=dtype, recompute=rc)


def _batches(spec: ModelSpec) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    return [(torch.randint(0, spec.vocab, (B, spec.seq_len), generator=gen),
             torch.randint(0, spec.vocab, (B, spec.seq_len), generator=gen)) for _ in range(N_MICRO)]


def _fp32_step(spec: ModelSpec, mesh: Mesh, rc: str, micro: list, tokens: int) -> tuple[tuple, list, list]:
    model = build_model(spec, mesh, seed=7, recompute=rc)
    mesh.recorder.reset()
    res = train_step(model, adamw(model), mesh, micro, tokens, MAX_NORM)
    rec = mesh.recorder
    rings: dict[int, list] = {}
    for s in rec.ring_steps:
        rings.setdefault(s.event, []).append(s)
    ring_info = [(rec.events[i].key(), rec.events[i].group_size, rec.events[i].sent_bytes(),
                  len(steps), sum(s.sent_bytes for s in steps), all(s.gemm is not None for s in steps),
                  rec.events[i].label.rsplit(".", 1)[-1], rec.events[i].phase) for i, steps in rings.items()]
    return (res.loss, res.grad_norm), [e.key() for e in rec.events], ring_info


def _one_case(rank: int, layout_text: str, family: str, rc: str) -> dict[str, Any]:
    spec, layout = MODELS[family], parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    micro, tokens = _batches(spec), B * N_MICRO * spec.seq_len
    model = build_model(spec, mesh, seed=7, recompute=rc, dtype=F64)
    ref = serial_reference(spec, seed=7, recompute=rc, dtype=F64, vocab=model.vocab)
    errors, _ = steps_against_serial(model, adamw(model), ref, adamw(ref), micro, micro, tokens, STEPS, MAX_NORM)
    got, events, rings = _fp32_step(spec, mesh, rc, micro, tokens)
    plain, plain_events, plain_rings = _fp32_step(spec, Mesh(layout.with_(tpo=False), rank), rc, micro, tokens)
    vs_plain = max(abs(a - b) / abs(b) for a, b in zip(got, plain, strict=True))
    activations = [saved_bytes(build_model(spec, Mesh(lay, rank), seed=7, recompute=rc), *micro[0])[1]
                   for lay in (layout, layout.with_(tpo=False))]  # fp32, the priced dtype: (tpo, plain)
    axes = MODES[layout.mode].axes  # 2D / 2.5D: a rank off the row = col diagonal (collective_matmul_2d.py)
    off_diagonal = "row" in axes and mesh.index(("row",)) != mesh.index(("col",))
    return {"errors": errors, "events": events, "plain_events": plain_events, "rings": rings,
            "plain_rings": plain_rings, "vs_plain": vs_plain, "off_diagonal": off_diagonal, "activations": activations}


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_case(rank, *case) for case in CASES[world]]


@pytest.fixture(scope="module", params=sorted(CASES))
def world(request: pytest.FixtureRequest) -> tuple[int, list[list[dict[str, Any]]]]:
    return request.param, run_distributed(_all_cases, request.param, timeout=600.0)  # [rank][case]


def _overlappable(predicted: list, mode: str, d: Any) -> Counter:
    """The CommEvent keys (with multiplicity, one step) of the predicted block collectives the mode declares
    tpo-overlappable (Collective.tpo): in 2D / 2.5D / 3D every collective of a block linear but its bias's
    (the weight's gather, dA's reduce-scatter and 3D's Y reduce-scatter included; kw=1: those once per step)."""
    tagged = {(c.label, c.kind) for c in (*MODES[mode].layer_fwd(d), *MODES[mode].layer_bwd(d)) if c.tpo}
    return Counter(e.key() for e in predicted
                   if e.label.startswith("layers.") and (e.label.split(".", 2)[2], e.kind) in tagged)


def test_tpo_matches_serial_traffic_and_rings(world: tuple[int, list[list[dict[str, Any]]]]) -> None:
    size, results = world
    for case, (text, family, rc) in enumerate(CASES[size]):
        layout = parse_layout(text).with_(micro_batch=B)
        d = dims_of(MODELS[family], training(rc))
        predicted = stage_events(layout, d, B)
        expected = _overlappable(predicted, layout.mode, d)
        assert expected, text
        for rank, per_case in enumerate(results):
            r = per_case[case]
            bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
            assert not bad, f"{text} rank {rank}: relative errors above {TOL_FP64}: {bad}"
            diff = traffic_difference(predicted, r["events"])
            assert not diff["missing_in_executor"] and not diff["unpredicted"], (text, rank, diff)
            assert sorted(r["events"]) == sorted(r["plain_events"]), (text, rank)
            assert not r["plain_rings"], (text, rank)
            assert r["vs_plain"] <= TOL_FP32, (text, rank, r["vs_plain"])
            rings = r["rings"]
            # exactly those collectives ran as rings (keys, with multiplicity)
            assert Counter(key for key, *_ in rings) == expected, (text, rank)
            for key, n, sent, steps, step_bytes, with_gemm, suffix, phase in rings:
                assert steps == n - 1 and step_bytes == sent, (text, key)
                lock_step = r["off_diagonal"] and suffix in ("X", "A") and phase != "bwd"
                assert with_gemm or lock_step, (text, rank, key, suffix)
            if r["off_diagonal"]:  # q = 2: the one exchange of the forward A ring (and X's beside it) hides nothing
                assert not any(g for *_, g, suffix, ph in rings if suffix == "A" and ph != "bwd"), (text, rank)
        # memory: the activations autograd saves on the most loaded rank, with the rings as without, equal the
        # model's (rel 2%, the bound of tests/test_token_split.py: the model's per-token closed forms vs storages)
        est = estimate(MODELS[family], training(rc), layout, load_topology("local-cpu", gpus=size), with_events=False)
        measured = [max(per_case[case]["activations"][i] for per_case in results) for i in (0, 1)]
        assert measured[0] == measured[1], (text, measured)
        assert measured[0] == pytest.approx(est.memory.activations, rel=0.02), (text, measured, est.memory.activations)


def test_tpo_refusals_before_any_rank_starts() -> None:
    """One line each: tpo without sp in 1D (nothing overlappable), tpo in mode none (nothing tensor-parallel)."""
    with pytest.raises(ParacubeError) as err:
        check_divisibility(SPEC, parse_layout("tp=1d:4,tpo"), B, B * N_MICRO, SPEC.seq_len)
    assert "\n" not in str(err.value) and "tpo in tp=1d" in str(err.value) and "add sp" in str(err.value)
    with pytest.raises(ParacubeError) as err:
        parse_layout("dp=4,tpo")
    assert "\n" not in str(err.value) and "tpo" in str(err.value) and "not none" in str(err.value)
    from paracube.runtimes import get_runtime

    rt = get_runtime("paracube")
    why = rt.refusal(parse_layout("tp=1d:4,tpo"))
    assert why is not None and "sequence parallelism only" in why and "add sp" in why
    assert rt.refusal(parse_layout("tp=1d:4,sp,tpo")) is None and rt.refusal(parse_layout("tp=3d:2x2x2,tpo")) is None
    assert rt.offers_tpo("2d", False) and rt.offers_tpo("1d", True) and not rt.offers_tpo("1d", False)
    assert not rt.offers_tpo("none", False)


@pytest.mark.parametrize(("layout", "gpus", "expected"), [
    ("dp=2,tp=1d:8,mb=2,sp,tpo", 8, "dp=2,tp=1d:4,mb=2,sp,tpo"),  # a megatron-style 1D + sp + tpo cluster plan
    ("dp=4,tp=3d:4x4x4,mb=16,tpo", 16, "dp=2,tp=3d:2x2x2,mb=16,tpo"),
    ("dp=2,pp=2,tp=2d:4x4,mb=4,tpo", 16, "dp=2,pp=2,tp=2d:2x2,mb=4,tpo"),
])
def test_tpo_plans_scale_down_and_pass_preflight(layout: str, gpus: int, expected: str) -> None:
    """`paracube run PLAN --model tiny --gpus G` keeps tpo (cli/scale_down.py) and the executor's preflight
    accepts the scaled plan (what `paracube run` checks before any rank starts)."""
    from paracube.cli.scale_down import scale_down
    from paracube.executor.launch.start import NodeSpec, preflight
    from paracube.model_presets import PRESETS
    from paracube.plan import LaunchSpec, Plan

    lay = parse_layout(layout)
    plan = Plan(model=PRESETS["gpt3-13b"], training=TrainingSpec(global_batch=512, dtype="bf16"), layout=lay,
                cluster="dgx-h100", gpus=lay.world_size,
                launch=LaunchSpec(nproc_per_node=8, nnodes=lay.world_size // 8))
    scaled, _ = scale_down(plan, PRESETS["tiny"], gpus)
    want = parse_layout(expected)
    got = scaled.layout
    assert (got.mode, got.shape, got.dp, got.pp, got.sequence_parallel, got.tpo) == (
        want.mode, want.shape, want.dp, want.pp, want.sequence_parallel, True)
    preflight(scaled, NodeSpec(), data="synthetic")


@pytest.mark.parametrize("q", [3, 4])
def test_3d_forward_terms_at_q_above_2(q: int) -> None:
    """One process, no ranks: the 3D forward's term schedule (collective_matmul_3d._Terms) fed X's and A's
    blocks in the order rank (r_I, r_W) receives them from its two rings, the last step's terms deferred to Y's
    ring chunks. Every row block equals X_k A of the gathered operands, every step before the last has a GEMM
    (what the 8-rank launch, q = 2, cannot show). fp64: the same terms in another order agree to ~1e-15, a
    missing or doubled term is off by O(1)."""
    from paracube.executor.layers.collective_matmul_3d import _Terms

    gen = torch.Generator().manual_seed(3)
    tl, sb, width = 3, 2, 5
    xs = [torch.randn(tl, q * sb, generator=gen, dtype=F64) for _ in range(q)]
    a = torch.randn(q * sb, width, generator=gen, dtype=F64)
    for r_i, r_w in ((0, 0), (1, q - 1), (q - 1, 2)):
        terms = _Terms(q, sb, width, F64)
        ran = [terms.arrive([((r_i - s) % q, xs[(r_i - s) % q]), ((r_w - s) % q, a[((r_w - s) % q) * sb:][:sb])],
                            defer=s == q - 1) for s in range(q)]
        assert all(ran[:-1]) and not ran[-1], ran
        for k in range(q):
            assert torch.allclose(terms.row(k), xs[k] @ a, rtol=1e-12, atol=1e-12), (q, r_i, r_w, k)
