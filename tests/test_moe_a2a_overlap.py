"""The MoE all_to_alls overlapped with another micro-batch's compute (Layout `a2ao`, cost_models/moe_a2a_overlap.py):
the closed form against a step-by-step two-stream reference, both engines agreeing with and without it, the step
never longer with it and shorter by less than the all_to_alls it can hide, and the one-line refusals where it
cannot run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.cli.main import main
from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.moe_a2a_overlap import SM_SHARE, combined, list_share, overlapped_fraction
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.runtimes import get_runtime
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

TRAIN = TrainingSpec(global_batch=32, dtype="bf16", recompute="selective")
MEGATRON = get_runtime("megatron").engine_options()


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


def two_streams(comm: float, compute: float, s: float, dt: float) -> float:
    """Reference: a compute stream slowed to 1 - s while a comm stream runs, stepped in dt."""
    t, done_c, done_a = 0.0, 0.0, 0.0
    while done_c < compute or done_a < comm:
        running = done_a < comm
        done_a += dt if running else 0.0
        done_c += dt * ((1.0 - s) if running else 1.0)
        t += dt
    return t


@pytest.mark.parametrize(("compute", "a_fwd", "a_bwd"), [(3.0, 0.5, 0.5), (3.0, 4.0, 1.0), (0.3, 2.0, 2.0),
                                                         (3.0, 0.0, 0.0)])
def test_combined_step_is_two_streams(compute: float, a_fwd: float, a_bwd: float) -> None:
    """The closed form's combined step (C + s A + x_f + x_b) against the stepped reference of its two pairs (A_b beside
    C_f, A_f beside C_b); dt = 1e-4 of seconds-scale terms: the stepping's error is below 2 dt per pair."""
    cmb = combined(compute, a_fwd, a_bwd)
    closed = compute + cmb.slowed + cmb.x_fwd + cmb.x_bwd
    ref = two_streams(a_bwd, compute / 3, SM_SHARE, 1e-4) + two_streams(a_fwd, 2 * compute / 3, SM_SHARE, 1e-4)
    assert abs(closed - ref) < 4e-4
    assert cmb.saved >= 0.0  # never longer than in line (C + A)
    assert cmb.saved <= (1.0 - SM_SHARE) * (a_fwd + a_bwd) + 1e-12


def test_overlapped_steps_follow_megatron_schedules() -> None:
    """pp = 1: all but the first forward / last backward; interleaved: after the warm-up of get_pp_rank_microbatches
    (2 (pp - rank - 1) + (v - 1) pp, plus one with the overlap)."""
    assert overlapped_fraction(1, 1, 8, 0) == 7 / 8
    assert overlapped_fraction(4, 2, 16, 0) == (32 - (6 + 4 + 1)) / 32
    assert overlapped_fraction(4, 2, 16, 3) == (32 - (4 + 1)) / 32
    assert overlapped_fraction(4, 2, 2, 0) == 0.0  # every chunk in warm-up
    assert 0.0 <= list_share(4, 2, 16, 0) <= 1.0 and list_share(1, 1, 8, 0) == 1.0


# Layouts (ep > 1; pp = 1 or interleaved): in-node and across nodes, with tensor and expert-tensor parallelism, dense
# first blocks (deepseek: none here; mixtral without a shared expert), both dispatchers (defaults: alltoall; megatron's
# options: DeepEP). The two engines' MoE terms are the same closed forms; what differs is the event engine's link
# sharing and pipeline schedule (as tests/test_moe_cost.py), hence 2%.
LAYOUTS = [
    ("qwen3-30b-a3b", "dp=16,ep=8,tp=none,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=16,ep=16,tp=none,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=8,ep=8,tp=1d:2,sp,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=4,pp=2,v=2,ep=4,etp=2,tp=1d:2,mb=1,zero=1"),
    ("mixtral-8x7b", "dp=8,pp=2,v=2,ep=8,tp=none,mb=1"),
    ("tiny-moe", "dp=8,ep=4,tp=1d:2,sp,mb=1"),
]


@pytest.mark.parametrize(("name", "text"), LAYOUTS)
@pytest.mark.parametrize("megatron", [False, True])
def test_engines_agree_with_and_without_the_overlap(h100: object, name: str, text: str, megatron: bool) -> None:
    model, options = PRESETS[name], MEGATRON if megatron else None
    steps = {}
    for a2ao in (False, True):
        layout = replace(parse_layout(text), a2ao=a2ao)
        a = estimate(model, TRAIN, layout, h100, with_events=False, options=options).step_time_s
        e = estimate_event(model, TRAIN, layout, h100, with_events=False, options=options).step_time_s
        assert abs(e / a - 1) < 0.02, (a2ao, a, e)
        steps[a2ao] = (a, e)
    # never longer with it: the analytic step exactly (saving >= 0), the event engine's within its 0.5% of schedule
    # noise (its pipeline and link sharing around the same closed form), far below the SMs' share
    assert steps[True][0] <= steps[False][0] * (1 + 1e-12)
    assert steps[True][1] <= steps[False][1] * 1.005


def test_analytic_saving_is_bounded_by_the_hidden_all_to_alls(h100: object) -> None:
    """pp = 1 (one stage): the step falls, by less than the (N - 1) / N of the step's all_to_all seconds the
    combined steps can hide."""
    model, text = PRESETS["qwen3-30b-a3b"], "dp=16,ep=16,tp=none,mb=1,zero=1"
    off = estimate(model, TRAIN, parse_layout(text), h100, with_events=False, options=MEGATRON)
    on = estimate(model, TRAIN, parse_layout(text + ",a2ao"), h100, with_events=False, options=MEGATRON)
    n = TRAIN.global_batch // 16
    a2a = off.comm_time_by_kind["all_to_all"]
    assert 0 < off.step_time_s - on.step_time_s < (n - 1) / n * a2a  # part of the all_to_alls hidden, never more


@pytest.mark.parametrize("engine", [estimate, estimate_event])
def test_the_hidden_share_scales_the_saving(engine: object) -> None:
    """The share of the two streams' hidden time a run hides (gemm.a2ao_eff: topologies/efficiency.A2AO_OVERLAP,
    shipped on the preset) scales what `a2ao` takes off the step: all of it at 1, none at 0 (the step exactly as
    without the overlap, in both engines), half of it at 0.5 (the analytic engine exactly, 1e-9 relative: the same
    sums, the replica jitter's square root left out; the event engine within 1% of the saving: its schedule moves
    the scaled compute ops as a whole)."""
    from paracube.topologies.calibration import as_calibration

    model, text = PRESETS["qwen3-30b-a3b"], "dp=16,ep=16,tp=none,mb=1,zero=1"
    off = parse_layout(text)

    def step(share: float, layout: object) -> float:
        topo = load_topology("dgx-h100", gpus=16)
        cal = as_calibration(topo.calibration)  # type: ignore[attr-defined]
        # without Hopper's replica jitter, whose wait grows with the step's square root (cost_models/stragglers.py)
        topo.calibration = replace(cal, gemm=replace(cal.gemm, a2ao_eff=share, straggler=0.0))  # type: ignore
        return engine(model, TRAIN, layout, topo, with_events=False, options=MEGATRON).step_time_s  # type: ignore

    plain, on = step(1.0, off), replace(off, a2ao=True)
    whole, none, half = step(1.0, on), step(0.0, on), step(0.5, on)
    assert whole < plain and none == pytest.approx(plain, rel=1e-12)
    tol = 1e-9 if engine is estimate else 0.01
    assert plain - half == pytest.approx((plain - whole) / 2, rel=tol)


REFUSED = [
    ("paracube", "dp=8,ep=4,tp=none,mb=1,a2ao", "bf16",
     "runtime paracube (paracube run) does not overlap the MoE all_to_alls with another micro-batch's compute; "
     "drop a2ao"),
    ("megatron", "dp=4,pp=2,ep=4,tp=none,mb=1,a2ao", "bf16",
     "runtime megatron (Megatron-core / NeMo) runs a2ao with pipelines (pp=2) only interleaved; add v=N (N > 1) or "
     "drop a2ao"),
    ("megatron", "dp=8,tp=none,mb=1,a2ao", "bf16",
     "runtime megatron (Megatron-core / NeMo) overlaps the MoE all_to_alls (a2ao) with expert parallelism only; add "
     "ep=N (N > 1) or drop a2ao"),
    ("megatron", "dp=8,ep=4,tp=none,mb=1,rc=full,a2ao", "bf16",
     "runtime megatron (Megatron-core / NeMo) does not run a2ao with full recomputation; valid: rc=none/selective"),
    ("megatron", "dp=8,ep=4,tp=none,mb=1,a2ao", "fp32",
     "runtime megatron (Megatron-core / NeMo) runs a2ao in bf16 / fp16 / fp8 only (16-bit parameters), not fp32; "
     "drop a2ao"),
    ("torchtitan", "dp=8,ep=4,tp=none,mb=1,zero=3,a2ao", "bf16",
     "runtime torchtitan (FSDP2 + DTensor TP) does not overlap the MoE all_to_alls with another micro-batch's "
     "compute; drop a2ao"),
]


@pytest.mark.parametrize(("runtime", "text", "dtype", "message"), REFUSED)
def test_refused_in_one_line(capsys: pytest.CaptureFixture[str], runtime: str, text: str, dtype: str,
                             message: str) -> None:
    code = main(["simulate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--gpus", "8", "--runtime", runtime,
                 "--dtype", dtype, "--layout", text])
    err = capsys.readouterr().err
    assert code == 2 and err == f"paracube: error: layout {parse_layout(text)}: {message}\n"


def test_full_recomputation_of_the_run_is_refused_by_the_engines(capsys: pytest.CaptureFixture[str]) -> None:
    """`--recompute full` (the run's, not the layout's rc=): the engines refuse the layout in one line."""
    text = "dp=8,ep=4,tp=none,mb=1,a2ao"
    code = main(["simulate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--gpus", "8", "--runtime", "megatron",
                 "--recompute", "full", "--layout", text])
    assert code == 2 and capsys.readouterr().err == (
        f"paracube: error: layout {text}: a2ao (the MoE all_to_all overlap) does not run with full recomputation; "
        "valid: rc=none/selective\n")
