"""Planning MoE models (planner/experts.py): the chosen ep / etp with their runner-ups, the export of the plan,
and bad input refused in one line with exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import run_cli

from paracube.layout_parse import parse_layout


def test_qwen3_plan_chooses_ep_and_says_why(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "qwen.json"
    code, out, err = run_cli(capsys, "plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
                             "--top", "3", "--runtime", "megatron", "-o", str(plan))
    assert code == 0, err
    best = json.loads(plan.read_text())["layout"]
    assert "ep=" in best
    assert "ep=" in out and "chosen; best with ep=" in out  # the runner-up with another ep, and its step time
    code, out, err = run_cli(capsys, "export", str(plan), "--to", "megatron")
    assert code == 0, err
    assert "--num-experts 128" in out and "--moe-router-topk 8" in out and "--expert-model-parallel-size" in out


def test_deepseek_v3_plans_with_paracubes_runtime(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """MLA + MoE in one model runs in paracube's executor (tests/test_moe_run.py), so the default runtime plans
    DeepSeek-V3: the chosen ep and etp with why, a layout the executor runs, and its Megatron export."""
    from paracube.executor import check_divisibility
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS

    plan = tmp_path / "dsv3.json"
    code, out, err = run_cli(capsys, "plan", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024",
                             "-o", str(plan))
    assert code == 0, err
    best = parse_layout(json.loads(plan.read_text())["layout"])
    assert best.ep > 1 and best.etp == 1 and "chosen; best with ep=" in out and "etp=1 chosen" in out
    check_divisibility(PRESETS["deepseek-v3"], best, best.micro_batch, 512, 4096)  # what it plans, the executor runs
    code, out, err = run_cli(capsys, "export", str(plan), "--to", "megatron")
    assert code == 0, err
    assert "--multi-latent-attention" in out and f"--expert-model-parallel-size {best.ep}" in out


def test_paracubes_runtime_ranks_etp_layouts_of_a_tiny_moe() -> None:
    """paracube's executor runs tensor parallelism inside experts (executor/layers/expert_tensor.py,
    tests/test_moe_run.py), so its runtime's search scores tiny-moe's etp > 1 layouts (etp = tp, 1D with sp) and
    ranks every one of them beside the etp = 1 ones, at each zero stage the search prices (0 and 1; memory unbounded
    here: none is dropped for it)."""
    from dataclasses import replace

    from paracube.model_presets import PRESETS
    from paracube.planner.experts import candidates, search_experts
    from paracube.runtimes import RUNTIMES
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    model, training, rt = PRESETS["tiny-moe"], TrainingSpec(global_batch=16, dtype="bf16"), RUNTIMES["paracube"]
    wanted = [c for c in candidates(model, training, 8, 8, rt, None, None) if c.etp > 1]
    assert wanted and all(c.etp == c.tensor_size and c.sequence_parallel for c in wanted)
    ranked, scored, rejected, _, _ = search_experts(model, training, load_topology("dgx-h100", gpus=8), 8, rt, None,
                                                 None, float("inf"), 10 ** 6)
    got = sorted(repr(lay) for lay, est in ranked if lay.etp > 1 and est.step_time_s > 0)
    assert got == sorted(repr(replace(c, zero=z)) for c in wanted for z in (0, 1))
    assert not rejected and scored >= len(ranked)


def test_paracubes_runtime_ranks_sharded_moe_layouts() -> None:
    """paracube's executor runs MoE blocks with zero=2 and zero=3 (data_parallel/sharded.py, fsdp.py: the experts a
    unit over edp, tests/test_moe_run.py), so its runtime's search ranks tiny-moe's zero=2 / zero=3 layouts (pinned:
    unbounded memory picks the lowest stage), ep > 1 among them, each one the executor runs."""
    from paracube.executor import check_divisibility
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.topologies.loader import load_topology
    from paracube.workload import TrainingSpec

    model, training, topo = PRESETS["tiny-moe"], TrainingSpec(global_batch=16, dtype="bf16"), load_topology(
        "dgx-h100", gpus=8)
    for zero in (2, 3):
        ranked = [lay for lay, _ in search(model, training, topo, 8, top_k=10 ** 6, runtime="paracube",
                                           fixed=parse_layout(f"zero={zero}")).ranked]
        assert any(lay.ep > 1 for lay in ranked) and {lay.zero for lay in ranked} == {zero}
        for lay in ranked:
            check_divisibility(model, lay, lay.micro_batch, 16, model.seq_len)


def _config(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(("argv", "message"), [
    (("simulate", "--model", "mixtral-8x7b", "--layout", "dp=16,ep=16,tp=none", "--runtime", "megatron"),
     "ep=16 must divide the 8 experts of mixtral-8x7b; valid: 1, 2, 4, 8"),
    (("simulate", "--model", "qwen3-30b-a3b", "--layout", "dp=3,ep=2,tp=none", "--runtime", "megatron"),
     "ep=2 x etp=1 must divide the dp x cp x tp = 3 ranks it folds over; valid ep: 1, 3"),
    (("simulate", "--model", "qwen3-30b-a3b", "--layout", "dp=8,ep=4,etp=2,tp=1d:2", "--runtime", "deepspeed"),
     "does not run tensor parallelism inside experts (etp=2); valid: etp=1"),
    (("plan", "--model", "llama2-7b", "--layout", "dp=16,ep=2,tp=none", "--runtime", "megatron"),
     "model llama2-7b has none"),
    # paracube's executor runs MoE blocks with every zero stage, not with HSDP (its runtime is the default)
    (("plan", "--model", "qwen3-30b-a3b", "--layout", "dp=16,ep=4,zero=3,shard=8,tp=none"),
     "MoE blocks with zero=3 run without HSDP, not shard=8; valid: drop shard="),
    (("plan", "--model", "tiny-moe", "--layout", "dp=4,ep=2,etp=2,tp=1d:2", "--runtime", "deepspeed"),
     "does not run tensor parallelism inside experts (etp=2); valid: etp=1"),
    # a model whose blocks the runtime does not train, whatever the layout: refused before any search, with the
    # runtimes that train it (its export refused such plans after `plan` had written them)
    (("plan", "--model", "tiny-mla", "--runtime", "deepspeed"),
     "runtime deepspeed (DeepSpeed + Megatron-DeepSpeed) does not train multi-head latent attention with MoE blocks "
     "(tiny-mla); valid: --runtime paracube, megatron, torchtitan"),
    (("simulate", "--model", "llama4-scout", "--layout", "dp=16,ep=16,tp=none", "--runtime", "deepspeed"),
     "does not train NoPE blocks or the L2 q / k norm or router scores on the experts' input (Llama 4's; "
     "llama4-scout); valid: --runtime paracube, megatron, torchtitan"),
    # a pin without dp: the experts' divisors are valid (the search sets the ranks ep folds over)
    (("plan", "--model", "mixtral-8x7b", "--layout", "ep=16", "--runtime", "megatron"),
     "ep=16 must divide the 8 experts of mixtral-8x7b; valid: 1, 2, 4, 8"),
    # ... and ep x etp must divide a pipeline stage's dp x cp x tp ranks for some dp: at most --gpus / pp of them
    (("plan", "--model", "qwen3-30b-a3b", "--layout", "pp=2,ep=16", "--runtime", "megatron"),
     "ep=16 x etp=1 must divide the dp x cp x tp ranks of a pipeline stage, at most 8 with --gpus 16 and pp=2; "
     "valid ep: 1, 2, 4, 8"),
    # a whole layout is checked whole: dp = 1 is one rank to fold ep=8 over
    (("simulate", "--model", "qwen3-30b-a3b", "--layout", "dp=1,ep=8,tp=none", "--gpus", "1", "--runtime",
      "megatron"), "ep=8 x etp=1 must divide the dp x cp x tp = 1 ranks it folds over; valid ep: 1"),
])
def test_bad_expert_layouts_exit_2_in_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path, argv: tuple, message: str) -> None:
    monkeypatch.chdir(tmp_path)  # `plan` writes plan.json here by default: a stray one would refuse first
    code, out, err = run_cli(capsys, *argv, "--cluster", "dgx-h100", "--gpus", "16")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("pins", ["ep=8", "tp=1d:2,ep=16", "pp=2,v=2,ep=8,a2ao"])
def test_a_pinned_ep_leaves_dp_to_the_search(capsys: pytest.CaptureFixture[str], tmp_path: Path, pins: str) -> None:
    """`plan --layout ep=N` without dp (Layout.pin: dp = 1 is not a pin): the search sets dp and folds the experts
    over dp x cp x tp, and its best layout keeps every pin."""
    from paracube.layout_parse import parse_layout
    from paracube.plan import load_plan

    code, out, err = run_cli(capsys, "plan", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
                             "--runtime", "megatron", "--layout", pins, "-o", str(tmp_path / "p.json"))
    assert code == 0, err
    best, pinned = load_plan(tmp_path / "p.json").layout, parse_layout(pins, pin=True)
    assert (best.ep, best.a2ao) == (pinned.ep, pinned.a2ao)
    assert pinned.pp == 1 or best.pp == pinned.pp  # pp = 1 and no tp are not pins either
    assert not pinned.shape or best.tensor_size == pinned.tensor_size
    assert best.dp * best.cp * best.tensor_size % (best.ep * best.etp) == 0 and best.dp > 1


@pytest.mark.parametrize(("pins", "kept"), [("dp=4,cp=2,cpc=ag,ep=2", {"cp_comm": "ag"}),
                                           ("dp=8,ep=2,fa=0", {"flash": 0}),
                                           ("dp=8,ep=2,overlap=0", {"overlap": False}),
                                           ("dp=2,tp=1d:4,sp,tpo", {"tpo": True})])
def test_the_moe_search_keeps_the_pins_it_prices(capsys: pytest.CaptureFixture[str], tmp_path: Path, pins: str,
                                                  kept: dict) -> None:
    """cpc=, fa=, overlap=0 and tpo reach every layout the MoE search prices (before, it built its layouts without
    them: a pinned cpc=ag was planned and written as the ring), and the written plan keeps them."""
    from paracube.plan import load_plan

    code, out, err = run_cli(capsys, "plan", "--model", "tiny-moe", "--cluster", "local-cpu", "--gpus", "8",
                             "--seq", "256", "--layout", pins, "-o", str(tmp_path / "p.json"))
    assert code == 0, err
    best = load_plan(tmp_path / "p.json").layout
    assert {k: getattr(best, k) for k in kept} == kept


@pytest.mark.parametrize(("model", "pins", "bad"), [("tiny-mla", "dp=2,tp=1d:4,sp,tpo", "drop tpo"),
                                                   ("tiny-moe", "dp=4,ep=2,tp=1d:2,sp,place=dp.tp", "drop place=")])
def test_pins_the_moe_search_does_not_price_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        model: str, pins: str, bad: str) -> None:
    """place= (layout by layout, planner/experts.py, the default placement only) and tpo with MLA (its latent has no
    collective-matmul form) are not priced: refused in one line, exit 2, nothing written, instead of a plan that
    silently drops them."""
    code, out, err = run_cli(capsys, "plan", "--model", model, "--cluster", "local-cpu", "--gpus", "8",
                             "--layout", pins, "-o", str(tmp_path / "p.json"))
    assert code == 2 and bad in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_the_moe_search_prices_each_runtimes_first_sharding_stage() -> None:
    """The MoE search prices every layout unsharded and at the runtime's first sharding stage (experts.searched_zeros):
    zero=1 where the runtime has it, torchtitan's FSDP there (zero=3, its first without pipelines; zero=1 with them,
    where pipelining keeps FSDP2's parameters and gradients unsharded across micro-batches), so torchtitan's plans
    rank zero=3 layouts and zero=1 pipelines; a stage it does not price (Megatron-core's zero=3 beside its zero=1) is
    named as unsearched, never claimed to be invalid."""
    from paracube.model_presets import PRESETS
    from paracube.planner.experts import experts_unsearched, searched_zeros
    from paracube.planner.search import search
    from paracube.runtimes import get_runtime
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    assert [searched_zeros(get_runtime(n)) for n in ("paracube", "megatron", "torchtitan", "deepspeed")] == [
        [0, 1], [0, 1], [0, 1, 3], [0, 1]]
    model, training = PRESETS["tiny-moe"], TrainingSpec(global_batch=16, dtype="bf16")
    res = search(model, training, load_topology("dgx-h100", gpus=8), 8, top_k=200, runtime=get_runtime("torchtitan"))
    assert {(lay.zero, lay.pp > 1) for lay, _ in res.ranked if lay.zero} == {(3, False), (1, True)}
    # torchtitan folds the experts over dp_shard x cp x tp (refusals.expert_refusal): ep over dp runs at zero=3 only.
    # A layout refused at zero=0 is still priced at zero=3 (before 2026-12-04 the first refusal ended its stages).
    assert any(lay.zero == 3 and lay.ep > 1 and lay.tensor_size == 1 for lay, _ in res.ranked)
    for lay, _ in res.ranked:
        assert get_runtime("torchtitan").refusal(lay, model.family, model.tied_embeddings, "bf16", moe=True,
                                                 model=model) is None
    megatron = get_runtime("megatron")
    why = experts_unsearched(model, training, 8, megatron, None, None)["zero"]
    assert why == "zero=0/1 only; --layout zero=N prices zero=3"
    assert "zero" not in experts_unsearched(model, training, 8, megatron, parse_layout("zero=3", pin=True), None)


@pytest.mark.parametrize(("data", "message"), [
    ({"model_type": "deepseek_v3", "n_routed_experts": 4, "moe_intermediate_size": 64, "num_experts_per_tok": 8},
     "top_k=8 > experts=4; valid: 1..4"),
    ({"model_type": "qwen3_moe", "num_experts": 64}, "num_experts=64 routed experts but no 'moe_intermediate_size'"),
])
def test_bad_moe_configs_exit_2_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, data: dict,
                                            message: str) -> None:
    code, out, err = run_cli(capsys, "plan", "--model", _config(tmp_path, data), "--cluster", "dgx-h100",
                             "--gpus", "16")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_published_moe_rows_load_and_plan_with_their_layouts() -> None:
    """benchmarks/data/published_runs_moe.csv through the row loader (calibration/runs_csv.py): every row reads,
    and a planned row keeps its pinned ep / pp / v / tp (the error figures: benchmarks/published_runs.py)."""
    from paracube.calibration.run_prediction import predict
    from paracube.calibration.runs_csv import read_runs
    from paracube.topologies import load_topology
    from paracube.topologies.presets import PRESETS

    csv = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs_moe.csv"
    runs = {r.name: r for r in read_runs(csv, tuple(PRESETS))}
    # 6 H100 (GPT-OSS-120B with sliding windows among them), 2 Mixtral on Blackwell
    assert len(runs) == 8 and all(r.model.moe is not None for r in runs.values())
    # three MoE figures, each on one row (topologies/efficiency.py): the all_to_all's share of the line rate on
    # qwen3-235b-256, the host's issue factor on qwen3-30b-16-fp8, the a2a overlap's hidden share on the one row that
    # runs it, qwen3-235b-256-fp8; the rest are held out
    assert [n for n, r in runs.items() if r.split == "fit"] == ["qwen3-235b-256", "qwen3-30b-16-fp8",
                                                                "qwen3-235b-256-fp8"]
    r = runs["qwen3-235b-256"]
    lay, step = predict(r, load_topology(r.cluster, gpus=r.gpus), "megatron")
    assert (lay.ep, lay.pp, lay.interleave, lay.tensor_size, lay.dp) == (32, 8, 4, 2, 16) and step > 0


def test_a_long_sequence_moe_plan_on_paracubes_runtime_chooses_cp(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    """The executor runs MoE blocks with cp > 1 (tests/test_moe_run.py), so the MoE search takes cp as the dense
    one does (planner/enumerate.context_degrees: from 8192 tokens on): tiny-moe over 16384 tokens on 8 GPUs ranks
    cp layouts, with ep > 1 folded over dp x cp among them, and the plan it writes is one the executor runs.
    MLA + MoE (tiny-mla) ranks cp layouts too (executor/layers/mla.py runs MLA's core under cp), on this runtime as
    on Megatron-core's, and its best cp layout is one the executor runs."""
    from paracube.executor import check_divisibility
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.topologies.loader import load_topology
    from paracube.workload import TrainingSpec, with_seq_len

    plan = tmp_path / "moe-cp.json"
    code, out, err = run_cli(capsys, "plan", "--model", "tiny-moe", "--seq", "16384", "--cluster", "dgx-h100",
                             "--gpus", "8", "-o", str(plan))
    assert code == 0, err
    best = parse_layout(json.loads(plan.read_text())["layout"])
    assert best.cp > 1 and f"cp={best.cp} chosen; best with cp=1" in out  # the runner-up without cp, its time
    check_divisibility(with_seq_len(PRESETS["tiny-moe"], 16384), best, best.micro_batch, 8, 16384)
    topo, training = load_topology("dgx-h100", gpus=8), TrainingSpec(global_batch=8, dtype="bf16", seq_len=16384)
    for name, runtime in (("tiny-moe", "paracube"), ("tiny-mla", "paracube"), ("tiny-mla", "megatron")):
        model = with_seq_len(PRESETS[name], 16384)
        ranked = [lay for lay, _ in search(model, training, topo, 8, top_k=1000, runtime=runtime).ranked]
        assert any(lay.cp > 1 and lay.ep > 1 for lay in ranked), (name, runtime)
        assert any(lay.cp == 1 for lay in ranked)
        if runtime == "paracube":
            cp = next(lay for lay in ranked if lay.cp > 1)
            check_divisibility(model, cp, cp.micro_batch, 8, 16384)


@pytest.mark.parametrize("runtime", ["paracube", "megatron"])
def test_zero3_on_a_model_without_shared_experts_plans(runtime: str) -> None:
    """Qwen3-30B-A3B has no shared expert, so its MoE blocks drop the dense part's MLP tensor collectives
    (cost_models/moe_unshared.py); zero=3's gather of a block's unit is labelled after the block's last program
    unit (traffic._unit_labels: the MLP's in 1D) but runs over dp and stays: the search pinned to zero=3 ranks
    layouts (it raised KeyError ('dp',) on the dropped gather's missing tensor link before)."""
    from paracube.cost_models.dims import dims_of
    from paracube.cost_models.moe import dense_part
    from paracube.cost_models.moe_unshared import dropped_events
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.runtimes import get_runtime
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    model = PRESETS["qwen3-30b-a3b"]
    d = dims_of(dense_part(model), TrainingSpec(global_batch=512, dtype="bf16"))
    lay = parse_layout("dp=8,ep=8,tp=1d:2,sp,mb=1,zero=3")
    dropped = dropped_events(model, d, lay, 1)
    assert dropped and all(e.axes == ("tp",) for e in dropped)
    result = search(model, TrainingSpec(global_batch=512, dtype="bf16"), load_topology("dgx-h100", gpus=16), 16,
                    fixed=parse_layout("zero=3"), top_k=5, runtime=get_runtime(runtime))
    assert result.ranked and all(lay.zero == 3 for lay, _ in result.ranked)


def test_a_moe_search_that_fits_nothing_says_why_by_reason() -> None:
    """The MoE search's no-fit line names each reason with its count, as the dense search's does: the runtime's own
    refusal, the validity rule (one entry per rule, not per layout or per cp degree) and the memory cap with the
    closest miss."""
    from paracube.errors import ParacubeError
    from paracube.model_presets import PRESETS
    from paracube.planner import search
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    def no_fit(model: str, gpus: int, runtime: str, cluster: str = "dgx-h100", **training: object) -> str:
        with pytest.raises(ParacubeError) as err:
            search(PRESETS[model], TrainingSpec(**training), load_topology(cluster, gpus=gpus), gpus,
                   runtime=runtime)
        line = str(err.value)
        assert "\n" not in line and line.startswith(f"no layout of {gpus} GPUs fits {model}")
        return line

    with pytest.raises(ParacubeError) as err:  # a model the runtime does not train: refused whole, before any layout
        search(PRESETS["gpt-oss-120b"], TrainingSpec(global_batch=512, dtype="bf16"),
               load_topology("dgx-h100", gpus=72), 72, runtime="deepspeed")
    assert str(err.value) == ("runtime deepspeed (DeepSpeed + Megatron-DeepSpeed) does not train sliding-window "
                              "attention (gpt-oss-120b: sliding_window=128); valid: --runtime paracube, megatron, "
                              "torchtitan")
    memory = no_fit("deepseek-v3", 2, "megatron", global_batch=64, dtype="bf16")
    assert re.search(r"memory > \d+ GiB per device \(the least: [\d.]+ GiB, dp=1,[^)]*\) \(\d+ layouts\)", memory)
    kv = no_fit("qwen3-235b-a22b", 16, "megatron", "gb200-nvl72", global_batch=512, dtype="fp8", seq_len=131072)
    # one entry for the rule, whatever the layout or the cp rank's sequence its message names (validity.RuleError)
    rules = re.findall(r"kv heads % p != 0( \([^)]*\))? \((\d+) layouts\)", kv)
    assert len(rules) == 1 and rules[0][0] == "" and int(rules[0][1]) > 1, kv


def test_moe_search_interleaves_pipelines_and_its_pruning_loses_nothing() -> None:
    """The MoE search ranks the interleaved variants (v > 1) of the pipelines that fit, where the runtime interleaves
    (planner/experts.interleaved): a 12-block tiny-moe on 8 GPUs ranks v = 2 .. 6 layouts; the top 5 with the
    variants pruned by their lower bound (the v = 1 step less (1 - 1 / v) of its bubble) equal the top 5 of the
    search that prices every variant (an unbounded ranking: nothing pruned), which prices more layouts. A pinned v is
    the only one (v=1 too); DeepSpeed (no interleaving) ranks none."""
    from dataclasses import replace

    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.experts import search_experts
    from paracube.runtimes import RUNTIMES
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    model = replace(PRESETS["tiny-moe"], name="tiny-moe-12", layers=12)
    training, topo = TrainingSpec(global_batch=32, dtype="bf16"), load_topology("dgx-h100", gpus=8)

    def ranked(runtime: str, top_k: int, fixed: str | None = None) -> tuple[list[str], int]:
        lays, scored, _, _, _ = search_experts(model, training, topo, 8, RUNTIMES[runtime],
                                            fixed and parse_layout(fixed), None, float("inf"), top_k)
        return [str(lay) for lay, _ in lays], scored

    every, priced_all = ranked("megatron", 10 ** 6)
    assert {int(m) for m in re.findall(r",v=(\d+)", " ".join(every))} == {2, 3, 4, 5, 6}
    top, priced = ranked("megatron", 5)
    assert top == every[:5] and priced < priced_all
    pinned, _ = ranked("megatron", 10 ** 6, "pp=4,v=3")
    assert pinned and all(",pp=4," in lay and ",v=3," in lay for lay in pinned)
    plain, _ = ranked("megatron", 10 ** 6, "pp=4,v=1")  # an explicit v=1 pins plain 1F1B (Layout.forbid_interleave)
    assert plain and all(",pp=4," in lay and ",v=" not in lay for lay in plain)
    assert all(",v=" not in lay for lay in ranked("deepspeed", 10 ** 6)[0])


def test_moe_search_prunes_the_rcm_ladder_without_changing_its_ranking() -> None:
    """Under a memory cap that refuses a fifth of the 12-block tiny-moe's layouts (8 GPUs), the layouts the rcm=
    ladder would climb are pruned where their lower bound (the v = 1 step, less the whole bubble where interleaving
    may follow) loses to the ranking so far: the top 5 equal the unpruned search's (an unbounded ranking), rcm=
    layouts among them, with fewer layouts priced and the pruned ones counted as such."""
    from dataclasses import replace

    from paracube.model_presets import PRESETS
    from paracube.planner.experts import search_experts
    from paracube.runtimes import RUNTIMES
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    model = replace(PRESETS["tiny-moe"], name="tiny-moe-12", layers=12)
    training, topo, rt = TrainingSpec(global_batch=32, dtype="bf16"), load_topology("dgx-h100", gpus=8), \
        RUNTIMES["megatron"]
    every = sorted(e.memory.total for _, e in search_experts(model, training, topo, 8, rt, None, None, float("inf"),
                                                             10 ** 6)[0])
    cap = every[len(every) // 5]
    full, priced_all, _, none_pruned, _ = search_experts(model, training, topo, 8, rt, None, None, cap, 10 ** 6)
    top, priced, _, pruned, _ = search_experts(model, training, topo, 8, rt, None, None, cap, 5)
    assert [(str(lay), e.step_time_s) for lay, e in top] == [(str(lay), e.step_time_s) for lay, e in full[:5]]
    assert any(lay.recompute_modules for lay, _ in top) and all(e.memory.total <= cap for _, e in full)
    assert none_pruned == 0 < pruned and priced < priced_all

    # A cap below every layout's weights + gradients + optimizer state: a rung drops activations only, so the ladder
    # prices nothing, as many estimates as the search without a ladder (rc=none pinned: no rung) makes
    from paracube.layout import Layout

    statics = [e.memory.parameters + e.memory.gradients + e.memory.optimizer
               for _, e in search_experts(model, training, topo, 8, rt, None, None, float("inf"), 10 ** 6)[0]]
    tiny = 0.5 * min(statics)
    none, without = (search_experts(model, training, topo, 8, rt, fixed, None, tiny, 10 ** 6)
                     for fixed in (None, Layout(recompute="none")))
    assert not none[0] and none[1] == without[1] > 0


def test_a_middle_stage_holding_the_most_experts_sets_the_memory() -> None:
    """DeepSeek-V3 at pp = 16: its 3 dense blocks sit on the first stage (with the embedding), 4 MoE blocks on each
    middle stage, 2 and the head on the last. At ep = 8 a rank holds 32 experts of each of its MoE blocks: a middle
    stage's experts alone are 4 x 32 x 3 x 7168 x 2048 parameters (5.6B, 11.3 GB in bf16). The estimate counted the
    first and the last stage only (52 GiB, 3.1 GiB of parameters: the search ranked this layout first at a batch of
    8192); it counts the middle too, and the planner no longer ranks a layout whose middle stage does not fit."""
    from paracube.cost_models.analytic import estimate
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.runtimes import get_runtime
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    model = PRESETS["deepseek-v3"]
    train = TrainingSpec(global_batch=8192, dtype="bf16", recompute="selective")
    topo = load_topology("dgx-h100", gpus=1024)
    lay = parse_layout("dp=64,pp=16,ep=8,tp=none,mb=1,zero=1,overlap")
    est = estimate(model, train, lay, topo, with_events=False, options=get_runtime("megatron").engine_options())
    experts = 4 * 32 * 3 * 7168 * 2048
    assert est.memory.parameters >= 2 * experts and est.memory.gradients >= 4 * experts
    assert est.memory.total > topo.device.memory_bytes
    res = search(model, train, topo, 1024, runtime=get_runtime("megatron"), top_k=3, memory_headroom=0.1)
    assert res.ranked and all(e.memory.total <= 0.9 * topo.device.memory_bytes for _, e in res.ranked)
    assert all(str(lay) != str(layout) for layout, _ in res.ranked)


def test_an_interleaved_variant_climbs_the_rcm_ladder_above_its_layouts_rung() -> None:
    """planner/experts.interleaved through its explicit `price` hook: a pipeline fitted at the ladder's first rung
    holds more chunks in flight interleaved; where a variant fits only at a higher rung it is ranked there (it was
    dropped: only variants of layouts without rcm= climbed the ladder), and never tried at a lighter rung than its
    layout's. Priced stand-ins: memory 1 at v = 1 whatever the rung, at v > 1 3 less the rung's index (fits: <= 1);
    step time 10 less the v's saved bubble."""
    from dataclasses import replace

    from paracube.estimate import MemoryBreakdown, StepEstimate
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.experts import interleaved
    from paracube.runtimes import get_runtime
    from paracube.workload import TrainingSpec

    model = replace(PRESETS["tiny-moe"], layers=8)
    rungs = [("layernorm",), ("layernorm", "moe_act"), ("layernorm", "moe_act", "moe")]
    priced: list[str] = []

    def price(lay):  # type: ignore[no-untyped-def]
        priced.append(str(lay))
        rung = rungs.index(lay.recompute_modules) if lay.recompute_modules else 0
        mem = 1.0 if lay.interleave == 1 else 3.0 - rung
        step = 10.0 - 2.0 * (1.0 - 1.0 / lay.interleave)
        return StepEstimate(str(lay), "analytic", step, step, 0.0, 0.0, 2.0, MemoryBreakdown(parameters=mem), 0.0,
                            1.0, 0.5)

    base = parse_layout("dp=2,pp=2,ep=2,tp=none,mb=1,zero=1,rcm=layernorm+moe_act")
    fits = [(base, price(base))]
    out = interleaved(model, TrainingSpec(global_batch=8), get_runtime("megatron"), fits, price, 1.0, 10, [0, 1],
                      False, rungs)
    assert {lay.interleave for lay, _ in out} == {2, 3, 4}  # every v whose 2 v virtual stages keep a block
    assert all(lay.recompute_modules == rungs[2] and lay.zero == 1 and e.memory.total <= 1.0 for lay, e in out)
    assert not any("rcm=layernorm," in p for p in priced)  # no variant below its layout's rung


def test_the_moe_search_ranks_each_zero_stage_that_fits() -> None:
    """Where zero=0 fits, zero=1 is priced too: it shards the optimizer step (faster) and gathers the parameters after
    it (slower without the runtime's gather overlap), so neither is the faster everywhere. Qwen3-30B-A3B on 64 H100s
    at one layout: zero=1 is both smaller and faster, and ranks first (the search ranked zero=0 alone before)."""
    from paracube.cost_models.analytic import estimate
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.runtimes import get_runtime
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    model, training = PRESETS["qwen3-30b-a3b"], TrainingSpec(global_batch=512, dtype="bf16")
    topo, rt = load_topology("dgx-h100", gpus=64), get_runtime("paracube")
    fixed = parse_layout("dp=16,pp=2,ep=16,tp=1d:2,mb=1,v=3,sp,overlap")
    ranked = search(model, training, topo, 64, fixed=fixed, top_k=10, runtime=rt).ranked
    by_zero: dict[int, tuple] = {}
    for lay, est in ranked:
        if lay.etp == 1:  # the layout as pinned (etp=2 variants rank too)
            by_zero.setdefault(lay.zero, (lay, est))
    assert set(by_zero) == {0, 1} and ranked[0][0].zero == 1
    (_, e0), (_, e1) = by_zero[0], by_zero[1]
    assert e1.step_time_s < e0.step_time_s and e1.memory.total < e0.memory.total
    opts = rt.engine_options()
    for lay, est in by_zero.values():  # each the layout's own estimate
        assert est.step_time_s == estimate(model, training, lay, topo, with_events=False,
                                           options=opts).step_time_s


def test_the_rcm_ladder_gives_each_zero_stage_its_first_rung_that_fits() -> None:
    """planner/module_ladder.ladder through its explicit `price` hook: zero=1 holds less, so it fits under a lighter
    rung than zero=0 (which re-runs less): each zero stage's first fitting rung is returned (before: zero=0's alone,
    at its heavier rung). Priced stand-ins: memory 3 less the rung's index less the zero stage (fits: <= 1)."""
    from paracube.estimate import MemoryBreakdown, StepEstimate
    from paracube.layout_parse import parse_layout
    from paracube.planner.module_ladder import ladder

    rungs = [("layernorm",), ("layernorm", "moe_act"), ("layernorm", "moe_act", "moe")]

    def price(lay):  # type: ignore[no-untyped-def]
        mem = 3.0 - rungs.index(lay.recompute_modules) - lay.zero
        return StepEstimate(str(lay), "analytic", 1.0, 1.0, 0.0, 0.0, 0.0, MemoryBreakdown(parameters=mem), 0.0,
                            1.0, 0.5)

    lay = parse_layout("dp=2,pp=2,ep=2,tp=none,mb=1")
    got = [(z.zero, z.recompute_modules) for z, _ in ladder(lay, [0, 1], rungs, price, 1.0)]
    assert got == [(0, rungs[2]), (1, rungs[1])]
    assert ladder(lay, [0, 1], rungs, price, -1.0) == []  # nothing fits even at the last rung and zero stage


def test_compare_shows_each_folding_modes_best_for_a_moe_model(capsys: pytest.CaptureFixture[str]) -> None:
    """`paracube compare` on a MoE model: a row per tensor mode the experts fold over (none, 1d), each that mode's
    best of the whole search (exact: with mode_bests no layout that may beat its mode's best is pruned), and a line
    per other mode saying why it has none (it printed an empty table: the MoE search kept no mode's best)."""
    from paracube.layout_parse import parse_layout
    from paracube.model_presets import PRESETS
    from paracube.planner.search import search
    from paracube.topologies import load_topology
    from paracube.workload import TrainingSpec

    model, training = PRESETS["tiny-moe"], TrainingSpec(global_batch=32, dtype="bf16")
    topo = load_topology("dgx-h100", gpus=8)
    every = search(model, training, topo, 8, top_k=10 ** 6, runtime="megatron").ranked
    bests = search(model, training, topo, 8, top_k=3, runtime="megatron", mode_bests=True).best_per_mode
    assert set(bests) == {"none", "1d"}
    for mode, (_, est) in bests.items():
        assert est.step_time_s == min(e.step_time_s for lay, e in every if lay.mode == mode), mode
    # paracube's runtime runs every tensor mode (megatron's: none and 1d, nothing to tell)
    code, out, _ = run_cli(capsys, "compare", "--model", "tiny-moe", "--gpus", "8", "--json")
    data = json.loads(out)
    assert code == 0 and [m["mode"] for m in data["modes"]] == ["none", "1d"]
    assert all(parse_layout(m["layout"]).mode == m["mode"] for m in data["modes"])
    assert set(data["no_layout"]) == {"2d", "2.5d", "3d"} and "whole tokens (none, 1d)" in data["no_layout"]["2d"]
