"""Bucketed, overlapped gradient reduction and the distributed optimizer (zero=1) against the serial model
and the cost model.

One rank launch per layout (dp=2 with zero=1 in every tensor mode the executor runs within 8 ranks: none,
1D tp=2, 2D 2x2; 3D at dp=2 needs 16 ranks with q=2, so 3D runs its 1x1x1 mesh -- the 3D code path with
groups of one; 2.5D 2x2x2 at dp=1: its optimizer shards over (dp, dep), here the 2 depth layers alone)
checks:
- equivalence: the reduce-scattered gradient shards of the global batch equal their elements of the serial
  gradients; losses, grad norms and parameters after 3 AdamW steps (clipping active) equal the serial
  model's (relative 1e-5, both copies in fp64 with fp32 buckets and masters: dist_helpers.TOL_FP64 says why);
- memory: parameter, gradient (fp32 buckets) and optimizer (fp32 master shard + Adam moments) bytes per
  rank equal cost_models' estimate exactly (one bucket);
- with small buckets (several per step), for zero=1 and for zero=0: overlap on and off give bit-identical
  losses and parameters (zero=1: the parameter all-gathers overlapped with the next forward too, each bucket's
  finished by a module pre-hook of that forward: data_parallel/param_gather.py), the same collectives in the
  same order, and the recorded collectives equal traffic.stage_events (bucket count and sizes) with zero
  difference;
- checkpoints (1D layout): a zero=1 checkpoint after 2 steps reloads into zero=1 (the next step is
  bit-identical to the uninterrupted run) and into zero=0 (equal within 1e-5);
- bf16 (parameters in bf16, fp32 masters): zero=1 tracks the serial bf16 model with fp32 masters (loose),
  its masters and moments are fp32 and the bytes per rank equal the model's (2 + 4 + 12/z per parameter,
  z = dp, 2.5D dp x depth).
fp16 dynamic loss scaling: an overflowing step is skipped and backs off, with pp=2 on every stage alike
(an overflow forced on one stage's gradients through train_step's explicit `after_backward` hook).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from dist_helpers import TOL_FP64, rel_err, run_distributed

from paracube.cost_models import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.estimate import traffic_difference
from paracube.executor import Mesh, build_model, serial_reference, train_step
from paracube.executor.data_parallel.distributed_adamw import DistributedAdamW
from paracube.executor.data_parallel.grad_sync import GradSync
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.modes.buckets import BUCKET_BYTES
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("zero", layers=2, hidden=32, heads=8, ffn_hidden=128, vocab=64, seq_len=16)
B, N_MICRO, STEPS, MAX_NORM, TOL = 4, 2, 3, 0.3, TOL_FP64
F64 = torch.float64  # the equivalence runs; memory and traffic are checked on fp32 models
SMALL_BUCKET = 8 * 1024  # bytes: several buckets per step on every layout below
ADAMW = {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}
LAYOUTS = ["dp=2,zero=1", "dp=2,tp=1d:2,zero=1", "dp=2,tp=2d:2x2,zero=1", "dp=2,tp=3d:1x1x1,zero=1",
           "tp=2.5d:2x2x2,zero=1"]


def _micro(layout: Layout, dp_index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1234)
    n = layout.dp * B * N_MICRO
    ids = torch.randint(0, SPEC.vocab, (n, SPEC.seq_len), generator=gen)
    labels = torch.randint(0, SPEC.vocab, (n, SPEC.seq_len), generator=gen)
    s = dp_index * B * N_MICRO
    return [(ids[s + m * B:s + (m + 1) * B], labels[s + m * B:s + (m + 1) * B]) for m in range(N_MICRO)]


def _sharded(model: torch.nn.Module, mesh: Mesh, bucket_bytes: int | None = None) -> DistributedAdamW:
    specs = {p: model.shard_specs[n] for n, p in model.named_parameters()}
    sync = GradSync(model, mesh, 1) if bucket_bytes is None else GradSync(model, mesh, 1, bucket_bytes)
    return DistributedAdamW(sync, specs, **ADAMW)


def _shard_grad_errors(model: Any, opt: DistributedAdamW, ref: Any, micro: list, tokens: int) -> list[float]:
    """Reduce-scatter the global batch's gradients; each bucket shard vs the serial gradients' elements."""
    sync = opt.sync
    sync.start(overlap=True)
    for k, (ids, labels) in enumerate(micro):
        if k == len(micro) - 1:
            sync.last_micro_batch()
        (model(ids, labels)[0] / tokens).backward()
    sync.finish()
    names = {p: n for n, p in model.named_parameters()}
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    errors = []
    k = sync.shard_index()
    for b in sync.buckets:
        lo, hi = k * b.shard_numel, (k + 1) * b.shard_numel
        mine, want = [], []
        for i, p in enumerate(b.params):
            o = b.offsets[i]
            a, c = max(lo, o), min(hi, o + p.numel())
            if a < c:
                full = model.block_of(names[p], ref_grads[names[p]]).reshape(-1)
                mine.append(b.shard[a - lo:c - lo])
                want.append(full[a - o:c - o])
        errors.append(rel_err(torch.cat(mine), torch.cat(want)))
    return errors


def _equivalence(mesh: Mesh, layout: Layout, out: dict[str, Any]) -> None:
    micro = _micro(layout, mesh.coord("dp"))
    every = [m for d in range(layout.dp) for m in _micro(layout, d)]
    tokens = layout.dp * B * N_MICRO * SPEC.seq_len
    model, ref = build_model(SPEC, mesh, seed=7, dtype=F64), serial_reference(SPEC, seed=7, dtype=F64)
    for ids, labels in every:
        (ref(ids, labels)[0] / tokens).backward()
    out["grad_errors"] = _shard_grad_errors(model, _sharded(model, mesh), ref, micro, tokens)

    # fp64 copies: both optimizers step fp32 masters of them (DistributedAdamW, MasterAdamW)
    model, ref = build_model(SPEC, mesh, seed=7, dtype=F64), serial_reference(SPEC, seed=7, dtype=F64)
    opt, ref_opt = _sharded(model, mesh), build_optimizer(ref, ref.mesh, 0, BUCKET_BYTES, **ADAMW)
    errs = out["step_errors"] = []
    for _ in range(STEPS):
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM)
        want = train_step(ref, ref_opt, ref.mesh, every, tokens, MAX_NORM)
        errs += [abs(res.loss - want.loss) / want.loss, abs(res.grad_norm - want.grad_norm) / want.grad_norm]
        out["clipped"] = want.grad_norm > MAX_NORM
    full = dict(ref.named_parameters())
    out["param_errors"] = {n: rel_err(p, model.block_of(n, full[n])) for n, p in model.named_parameters()}
    model = build_model(SPEC, mesh, seed=7)  # fp32, as the memory model prices it; one step creates the moments
    opt = _sharded(model, mesh)
    train_step(model, opt, mesh, micro, tokens, MAX_NORM)
    out["memory"] = _memory(model, opt)


def _memory(model: torch.nn.Module, opt: DistributedAdamW) -> dict[str, Any]:
    """Bytes per rank as the executor holds them, and the dtypes of the optimizer's tensors."""
    return {
        "parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": sum(b.buffer.numel() * b.buffer.element_size() for b in opt.sync.buckets),
        "optimizer": sum(m.numel() * m.element_size() for m in opt.masters)
        + sum(s[k].numel() * s[k].element_size() for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")),
        "state_dtypes": sorted({str(m.dtype) for m in opt.masters} | {str(t.dtype) for s in opt.state.values()
                                                                      for t in s.values() if t.dim() > 0}),
    }


def _bf16(mesh: Mesh, layout: Layout, out: dict[str, Any]) -> None:
    """zero=1 in bf16 against the serial bf16 model with fp32 masters (MasterAdamW), 3 steps."""
    micro = _micro(layout, mesh.coord("dp"))
    every = [m for d in range(layout.dp) for m in _micro(layout, d)]
    tokens = layout.dp * B * N_MICRO * SPEC.seq_len
    model = build_model(SPEC, mesh, seed=7, dtype=torch.bfloat16)
    ref = serial_reference(SPEC, seed=7, dtype=torch.bfloat16)
    opt, ref_opt = _sharded(model, mesh), build_optimizer(ref, ref.mesh, 0, BUCKET_BYTES, **ADAMW)
    errs = []
    for _ in range(STEPS):
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM)
        want = train_step(ref, ref_opt, ref.mesh, every, tokens, MAX_NORM)
        errs.append(abs(res.loss - want.loss) / want.loss)
    names = [n for n, _ in model.named_parameters()]
    full = dict(ref.named_parameters())
    mine = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    want_p = torch.cat([model.block_of(n, full[n]).reshape(-1).double() for n in names])  # padded vocabulary too
    out["bf16"] = {"loss_err": max(errs), "param_err": rel_err(mine, want_p), "memory": _memory(model, opt),
                   "dtypes": sorted({str(p.dtype) for p in model.parameters()})}


def _overlap_runs(mesh: Mesh, layout: Layout, zero: int) -> dict[str, Any]:
    """Two steps with small buckets, overlap on then off (zero=1: the parameter all-gathers too, finished by the
    next forward's pre-hooks): losses, parameters, step-1 events, and how many buckets the forward finished."""
    micro = _micro(layout, mesh.coord("dp"))
    tokens = layout.dp * B * N_MICRO * SPEC.seq_len
    runs = []
    in_forward = 0
    for overlap in (True, False):
        model = build_model(SPEC, mesh, seed=7)
        if zero:
            opt: torch.optim.Optimizer = _sharded(model, mesh, SMALL_BUCKET)
        else:
            opt = torch.optim.AdamW(model.parameters(), **ADAMW)
        losses, events = [], []
        for step in range(2):
            mesh.recorder.reset()
            losses.append(train_step(model, opt, mesh, micro, tokens, MAX_NORM, overlap=overlap,
                                     bucket_bytes=SMALL_BUCKET, param_overlap=overlap).loss)
            if step == 0:
                events = [e.key() for e in mesh.recorder.events]
        if zero and overlap:
            in_forward = opt.prefetch.waited_in_forward  # type: ignore[attr-defined]  # step 1's gathers
            opt.wait_params()  # type: ignore[attr-defined]  # step 2's, still pending
        runs.append((losses, [p.detach().clone() for p in model.parameters()], events))
    (l1, p1, e1), (l2, p2, e2) = runs
    return {"identical": l1 == l2 and all(torch.equal(a, b) for a, b in zip(p1, p2, strict=True)),
            "events": e1, "same_events": sorted(e1) == sorted(e2), "gathers_in_forward": in_forward,
            "buckets": len(opt.sync.buckets) if zero else 0}  # type: ignore[attr-defined]


def _checkpoints(mesh: Mesh, plain_mesh: Mesh, layout: Layout, root: str) -> dict[str, Any]:
    from paracube.executor.checkpoint.store import load_checkpoint, save_checkpoint

    micro = _micro(layout, mesh.coord("dp"))
    tokens = layout.dp * B * N_MICRO * SPEC.seq_len
    model = build_model(SPEC, mesh, seed=7)
    opt = _sharded(model, mesh)
    for _ in range(2):
        train_step(model, opt, mesh, micro, tokens, MAX_NORM)
    save_checkpoint(root, 2, model, opt.checkpoint_view(), {"layout": str(layout)})  # type: ignore[arg-type]
    want = train_step(model, opt, mesh, micro, tokens, MAX_NORM).loss
    again = build_model(SPEC, mesh, seed=99)
    opt1 = _sharded(again, mesh)
    view = opt1.empty_view()
    load_checkpoint(root, again, view)  # type: ignore[arg-type]
    opt1.load_view(view)
    got1 = train_step(again, opt1, mesh, micro, tokens, MAX_NORM).loss
    plain = build_model(SPEC, plain_mesh, seed=99)
    opt0 = torch.optim.AdamW(plain.parameters(), **ADAMW)
    load_checkpoint(root, plain, opt0)
    got0 = train_step(plain, opt0, plain_mesh, micro, tokens, MAX_NORM).loss
    return {"bit_identical": got1 == want and all(torch.equal(a, b) for a, b in
                                                  zip(again.parameters(), model.parameters(), strict=True)),
            "zero0_loss_err": abs(got0 - want) / want,
            "zero0_param_err": max(rel_err(a, b) for a, b in zip(plain.parameters(), model.parameters(), strict=True))}


def _run(rank: int, world: int, text: str, root: str) -> dict[str, Any]:
    layout = parse_layout(text)
    mesh = Mesh(layout, rank)
    out: dict[str, Any] = {}
    _equivalence(mesh, layout, out)
    _bf16(mesh, layout, out)
    out["zero1"] = _overlap_runs(mesh, layout, 1)
    plain = parse_layout(text.replace(",zero=1", ""))
    plain_mesh = Mesh(plain, rank)
    out["zero0"] = _overlap_runs(plain_mesh, plain, 0)
    if text == CHECKPOINT_LAYOUT:
        out["checkpoint"] = _checkpoints(mesh, plain_mesh, layout, root)
    return out


CHECKPOINT_LAYOUT = "dp=2,tp=1d:2,zero=1"


class _Runs(dict):
    """Each layout's rank outputs, launched the first time a test asks for them (so `-k` runs only those)."""

    def __init__(self, root: Any) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, text: str) -> list[dict[str, Any]]:
        self[text] = run_distributed(_run, parse_layout(text).world_size, text, str(self.root / text))
        return self[text]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return _Runs(tmp_path_factory.mktemp("zero1"))


def test_zero1_checkpoint_reloads_into_zero1_and_zero0(runs) -> None:
    for rank, out in enumerate(runs[CHECKPOINT_LAYOUT]):
        c = out["checkpoint"]
        assert c["bit_identical"], rank
        assert c["zero0_loss_err"] < TOL and c["zero0_param_err"] < TOL, (rank, c)


def _training(layout: Layout, dtype: str = "fp32") -> TrainingSpec:
    return TrainingSpec(global_batch=layout.dp * B * N_MICRO, dtype=dtype)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", LAYOUTS)
def test_zero1_equals_serial(runs, text) -> None:
    for rank, out in enumerate(runs[text]):
        assert out["clipped"]
        assert max(out["grad_errors"]) < TOL, (rank, out["grad_errors"])
        assert max(out["step_errors"]) < TOL, (rank, out["step_errors"])
        worst = max(out["param_errors"].items(), key=lambda kv: kv[1])
        assert worst[1] < TOL, (rank, worst)


@pytest.mark.parametrize("text", LAYOUTS)
def test_zero1_memory_equals_model(runs, text) -> None:
    layout = parse_layout(text).with_(micro_batch=B)
    est = estimate(SPEC, _training(layout), layout, load_topology("local-cpu", gpus=layout.world_size),
                   with_events=False).memory
    plain = estimate(SPEC, _training(layout), layout.with_(zero=0),
                     load_topology("local-cpu", gpus=layout.world_size), with_events=False).memory
    assert est.optimizer < plain.optimizer  # 12 / z bytes per parameter instead of 8 (z = dp; 2.5D dp x depth)
    for out in runs[text]:
        m = out["memory"]
        assert (m["parameters"], m["gradients"], m["optimizer"]) == (est.parameters, est.gradients, est.optimizer)


@pytest.mark.parametrize("text", LAYOUTS)
def test_zero1_bf16_tracks_serial_bf16_and_memory_equals_model(runs, text) -> None:
    layout = parse_layout(text).with_(micro_batch=B)
    topo = load_topology("local-cpu", gpus=layout.world_size)
    est = estimate(SPEC, _training(layout, "bf16"), layout, topo, with_events=False).memory
    plain = estimate(SPEC, _training(layout, "bf16"), layout.with_(zero=0), topo, with_events=False).memory
    n = plain.gradients / 4  # local parameters (fp32 gradient buckets)
    assert (plain.parameters, plain.optimizer) == (2 * n, 12 * n)  # bf16 copy; fp32 master + moments: 18 n
    for rank, out in enumerate(runs[text]):
        r = out["bf16"]
        assert r["dtypes"] == ["torch.bfloat16"] and r["memory"]["state_dtypes"] == ["torch.float32"], rank
        assert r["loss_err"] < 1e-2 and r["param_err"] < 1e-2, (rank, r)  # bf16 rounding in another order
        m = r["memory"]
        assert (m["parameters"], m["gradients"], m["optimizer"]) == (est.parameters, est.gradients, est.optimizer)


@pytest.mark.parametrize("zero", ["zero1", "zero0"])
@pytest.mark.parametrize("text", LAYOUTS)
def test_overlap_bit_identical_and_buckets_priced(runs, text, zero) -> None:
    layout = parse_layout(text if zero == "zero1" else text.replace(",zero=1", "")).with_(micro_batch=B)
    predicted = stage_events(layout, dims_of(SPEC, _training(layout)), B, bucket_bytes=SMALL_BUCKET)
    n_buckets = sum(e.label == "gradients" for e in predicted)
    assert n_buckets > 2
    for rank, out in enumerate(runs[text]):
        r = out[zero]
        assert r["identical"] and r["same_events"], rank
        # zero=1: every bucket's parameter gather of step 1 was finished by a module pre-hook of step 2's forward
        assert r["gathers_in_forward"] == r["buckets"], (rank, r["gathers_in_forward"], r["buckets"])
        diff = traffic_difference(predicted, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)


# --- fp16 dynamic loss scaling ---------------------------------------------------------------------------
def _fp16(rank: int, world: int) -> dict[str, Any]:
    from paracube.executor.training.loop import TrainConfig, TrainingDiverged, train
    from paracube.executor.training.loss_scale import LossScaler
    from paracube.plan import default_plan

    layout = parse_layout("dp=1")
    mesh = Mesh.single(layout)
    model = build_model(SPEC, mesh, seed=7, dtype=torch.float16)
    opt = build_optimizer(model, mesh, 0, BUCKET_BYTES, **ADAMW)
    micro, tokens = _micro(layout, 0), B * N_MICRO * SPEC.seq_len
    scaler = LossScaler(scale=2.0 ** 200, backoff=2.0 ** -190, growth_interval=2)  # 2^200: inf in fp32
    before = [p.detach().clone() for p in model.parameters()]
    rows = []
    for _ in range(4):
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM, scaler=scaler)
        rows.append((res.overflow, scaler.scale, res.loss))
        if len(rows) == 1:
            rows.append(all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)))
            rows.append(len(opt.state))
    plan = default_plan("dp=1", model=SPEC, training=TrainingSpec(global_batch=B * N_MICRO, dtype="fp16"))
    try:
        train(plan, 0, 1, 30, config=TrainConfig(loss_scale=2.0 ** 200, data="synthetic"))
        stop = ""
    except TrainingDiverged as exc:
        stop = str(exc)
    return {"rows": rows, "stop": stop}


def _fp16_pipeline(rank: int, world: int) -> dict[str, Any]:
    """pp=2 in fp16: step 2 gets an inf in one gradient element of stage 0 only (the after_backward hook);
    the norm, all-reduced over pp, overflows on both stages, which skip the step and back off alike."""
    from paracube.executor.layers.functional import main_grad
    from paracube.executor.training.loop import TrainConfig, train
    from paracube.executor.training.loss_scale import LossScaler
    from paracube.plan import default_plan

    layout = parse_layout("pp=2")
    mesh = Mesh(layout, rank)
    model = build_model(SPEC, mesh, seed=7, dtype=torch.float16)
    opt = build_optimizer(model, mesh, 0, BUCKET_BYTES, **ADAMW)
    micro, tokens = _micro(layout, 0), B * N_MICRO * SPEC.seq_len
    scaler = LossScaler(scale=2.0 ** 12)

    def poison(m: torch.nn.Module) -> None:
        if mesh.coord("pp") == 0:
            main_grad(next(m.parameters())).view(-1)[0] = float("inf")

    rows = []
    for step in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM, scaler=scaler,
                         after_backward=poison if step == 1 else None)
        same = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        rows.append((res.overflow, scaler.scale, same, res.loss))
    plan = default_plan("pp=2", model=SPEC, training=TrainingSpec(global_batch=B * N_MICRO, dtype="fp16"))
    trained = train(plan, rank, world, 3, config=TrainConfig(data="synthetic"))
    return {"rows": rows, "losses": trained.losses}


def test_fp16_with_pipeline_skips_an_overflow_on_every_stage() -> None:
    """fp16 with pp=2 runs (no refusal): one forced overflow on stage 0 is skipped identically by both
    stages (no parameter changes, the scale halves on both), the steps around it apply."""
    out = run_distributed(_fp16_pipeline, 2)
    for r in out:
        (ov1, s1, same1, _), (ov2, s2, same2, _), (ov3, s3, same3, _) = r["rows"]
        assert not ov1 and not same1 and s1 == 2.0 ** 12
        assert ov2 and same2 and s2 == 2.0 ** 11
        assert not ov3 and not same3 and s3 == 2.0 ** 11
        assert len(r["losses"]) == 3 and all(math.isfinite(x) for x in r["losses"])
    assert out[0]["rows"] == out[1]["rows"] and out[0]["losses"] == out[1]["losses"]


def test_fp16_overflow_skips_backs_off_and_stops() -> None:
    """Step 1 overflows (scale 2^200): skipped (parameters bit-identical, no Adam state), scale backed off
    to 2^10; steps 2-3 apply, and after growth_interval = 2 good steps the scale doubles. A run whose every
    step overflows stops after max_skips (20) steps with one line."""
    out = run_distributed(_fp16, 1)[0]
    (ov1, s1, _), unchanged, n_state, (ov2, s2, l2), (ov3, s3, l3), (ov4, s4, _) = out["rows"]
    assert ov1 and s1 == 2.0 ** 10 and unchanged and n_state == 0
    assert not ov2 and not ov3 and not ov4 and s2 == 2.0 ** 10 and s3 == 2.0 ** 11 and s4 == 2.0 ** 11
    assert l3 < l2  # the applied steps train
    assert "overflowed in 20 steps in a row" in out["stop"] and "step 20" in out["stop"]
    assert "\n" not in out["stop"]
