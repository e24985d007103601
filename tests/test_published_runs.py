"""Fidelity on published runs: layout pins, the search's recompute / zero / overlap choices, runs CSV input,
and the calibrated cluster file (calibration/runs_csv.py, run_prediction.py, from_runs.py, cli/runs_cmd.py)."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from paracube.calibration.from_runs import cluster_file, fit_runs, shipped_fit
from paracube.calibration.run_prediction import predict, preset_topology
from paracube.calibration.runs_csv import read_runs
from paracube.cli.main import main
from paracube.cost_models.analytic import estimate
from paracube.cost_models.compute import optimizer_time
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.overlap_drag import nvlink_share
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.planner import search
from paracube.topologies import load_topology
from paracube.topologies.loader import topology_from_dict
from paracube.topologies.presets import PRESETS
from paracube.workload import ModelSpec, TrainingSpec

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.csv"
MODEL = ModelSpec("m", layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=51200, seq_len=1024)


def _rows() -> list[dict[str, str]]:
    with DATA.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_layout_pins_round_trip() -> None:
    for text in ("dp=2,tp=1d:4,sp=0,zero=1,rc=full,overlap", "dp=2,tp=1d:4,sp,rc=selective", "dp=8,tp=none"):
        assert str(parse_layout(text)) == text
        assert parse_layout(str(parse_layout(text))) == parse_layout(text)
    for bad, word in (("dp=2,tp=1d:2,rc=some", "rc='some'"), ("dp=2,tp=1d:2,sp=2", "sp='2'"),
                      ("dp=2,tp=1d:2,sp,sp=0", "twice"), ("dp=2,overlap=x", "overlap='x'")):
        with pytest.raises(ParacubeError, match=word):
            parse_layout(bad)


def test_search_respects_pins_and_chooses_recompute() -> None:
    topo = load_topology("dgx-a100", gpus=16)
    training = TrainingSpec(global_batch=64, dtype="bf16")
    free = search(MODEL, training, topo, 16, modes=["1d"], recomputes=["none", "selective", "full"], top_k=50)
    chosen = {lay.recompute for lay, _ in free.ranked}
    assert chosen <= {"none", "selective", "full"} and None not in chosen
    # the best layout's estimate is that of its recomputation, as if pinned through TrainingSpec
    lay, est = free.ranked[0]
    from paracube.runtimes import RUNTIMES  # the search prices with the runtime's options (zero=3: prefetch)

    direct = estimate(MODEL, replace(training, recompute=lay.recompute), lay.with_(recompute=None), topo,
                      options=RUNTIMES["paracube"].engine_options())
    assert est.step_time_s == pytest.approx(direct.step_time_s, rel=1e-9)
    pinned = search(MODEL, training, topo, 16, fixed=parse_layout("dp=2,tp=1d:8,sp=0,rc=full"), top_k=20,
                    recomputes=["none", "selective", "full"])
    assert all(lay.recompute == "full" and not lay.sequence_parallel for lay, _ in pinned.ranked)


def test_zero1_fits_where_zero0_does_not_and_ranks_beside_it_where_both_fit() -> None:
    big = ModelSpec("big", layers=40, hidden=6144, heads=48, ffn_hidden=4 * 6144, vocab=51200, seq_len=2048)
    training = TrainingSpec(global_batch=1024, dtype="fp16", recompute="full", activations="megatron")
    fixed = parse_layout("dp=32,tp=1d:8,sp=0")
    topo = load_topology("dgx-a100", gpus=256)
    cap = topo.device.memory_bytes
    # Without overlap (zero=1's reduce_scatter + all_gather then cost what the all_reduce does; overlapped,
    # only the reduce_scatter hides under backward): a runtime that overlaps neither the gradient reduction nor
    # zero=1's parameter all_gather (paracube's executor does both since the gathers run under the next forward).
    from dataclasses import replace

    from paracube.runtimes import RUNTIMES

    no_overlap = replace(RUNTIMES["paracube"], grad_overlap_default=False, param_gather_overlap_default=False)
    lay, est = search(big, training, topo, 256, fixed=fixed, zeros=[0, 1], top_k=1, runtime=no_overlap).ranked[0]
    assert lay.zero == 1 and est.memory.total <= cap
    unsharded = estimate(big, training, lay.with_(zero=0), topo, with_events=False)
    assert unsharded.memory.total > cap  # zero=1 was needed to fit this layout
    assert unsharded.step_time_s == pytest.approx(est.step_time_s, rel=1e-2)  # only the Adam step shrinks
    lay0, _ = search(big, training, topo, 256, fixed=fixed, zeros=[0], top_k=1, runtime=no_overlap).ranked[0]
    assert lay0.zero == 0 and (lay0.micro_batch or 0) < (lay.micro_batch or 0)
    small = search(MODEL, TrainingSpec(global_batch=64, dtype="bf16"), load_topology("dgx-a100", gpus=16), 16,
                   zeros=[0, 1], top_k=10, runtime=no_overlap)
    # where both fit both rank (the search ranked zero=0 alone before 2026-12-04): without overlap zero=1 sends the
    # all_reduce's bytes and its Adam step updates a shard, so it is the faster by that step only, and the smaller
    by_config: dict[str, dict[int, object]] = {}
    for lay, e in small.ranked:
        by_config.setdefault(repr(lay.with_(zero=0)), {})[lay.zero] = e
    pairs = [(lay, z[0], z[1]) for lay, z in by_config.items() if set(z) == {0, 1}]
    assert small.ranked[0][0].zero == 1 and any(parse_layout(e.layout).mode == "none" for _, e, _ in pairs)
    g = gemm_model(load_topology("dgx-a100", gpus=16), "bf16")
    for lay, e0, e1 in pairs:
        assert e1.step_time_s < e0.step_time_s and e1.memory.total < e0.memory.total, lay
        if parse_layout(e0.layout).mode == "none":  # every parameter on each rank: its Adam step, 1 - 1 / dp saved
            adam = float(optimizer_time(MODEL.num_parameters(), 2, g)) * (1 - 1 / parse_layout(e0.layout).dp)
            # within 5%: zero=1 also sums the gradient norm over the shards (one small all_reduce)
            assert e0.step_time_s - e1.step_time_s == pytest.approx(adam, rel=0.05), lay


def test_overlap_hides_gradient_reduction_up_to_one_backward() -> None:
    """Buckets start once produced (the first after one block's backward) and queue on the dp stream; the
    embedding's, produced last, is the tail: exposed = max(G - B' (1 - 1/L), G x embedding share), where the
    backward beside the stream is slowed by the generation's drag (overlap_drag.py): B' = B + c,
    c = D f min(G (1 - embedding share), B (1 - 1/L)), which the step pays too."""
    topo = load_topology("dgx-a100", gpus=32)
    training = TrainingSpec(global_batch=64, dtype="bf16")
    lay = parse_layout("dp=32,tp=none,mb=1")
    plain = estimate(MODEL, training, lay, topo)
    over = estimate(MODEL, training, lay.with_(overlap=True), topo)
    grad = plain.comm_time_by_axis["dp"]
    n_micro = 64 // 32
    backward = 2 / 3 * (plain.compute_time_s - _optim(plain)) / n_micro
    emb_share = (MODEL.vocab + MODEL.seq_len) * MODEL.hidden / MODEL.num_parameters()
    drag = gemm_model(topo, "bf16").overlap_drag * nvlink_share(lay.groups(("dp",))[0], topo.devices_per_node)
    c = drag * min(grad * (1 - emb_share), backward * (1 - 1 / MODEL.layers))
    exposed = max(grad - (backward + c) * (1 - 1 / MODEL.layers), emb_share * grad)
    assert plain.step_time_s - over.step_time_s == pytest.approx(grad - exposed - c, rel=1e-2)
    assert over.exposed_comm_time_s < plain.exposed_comm_time_s


def _optim(est: object) -> float:
    """The optimizer step's part of compute: what compute has beyond the per-micro-batch work."""
    from paracube.cost_models.compute import optimizer_time
    from paracube.cost_models.device_model import gemm_model

    g = gemm_model(load_topology("dgx-a100", gpus=32), "bf16")
    return float(optimizer_time(MODEL.num_parameters(), 2, g))


@pytest.mark.parametrize("field,value,word", [
    ("measured_step_s", "abc", "measured_step_s='abc'"),
    ("cluster", "dgx-z", "cluster='dgx-z'"),
    ("layout", "dp=2,tp=1d:2", "layout='dp=2,tp=1d:2' has 4 ranks"),
    ("recompute", "most", "recompute"),
    ("capacity_factor", "1.0", "capacity_factor='1.0' for"),  # a dense model has no experts to drop tokens at
    ("dispatcher", "alltoall", "dispatcher='alltoall' for"),  # nor tokens to dispatch
])
def test_runs_csv_errors_name_row_and_field(tmp_path: Path, field: str, value: str, word: str) -> None:
    rows = [r for r in _rows() if r["run"].startswith("v-")]
    for r in rows:
        r.setdefault(field, "")
    rows[1][field] = value
    path = _write(tmp_path / "runs.csv", rows)
    with pytest.raises(ParacubeError, match=r"row 3 \(v-2.03B\)") as err:
        read_runs(path, tuple(PRESETS))
    assert word in str(err.value) and "\n" not in str(err.value)
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--from-runs", str(path), "--cluster", "dgx2-v100", "--out", str(out)]) == 2
    assert not out.exists()


def test_runs_csv_missing_column(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "global_batch"} for r in _rows()[:2]]
    with pytest.raises(ParacubeError, match="missing column 'global_batch'"):
        read_runs(_write(tmp_path / "runs.csv", rows), tuple(PRESETS))


@pytest.mark.parametrize("edit,words", [
    ("drop:measured_step_s", ["missing column 'measured_step_s'"]),
    ("model:gpt-9000", ["row 3 (v-2.03B)", "model", "gpt-9000"]),
    ("measured_step_s:1.2s", ["row 3 (v-2.03B)", "measured_step_s='1.2s'"]),
    ("layout:dp=4,tp=1d:2", ["row 3 (v-2.03B)", "layout='dp=4,tp=1d:2' has 8 ranks, gpus=2"]),
])
def test_bad_runs_csv_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         edit: str, words: list[str]) -> None:
    """calibrate --from-runs and validate --from-runs: a missing column, an unknown model preset, a non-numeric
    time, a layout whose ranks are not the row's GPUs: one line naming the row and the field, exit 2, no file."""
    rows = [r for r in _rows() if r["run"].startswith("v-")]
    key, value = edit.split(":", 1)
    if key == "drop":
        rows = [{k: v for k, v in r.items() if k != value} for r in rows]
    else:
        if key == "model":  # a model preset column instead of the shape (the shape columns left empty)
            rows = [{**r, "model": ""} for r in rows]
            for k in ("hidden", "heads", "layers", "vocab"):
                rows[1][k] = ""
        rows[1][key] = value
    path = _write(tmp_path / "runs.csv", rows)
    out = tmp_path / "cal.yaml"
    for argv in (["calibrate", "--from-runs", str(path), "--cluster", "dgx2-v100", "--out", str(out)],
                 ["validate", "--from-runs", str(path), "--cluster", "dgx2-v100"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and all(w in err for w in words), err
        assert not out.exists() and "Traceback" not in err


def test_fit_and_calibrated_file_reproduce_predictions(tmp_path: Path) -> None:
    """Fit the V100 rows (single node: fast); the written cluster file predicts what the fit predicted."""
    runs = [r for r in read_runs(DATA, tuple(PRESETS)) if r.cluster == "dgx2-v100"]
    fit, rows = fit_runs(runs, "dgx2-v100", rounds=1)
    for name in ("eff_max", "mem_eff", "intra"):
        assert 0.1 <= getattr(fit, name) <= 1.0
    data = cluster_file("dgx2-v100", fit)
    for r, lay, pred in rows:
        lay_again, again = predict(r, topology_from_dict(data, gpus=r.gpus))
        assert lay_again == lay and again == pytest.approx(pred, rel=1e-9)
        assert predict(r, preset_topology(r, fit))[1] == pytest.approx(pred, rel=1e-9)


def test_largest_published_layouts_plannable() -> None:
    """Table 1's largest rows (pp = 16, 35, 64) are plannable with the shipped presets, none refused."""
    runs = [r for r in read_runs(DATA, tuple(PRESETS)) if r.split == "held_out" and r.gpus >= 1920]
    assert len(runs) == 3
    shipped = shipped_fit("A100-SXM-80GB", "dgx-a100")
    for r in runs:
        lay, pred = predict(r, preset_topology(r))
        assert lay.pp == r.layout.pp and lay.mode == r.layout.mode and not lay.sequence_parallel
        assert pred == pytest.approx(predict(r, preset_topology(r, shipped))[1], rel=1e-9)


FSDP = DATA.with_name("published_runs_fsdp.csv")


def test_runs_csv_runtime_column(tmp_path: Path) -> None:
    """The optional runtime column: a row's own runtime (empty: the caller's); a bad name is one line."""
    rows = [{**r, "runtime": ""} for r in _rows() if r["run"].startswith("v-")]
    rows[0]["runtime"] = "torchtitan"
    runs = read_runs(_write(tmp_path / "runs.csv", rows), tuple(PRESETS))
    assert runs[0].runtime == "torchtitan" and all(r.runtime is None for r in runs[1:])
    assert runs[0].training.activations == "paracube" and runs[1].training.activations == "megatron"
    # predict plans a row for its own runtime, not the caller's: torchtitan has no zero=1, megatron has
    zero1 = replace(runs[0], layout=runs[0].layout.with_(zero=1))
    with pytest.raises(ParacubeError, match="torchtitan.*zero=1"):
        predict(zero1, preset_topology(zero1), "megatron")
    rows[1]["runtime"] = "titan"
    with pytest.raises(ParacubeError, match=r"row 3 \(v-2.03B\): runtime='titan'; valid: .*torchtitan") as err:
        read_runs(_write(tmp_path / "bad.csv", rows), tuple(PRESETS))
    assert "\n" not in str(err.value)


def test_fsdp_row_plans_with_torchtitan_at_zero3() -> None:
    """The FSDP rows (docs/published-runs.md section 6) are torchtitan's, held out; the Llama 3 8B row plans at
    zero=3 whatever runtime the caller names (the row's column wins), at the analytic estimate of that layout."""
    runs = read_runs(FSDP, tuple(PRESETS))
    assert len(runs) == 4 and all(r.runtime == "torchtitan" and r.split == "held_out" for r in runs)
    r = next(x for x in runs if x.name == "llama3-8B-64")
    topo = preset_topology(r)
    lay, pred = predict(r, topo, "megatron")
    assert lay.zero == 3 and lay.dp == 64 and lay.micro_batch == 1 and lay.mode == "none"
    assert predict(r, topo, "torchtitan") == (lay, pred)
    from paracube.runtimes import RUNTIMES

    assert lay.overlap  # torchtitan's reduce-scatters run under backward; its gathers are prefetched
    direct = estimate(r.model, r.training, lay.with_(recompute=None), topo, with_events=False,
                      options=RUNTIMES["torchtitan"].engine_options())
    assert pred == pytest.approx(direct.step_time_s, rel=1e-9)


MOE = DATA.with_name("published_runs_moe.csv")


def test_runs_csv_dispatcher_column(tmp_path: Path) -> None:
    """The optional dispatcher column of MoE rows: the row is priced with that dispatcher (reference: the estimate
    with the runtime's options and that moe_dispatch), empty the runtime's; a bad name, or DeepEP with a capacity
    factor (Megatron-core refuses it), is one line naming the row."""
    from paracube.calibration.run_prediction import run_estimate
    from paracube.runtimes import get_runtime

    with MOE.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["run"] == "qwen3-30b-16-fp8"]
    assert rows[0]["dispatcher"] == "hybridep"
    rows.append({**rows[0], "run": "plain", "dispatcher": ""})
    rows.append({**rows[0], "run": "a2a", "dispatcher": "alltoall"})
    hybrid, plain, a2a = read_runs(_write(tmp_path / "moe.csv", rows), tuple(PRESETS))
    assert (hybrid.dispatcher, plain.dispatcher, a2a.dispatcher) == ("hybridep", None, "alltoall")
    lay = parse_layout("dp=16,ep=16,tp=none,mb=1,zero=1,overlap")
    rt = get_runtime("megatron")
    steps = []
    for r, name in ((hybrid, "hybridep"), (plain, rt.moe_dispatch), (a2a, "alltoall")):
        ref = estimate(r.model, r.training, lay, preset_topology(r), with_events=False,
                       options=rt.engine_options().with_(moe_dispatch=name, grad_bytes=r.grad_bytes,
                                                         bucket_bytes=r.bucket_bytes))
        steps.append(run_estimate(r, lay, preset_topology(r), "megatron").step_time_s)
        assert steps[-1] == ref.step_time_s
    assert len(set(steps)) == 3  # 2 nodes: the deduplicating dispatchers send a token once per remote node
    for edit, words in ((dict(dispatcher="nccl"), "dispatcher='nccl'; valid: alltoall, deepep, hybridep"),
                        (dict(dispatcher="deepep", capacity_factor="1.0"), "DeepEP dropless only")):
        bad = [rows[0], {**rows[0], **edit}]
        with pytest.raises(ParacubeError, match=r"row 3 \(qwen3-30b-16-fp8\)") as err:
            read_runs(_write(tmp_path / "bad.csv", bad), tuple(PRESETS))
        assert words in str(err.value) and "\n" not in str(err.value)
