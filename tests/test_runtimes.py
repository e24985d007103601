"""Runtimes (paracube/runtimes): declarations, one-line refusals, the search respecting each runtime, plans that
record their runtime, overlap chosen by default, and the tpo / overlap prices of the two engines agreeing."""

from __future__ import annotations

import itertools
import json
from dataclasses import fields
from pathlib import Path

import pytest

from paracube.cli.main import main
from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.tpo import hidden
from paracube.layout_checks import RECOMPUTES
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes import MODES, executor_runs, runnable_modes
from paracube.plan import load_plan
from paracube.planner import search
from paracube.runtimes import RUNTIMES, for_target, get_runtime
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- declarations ---------------------------------------------------------------------------------------------
def test_declarations() -> None:
    assert list(RUNTIMES) == ["paracube", "megatron", "torchtitan", "deepspeed"]
    for name, rt in RUNTIMES.items():
        assert rt.name == name and set(rt.modes) <= set(MODES) and set(rt.recomputes) <= set(RECOMPUTES)
        assert 0 in rt.zeros and 0 in rt.zeros_with_pp and set(rt.all_zeros) == set(rt.zeros) | set(rt.zeros_with_pp)
        assert (for_target(rt.export_target) is rt) if rt.export_target else name == "paracube"
    meg, tt, ds = RUNTIMES["megatron"], RUNTIMES["torchtitan"], RUNTIMES["deepspeed"]
    assert meg.modes == tt.modes == ds.modes == tuple(n for n, m in MODES.items() if not m.axes or m.megatron_style)
    assert meg.modes == ("none", "1d")  # Megatron-style 1D tensor parallelism only
    assert meg.interleave and tt.interleave and not ds.interleave and ds.sequence_parallel
    assert meg.tpo and meg.tpo_needs_sp and tt.tpo and tt.tpo_needs_sp and not ds.tpo
    assert 3 in tt.zeros and 1 not in tt.zeros and 3 not in ds.zeros_with_pp and tt.hybrid_shard
    assert all(rt.grad_overlap and rt.grad_overlap_default for rt in RUNTIMES.values())
    with pytest.raises(Exception, match="unknown runtime 'nemo'; valid: paracube, megatron, torchtitan, deepspeed"):
        get_runtime("nemo")


def test_to_dict_lists_every_declaration_the_offload_one_included() -> None:
    """Runtime.to_dict is JSON data and carries the activation-offloading declaration field by field (reference: the
    Offload dataclass's own fields), None for torchtitan, which does not offload activations."""
    for rt in RUNTIMES.values():
        data = json.loads(json.dumps(rt.to_dict()))
        assert data["name"] == rt.name and data["modes"] == list(rt.modes)
        if rt.offload is None:
            assert data["offload"] is None
            continue
        ref = {f.name: getattr(rt.offload, f.name) for f in fields(rt.offload)}
        assert data["offload"] == {k: list(v) if isinstance(v, tuple) else v for k, v in ref.items()}
    assert RUNTIMES["torchtitan"].to_dict()["offload"] is None
    assert RUNTIMES["megatron"].to_dict()["offload"]["recomputes"] == list(RUNTIMES["megatron"].offload.recomputes)  # type: ignore[index, union-attr]


def test_paracube_runtime_is_what_the_executor_runs() -> None:
    """Derived from the modes' ExecutorSupport: it accepts exactly what modes.executor_runs accepts."""
    rt = RUNTIMES["paracube"]
    assert rt.modes == runnable_modes() and rt.tpo and not rt.tpo_default and rt.export_target is None
    for mode, pp, sp, zero, tied, family in itertools.product(MODES, (1, 2), (False, True), (0, 1, 3),
                                                                (False, True), ("gpt", "llama")):
        if sp and not MODES[mode].sequence_parallel:
            continue
        assert rt.runs(mode, pp, sp, zero, tied, family) == executor_runs(mode, pp, sp, zero, tied, family), \
            (mode, pp, sp, zero, tied, family)


# --- refusals -------------------------------------------------------------------------------------------------
REFUSED = [
    (["--runtime", "deepspeed", "--layout", "tp=3d:2x2x2"],
     "layout dp=1,tp=3d:2x2x2: runtime deepspeed (DeepSpeed + Megatron-DeepSpeed) does not run tp=3d; "
     "valid: tp=none/1d"),
    (["--runtime", "megatron", "--layout", "tp=2d:2x2"],
     "layout dp=1,tp=2d:2x2: runtime megatron (Megatron-core / NeMo) does not run tp=2d; valid: tp=none/1d"),
    (["--runtime", "megatron", "--layout", "tp=1d:4,tpo"],
     "layout dp=1,tp=1d:4,tpo: runtime megatron (Megatron-core / NeMo) runs tpo with sequence parallelism only; "
     "add sp (tp=1d:N,sp,tpo)"),
    (["--runtime", "torchtitan", "--layout", "dp=2,tp=1d:2,sp,zero=1"],
     "layout dp=2,tp=1d:2,sp,zero=1: runtime torchtitan (FSDP2 + DTensor TP) does not run zero=1; valid: zero=0/3"),
    (["--runtime", "torchtitan", "--layout", "dp=2,pp=2,tp=1d:2,sp,zero=3"],
     "layout dp=2,pp=2,tp=1d:2,sp,zero=3: runtime torchtitan (FSDP2 + DTensor TP) does not run zero=3 with pipelines "
     "(pp > 1): torch.distributed.pipelining keeps FSDP2's parameters unsharded and its gradients accumulated "
     "unsharded across micro-batches, so with pipelines its FSDP is ZeRO-1; valid: zero=0/1"),
    (["--layout", "tp=1d:4,tpo"],
     "layout dp=1,tp=1d:4,tpo: runtime paracube (paracube run) runs tpo in tp=1d with sequence parallelism only "
     "(without sp its collectives are all-reduces, none overlappable); add sp (tp=1d:N,sp,tpo)"),
    (["--runtime", "deepspeed", "--layout", "dp=2,pp=2,tp=1d:2,v=2"],
     "layout dp=2,pp=2,tp=1d:2,v=2: runtime deepspeed (DeepSpeed + Megatron-DeepSpeed) does not run interleaved "
     "pipelines (v=2); valid: v=1"),
    (["--runtime", "trt"], "unknown runtime 'trt'; valid: paracube, megatron, torchtitan, deepspeed"),
    (["--runtime", "torchtitan", "--layout", "dp=8,shard=3,zero=3"], "shard=3 must divide dp=8; valid: 1, 2, 4, 8"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED)
def test_refused_in_one_line_nothing_written(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                             message: str) -> None:
    out = tmp_path / "p.json"
    for command in ("plan", "simulate"):
        code, _, err = run_cli(capsys, command, *argv, *(["-o", str(out)] if command == "plan" else []))
        assert code == 2 and err == f"paracube: error: {message}\n", command
    assert not out.exists()


# --- the search -----------------------------------------------------------------------------------------------
def test_search_respects_each_runtime() -> None:
    """Every ranked layout is one its runtime runs; overlap (and tpo with sp) where the runtime does them."""
    topo = load_topology("dgx-h100", gpus=32)
    model, training = PRESETS["gpt3-2.7b"], TrainingSpec(global_batch=128, dtype="bf16")
    seen = {}
    for name, rt in RUNTIMES.items():
        res = search(model, training, topo, 32, top_k=12, runtime=name, recomputes=list(RECOMPUTES))
        for lay, _ in res.ranked:
            assert rt.refusal(lay, model.family, model.tied_embeddings, training.dtype) is None, (name, str(lay))
            # zero=2/3 reduce in backward without the layout's overlap (fsdp_overlap.py prices it: fsdp_prefetch)
            if (lay.dp > 1 and lay.zero < 2 and (lay.pp == 1 or rt.grad_overlap_pp)
                    and lay != res.ranked[0][0].with_(overlap=False)):
                assert lay.overlap, (name, str(lay))  # the runner-up without overlap is the one exception
        seen[name] = res
        assert set(res.best_per_mode) <= set(rt.modes)
    assert not any(lay.tpo for lay, _ in seen["paracube"].ranked + seen["deepspeed"].ranked)
    assert not any(lay.interleave > 1 for lay, _ in seen["deepspeed"].ranked)
    meg = [lay for lay, _ in seen["megatron"].ranked if lay.mode == "1d" and lay.sequence_parallel]
    assert meg and all(lay.tpo for lay in meg if lay != seen["megatron"].ranked[0][0].with_(tpo=False))


def test_megatron_plan_chooses_overlap_and_prints_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's command with tp=1d:4 pinned (unpinned, ZeRO-3 over 64 ranks now wins: data-parallel rings cross
    nodes over all 8 NICs): overlapped gradient reduction and tpo chosen, their runner-ups printed."""
    out = tmp_path / "p.json"
    code, text, _ = run_cli(capsys, "plan", "--model", "gpt3-13b", "--cluster", "dgx-h100", "--gpus", "64",
                            "--runtime", "megatron", "--layout", "tp=1d:4", "-o", str(out))
    assert code == 0
    plan = load_plan(out)
    assert plan.runtime == "megatron" and plan.layout.overlap and plan.layout.tpo and plan.layout.sequence_parallel
    assert "overlap chosen; best with no overlap:" in text and "tpo chosen; best with no tpo:" in text
    assert f"export it with `paracube export {out} --to megatron`" in text.replace("\n", "")
    data = json.loads(out.read_text())
    assert data["schema_version"] == 2 and data["runtime"] == "megatron"


def test_plan_records_runtime_and_export_and_run_recheck(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    out = tmp_path / "p.json"
    code, _, _ = run_cli(capsys, "plan", "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "16",
                         "--runtime", "megatron", "--layout", "dp=2,pp=2,tp=1d:4,sp,v=2", "-o", str(out))
    assert code == 0 and load_plan(out).runtime == "megatron"
    code, _, err = run_cli(capsys, "export", str(out), "--to", "deepspeed", "-o", str(tmp_path / "ds.sh"))
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "ds.sh").exists()
    # The exporter's own refusal comes first: it names the targets that do run the plan.
    assert "deepspeed cannot run layout" in err and "without interleaving (v=1, not v=2); targets that run it: " \
        "megatron, torchtitan" in err
    # paracube runs the megatron plan's layout (1D + sp + tpo, interleaved pipeline) as is (collective matmul:
    # executor/layers/collective_matmul.py), saying so; checked without starting ranks.
    from paracube.cli.run_cmd import runnable_plan

    assert load_plan(out).layout.tpo and runnable_plan(load_plan(out), str(out)).layout == load_plan(out).layout
    assert "was made for runtime megatron; paracube runs its layout as is" in capsys.readouterr().err
    # A schema-1 plan (before runtimes) reads as runtime paracube.
    data = json.loads(out.read_text())
    data.update(schema_version=1, runtime=None)
    del data["runtime"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_plan(tmp_path / "old.json").runtime == "paracube"


def test_compare_all_runtimes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "c.png"
    code, text, _ = run_cli(capsys, "compare", "--model", "gpt3-13b", "--cluster", "dgx-h100", "--gpus", "64",
                            "--runtime", "all", "--json", "--plot", str(png))
    assert code == 0 and png.stat().st_size > 10_000
    rows = json.loads(text)["runtimes"]
    assert [r["runtime"] for r in rows] == list(RUNTIMES)
    for r in rows:
        rt = RUNTIMES[r["runtime"]]
        assert rt.refusal(parse_layout(r["layout"])) is None and r["mfu"] > 0 and r["memory_per_gpu_bytes"] > 0
    assert rows[0]["speedup_over_paracube"] == 1.0


# --- tpo and overlap pricing ------------------------------------------------------------------------------------
def test_tpo_hides_all_but_one_ring_step_up_to_the_gemm() -> None:
    """exposed = C / (n - 1) + max(0, C (n - 2) / (n - 1) - G): hidden = min(C (n - 2) / (n - 1), G)."""
    assert float(hidden(3.0, 4, 1.0)) == pytest.approx(1.0)  # the GEMM (1 s) is shorter than the 2 s it could hide
    assert float(hidden(3.0, 4, 5.0)) == pytest.approx(2.0)  # all but one of 3 steps hidden
    assert float(hidden(3.0, 2, 5.0)) == 0.0  # one ring step: nothing to overlap it with
    topo = load_topology("dgx-h100", gpus=16)
    model, training = PRESETS["gpt3-1.3b"], TrainingSpec(global_batch=32, dtype="bf16")
    plain = estimate(model, training, parse_layout("dp=2,tp=1d:8,mb=2,sp"), topo, with_events=True)
    tpo = estimate(model, training, parse_layout("dp=2,tp=1d:8,mb=2,sp,tpo"), topo, with_events=True)
    assert tpo.events == plain.events and tpo.comm_bytes_per_gpu == plain.comm_bytes_per_gpu  # bytes unchanged
    assert tpo.compute_time_s == plain.compute_time_s and tpo.step_time_s < plain.step_time_s
    no_sp = parse_layout("dp=2,tp=1d:8,mb=2")  # the all-reduces without sp are not overlappable
    assert estimate(model, training, no_sp.with_(tpo=True), topo).step_time_s == \
        estimate(model, training, no_sp, topo).step_time_s


AGREE = [  # 20 layouts with overlap and / or tpo: 1D + sp at several tensor sizes, dp, pipelines, recomputation
    "dp=2,tp=1d:8,mb=2,sp,tpo", "dp=2,tp=1d:8,mb=2,sp,tpo,overlap", "dp=4,tp=1d:4,mb=2,sp,tpo",
    "dp=4,tp=1d:4,mb=2,sp,tpo,overlap", "dp=8,tp=1d:2,mb=2,sp,tpo,overlap", "dp=8,tp=1d:2,mb=4,sp,tpo",
    "dp=1,tp=1d:16,mb=4,sp,tpo", "dp=2,tp=1d:8,mb=8,sp,tpo,overlap", "dp=16,tp=none,mb=2,overlap",
    "dp=8,tp=none,mb=4,overlap,place=pp.dp", "dp=4,pp=2,tp=1d:2,mb=2,sp,tpo", "dp=2,pp=2,tp=1d:4,mb=2,sp,tpo,overlap",
    "dp=2,pp=2,tp=1d:4,mb=4,v=2,sp,tpo", "dp=4,tp=1d:4,mb=2,sp,tpo,rc=full", "dp=4,tp=1d:4,mb=2,sp,tpo,rc=selective",
    "dp=2,tp=1d:8,mb=2,sp,zero=1,tpo,overlap", "dp=4,tp=1d:4,mb=1,sp,tpo,overlap,place=dp.tp",
    "dp=8,tp=1d:2,mb=1,sp,overlap", "dp=1,pp=2,tp=1d:8,mb=2,sp,tpo", "dp=4,tp=1d:4,mb=4,sp,tpo,overlap,fa=0",
]


def test_engines_agree_on_overlap_and_tpo() -> None:
    """Same decomposition in both engines (tpo.py); within 2% on each layout: the event engine's bucket queue
    and links shared by concurrent groups differ slightly from the closed forms (tests/test_event_engine.py)."""
    topo = load_topology("dgx-h100", gpus=16)
    model, training = PRESETS["gpt3-1.3b"], TrainingSpec(global_batch=32, dtype="bf16")
    for text in AGREE:
        lay = parse_layout(text)
        if lay.recompute:
            lay, train = lay.with_(recompute=None), TrainingSpec(global_batch=32, dtype="bf16", recompute=lay.recompute)
        else:
            train = training
        a = estimate(model, train, lay, topo, with_events=False)
        e = estimate_event(model, train, lay, topo, with_events=False)
        assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.02), text
        assert e.comm_bytes_per_gpu == a.comm_bytes_per_gpu, text
