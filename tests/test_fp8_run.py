"""FP8 run by the executor (`--dtype fp8`, executor/layers/fp8.py): delayed scaling, overflow, equivalence, traffic,
memory, refusals.

- Delayed scaling on a hand-computed case (one process): amaxes recorded per tensor, scale = fp8_max / amax /
  2^margin over an amax history window, the GEMM's output from the hand-rounded FP8 operands.
- Overflow (as fp16's loss scaler): an inf amax skips the step, keeps parameters and scales, drops the step's
  amaxes; the next step trains and its update recovers the scales.
- One 2-rank launch: per layout (1D + sp tp=2, 1D tp=2, dp=2 at zero=0/1/2/3, pp=2, 1D + sp + tpo), the fp8
  model in fp64 against the serial fp8 reference in fp64 (the same casts, 3 AdamW steps): losses, gradient
  norms, parameters within TOL_FP64
  (dist_helpers: in fp64 a serial / sharded difference of ~1e-16 moves an FP8 rounding only when an operand lies
  that close to a rounding midpoint, which 3 steps of these sizes do not meet; a wrong scale or a missing amax
  reduction moves whole tensors by 1/16); the collectives of one bf16 fp8 step equal traffic.stage_events (the
  amax all_reduce included, zero difference); the FP8 copies and scales held equal cost_models/fp8.copy_bytes
  within 2%. In the same launch: the FP8 state checkpointed at 1D + sp (step 2) resumes bit-identically (losses
  and state of steps 3-4) and loads into pp=2; a NaN amax on one rank skips the step on both (fp16's rule).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from dist_helpers import TOL_FP64, run_distributed, steps_against_serial
from test_equivalence_model import MAX_NORM, SPEC, STEPS
from test_pipeline import _stage_name

from paracube.cost_models import fp8 as fp8_cost
from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.cost_models.validity import layout_arrays
from paracube.errors import ParacubeError
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, serial_reference, train_step
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.executor.layers.fp8 import E4M3, E5M2, STATE, Fp8Gemm, Fp8Scaling, amax_of
from paracube.executor.sizes import check_dtype
from paracube.layout_parse import parse_layout
from paracube.modes.buckets import BUCKET_BYTES
from paracube.runtimes import RUNTIMES
from paracube.workload import Fp8Recipe, TrainingSpec, check_dtype_on

B, N_MICRO = 2, 2
CASES = ["dp=1,tp=1d:2,sp", "dp=1,tp=1d:2", "dp=2", "dp=2,zero=1", "dp=1,pp=2", "dp=2,zero=2", "dp=2,zero=3",
         "dp=1,tp=1d:2,sp,tpo"]
RESUME, RESHARD = "dp=1,tp=1d:2,sp", "dp=1,pp=2"  # the checkpointed layout and the one its FP8 state loads into


def adamw(model: Any) -> torch.optim.Optimizer:
    """The run's optimizer for the layout (fp32 masters of the fp64 / bf16 copy; zero=1: DistributedAdamW), with
    test_equivalence_model's settings."""
    return build_optimizer(model, model.mesh, model.mesh.layout.zero, BUCKET_BYTES, lr=1e-3, weight_decay=0.1,
                           eps=1e-6)


def _micro(dp: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(5)
    return [[(torch.randint(0, SPEC.vocab, (B, SPEC.seq_len), generator=gen),
              torch.randint(0, SPEC.vocab, (B, SPEC.seq_len), generator=gen)) for _ in range(N_MICRO)]
            for _ in range(dp)]


def training(layout_text: str) -> TrainingSpec:
    return TrainingSpec(global_batch=parse_layout(layout_text).dp * B * N_MICRO, dtype="fp8")


# --- delayed scaling, by hand ------------------------------------------------------------------------------
def test_delayed_scaling_on_a_hand_computed_case() -> None:
    """History 3, algo max, margin 1: step 1 runs on scale 1; after it scale = fp8_max / amax / 2; an amax stays
    in the window for 3 updates; the forward's output is the hand-rounded FP8 product."""
    g = Fp8Gemm("lin", Fp8Recipe(amax_history_len=3, amax_compute_algo="max", margin=1))
    scaling, one = Fp8Scaling([g]), Mesh.single()
    w = torch.tensor([[0.5], [-0.3]])  # -0.3 rounds to -0.3125 in e4m3 at scale 1 (3 mantissa bits: 5/16)
    y = g.forward(torch.tensor([[2.0, -4.0]]), w)
    assert y.item() == 2.0 * 0.5 + (-4.0) * (-0.3125)
    dx, dw = g.backward(torch.tensor([[2.0, -4.0]]), w, torch.tensor([[8.0]]))
    assert dw.flatten().tolist() == [16.0, -32.0] and dx.flatten().tolist() == [4.0, -2.5]
    assert g.amax_history[0].tolist() == [4.0, 0.5, 8.0]
    assert not scaling.reduce_and_update(one, ())
    assert g.scale.tolist() == [448 / 4 / 2, 448 / 0.5 / 2, 57344 / 8 / 2]  # 56, 448, 3584
    assert g.scale_inv.tolist() == pytest.approx([2 / 112, 1 / 448, 1 / 3584], rel=1e-7)
    # step 2 at scale 56: X = [0.3, -1] -> 16.8 -> e4m3 16 (step 16 / 8 = 2 between 16 and 18: nearest 16)
    scaling.begin_step()
    y = g.forward(torch.tensor([[0.3, -1.0]]), torch.tensor([[0.25], [0.125]]))
    xq = torch.tensor([16.0, -56.0]) / 56
    wq = torch.tensor([0.25 * 448, 0.125 * 448]).to(E4M3).float() / 448
    assert y.item() == pytest.approx(float(xq @ wq), rel=1e-6)
    g.backward(torch.tensor([[0.3, -1.0]]), torch.tensor([[0.25], [0.125]]), torch.tensor([[16.0]]))
    assert not scaling.reduce_and_update(one, ())
    assert g.scale.tolist() == [56.0, 448.0, 57344 / 16 / 2]  # X, W: step 1's amaxes still in the window
    for _ in range(2):  # steps 3 and 4 with amaxes 1, 0.25, 1: step 1 leaves the window at step 4's update
        scaling.begin_step()
        g.forward(torch.tensor([[1.0]]), torch.tensor([[0.25]]))
        g.backward(torch.tensor([[1.0]]), torch.tensor([[0.25]]), torch.tensor([[1.0]]))
        assert not scaling.reduce_and_update(one, ())
    assert g.scale.tolist() == [448 / 1 / 2, 448 / 0.25 / 2, 57344 / 16 / 2]  # step 2's dY (16) still in it
    assert g.amax_history[0].tolist() == [0.0, 0.0, 0.0]


def test_e5m2_gradients_and_saturation() -> None:
    """dY is cast to e5m2 (2 mantissa bits: 0.3 -> 0.3125, 5 -> 5), operands beyond the format saturate."""
    g = Fp8Gemm("lin")
    _, dw = g.backward(torch.tensor([[1.0]]), torch.tensor([[1.0]]), torch.tensor([[0.3]]))
    assert dw.item() == 0.3125 == torch.tensor(0.3).to(E5M2).float().item()
    assert g.forward(torch.tensor([[1000.0]]), torch.tensor([[1.0]])).item() == 448.0  # scale 1: e4m3 max


# --- overflow ----------------------------------------------------------------------------------------------
def test_an_inf_amax_skips_the_step_and_keeps_the_scales() -> None:
    """fp64 serial fp8 model: a step whose amax is inf (forced after backward, the test hook) is skipped: the
    parameters and scales stay, the step's amaxes are dropped; the next step trains and updates again."""
    model = serial_reference(SPEC, seed=3, dtype=torch.float64, fp8=True)
    opt = adamw(model)
    micro = _micro(1)[0]
    tokens = B * N_MICRO * SPEC.seq_len
    assert not train_step(model, opt, model.mesh, micro, tokens).overflow
    before = [p.detach().clone() for p in model.parameters()]
    scales = [g.scale.clone() for g in model.fp8.gemms]

    def overflow(m: Any) -> None:
        m.fp8.gemms[3].amax_history[0, 2] = float("inf")

    out = train_step(model, opt, model.mesh, micro, tokens, after_backward=overflow)
    assert out.overflow and model.fp8.skips == 1
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(torch.equal(s, g.scale) for s, g in zip(scales, model.fp8.gemms, strict=True))
    assert all(not g.amax_history[0].any() for g in model.fp8.gemms)
    out = train_step(model, opt, model.mesh, micro, tokens)
    assert not out.overflow and model.fp8.skips == 0
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    for g in model.fp8.gemms:  # recovered: finite history, scale = fp8_max / max(history) (margin 0)
        assert torch.isfinite(g.amax_history).all() and torch.equal(g.scale, g.fp8_max / g.amax_history.max(0).values)
    # a non-finite operand is the signal: amax_of propagates inf and NaN, and the recorded max keeps them
    assert torch.isinf(amax_of(torch.tensor([1.0, -float("inf")])))
    assert torch.isnan(amax_of(torch.tensor([float("nan")])))
    g = Fp8Gemm("lin")
    g.forward(torch.tensor([[float("nan"), 1.0]]), torch.tensor([[1.0], [1.0]]))
    g.forward(torch.tensor([[2.0, 1.0]]), torch.tensor([[1.0], [1.0]]))
    assert torch.isnan(g.amax_history[0, 0]) and Fp8Scaling([g]).reduce_and_update(Mesh.single(), ())
    model.fp8.skips = model.fp8.max_skips
    assert model.fp8.exhausted  # training/loop.py stops the run (TrainingDiverged)


# --- refusals ----------------------------------------------------------------------------------------------
def test_fp8_runs_in_none_and_1d_and_is_refused_elsewhere() -> None:
    for text in ("dp=2", "tp=1d:2,sp", "pp=2,zero=1", "dp=2,zero=2", "dp=2,zero=3", "tp=1d:2,sp,tpo"):
        check_dtype("fp8", parse_layout(text))
        assert RUNTIMES["paracube"].refusal(parse_layout(text), dtype="fp8") is None
    with pytest.raises(ParacubeError, match="dtype fp8 is not run by paracube's executor with tensor mode 2d.*"
                                            "fp8 runs in tp=none/1d"):
        check_dtype("fp8", parse_layout("tp=2d:2x2"))
    assert "fp8 in tp=none/1d" in RUNTIMES["paracube"].refusal(parse_layout("tp=2d:2x2"), dtype="fp8")
    with pytest.raises(ParacubeError, match="fp8 with a float16 compute copy.*fp16 master state"):
        build_model(SPEC, Mesh.single(), dtype=torch.float16, fp8=True)


def test_local_cpu_emulates_fp8_where_v100_and_a100_refuse() -> None:
    from paracube.topologies import load_topology

    cpu = load_topology("local-cpu", gpus=2).device
    check_dtype_on("fp8", cpu.name, cpu.peak_flops)
    for cluster in ("dgx-a100", "longhorn"):
        dev = load_topology(cluster, gpus=4).device
        with pytest.raises(ParacubeError, match="no fp8 peak"):
            check_dtype_on("fp8", dev.name, dev.peak_flops)


# --- one 2-rank launch -------------------------------------------------------------------------------------
def _one_case(rank: int, text: str) -> dict[str, Any]:
    layout = parse_layout(text)
    mesh = Mesh(layout, rank)
    batches = _micro(layout.dp)
    micro = batches[mesh.coord("dp")]
    tokens = layout.dp * B * N_MICRO * SPEC.seq_len
    out: dict[str, Any] = {"stage": _stage_name(mesh)}
    # traffic and memory: one step of the bf16 fp8 model (the dtype its collectives are priced in)
    bf = build_model(SPEC, mesh, seed=7, dtype=torch.bfloat16, fp8=True)
    mesh.recorder.reset()
    train_step(bf, adamw(bf), mesh, micro, tokens, MAX_NORM)
    out["events"] = [e.key() for e in mesh.recorder.events]
    out["held"] = bf.fp8.held_bytes()
    # equivalence: fp64 fp8 model vs the serial fp64 fp8 reference
    model = build_model(SPEC, Mesh(layout, rank), seed=7, dtype=torch.float64, fp8=True)
    ref = serial_reference(SPEC, seed=7, dtype=torch.float64, vocab=model.vocab, fp8=True)
    out["errors"], _ = steps_against_serial(model, adamw(model), ref, adamw(ref), micro,
                                            [m for r in batches for m in r], tokens, STEPS, MAX_NORM)
    out["scales"] = [g.scale.tolist() for g in model.fp8.gemms]
    return out


def _fp8_state(model: Any) -> dict[str, list]:
    return {f"{g.label}.{n}": getattr(g, n).tolist() for g in model.fp8.gemms for n in STATE}


def _resume(rank: int, root: str) -> dict[str, Any]:
    """bf16 fp8 at RESUME: steps 1-2, checkpoint, steps 3-4 (the uninterrupted run); a fresh model loads the
    checkpoint and runs steps 3-4 again; a model at RESHARD loads the checkpoint's FP8 state."""
    from paracube.executor.checkpoint.store import load_checkpoint, save_checkpoint

    layout = parse_layout(RESUME)
    micro, tokens = _micro(1)[0], B * N_MICRO * SPEC.seq_len

    def run(model: Any, opt: Any, steps: int) -> list[float]:
        return [train_step(model, opt, model.mesh, micro, tokens, MAX_NORM).loss for _ in range(steps)]

    def restored(text: str) -> tuple[Any, Any]:
        model = build_model(SPEC, Mesh(parse_layout(text), rank), seed=7, dtype=torch.bfloat16, fp8=True)
        opt = adamw(model)
        view = opt.empty_view()
        load_checkpoint(root, model, view)
        opt.load_view(view)
        return model, opt

    model = build_model(SPEC, Mesh(layout, rank), seed=7, dtype=torch.bfloat16, fp8=True)
    opt = adamw(model)
    run(model, opt, 2)
    save_checkpoint(root, 2, model, opt.checkpoint_view(), {})
    saved = _fp8_state(model)
    out: dict[str, Any] = {"saved": saved, "losses": run(model, opt, 2), "after": _fp8_state(model)}
    again, again_opt = restored(RESUME)
    out["loaded"] = _fp8_state(again)
    out["resumed"], out["resumed_after"] = run(again, again_opt, 2), _fp8_state(again)
    out["resharded"] = _fp8_state(restored(RESHARD)[0])
    return out


def _nan_on_one_rank(rank: int) -> dict[str, Any]:
    """bf16 fp8 at dp=2: step 2's dY amax of one linear is NaN on rank 1 only (the test hook); steps 1 and 3
    train normally."""
    mesh = Mesh(parse_layout("dp=2"), rank)
    model = build_model(SPEC, mesh, seed=7, dtype=torch.bfloat16, fp8=True)
    opt = adamw(model)
    micro, tokens = _micro(2)[rank], 2 * B * N_MICRO * SPEC.seq_len

    def nan(m: Any) -> None:
        if rank == 1:
            m.fp8.gemms[2].amax_history[0, 2] = float("nan")

    flags = [train_step(model, opt, mesh, micro, tokens, MAX_NORM).overflow]
    params, scales = [p.detach().clone() for p in model.parameters()], _fp8_state(model)
    flags.append(train_step(model, opt, mesh, micro, tokens, MAX_NORM, after_backward=nan).overflow)
    kept = all(torch.equal(a, p) for a, p in zip(params, model.parameters(), strict=True))
    skipped = {"kept_params": kept, "kept_scales": _fp8_state(model) == scales, "skips": model.fp8.skips}
    flags.append(train_step(model, opt, mesh, micro, tokens, MAX_NORM).overflow)
    return {"flags": flags, **skipped, "after": _fp8_state(model), "skips_after": model.fp8.skips}


def _all_cases(rank: int, world: int, root: str) -> dict[str, Any]:
    return {"cases": [_one_case(rank, text) for text in CASES], "resume": _resume(rank, root),
            "nan": _nan_on_one_rank(rank)}


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = str(tmp_path_factory.mktemp("fp8_ckpt"))
    return run_distributed(_all_cases, 2, root, timeout=900.0)  # [rank]


@pytest.fixture(scope="module")
def results(launch: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [r["cases"] for r in launch]  # [rank][case]


def test_fp8_scaling_state_checkpointed_resumes_bit_identically_and_reshards(launch) -> None:
    """The amax histories and scales come back exactly: the resumed run's losses and FP8 state equal the
    uninterrupted run's bit for bit (same layout); the state loads into pp=2 (each stage its own linears,
    named by global block index) equal to what 1D tp=2 saved."""
    for rank, r in enumerate(launch):
        c = r["resume"]
        assert c["loaded"] == c["saved"], rank
        assert any(v != [1.0, 1.0, 1.0] for k, v in c["saved"].items() if k.endswith(".scale"))  # moved off 1
        assert c["resumed"] == c["losses"] and c["resumed_after"] == c["after"], (rank, c["resumed"], c["losses"])
        assert c["resharded"] and all(c["saved"][k] == v for k, v in c["resharded"].items()), rank
    stages = [set(r["resume"]["resharded"]) for r in launch]  # pp=2: the two stages' linears cover the model's
    assert not stages[0] & stages[1] and stages[0] | stages[1] == set(launch[0]["resume"]["saved"])


def test_a_nan_amax_on_one_rank_skips_the_step_everywhere_and_the_scales_recover(launch) -> None:
    """As fp16's loss scaler: a NaN amax on rank 1 only (gloo's max alone would drop it: fp8.py sends it as
    inf) skips step 2 on both ranks with parameters and scales kept; step 3 trains and updates the scales from
    the finite amaxes of steps 1 and 3 (step 2's were dropped): scale = fp8_max / max(history), both ranks alike."""
    fp8_max = {"x": 448.0, "w": 448.0, "dy": 57344.0}
    for rank, r in enumerate(launch):
        n = r["nan"]
        assert n["flags"] == [False, True, False] and n["kept_params"] and n["kept_scales"] and n["skips"] == 1
        assert n["skips_after"] == 0
        for key, hist in n["after"].items():
            if key.endswith(".amax_history"):
                amax = np.max(np.array(hist), axis=0)
                assert np.isfinite(hist).all() and (amax > 0).all(), (rank, key)
                scale = n["after"][key.removesuffix("amax_history") + "scale"]
                want = np.array(list(fp8_max.values()), dtype=np.float32) / amax.astype(np.float32)
                assert np.allclose(scale, want, rtol=1e-6), (rank, key, scale, want)
    assert launch[0]["nan"]["after"] == launch[1]["nan"]["after"]


@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_fp8_sharded_matches_serial_fp8_traffic_and_memory(results, case: int) -> None:
    text = CASES[case]
    layout = parse_layout(text).with_(micro_batch=B)
    d = dims_of(SPEC, training(text))
    for rank, per_case in enumerate(results):
        r = per_case[case]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
        assert not bad, f"rank {rank}: relative errors above {TOL_FP64}: {bad}"
        assert all(s != [1.0, 1.0, 1.0] for s in r["scales"])  # the scales moved off their initial 1
        events = stage_events(layout, d, B, r["stage"])
        assert any(e.label == "fp8_amax" for e in events) == (layout.dp * layout.tensor_size > 1)
        diff = traffic_difference(events, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
        first, last = int(r["stage"] == "first"), int(r["stage"] == "last")
        predicted = float(fp8_cost.copy_bytes(d, layout.mode, layout_arrays(layout, B), np.array([first]),
                                              np.array([last]))[0])
        assert r["held"] == pytest.approx(predicted, rel=0.02), (rank, r["held"], predicted)
