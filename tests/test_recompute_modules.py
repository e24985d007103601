"""Selective recomputation by module (Layout `rcm=`; paracube/recompute_modules.py, priced by
cost_models/recompute_modules_cost.py): the runtimes' declarations and refusals, both engines pricing every module
alike, the memory each module no longer keeps against its closed form from the model's shapes, the MoE layer's
all_to_alls re-run under `moe`, rc=selective without rcm= priced exactly as rcm=core_attn, the planner's ladder and
pins, and each bad input in one line (exit 2 from the CLI).

Tolerances: the engines' compute is one formula read twice (rel 1e-6: float rounding of sums taken in another order);
their steps within 2% (the event engine overlaps what the analytic one takes as fractions, tests/test_event_engine.py);
the memory closed forms are the same sums of a few products (rel 1e-9).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np
import pytest

from paracube.cli.main import main
from paracube.cost_models.analytic import estimate, layout_links, prepare
from paracube.cost_models.analytic_scores import evaluate
from paracube.cost_models.comm import comm_entries
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.dims import dims_of, with_pins
from paracube.cost_models.event import estimate_with
from paracube.cost_models.links import LinkCache
from paracube.cost_models.recompute_again import AFTER_LAST_SAVED, MLP_LABELS, NORM_LABELS
from paracube.cost_models.traffic import stage_events
from paracube.cost_models.validity import layout_arrays
from paracube.engine_options import EngineOptions
from paracube.errors import ParacubeError
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes import MODES, LayoutBatch
from paracube.modes.batch import FIELDS
from paracube.planner.explain import explain
from paracube.planner.search import search
from paracube.recompute_modules import MODULES, applies
from paracube.runtimes import RUNTIMES
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec

DENSE = PRESETS["small"]  # gpt, h 256, f 1024
LLAMA = PRESETS["llama2-7b"]
MLA = PRESETS["tiny-mla"]  # MLA, a dense first block, MoE blocks with a shared expert
TRAIN = TrainingSpec(global_batch=16, dtype="bf16", recompute="selective")
# (model, layout on 8 GPUs): none, 1D with sp, pipelines with experts
CASES = [(DENSE, "dp=2,tp=1d:4,sp,mb=2"), (DENSE, "dp=4,pp=2,tp=none,mb=1"), (LLAMA, "dp=2,tp=1d:4,sp,mb=1"),
         (MLA, "dp=4,ep=4,tp=1d:2,sp,mb=1"), (MLA, "dp=4,pp=2,ep=4,tp=none,mb=1")]


def _topo(gpus: int = 8) -> object:
    return load_topology("dgx-h100", gpus=gpus)


def test_runtimes_declare_their_modules() -> None:
    """Megatron-core and paracube's executor recompute every module, torchtitan and DeepSpeed none; to_dict lists
    them; a runtime without one refuses rcm= in one line naming what is valid."""
    assert {n: r.recompute_modules for n, r in RUNTIMES.items()} == {
        "paracube": tuple(MODULES), "megatron": tuple(MODULES), "torchtitan": (), "deepspeed": ()}
    assert RUNTIMES["megatron"].to_dict()["recompute_modules"] == list(MODULES)
    for name in ("torchtitan", "deepspeed"):
        why = RUNTIMES[name].refusal(parse_layout("dp=8,rcm=layernorm"))
        assert why and "\n" not in why and "rcm=layernorm" in why and "drop rcm=" in why
    assert RUNTIMES["megatron"].refusal(parse_layout("dp=8,rcm=layernorm+mlp")) is None
    why = RUNTIMES["megatron"].refusal(parse_layout("dp=8,rcm=moe_act"), model=DENSE)  # the model has no experts
    # (nor a norm of its own: Megatron-core's fused norms, test_fused_layernorm_refused_on_dense_models)
    assert why and "\n" not in why and "rcm=moe_act" in why and "valid for it: core_attn, mlp" in why


@pytest.mark.parametrize(("model", "text"), CASES)
def test_selective_without_rcm_is_core_attn(model: object, text: str) -> None:
    """rc=selective without rcm= is Megatron's default module list, ["core_attn"]: every figure equal."""
    for engine in ("analytic", "event"):
        rule, pinned = (estimate_with(engine, model, TRAIN, parse_layout(text + extra), _topo())
                        for extra in ("", ",rcm=core_attn"))
        assert rule.step_time_s == pinned.step_time_s and rule.compute_time_s == pinned.compute_time_s, engine
        assert rule.memory == pinned.memory and rule.comm_time_by_axis == pinned.comm_time_by_axis, engine


@pytest.mark.parametrize(("model", "text"), CASES)
def test_engines_price_each_module_alike(model: object, text: str) -> None:
    """Per module the model has: both engines' compute equal, memory equal, steps within 2%; the module re-runs
    forward work (compute above rcm=core_attn's) and frees memory (activations below it; with pipelines, not above)."""
    base = estimate(model, TRAIN, parse_layout(text + ",rcm=core_attn"), _topo())
    for name in MODULES:
        if name == "core_attn" or not applies(name, model):
            continue
        lay = parse_layout(f"{text},rcm=core_attn+{name}")
        an, ev = (estimate_with(e, model, TRAIN, lay, _topo()) for e in ("analytic", "event"))
        assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6), name
        assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.02), name
        assert ev.memory == an.memory, name
        if lay.pp == 1:  # (with pipelines the slowest / heaviest stage may hold no block the module is in)
            assert an.compute_time_s > base.compute_time_s and an.memory.activations < base.memory.activations, name
        assert an.compute_time_s >= base.compute_time_s and an.memory.activations <= base.memory.activations, name


def _saved(model: object, text: str, name: str) -> float:
    """Activation bytes rcm=core_attn+NAME keeps less than rcm=core_attn (the estimate's, one stage)."""
    a, b = (estimate(model, TRAIN, parse_layout(f"{text},rcm={mods}"), _topo()).memory.activations
            for mods in ("core_attn", f"core_attn+{name}"))
    return a - b


def test_dense_memory_saved_closed_forms() -> None:
    """One stage of L blocks, one micro-batch in flight (pp = 1), T = mb s tokens, t tensor ranks, k = t with sp,
    c = 2: layernorm frees the two norms' outputs, 2 c T h / k a block; mlp the GELU's input and fc2's input,
    2 c T f / t (gpt) or c T 3 f / t (llama's gated fc output and fc2's input), not its input (the pre-MLP norm's
    output, outside the region in paracube's executor); both together their sum."""
    c = 2.0
    for model, text, mb, t, k in ((DENSE, "dp=2,tp=1d:4,sp,mb=2", 2, 4, 4), (DENSE, "dp=8,tp=none,mb=2", 2, 1, 1),
                                  (LLAMA, "dp=2,tp=1d:4,mb=1", 1, 4, 1)):
        T, h, f, L = float(mb * model.seq_len), model.hidden, model.ffn_hidden, model.layers
        inner = (3.0 if model.family == "llama" else 2.0) * c * T * f / t
        assert _saved(model, text, "layernorm") == pytest.approx(L * 2 * c * T * h / k, rel=1e-9), text
        assert _saved(model, text, "mlp") == pytest.approx(L * inner, rel=1e-9), text
        assert _saved(model, text, "layernorm+mlp") == pytest.approx(L * (2 * c * T * h / k + inner), rel=1e-9)


def test_moe_and_mla_memory_saved_closed_forms() -> None:
    """tiny-mla on 1D with sp (t = k = 2, ep = 4, one micro-batch in flight): T = mb s tokens at the tensor group,
    T_r = T / t at a rank's experts, R = T_r top_k etp imbalance the copies its experts receive. mla_up_proj frees
    q, k, v (in paracube's count with the core recomputed: the up projections' outputs, c T H (d_qk + d_n + d_v) / t)
    a block; mlp the dense block's c T 3 f / t; moe_act the experts' activation output c R f_e;
    shared_experts the shared expert's gated output and fc2 input c T 3 f_s / t; moe the
    whole MoE layer, c (R h + 3 R f_e) + 4 T_r E, and its shared expert's."""
    text, c, t, mb = "dp=4,ep=4,tp=1d:2,sp,mb=1", 2.0, 2, 1
    m, moe, mla = MLA, MLA.moe, MLA.mla
    T, h, H = float(mb * m.seq_len), m.hidden, m.heads
    n_moe = moe.moe_layers(m.layers)
    R = T / t * moe.top_k * moe.imbalance
    # with the core recomputed, paracube's count keeps the up projections' outputs (activations.attention_widths)
    up = H * (2 * mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)
    shared = c * T * 3 * moe.shared_ffn / t
    acts = c * (R * h + 3 * R * moe.expert_ffn) + 4 * T / t * moe.experts
    assert _saved(m, text, "mla_up_proj") == pytest.approx(m.layers * c * T * up / t, rel=1e-9)
    assert _saved(m, text, "mlp") == pytest.approx((m.layers - n_moe) * c * T * 3 * m.ffn_hidden / t, rel=1e-9)
    assert _saved(m, text, "moe_act") == pytest.approx(n_moe * c * R * moe.expert_ffn, rel=1e-9)
    assert _saved(m, text, "shared_experts") == pytest.approx(n_moe * shared, rel=1e-9)
    assert _saved(m, text, "moe") == pytest.approx(n_moe * (acts + shared), rel=1e-9)


def test_moe_reruns_its_all_to_alls() -> None:
    """rcm=moe re-runs the MoE layer's forward in backward, its dispatch and combine included: the expert-parallel
    traffic and time are full recomputation's (which re-runs the same forward), the recompute phase holds the
    all_to_alls, and moe_act alone runs none again."""
    text = "dp=4,ep=4,tp=1d:2,sp,mb=1"
    est = {rc: estimate(MLA, TRAIN, parse_layout(f"{text},{rc}"), _topo(), with_events=True)
           for rc in ("rcm=core_attn", "rcm=core_attn+moe", "rcm=core_attn+moe_act", "rc=full")}
    ep = {k: e.comm_time_by_axis["ep"] for k, e in est.items()}
    assert ep["rcm=core_attn+moe"] == pytest.approx(ep["rc=full"], rel=1e-12) and ep["rc=full"] > ep["rcm=core_attn"]
    assert ep["rcm=core_attn+moe_act"] == ep["rcm=core_attn"]
    again = [e for e in est["rcm=core_attn+moe"].events if e.phase == "recompute" and e.kind == "all_to_all"]
    assert again and not [e for e in est["rcm=core_attn+moe_act"].events if e.phase == "recompute"]


@pytest.mark.parametrize(("mode", "shape", "sp", "kw", "tpo"), [
    ("1d", (2,), True, None, False), ("1d", (2,), False, None, False), ("1d", (2,), True, None, True),
    ("2d", (2, 2), False, 1, False), ("2d", (2, 2), False, 0, False), ("2d", (2, 2), False, 0, True),
    ("3d", (2, 2, 2), False, 0, False), ("3d", (2, 2, 2), False, 0, True)])
def test_mlp_and_layernorm_reissue_their_tensor_collectives(mode: str, shape: tuple[int, ...], sp: bool,
                                                            kw: int | None, tpo: bool) -> None:
    """rcm=mlp re-runs the MLP's forward in backward up to its region's last saved tensor, its tensor-parallel
    collectives with it (not the last linear's output reduce / bias gather after its GEMM: AFTER_LAST_SAVED; 1D
    without sp then none; with tpo a ring among them, 1D + sp's output reduce-scatter, runs inside its GEMM's
    Function: again); rcm=layernorm re-runs the norms alone, their collectives with them (2D / 3D: statistics,
    gamma / beta). The explicit list holds exactly those of each block's forward once more in phase "recompute" (kept
    weights, kw=1, not gathered again), and the closed form (comm.py) sums the same calls and bytes per (kind, axes,
    dtype; with tpo per overlapped GEMM); pp = 3 interleaved, each stage. tests/test_recompute_modules_run.py: the
    list equals the executor's."""
    model = PRESETS["small"]
    training = TrainingSpec(global_batch=2 * 8 * 6, dtype="bf16", recompute="selective")
    tpo_rings = {c.label for c in MODES[mode].layer_fwd(dims_of(model, training)) if c.tpo} if tpo else set()
    for stage in ("first", "middle", "last"):
        layout = Layout(dp=2, pp=3, mode=mode, shape=shape, micro_batch=8, interleave=1, sequence_parallel=sp,
                        keep_weights=kw, recompute_modules=("core_attn", "layernorm", "mlp"), tpo=tpo)
        d = with_pins(dims_of(model, training), layout)
        events = stage_events(layout, d, 8, stage)

        def key(e: object) -> tuple:
            return (e.kind, e.axes, e.payload_bytes, e.dtype, e.label)  # type: ignore[attr-defined]

        again = Counter(key(e) for e in events if e.phase == "recompute")
        local = [(e, e.label.split(".", 2)[-1]) for e in events if e.phase == "fwd" and e.label.startswith("layers.")]
        after = [a for a in AFTER_LAST_SAVED if a not in tpo_rings]
        redo = Counter(key(e) for e, name in local if (name.startswith(MLP_LABELS) and name not in after)
                       or name.startswith(NORM_LABELS))
        if tpo and mode == "1d":  # the output's ring reduce-scatter again (the run test records it)
            assert any(k[4].endswith("mlp.out") for k in again), stage
        if kw == 1 and MODES[mode].keeps_weights:  # the kept weights' gathers: the first forward's only
            assert again and not again - redo and sum(again.values()) < sum(redo.values()), (mode, stage)
        else:
            assert again == redo and (bool(again) or (mode == "1d" and not sp)), (mode, stage)
        assert not [e for e, name in local if name in after and key(e) in again], (mode, stage)
        want: dict = defaultdict(lambda: [0, 0])
        for e in events:
            want[(e.kind, e.axes, e.dtype)][0] += 1
            want[(e.kind, e.axes, e.dtype)][1] += e.payload_bytes
        first, last = np.array([int(stage == "first")]), np.array([int(stage == "last")])
        got: dict = defaultdict(lambda: [0, 0])
        for e in comm_entries(d, mode, layout_arrays(layout, 8), first, last, kw=kw or 0, tpo=tpo):
            if e.count[0]:
                got[(e.kind, e.axes, e.dtype)][0] += int(e.count[0])
                got[(e.kind, e.axes, e.dtype)][1] += int(e.payload[0])
        assert dict(got) == dict(want), (mode, stage)


@pytest.mark.parametrize("text", ["dp=2,tp=1d:4,sp,tpo,mb=1", "tp=1d:8,sp,tpo,mb=1", "dp=2,tp=2d:2x2,tpo,mb=1",
                                  "tp=3d:2x2x2,tpo,mb=1"])
def test_tpo_rings_issued_again_run_beside_their_chunks_in_both_engines(text: str) -> None:
    """With tpo, the rings rcm=mlp issues again run beside the chunk GEMMs its re-run forward runs: the analytic
    engine hides them call by call (cost_models/tpo.py, the layer_again entries among its tpo sums), the event engine
    beside the block's recompute op (event_compute.unit_compute, event_program._apply_tpo). One stage without a
    data-parallel overlap: both engines' steps are the same sums (rel 1e-9; before the recompute op held the re-run,
    the event engine exposed those rings whole, up to 5% more on 3D). 1D + sp: the output's ring reduce-scatter is
    among them (the collectives' list: its bytes again, the executor's record)."""
    for mods in ("core_attn", "core_attn+mlp", "core_attn+layernorm+mlp"):
        lay = parse_layout(f"{text},rcm={mods}")
        an, ev = (estimate_with(e, LLAMA, TRAIN, lay, _topo(), with_events=e == "analytic")
                  for e in ("analytic", "event"))
        assert ev.step_time_s == pytest.approx(an.step_time_s, rel=1e-9), mods
        assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-9), mods
        again = Counter(e.label.split(".", 2)[-1] for e in an.events if e.phase == "recompute")
        if "mlp" in mods and lay.mode == "1d":
            n = TRAIN.global_batch // lay.dp  # micro-batches of one sequence
            assert again == {"mlp.in": LLAMA.layers * n, "mlp.out": LLAMA.layers * n}, mods


def test_a_batch_counts_the_rings_again_where_its_configuration_runs_tpo() -> None:
    """The search scores many configurations in one evaluation, tpo per configuration (planner/scoring.py): the ring
    rcm=mlp issues again (1D + sp's output reduce-scatter) counts where tpo is on only; each configuration's step
    equals its evaluation alone (rel 1e-12: the same sums)."""
    lays = [parse_layout(f"dp=2,tp=1d:4,sp{t},mb=1,rcm=core_attn+mlp") for t in (",tpo", "")]
    topo = _topo()
    d, mb, _ = prepare(LLAMA, TRAIN, lays[0], EngineOptions())
    g, cache = gemm_model(topo, "bf16"), LinkCache(topo)
    links = [layout_links(lay, cache) for lay in lays]
    batch = LayoutBatch(**{f: np.concatenate([getattr(layout_arrays(lay, mb), f) for lay in lays]) for f in FIELDS})
    both = {ax: tuple(np.concatenate([lk[ax][k] for lk in links]) for k in range(2)) for ax in links[0]}
    res = evaluate(d, "1d", batch, both, g, tpo=np.array([True, False]))
    alone = [evaluate(d, "1d", layout_arrays(lay, mb), lk, g, tpo=lay.tpo).step_time[0]
             for lay, lk in zip(lays, links, strict=True)]
    assert res.step_time == pytest.approx(alone, rel=1e-12) and alone[0] != alone[1]


def test_moe_models_reissue_their_dense_and_shared_mlp_collectives() -> None:
    """tiny-mla (block 0 dense, block 1 MoE with a shared expert), 1D + sp: mlp re-issues block 0's MLP input
    all_gather in backward, shared_experts and moe block 1's shared expert's (moe_mlp_again.py), once per micro-batch
    in phase "recompute"; both engines book the same time for it under tp, one block's either way."""
    text = "dp=4,ep=4,tp=1d:2,sp,mb=1"
    n_micro = TRAIN.global_batch // 4
    base = {e: estimate_with(e, MLA, TRAIN, parse_layout(f"{text},rcm=core_attn"), _topo()).comm_time_by_axis["tp"]
            for e in ("analytic", "event")}
    added = set()
    for mods, block in (("mlp", 0), ("shared_experts", 1), ("moe", 1)):
        lay = parse_layout(f"{text},rcm=core_attn+{mods}")
        est = estimate(MLA, TRAIN, lay, _topo(), with_events=True)
        again = [e.label for e in est.events if e.phase == "recompute" and e.axes == ("tp",)]
        assert again == [f"layers.{block}.mlp.in"] * n_micro, mods
        tp = {e: estimate_with(e, MLA, TRAIN, lay, _topo()).comm_time_by_axis["tp"] - base[e]
              for e in ("analytic", "event")}
        assert tp["analytic"] > 0 and tp["event"] == pytest.approx(tp["analytic"], rel=1e-9), mods
        added.add(round(tp["analytic"], 15))
    assert len(added) == 1


def test_bad_input_is_one_line() -> None:
    """A module the model lacks, rcm= with rc=full / none, rcm= on a runtime without it: one line naming the value
    and what is valid."""
    for model, text, phrase in ((DENSE, "dp=8,rcm=moe_act", "valid for it: core_attn, layernorm, mlp"),
                                (MLA, "dp=8,ep=8,rcm=mlp+moe", None)):
        if phrase is None:  # every module of tiny-mla applies: no refusal
            estimate(model, TRAIN, parse_layout(text), _topo())
            continue
        with pytest.raises(ParacubeError) as err:
            estimate(model, TRAIN, parse_layout(text), _topo())
        assert "\n" not in str(err.value) and phrase in str(err.value) and "rcm=moe_act" in str(err.value)
    with pytest.raises(ParacubeError, match="rcm= recomputes modules under rc=selective, not rc=full"):
        parse_layout("dp=8,rc=full,rcm=layernorm")


@pytest.mark.parametrize(("argv", "phrase"), [
    (("simulate", "--runtime", "torchtitan", "--layout", "dp=8,rcm=layernorm"), "does not recompute by module"),
    (("simulate", "--runtime", "megatron", "--layout", "dp=8,rcm=moe_act"), "valid for it: core_attn"),
    (("plan", "--runtime", "deepspeed", "--layout", "dp=8,rcm=core_attn"), "does not recompute by module"),
    (("plan", "--layout", "dp=8,rc=full,rcm=layernorm"), "not rc=full"),
])
def test_cli_refuses_in_one_line(argv: tuple[str, ...], phrase: str, capsys: pytest.CaptureFixture[str],
                                 tmp_path: object) -> None:
    code = main([*argv, "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "-o", f"{tmp_path}/p.json"]
                if argv[0] == "plan" else [*argv, "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and phrase in err and "Traceback" not in err, err


def test_planner_keeps_a_pin_and_climbs_the_ladder() -> None:
    """A pinned rcm= stays on every ranked layout (dense and MoE searches); a MoE layout that fits at no zero stage
    without modules is ranked with the first rung of the ladder that fits (dimensions.RCM_LADDER), which then fits."""
    topo = _topo()
    dense = search(DENSE, TRAIN, topo, 8, fixed=parse_layout("dp=8,rcm=layernorm+mlp"), runtime="paracube")
    assert all(lay.recompute_modules == ("layernorm", "mlp") for lay, _ in dense.ranked)
    dense = search(DENSE, TRAIN, topo, 8, fixed=parse_layout("dp=8,rcm=core_attn+mlp"), runtime="megatron")
    assert all(lay.recompute_modules == ("core_attn", "mlp") for lay, _ in dense.ranked)
    moe = search(MLA, TRAIN, topo, 8, fixed=parse_layout("dp=8,ep=8,rcm=moe_act"), runtime="megatron")
    assert all(lay.recompute_modules == ("moe_act",) for lay, _ in moe.ranked)
    qwen = PRESETS["qwen3-30b-a3b"]
    train = TrainingSpec(global_batch=1024, dtype="bf16")
    topo16 = _topo(16)
    pin = parse_layout("dp=8,ep=8,tp=1d:2,mb=2,sp,zero=1,overlap")
    cap = 0.9 * float(topo16.device.memory_bytes)  # `paracube plan`'s 10% headroom
    assert estimate(qwen, train, pin, topo16).memory.total > cap
    ranked = search(qwen, train, topo16, 16, fixed=pin, runtime="megatron", memory_headroom=0.1).ranked
    # the pin's own shape (etp=1; the search also ranks etp=2, which fits without modules): Megatron-core's fused
    # norms leave layernorm+moe_act and core_attn+layernorm+moe_act 0.35 / 0.23 GiB over the cap; the rung with moe fits
    same = [(lay, est) for lay, est in ranked if lay.etp == 1]
    best, est = same[0]
    assert best.recompute_modules == ("core_attn", "layernorm", "moe") and est.memory.total <= cap
    why = next(c for c in explain(same, pin) if c.part == "rcm")  # told as chosen, not pinned
    assert (why.value, why.pinned) == ("rcm=core_attn+layernorm+moe", False)



def test_dense_search_ranks_a_rung_only_where_it_is_faster() -> None:
    """Choosing the recomputation (none, selective, full), the dense search also passes over the rcm= ladder's rungs
    (module_ladder.recompute_passes): GPT-3 1.3B on 32 A100s (batch 512, bf16, paracube's 10% headroom) ranks
    mb=16 with rcm=layernorm second (first before zero=1 was ranked beside a zero=0 that fits: mb=8 at zero=1 needs no
    rung), which fits where that layout without modules does not and beats every layout without modules but that
    one; every ranked rung layout, and every rc=selective or rc=full one, is faster than the same layout of every
    lighter pass that fits (none kept at a tie or a loss), and each choice is told against its runner-up. A pinned
    recomputation searches no rung."""
    model, train = PRESETS["gpt3-1.3b"], TrainingSpec(global_batch=512, dtype="bf16")
    topo = load_topology("dgx-a100", gpus=32)
    cap = 0.9 * float(topo.device.memory_bytes)
    res = search(model, train, topo, 32, recomputes=["none", "selective", "full"], memory_headroom=0.1)
    (first, first_est), (best, est) = res.ranked[:2]
    assert first.recompute_modules is None and first.zero == 1 and first_est.step_time_s < est.step_time_s
    assert best.recompute_modules == ("layernorm",) and best.micro_batch == 16 and est.memory.total <= cap
    assert estimate(model, train, best.with_(recompute="none", recompute_modules=None), topo).memory.total > cap
    plain = [(lay, e) for lay, e in res.ranked[1:] if lay.recompute_modules is None]
    assert plain and all(e.step_time_s > est.step_time_s for _, e in plain)
    lighter = {"selective": ("none",), "full": ("none", "selective")}  # the plain passes' order (scoring.py)
    for lay, e in res.ranked:
        for rc in ("none", "selective") if lay.recompute_modules else lighter.get(lay.recompute or "none", ()):
            other = estimate(model, train, lay.with_(recompute=rc, recompute_modules=None), topo)
            assert other.memory.total > cap or other.step_time_s > e.step_time_s, (lay, rc)
    why = next(c for c in explain(res.ranked, None) if c.part == "rcm")
    assert why.value == "no rcm" and why.runner_up == "rcm=layernorm" and why.runner_up_step_time_s == est.step_time_s
    pinned = search(model, train, topo, 32, recomputes=["none"], memory_headroom=0.1)
    assert all(lay.recompute_modules is None for lay, _ in pinned.ranked)
    faster = [(lay.with_(recompute=None), e.step_time_s) for lay, e in pinned.ranked if e.step_time_s < est.step_time_s]
    assert faster == [(first.with_(recompute=None), first_est.step_time_s)]


def test_selective_beside_fused_attention_is_not_ranked_twice() -> None:
    """Paracube's executor fuses attention, so rc=selective re-runs nothing there and prices as rc=none: the search
    ranked every layout twice (rc=none, then rc=selective at the same step time: Llama 2 70B on 256 H100s at 32k
    tokens). It ranks the lighter only, and the recomputation's choice says why it has no runner-up."""
    model, train = PRESETS["llama2-70b"], TrainingSpec(global_batch=256, dtype="fp8", seq_len=32768)
    topo = load_topology("dgx-h100", gpus=256)
    res = search(model, train, topo, 256, recomputes=["none", "selective", "full"], memory_headroom=0.1)
    keys = [repr(lay.with_(recompute=None, recompute_modules=None)) for lay, _ in res.ranked]
    assert len(keys) == len(set(keys)) and res.ranked[0][0].cp > 1
    none, selective = (estimate(model, train, res.ranked[0][0].with_(recompute=rc), topo) for rc in ("none",
                                                                                                 "selective"))
    assert selective.step_time_s == pytest.approx(none.step_time_s, rel=1e-12)  # the tie it drops
    why = next(c for c in explain(res.ranked, None) if c.part == "recompute")
    assert why.value == "rc=none" and not why.only_value
    assert why.runner_up is None or why.runner_up_layout != str(res.ranked[0][0].with_(recompute="selective"))

# Fused norms (Runtime.fused_norms): per block kind, the norms rcm=layernorm re-runs where a dense block's run inside
# the next linear. A MoE model with a dense first block of GQA attention (0 norms) and 3 MoE blocks (1 each: the
# pre-MLP norm); tiny-mla without experts (1 a block: latent attention's input norm); tiny-mla (its dense MLA block 1,
# its MoE MLA block 2). Paracube's executor re-runs both norms of every block.
_TM = PRESETS["tiny-moe"]
GQA_MOE = replace(_TM, name="tiny-moe-gqa", layers=4, kv_heads=2, moe=replace(_TM.moe, first_dense=1))
MLA_DENSE = replace(MLA, name="tiny-mla-dense", moe=None)
FUSED = [(GQA_MOE, ",ep=4", 3), (MLA_DENSE, "", 2), (MLA, ",ep=4", 3)]


def test_runtimes_declare_fused_norms() -> None:
    """Megatron-core (its Transformer Engine spec) runs a dense block's norms inside the next linear; paracube's
    executor, torchtitan and DeepSpeed keep them as modules; engine_options carries it, to_dict lists it."""
    assert {n: r.fused_norms for n, r in RUNTIMES.items()} == {
        "paracube": False, "megatron": True, "torchtitan": False, "deepspeed": False}
    assert RUNTIMES["megatron"].engine_options().fused_norms and RUNTIMES["megatron"].to_dict()["fused_norms"]
    assert not RUNTIMES["paracube"].engine_options().fused_norms


@pytest.mark.parametrize(("model", "ep", "norms"), FUSED)
def test_fused_layernorm_closed_forms(model: object, ep: str, norms: int) -> None:
    """rcm=layernorm against rcm=core_attn, one stage of L blocks (pp = 1), n = 4 micro-batches, T = mb s tokens,
    k = t = 2 with sp, c = 2, bw the device's memory rate: it frees N c T h / k and re-runs N x 2 c T h / k / bw per
    micro-batch, N the norms it recomputes (FUSED's; paracube's runtime: 2 L). Memory under the megatron runtime's
    options, the re-run under fused_norms alone (megatron's host issue, host_issue.py, hides a tiny MoE block's GPU
    work); both engines alike."""
    text, c, k, n = "dp=4,tp=1d:2,sp,mb=1" + ep, 2.0, 2.0, 4
    g = gemm_model(_topo(), "bf16")
    bw = g.mem_bw * g.mem_eff
    one = c * model.seq_len * model.hidden / k  # one norm's output, one micro-batch
    for runtime, opts, want in (("paracube", RUNTIMES["paracube"].engine_options(), 2 * model.layers),
                                ("megatron", RUNTIMES["megatron"].engine_options(), norms),
                                ("fused", EngineOptions(fused_norms=True), norms)):
        for engine in ("analytic", "event"):
            a, b = (estimate_with(engine, model, TRAIN, parse_layout(f"{text},rcm={mods}"), _topo(), options=opts)
                    for mods in ("core_attn", "core_attn+layernorm"))
            assert a.memory.activations - b.memory.activations == pytest.approx(want * one, rel=1e-9), (runtime,
                                                                                                          engine)
            if runtime != "megatron":
                assert b.compute_time_s - a.compute_time_s == pytest.approx(n * want * 2 * one / bw, rel=1e-6), (
                    runtime, engine)


@pytest.mark.parametrize(("model", "text", "dense"), [(DENSE, "dp=2,tp=1d:4,sp,mb=2", DENSE.layers),
                                                      (GQA_MOE, "dp=4,tp=1d:2,sp,mb=1,ep=4", 1),
                                                      (MLA, "dp=4,tp=1d:2,sp,mb=1,ep=4", 1)])
def test_fused_mlp_reruns_its_norm(model: object, text: str, dense: int) -> None:
    """rcm=mlp where the dense blocks' pre-MLP norm runs inside fc (fused norms: Transformer Engine's LayerNormLinear,
    inside the checkpointed region) against the unfused norms (outside it, paracube's executor): per dense block and
    micro-batch it re-runs that norm too, one norm pass 2 c T h / k / bw, and frees its output c T h / k; nothing else
    differs (rcm=core_attn prices alike). One stage (pp = 1), n = 4 micro-batches, T = mb s, k = t with sp, c = 2;
    both engines; MoE blocks' shared experts do not hold the norm (GQA_MOE has none, tiny-mla one: only `dense`
    blocks count). Tolerance: rel 1e-6, one formula summed in another order (module docstring)."""
    lay = parse_layout(text)
    c, n, k = 2.0, 4, float(lay.tensor_size)
    g = gemm_model(_topo(), "bf16")
    one = c * lay.micro_batch * model.seq_len * model.hidden / k  # one norm's output, one micro-batch
    for engine in ("analytic", "event"):
        est = {(fused, mods): estimate_with(engine, model, TRAIN, parse_layout(f"{text},rcm={mods}"), _topo(),
                                            options=EngineOptions(fused_norms=fused))
               for fused in (False, True) for mods in ("core_attn", "core_attn+mlp")}
        base_u, base_f = est[False, "core_attn"], est[True, "core_attn"]
        assert base_u.compute_time_s == base_f.compute_time_s and base_u.memory == base_f.memory, engine
        mlp_u, mlp_f = est[False, "core_attn+mlp"], est[True, "core_attn+mlp"]
        assert mlp_f.compute_time_s - mlp_u.compute_time_s == pytest.approx(
            n * dense * 2 * one / (g.mem_bw * g.mem_eff), rel=1e-6), engine
        assert mlp_u.memory.activations - mlp_f.memory.activations == pytest.approx(dense * one, rel=1e-9), engine


def test_fused_layernorm_refused_on_dense_models(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    """rcm=layernorm on a dense model without latent attention re-runs nothing where the norms are fused: the
    megatron runtime refuses it in one line naming itself, the model and what is valid (the runtime's refusal, the
    estimate, the search, the CLI and the export of paracube's plan to it: exit 2); paracube's runtime prices it; with
    latent attention it is valid."""
    llama = PRESETS["llama3-8b"]
    why = RUNTIMES["megatron"].refusal(parse_layout("dp=8,rcm=layernorm"), model=llama)
    assert why and "\n" not in why and "runtime megatron" in why and "'llama3-8b'" in why
    assert "valid for it: core_attn, mlp" in why
    assert RUNTIMES["paracube"].refusal(parse_layout("dp=8,rcm=layernorm"), model=llama) is None
    assert RUNTIMES["megatron"].refusal(parse_layout("dp=8,rcm=layernorm"), model=MLA_DENSE) is None
    assert not applies("layernorm", llama, fused_norms=True) and applies("layernorm", GQA_MOE, fused_norms=True)
    with pytest.raises(ParacubeError) as err:
        estimate(llama, TRAIN, parse_layout("dp=8,rcm=layernorm"), _topo(), fused_norms=True)
    assert "\n" not in str(err.value) and "valid for it: core_attn, mlp" in str(err.value)
    with pytest.raises(ParacubeError, match="valid for it: core_attn, mlp"):
        search(DENSE, TRAIN, _topo(), 8, fixed=parse_layout("dp=8,rcm=layernorm"), runtime="megatron")
    for cmd in ("simulate", "plan"):
        argv = [cmd, "--runtime", "megatron", "--layout", "dp=8,rcm=layernorm", "--model", "llama3-8b",
                "--cluster", "dgx-h100", "--gpus", "8"]
        code = main(argv + (["-o", "/dev/null"] if cmd == "plan" else []))
        out = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in out and "runtime megatron" in out and "valid for it: core_attn, mlp" in out
    plan = f"{tmp_path}/p.json"
    assert main(["plan", "--layout", "dp=8,rcm=layernorm", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus",
                 "8", "-o", plan]) == 0
    capsys.readouterr()
    assert main(["export", plan, "--to", "megatron", "-o", f"{tmp_path}/x"]) == 2
    out = capsys.readouterr().err.strip()
    assert "\n" not in out and "runtime megatron" in out and "valid for it: core_attn, mlp" in out
