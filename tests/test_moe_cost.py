"""MoE pricing (cost_models/moe.py, moe_step.py, moe_program.py): both engines agree, the declared all-to-all
bytes are the routing's, expert memory follows ep / etp / zero, and bad ep is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.experts import EXECUTOR_PROBS, balanced_routing, splits
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

TRAIN = TrainingSpec(global_batch=32, dtype="bf16", recompute="selective")


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=16)


# In line with compute the MoE collectives and GEMMs are the same closed forms in both engines; what differs is
# the event engine's link sharing between concurrent groups and the pipeline schedule, hence 2%.
@pytest.mark.parametrize(("name", "text"), [
    ("qwen3-30b-a3b", "dp=16,ep=8,tp=none,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=8,ep=8,tp=1d:2,sp,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=16,ep=16,tp=none,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=4,pp=2,ep=4,etp=2,tp=1d:2,mb=1,zero=1"),
    ("tiny-mla", "dp=8,ep=4,tp=1d:2,mb=1"),
    ("tiny-moe", "dp=8,ep=4,tp=1d:2,sp,mb=1"),  # the counts over ep and the aux loss's over tp, the experts' norm
    ("mixtral-8x7b", "dp=8,pp=2,ep=8,tp=none,mb=1"),
    ("mixtral-8x7b", "dp=2,pp=2,ep=4,tp=1d:4,sp,mb=1"),  # no shared expert: the MoE blocks' MLP collectives dropped
    ("qwen3-30b-a3b", "dp=4,cp=2,ep=8,tp=none,mb=1"),  # cp: T = b s / cp, ep folded over dp x cp
    ("tiny-moe", "dp=2,cp=2,ep=4,tp=1d:2,sp,mb=1"),  # the aux loss's counts over (cp, tp)
    # the expert units' zero=2/3 collectives in line (moe_fsdp.py): per micro-batch, and with pipelines once a step
    ("qwen3-30b-a3b", "dp=16,ep=8,tp=none,mb=1,zero=3,overlap"),
    ("qwen3-30b-a3b", "dp=16,tp=none,mb=1,zero=3,overlap"),  # ep = 1: every expert gathered over dp
    ("qwen3-30b-a3b", "dp=16,ep=4,tp=none,mb=1,zero=2"),
    ("qwen3-30b-a3b", "dp=8,pp=2,ep=4,tp=none,mb=1,zero=3,overlap"),
    # tpo: the MLP rings of blocks without a shared expert dropped by both (moe_unshared.py), their GEMMs kept
    ("mixtral-8x7b", "dp=2,pp=2,ep=4,tp=1d:4,sp,tpo,mb=1"),
    ("qwen3-30b-a3b", "dp=4,ep=4,tp=1d:4,sp,tpo,mb=1,zero=1,rc=full"),
])
def test_engines_agree_within_2_percent(h100: object, name: str, text: str) -> None:
    model, layout = PRESETS[name], parse_layout(text)
    a = estimate(model, TRAIN, layout, h100, with_events=False)
    e = estimate_event(model, TRAIN, layout, h100, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


def test_dropped_mlp_collectives_come_off_the_tensor_axis(h100: object) -> None:
    """Mixtral's blocks run no dense MLP (moe_unshared.py): the analytic engine takes the dense part's MLP collectives
    off the tensor axis they were booked on, as the event engine drops their ops, so both report the same tp and ep
    seconds (before, the analytic engine subtracted them from ep: a negative ep at tp = 8). The analytic figures are
    serialized seconds, the event engine's exposed ones: equal here, every tp and ep collective running in line.
    5%: the event engine's link sharing between the concurrent groups, as in the step's 2% above, on the smaller
    per-axis sums."""
    model, layout = PRESETS["mixtral-8x7b"], parse_layout("dp=2,pp=2,ep=4,tp=1d:4,sp,mb=1")
    a = estimate(model, TRAIN, layout, h100, with_events=False)
    e = estimate_event(model, TRAIN, layout, h100, with_events=False)
    assert min(a.comm_time_by_axis.values()) >= 0.0
    assert sum(a.comm_time_by_axis.values()) == pytest.approx(a.comm_time_s, rel=1e-9)
    for axis in ("tp", "ep"):
        assert a.comm_time_by_axis[axis] == pytest.approx(e.comm_time_by_axis[axis], rel=0.05), axis


def test_tpo_hides_the_attention_rings_of_a_moe_model_and_runs_no_mlp_ring(h100: object) -> None:
    """Mixtral's shape at tp=4 with tpo: the step is the one without tpo less what the attention's rings hide (both
    engines), and neither engine keeps a ring of the MLP its blocks do not run: the serialized tp seconds are the
    same with and without tpo (before, the stand-in's MLP rings stayed priced under tpo)."""
    model, on = PRESETS["mixtral-8x7b"], parse_layout("dp=2,pp=2,ep=4,tp=1d:4,sp,tpo,mb=1")
    off = on.with_(tpo=False)
    a_on, a_off = (estimate(model, TRAIN, x, h100, with_events=False) for x in (on, off))
    e_on = estimate_event(model, TRAIN, on, h100, with_events=False)
    assert a_on.step_time_s < a_off.step_time_s and e_on.step_time_s == pytest.approx(a_on.step_time_s, rel=0.02)
    assert a_on.comm_time_by_axis["tp"] == pytest.approx(a_off.comm_time_by_axis["tp"], rel=1e-9)
    assert not [e for e in estimate(model, TRAIN, on, h100).events if ".mlp." in e.label and e.axes == ("tp",)]


@pytest.mark.parametrize(("shared", "text"), [(True, "dp=8,ep=4,tp=none,mb=2"), (True, "dp=4,ep=4,tp=1d:2,sp,mb=1"),
                                             (True, "dp=8,ep=8,tp=none,mb=1,zero=1"),
                                             (True, "dp=4,ep=2,tp=1d:2,sp,mb=1,rc=full"),
                                             (False, "dp=4,ep=4,tp=1d:2,sp,mb=1"),
                                             (True, "dp=4,cp=2,ep=4,tp=none,mb=1"),  # aux counts over cp
                                             (True, "dp=2,cp=2,ep=4,tp=1d:2,sp,mb=1,rc=full"),  # over (cp, tp)
                                             (True, "dp=4,ep=2,etp=2,tp=1d:2,sp,mb=1,rc=full"),  # etp exchanges
                                             (True, "dp=8,etp=2,tp=none,mb=1"),  # ep = 1: the etp ones alone
                                             (False, "dp=4,ep=4,tp=1d:2,sp,tpo,mb=1"),  # tpo: no MLP rings either
                                             (True, "dp=4,ep=4,tp=1d:2,sp,tpo,mb=1")])
def test_the_engines_price_every_moe_collective_the_executor_issues(h100: object, shared: bool, text: str) -> None:
    """The MoE collectives both engines price (the events of cost_models/moe.py's block and stage costs, which the
    event engine inserts as they are: moe_program.py) are cost_models/moe_traffic's, the list tests/test_moe_run.py
    holds equal to what the executor records: copy counts, aux-loss counts over tp (with cp: cp x tp), dispatch
    (and the routing weights' beside it) and combine, forward, recomputation and backward, and the experts' norm
    (a multiset: zero difference; the expert buckets differ by design, moe.grad_event prices one fused reduction).
    Without a shared expert (Mixtral's shape) a MoE block has no MLP collectives (moe_unshared.py), in the estimate
    as in the executor's list."""
    from collections import Counter
    from dataclasses import replace

    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.moe_traffic import moe_stage_events

    model, layout = PRESETS["tiny-moe"], parse_layout(text)
    if not shared:
        model = replace(model, name="tiny-mixtral", moe=replace(model.moe, shared_ffn=0))
    train = TrainingSpec(global_batch=2 * layout.dp * layout.micro_batch, dtype="bf16",
                         recompute=layout.recompute or "none")
    # priced as paracube's executor dispatches: the routing weights' own all_to_all beside the tokens' (its runtime's)
    est = estimate(model, train, layout, load_topology("dgx-h100", gpus=8), moe_probs=EXECUTOR_PROBS)
    want = moe_stage_events(layout, dims_of(model, train), model.moe, layout.micro_batch)

    def moe_part(events: object) -> Counter:
        return Counter((*e.key(), e.phase, e.label) for e in events  # type: ignore[attr-defined]
                       if ".moe." in e.label or e.label == "grad_norm.experts")

    assert moe_part(want) and moe_part(est.events) == moe_part(want)
    ev = estimate_event(model, train, layout, load_topology("dgx-h100", gpus=8), moe_probs=EXECUTOR_PROBS)
    assert moe_part(ev.events) == moe_part(want)  # the event engine's, inserted as they are
    mlp = Counter((*e.key(), e.phase, e.label) for e in est.events if ".mlp." in e.label)
    assert mlp == Counter((*e.key(), e.phase, e.label) for e in want if ".mlp." in e.label)
    assert bool(mlp) == (shared and layout.tensor_size > 1)


@pytest.mark.parametrize("text", ["dp=8,ep=4,tp=none,mb=1,zero=3", "dp=8,ep=2,tp=none,mb=1,zero=2,overlap",
                                  "dp=4,pp=2,ep=2,tp=none,mb=1,zero=3", "dp=4,pp=2,ep=2,tp=none,mb=1,zero=2",
                                  "dp=4,ep=2,tp=1d:2,sp,mb=1,zero=3,overlap"])
def test_both_engines_price_the_expert_units_the_executor_runs(text: str) -> None:
    """zero=2/3: each MoE block's experts are an FSDP unit of their own over edp (moe_fsdp.py); the collectives
    both engines put in the step (kind, group, bytes, dtype: per micro-batch and per step, two micro-batches) are
    cost_models/moe_fsdp_traffic's, the list tests/test_moe_run.py holds equal to what the executor records (a
    multiset, zero difference), and they replace the one expert-gradient all_reduce zero <= 1 prices."""
    from collections import Counter

    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.moe_traffic import moe_stage_events

    model, layout = PRESETS["tiny-moe"], parse_layout(text)
    train = TrainingSpec(global_batch=2 * layout.dp * layout.micro_batch, dtype="bf16")
    topo = load_topology("dgx-h100", gpus=8)

    def units(events: object) -> Counter:
        return Counter((e.kind, e.group_size, e.payload_bytes, e.dtype) for e in events  # type: ignore[attr-defined]
                       if e.axes == ("edp",))

    for stage in ("first", "last") if layout.pp > 1 else ("first",):
        want = units(moe_stage_events(layout, dims_of(model, train), model.moe, layout.micro_batch, stage))
        assert want and not any(kind == "all_reduce" for kind, *_ in want)
        if stage == "first":  # the estimate lists its slowest stage's (moe_step.py); tiny-moe's stages are alike
            for est in (estimate(model, train, layout, topo), estimate_event(model, train, layout, topo)):
                assert units(est.events) == want
                assert est.comm_time_by_axis.get("edp", 0.0) > 0  # in line: exposed, booked on their own axis


def test_expert_units_are_priced_in_the_step_in_line_or_prefetched() -> None:
    """zero=3 with ep = 1 gathers every expert of a block over the whole data-parallel group each micro-batch, twice
    (forward, backward), and reduce-scatters its gradient (moe_fsdp.py). In line (no prefetch) the step holds at least
    their bandwidth time; prefetched (every stack here) it hides part of them, never more than all of them: 2.46 s
    before the units were priced, a step with every expert's collectives free."""
    from paracube.cost_models.collective import collective_time
    from paracube.cost_models.moe_fsdp import unit_numel

    model = PRESETS["qwen3-30b-a3b"]
    topo = load_topology("dgx-h100", gpus=64)
    train = TrainingSpec(global_batch=512, dtype="bf16")
    layout = parse_layout("dp=64,tp=none,mb=2,zero=3,overlap")
    line, ahead = (estimate(model, train, layout, topo, with_events=False, fsdp_prefetch=pf) for pf in (False, True))
    p = unit_numel(model.moe, model.hidden, layout)
    # a lower bound of the units' seconds a step: 4 micro-batches x 48 blocks x (2 gathers of 2 p bytes + a
    # reduce-scatter of 4 p) at NVLink 4's 450 GB/s, no latency (no link of the cluster is faster)
    floor = 4 * 48 * float(collective_time("all_gather", 64, 1, 8 * p, 450e9, 0.0))
    units = line.comm_time_by_axis["edp"]  # the units' serialized seconds (their own axis), the same both ways
    assert units > floor and ahead.comm_time_by_axis["edp"] == pytest.approx(units, rel=1e-12)
    assert line.step_time_s > ahead.step_time_s > line.step_time_s - units > 2.0
    assert "in line" in line.notes[-1] and "prefetched" in ahead.notes[-1]


def test_a_prefetched_expert_unit_is_held_beside_the_current_one() -> None:
    """Prefetched at zero=3, the next MoE block's expert unit is gathered while the current block's experts run: one
    more gathered unit (c p bytes) in temporaries than in line, as the dense units count two gathered units
    (memory.with_zero); zero=2 gathers no unit per block (no change). Mixtral 8x7B's whole-expert unit (ep = 1,
    2.6 GiB) outweighs its loss's temporaries, so the difference shows in the peak whole."""
    from paracube.cost_models.moe_fsdp import unit_numel

    model = PRESETS["mixtral-8x7b"]
    topo = load_topology("dgx-h100", gpus=64)
    train = TrainingSpec(global_batch=512, dtype="bf16")
    for text, held in (("dp=64,tp=none,mb=1,zero=3,overlap", 1), ("dp=64,ep=8,tp=none,mb=1,zero=2,overlap", 0)):
        layout = parse_layout(text)
        line, ahead = (estimate(model, train, layout, topo, with_events=False, fsdp_prefetch=pf)
                       for pf in (False, True))
        extra = held * 2 * unit_numel(model.moe, model.hidden, layout)  # bf16
        assert ahead.memory.temporaries - line.memory.temporaries == extra, text
        assert estimate_event(model, train, layout, topo, with_events=False, fsdp_prefetch=True).memory.temporaries \
            == ahead.memory.temporaries


@pytest.mark.parametrize(("k", "pre", "block", "a", "r", "overlap", "want"), [
    (4, 0.0, 0.0, 1.0, 0.5, True, 2 * 4 * 1.0 + 4 * 0.5),  # no work: every collective in turn on the one stream
    (4, 0.0, 0.0, 1.0, 0.5, False, 2 * 4 * 1.0 + 4 * 0.5),  # the same, the reduce-scatters in line
    (4, 2.0, 3.0, 1.0, 0.5, True, 0.0),  # each gather under the work before its wait, each reduce-scatter under the
    (4, 2.0, 3.0, 1.0, 0.5, False, 4 * 0.5),  # next block's; in line, the reduce-scatters only
    (4, 2.0, 3.0, 0.0, 0.5, True, 0.0),  # zero=2: no gathers, the reduce-scatters hidden
    (1, 0.25, 3.0, 1.0, 0.5, True, 2 * 0.75),  # one block: its gather exposed but for the work before it, twice
])
def test_prefetched_expert_units_stall_as_one_stream(k: int, pre: float, block: float, a: float, r: float,
                                                     overlap: bool, want: float) -> None:
    """moe_fsdp.Chain.stalls, fsdp_overlap.py's one-stream recursion over the expert units, against its closed forms:
    with no work between the issue points every gather and reduce-scatter runs in turn (2 k a + k r); with enough
    work all hide (in line, the reduce-scatters stay); with one block the first gather of each pass is exposed by
    what the work before its wait leaves of it."""
    from paracube.cost_models.moe_fsdp import Chain

    chain = Chain(k, pre, block, pre, block, block / 2, block / 2 if k > 1 else block, a, r, overlap)
    assert chain.stalls() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(("name", "gpus", "batch", "text"), [
    ("qwen3-30b-a3b", 16, 32, "dp=16,ep=8,tp=none,mb=1,zero=3,overlap"),  # edp across the two nodes
    ("qwen3-30b-a3b", 16, 32, "dp=16,tp=none,mb=1,zero=3,overlap"),  # ep = 1: every expert gathered over dp
    ("qwen3-30b-a3b", 16, 32, "dp=16,ep=4,tp=none,mb=1,zero=2,overlap"),  # zero=2: the reduce-scatters only
    ("qwen3-30b-a3b", 16, 32, "dp=16,ep=8,tp=none,mb=1,zero=3"),  # the reduce-scatters in line
    ("mixtral-8x7b", 32, 128, "dp=32,ep=8,tp=none,mb=1,zero=3,overlap"),
])
def test_engines_agree_on_prefetched_expert_units(name: str, gpus: int, batch: int, text: str) -> None:
    """Prefetched (pp = 1, fsdp_prefetch: every stack here), the event engine issues and waits for the expert units'
    collectives where moe_fsdp.Chain does (moe_program._prefetched) and shares their links with the dense units'
    max-min; the analytic engine takes each expert collective as moving its block's dense one too. 2%, as the
    engines' MoE agreement above (measured: -0.8 to +0.2% on these)."""
    model, layout = PRESETS[name], parse_layout(text)
    topo, train = load_topology("dgx-h100", gpus=gpus), TrainingSpec(global_batch=batch, dtype="bf16")
    a = estimate(model, train, layout, topo, with_events=False, fsdp_prefetch=True)
    e = estimate_event(model, train, layout, topo, with_events=False, fsdp_prefetch=True)
    assert "prefetched" in a.notes[-1]
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


def test_declared_all_to_all_bytes_are_the_balanced_routing(h100: object) -> None:
    model, layout = PRESETS["tiny-moe"], parse_layout("dp=8,ep=4,etp=2,tp=none,mb=1")
    est = estimate(model, TrainingSpec(global_batch=8, dtype="bf16"), layout, load_topology("dgx-h100", gpus=8))
    a2a = [e for e in est.events if e.kind == "all_to_all" and not e.label.endswith("moe.counts")]
    T, k, h, c = 64, 2, 64, 2  # one sequence of 64 tokens per rank, top-2, hidden 64, bf16
    # 2 MoE blocks x (dispatch + combine) x (forward + backward), one micro-batch
    assert len(a2a) == 8 and {e.payload_bytes for e in a2a} == {T * k * h * c} and {e.axes for e in a2a} == {("ep",)}
    counts = [e for e in est.events if e.label.endswith("moe.counts")]  # per block forward: E int64 counts
    assert len(counts) == 2 and {(e.payload_bytes, e.dtype) for e in counts} == {(8 * 8, "int64")}
    # etp=2: every expert shard's copies gathered over etp (an all_gather's payload its output: the etp group's
    # T k etp copies) and their partial outputs reduce-scattered back in the router's fp32, forward and backward
    # (each one's gradient the other kind); per block forward the etp peers' E int64 received counts gathered
    ins = [e for e in est.events if e.label.endswith("moe.experts.in")]
    assert sorted(e.kind for e in ins) == ["all_gather"] * 2 + ["reduce_scatter"] * 2
    assert {(e.payload_bytes, e.axes) for e in ins} == {(T * k * 2 * h * c, ("etp",))}
    outs = [e for e in est.events if e.label.endswith("moe.experts.out")]
    assert len(outs) == 4 and {(e.payload_bytes, e.dtype) for e in outs} == {(T * k * 2 * h * 4, "float32")}
    gathered = [e for e in est.events if e.label.endswith("moe.etp_counts")]
    assert len(gathered) == 2 and {(e.kind, e.payload_bytes) for e in gathered} == {("all_gather", 8 * 8 * 2)}
    # the split sizes of a balanced routing: T k / ep token copies to each of the ep peers
    assert np.array_equal(splits(balanced_routing(T, k, 8, 4), 4), np.full((4, 4), T * k / 4))
    skew = np.zeros((4, 8))
    skew[:, 0] = T * k  # every token's copies to expert 0 (held by ep rank 0)
    assert splits(skew, 4)[:, 0].tolist() == [T * k] * 4 and splits(skew, 4)[:, 1:].sum() == 0


def test_expert_memory_falls_with_ep_and_zero(h100: object) -> None:
    model = PRESETS["qwen3-30b-a3b"]
    mem = {t: estimate(model, TRAIN, parse_layout(t), h100, with_events=False).memory.parameters
           for t in ("dp=16,ep=4,tp=none,mb=1", "dp=16,ep=8,tp=none,mb=1")}
    # ep=4 holds 32 of the 128 experts per block, ep=8 16: 16 more of 48 blocks x 3 x 2048 x 768, bf16
    assert mem["dp=16,ep=4,tp=none,mb=1"] - mem["dp=16,ep=8,tp=none,mb=1"] == 48 * 16 * 3 * 2048 * 768 * 2
    plain, sharded = (estimate(model, TRAIN, parse_layout(t), h100, with_events=False).memory.optimizer
                      for t in ("dp=16,ep=8,tp=none,mb=1", "dp=16,ep=8,tp=none,mb=1,zero=1"))
    assert sharded < plain / 1.5


# Layouts whose dense zero group (dp) and expert-data-parallel group (edp = dp tp / ep) differ: qwen3-30b-a3b's
# wide heads (2h queries) and tiny-mla's latent attention add dense attention parameters in moe.stage_cost.
@pytest.mark.parametrize(("name", "text"), [
    ("qwen3-30b-a3b", "dp=16,ep=16,tp=none,mb=1,zero=1"),
    ("qwen3-30b-a3b", "dp=16,ep=8,tp=none,mb=1,zero=1"),
    ("tiny-mla", "dp=8,ep=4,tp=1d:2,mb=1,zero=1"),
])
def test_zero_shards_experts_over_edp_and_every_dense_parameter_over_dp(h100: object, name: str, text: str) -> None:
    """Reference: Megatron-core's distributed optimizer (zero=1), 12 bytes (fp32 master, two moments) per parameter
    sharded over its data-parallel group: the experts' over edp, every other parameter's (the attention correction's
    included) over dp: 12 (n_e / edp + (P - n_e) / dp), P the rank's parameters (its parameter bytes / 2, bf16),
    n_e its expert parameters (moe.expert_params_per_rank). Candidate: the estimate's optimizer bytes. Tolerance: the
    dense buckets pad to a multiple of dp (memory.with_zero: 12 ceil(n / dp), under 12 bytes more) plus float
    rounding. The event engine reports the same memory (one count for both engines)."""
    from paracube.cost_models.moe import expert_params_per_rank

    model, layout = PRESETS[name], parse_layout(text)
    mem = estimate(model, TRAIN, layout, h100, with_events=False).memory
    assert estimate_event(model, TRAIN, layout, h100, with_events=False).memory == mem
    n_e = expert_params_per_rank(model, layout, 0)
    assert 0 < layout.expert_data <= layout.dp
    want = 12 * (n_e / layout.expert_data + (mem.parameters / 2 - n_e) / layout.dp)
    assert mem.optimizer == pytest.approx(want, abs=12 + 1e-9 * want)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("qwen3-30b-a3b", "dp=16,ep=16,etp=1,tp=none", None),
    ("mixtral-8x7b", "dp=16,ep=16,tp=none", r"ep=16 must divide the 8 experts of mixtral-8x7b; valid: 1, 2, 4, 8"),
    ("llama2-7b", "dp=16,ep=2,tp=none", r"ep=2,etp=1 split experts: model llama2-7b has none \(use ep=1,etp=1\)"),
])
def test_bad_ep_for_the_model_is_refused(h100: object, name: str, text: str, message: str | None) -> None:
    if message is None:
        estimate(PRESETS[name], TRAIN, parse_layout(text), h100, with_events=False)
        return
    with pytest.raises(ParacubeError, match=message):
        estimate(PRESETS[name], TRAIN, parse_layout(text), h100, with_events=False)


def test_memory_is_one_stages_dense_and_expert_parts(h100: object) -> None:
    """Reference: each pipeline stage's own dense memory (memory.stage_memory with zero=1's sharding, as the dense
    engine counts the first and the last stage) plus that stage's expert parts (moe.stage_cost, its own in-flight
    micro-batches), the dispatch buffers beyond the loss's logits on the last stage; candidate: the estimate's
    memory. Same closed forms summed in another order: equal to float rounding (1e-9)."""
    from paracube.cost_models.analytic import prepare
    from paracube.cost_models.device_model import gemm_model
    from paracube.cost_models.links import LinkCache
    from paracube.cost_models.memory import logit_bytes, stage_memory, total, with_zero, zero_shards
    from paracube.cost_models.moe import stage_cost
    from paracube.cost_models.moe_links import expert_links
    from paracube.cost_models.moe_step import in_flight
    from paracube.cost_models.validity import layout_arrays

    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout("dp=8,pp=2,ep=8,tp=none,mb=2,v=24,zero=1")
    train = TrainingSpec(global_batch=512, dtype="bf16", recompute="selective", activations="megatron")
    d, mb, _ = prepare(model, train, layout)
    g = gemm_model(h100, "bf16")
    links = expert_links(layout, LinkCache(h100))
    b = layout_arrays(layout, mb)
    n = train.global_batch // (layout.dp * mb)
    stages = []
    for stage, first, last in ((0, True, False), (1, False, True)):
        dense = with_zero(stage_memory(d, "none", b, first, last), zero_shards("none", b), 1)
        moe = stage_cost(model, d, layout, mb, g, stage, links, in_flight(layout, n, stage))
        loss = (d.c + logit_bytes(d)) * mb * d.s * d.V if last else 0.0
        stages.append(float(total(dense)[0]) + sum(moe.memory.values()) + max(0.0, moe.buffers - loss))
    got = estimate(model, train, layout, h100, with_events=False).memory.total
    assert got == pytest.approx(max(stages), rel=1e-9)


@pytest.mark.parametrize("recompute", ["selective", "full", "none"])
def test_recomputation_reruns_the_true_attention_core(h100: object, recompute: str) -> None:
    """Megatron-core's core_attn checkpoint re-runs the whole core at its true head widths
    (attention_correction.delta_again): Qwen3-235B's heads (128 wide) are twice the dense part's (4096 / 64), so
    selective recomputation re-runs one more dense core forward (compute.attention_core_time) than the dense part
    does; full recomputation the whole correction; none nothing."""
    from paracube.cost_models.analytic import prepare
    from paracube.cost_models.attention_correction import attention_delta, delta_again
    from paracube.cost_models.compute import attention_core_time
    from paracube.cost_models.device_model import gemm_model

    model, layout = PRESETS["qwen3-235b-a22b"], parse_layout("dp=4,pp=2,ep=4,tp=1d:2,sp,mb=1,zero=1")
    train = TrainingSpec(global_batch=32, dtype="bf16", recompute=recompute)
    d, mb, _ = prepare(model, train, layout)
    g = gemm_model(h100, "bf16")  # type: ignore[arg-type]
    af, _, _ = attention_delta(model, d, layout, mb, g)
    core_f = float(np.ravel(attention_core_time(d, mb, layout.tensor_size, g)[0])[0])
    want = {"selective": core_f, "full": af, "none": 0.0}[recompute]
    assert delta_again(model, d, layout, mb, g, af) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep", "hybridep"])
def test_the_routing_weights_all_to_all_is_priced_beside_a_plain_dispatch_only(dispatcher: str) -> None:
    """Megatron-core's alltoall dispatcher sends the routing weights by an all_to_all of their own beside the tokens'
    (Runtime.moe_probs "always"; moe_dispatch.sends_probs): both engines list it once per MoE block forward and
    backward, T k fp32 weights over ep, and the analytic engine prices each as one more all_to_all call, its latency
    (n - 1) a and its bytes (moe_a2a.py: (n - 1) a + (n - 1) / n P / B_a2a), no other event moving (the sums of
    floats in another order: rel 1e-9). DeepEP and HybridEP carry the weights inside their own
    dispatch kernel: both engines' estimates are the same to the last bit."""
    from collections import Counter

    from paracube.cost_models.collective import collective_time
    from paracube.cost_models.links import LinkCache
    from paracube.cost_models.moe import tokens_per_rank
    from paracube.cost_models.moe_a2a import a2a_link
    from paracube.cost_models.moe_links import expert_placement

    topo = load_topology("dgx-h100", gpus=32)
    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout("dp=32,ep=16,tp=none,mb=1,zero=1")  # ep over 2 nodes
    train = TrainingSpec(global_batch=64, dtype="bf16")
    an = {p: estimate(model, train, layout, topo, moe_dispatch=dispatcher, moe_probs=p) for p in ("none", "always")}
    ev = {p: estimate_event(model, train, layout, topo, moe_dispatch=dispatcher, moe_probs=p)
          for p in ("none", "always")}
    probs = [e for e in an["always"].events if e.label.endswith("moe.dispatch_probs")]
    if dispatcher != "alltoall":
        assert not probs and an["always"] == an["none"] and ev["always"] == ev["none"]
        return
    T, k, n_micro, blocks = tokens_per_rank(layout, 1, model.seq_len), model.moe.top_k, 2, model.layers
    assert {(e.kind, e.axes, e.group_size, e.payload_bytes, e.dtype) for e in probs} == {
        ("all_to_all", ("ep",), 16, 4 * T * k, "float32")}
    assert Counter(e.phase for e in probs) == {"fwd": n_micro * blocks, "bwd": n_micro * blocks}

    def keyed(events: object) -> Counter:
        return Counter((*e.key(), e.phase, e.label) for e in events)  # type: ignore[attr-defined]

    assert keyed(an["always"].events) - keyed(an["none"].events) == keyed(probs)
    assert not keyed(an["none"].events) - keyed(an["always"].events)
    assert keyed(ev["always"].events) == keyed(an["always"].events)
    bw, lat = a2a_link(LinkCache(topo), expert_placement(layout), ("ep",))
    call = float(collective_time("all_to_all", 16, 1, 4 * T * k, bw, lat))
    assert lat > 0 and call == pytest.approx(15 * lat + 15 / 16 * 4 * T * k / bw, rel=1e-12)
    added = an["always"].comm_time_by_kind["all_to_all"] - an["none"].comm_time_by_kind["all_to_all"]
    assert added == pytest.approx(len(probs) * call, rel=1e-9)
    # the step: at least those calls (more here: the expert group spans nodes, so its all_to_alls also hold the NICs
    # the overlapped expert gradients need, moe_step.py's `busy`)
    assert an["always"].step_time_s - an["none"].step_time_s >= added * (1 - 1e-9)
    assert ev["always"].step_time_s > ev["none"].step_time_s


@pytest.mark.parametrize(("layers", "text", "seq"), [
    (8, "dp=4,pp=2,ep=8,tp=1d:8,mb=1,sp,zero=1,overlap", 32768),
    (16, "dp=2,pp=4,ep=8,tp=1d:8,mb=1,sp,zero=1,overlap", 16384),
])
def test_engines_agree_when_expert_gradients_outlast_the_last_backward(layers: int, text: str, seq: int) -> None:
    """Few long micro-batches on a pipeline (DeepSeek-V3's blocks, 4 micro-batches): each stage's expert gradients
    run after its own last backward, the slow last stage's while the stages before it drain theirs (moe_step.py).
    Before, the analytic engine added them after the whole drain: 10% and 3% above the event engine's replay; 2% as
    above."""
    from dataclasses import replace

    from paracube.runtimes import get_runtime

    model, layout = replace(PRESETS["deepseek-v3"], layers=layers), parse_layout(text)
    training = TrainingSpec(global_batch=16, seq_len=seq, dtype="bf16")
    topo = load_topology("dgx-h100", gpus=64)
    for options in (None, get_runtime("megatron").engine_options()):
        kw = {} if options is None else {"options": options}
        a = estimate(model, training, layout, topo, with_events=False, **kw)
        e = estimate_event(model, training, layout, topo, with_events=False, **kw)
        assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_engines_agree_when_the_forward_waits_on_its_host(dtype: str) -> None:
    """gpt-oss-20b under Megatron-core (dropless: each MoE block's forward waits on its host, host_sync.py) with 2
    micro-batches on 32 B200s, pp=2: the first stage's expert gradients outlast its last backward, which holds none of
    the forward's host waits (moe_step.py's B). Before, the analytic engine took the backward's share of the whole
    micro-batch, the waits included: the event engine 4.4% (bf16) and 5.0% (fp8) above; now within 1% (measured 0.3%,
    0.4%); both engines are deterministic arithmetic, so the bound is not a timing tolerance."""
    from paracube.runtimes import get_runtime

    model, layout = PRESETS["gpt-oss-20b"], parse_layout("dp=16,pp=2,ep=8,tp=none,mb=2,zero=1,overlap")
    training = TrainingSpec(global_batch=64, dtype=dtype)
    topo, options = load_topology("dgx-b200", gpus=32), get_runtime("megatron").engine_options()
    a = estimate(model, training, layout, topo, with_events=False, options=options)
    e = estimate_event(model, training, layout, topo, with_events=False, options=options)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.01, (a.step_time_s, e.step_time_s)


def test_interleaved_expert_gradients_wait_for_their_own_chunk(h100: object) -> None:
    """With v > 1 and overlap, each model chunk's expert gradients are reduced from the start of that chunk's last
    backward (moe_program._per_chunk, as Megatron-core starts a chunk's grad sync at its last micro-batch), not all of
    them from the last chunk's: on stage 0 the cool-down runs chunk 1's last backward, then chunk 0's last two; chunk
    0's experts' gradients are not ready before its own. Before, one reduction of every chunk's left at chunk 1's last
    backward: hidden early (the engines then 6.9% apart here; test_interleaved_expert_gradients_priced_alike)."""
    from paracube.cost_models.event import simulate

    per_chunk = PRESETS["qwen3-30b-a3b"].layers // 4  # pp 2 x v 2 virtual stages, the blocks of a chunk
    res = simulate(PRESETS["qwen3-30b-a3b"], TrainingSpec(global_batch=64, dtype="bf16"),
                   parse_layout("dp=8,pp=2,tp=none,mb=2,v=2,zero=1,overlap"), h100)
    spans = res.timeline.spans
    grads = sorted((s for s in spans if s.device == 0 and s.name == "expert_gradients"), key=lambda s: s.start)
    bwd = sorted((s for s in spans if s.device == 0 and s.category == "bwd" and s.name.startswith("layers.")),
                 key=lambda s: s.start)
    block = [int(s.name.split(".")[1]) for s in bwd]
    # a backward walks its chunk's blocks downwards: a new one starts where the block rises or the chunk changes
    firsts = [bwd[0]] + [bwd[k] for k in range(1, len(bwd))
                         if block[k] > block[k - 1] or block[k] // per_chunk != block[k - 1] // per_chunk]
    last_of = {c: max(s.start for s in firsts if int(s.name.split(".")[1]) // per_chunk == c) for c in (0, 1)}
    assert last_of[1] < last_of[0] and len(grads) == 2  # one reduction per chunk, chunk 1's first
    assert grads[0].start <= last_of[1] < grads[1].start <= last_of[0]


@pytest.mark.parametrize(("cluster", "gpus", "batch", "dtype", "text"), [
    ("dgx-h100", 16, 64, "bf16", "dp=8,pp=2,tp=none,mb=2,v=2,zero=1,overlap"),  # 4 micro-batches: was -6.9%
    ("gb200-nvl72", 32, 512, "fp8", "dp=16,pp=2,tp=none,mb=2,v=2,zero=1,overlap"),  # was -2.0%
    ("gb200-nvl72", 32, 512, "fp8", "dp=16,pp=2,tp=none,mb=2,v=8,zero=1,overlap"),  # was -3.1%
])
def test_interleaved_expert_gradients_priced_alike(cluster: str, gpus: int, batch: int, dtype: str, text: str) -> None:
    """Expert gradients over dp (ep = 1) reduced per model chunk under interleaving, overlapped: the analytic model's
    windows (moe_step.interleaved_windows: the cool-down's pp (v - 1) + 1 chunk backwards from the first chunk's, the
    last chunk's own) against the event engine's per-chunk schedule (moe_program._per_chunk), within the 2% above.
    Found by benchmarks/engines_agree.py --sample; before, the analytic model gave every chunk's gradients one
    micro-batch's backward and the event engine all of them the cool-down from the last chunk's."""
    model, layout = PRESETS["qwen3-30b-a3b"], parse_layout(text)
    train, topo = TrainingSpec(global_batch=batch, dtype=dtype), load_topology(cluster, gpus=gpus)
    a = estimate(model, train, layout, topo, with_events=False)
    e = estimate_event(model, train, layout, topo, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


def test_all_to_all_beside_a_reduce_scatter_conserves_the_shared_link() -> None:
    """moe_contention.beside on one shared bottleneck (per byte a on the all_to_all, r on the ring, both on the same
    link class): s_a = (a + r) / a, s_r = (a + r) / r, and the link's work is conserved: the all_to_all takes
    min(D (s_a - 1), W) more, the queue ends so that both finish by D + W (the later of the two)."""
    from paracube.cost_models.moe_contention import beside, rates

    s_a, s_r = rates(0.0, 1.0, 1.0 / 3.0, True)  # NVLink only: a = 1, r = 3
    assert (s_a, s_r) == pytest.approx((4.0, 4.0 / 3.0))
    for d, w in ((1.0, 10.0), (1.0, 0.5), (2.0, 6.0)):
        extra, later = beside(d, w, s_a, s_r)
        assert extra == pytest.approx(min(d * (s_a - 1.0), w))
        assert max(d + extra, w + later) == pytest.approx(d + w)
    assert rates(0.0, 1.0, 1.0 / 3.0, False) == (1.0, 1.0)  # the ring over the NICs, the all_to_all on NVLink only
    assert rates(2.0, 1.0, 0.5, False) == pytest.approx((2.0, 2.0))  # both on the NICs: (2 + 2) / 2, (2 + 2) / 2
    assert beside(1.0, 0.0, s_a, s_r) == (0.0, 0.0)  # nothing queued


def test_engines_agree_on_expert_units_reduce_scattered_beside_the_all_to_alls() -> None:
    """torchtitan's FSDP with ep on one DGX A100 (zero=3, overlap, prefetch): each block's expert unit and dense unit
    reduce-scatter asynchronously on the NVLink ports its backward all_to_alls use; the event engine shares them
    max-min (dispatch and combine 1.6-2x their forward time), the analytic model by moe_contention.beside in
    moe_fsdp.Chain. Before, the analytic step was 3.0% faster; 2% as the rows above."""
    from paracube.runtimes import RUNTIMES

    model, layout = PRESETS["gpt-oss-20b"], parse_layout("dp=8,ep=4,tp=none,mb=2,zero=3,overlap")
    topo, options = load_topology("dgx-a100", gpus=8), RUNTIMES["torchtitan"].engine_options()
    train = TrainingSpec(global_batch=32, dtype="bf16")
    a = estimate(model, train, layout, topo, with_events=False, options=options)
    e = estimate_event(model, train, layout, topo, with_events=False, options=options)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02
