"""`paracube export`: each target's text equals its golden file (tests/golden/export/; regenerate with
PARACUBE_UPDATE_GOLDEN=1 after an intended change and review the diff), the scripts are valid shell, the
DeepSpeed config's batch arithmetic holds, and every refusal is one line, exit 2, nothing written.
The targets' own code checks the same exports in tests/test_export_targets.py (the [targets] extra)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from paracube.cli.main import main
from paracube.export import TARGETS, export_plan
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.plan import LaunchSpec, Plan, default_plan, load_plan
from paracube.workload import TrainingSpec

GOLDEN = Path(__file__).parent / "golden" / "export"
LAYOUT_13B = "dp=4,pp=4,tp=1d:4,mb=1,v=2,sp,zero=1,overlap"  # 64 GPUs: 8 nodes of 8
LAYOUT_13B_V1 = LAYOUT_13B.replace(",v=2", "")  # DeepSpeed's pipeline engine does not interleave


def plan_13b(layout: str = LAYOUT_13B) -> Plan:
    lay = parse_layout(layout)
    return Plan(PRESETS["gpt3-13b"], TrainingSpec(global_batch=512, dtype="bf16", recompute="selective"), lay,
                "dgx-a100", lay.world_size, LaunchSpec(nproc_per_node=8, nnodes=lay.world_size // 8))


def plan_for(target: str) -> Plan:
    """The 13B plan for the framework targets; paracube's own launch runs pp=1 plans (the default plan)."""
    if target in ("torchrun", "slurm"):
        lay = parse_layout("dp=2,tp=2d:2x2,mb=2")
        return Plan(PRESETS["tiny"], TrainingSpec(global_batch=8), lay, "dgx-a100", 8,
                    LaunchSpec(nproc_per_node=4, nnodes=2))
    return plan_13b(LAYOUT_13B_V1) if target == "deepspeed" else plan_13b()


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("PARACUBE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with PARACUBE_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text()


@pytest.mark.parametrize("target", TARGETS)
def test_export_equals_golden(target: str) -> None:
    result = export_plan(plan_for(target), target, plan_path="/jobs/plan.json", steps=50)
    check_golden(f"{target}.sh", result.text)
    assert result.text.startswith("#!/bin/bash\n")
    assert "written by paracube" in result.text and f"--to {target}" in result.text


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("target", TARGETS)
def test_exports_are_valid_shell(target: str, tmp_path: Path) -> None:
    script = tmp_path / "x.sh"
    script.write_text(export_plan(plan_for(target), target, plan_path="/jobs/plan.json").text)
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_megatron_arguments_follow_the_layout() -> None:
    text = export_plan(plan_13b(), "megatron").text
    args = dict(re.findall(r"--([a-z0-9-]+)(?: (\S+))? ?\\?$", text, flags=re.M))
    assert args["tensor-model-parallel-size"] == "4" and args["pipeline-model-parallel-size"] == "4"
    assert args["num-layers-per-virtual-pipeline-stage"] == str(40 // (4 * 2))
    assert args["micro-batch-size"] == "1" and args["global-batch-size"] == "512"
    assert args["recompute-granularity"] == "selective"
    for flag in ("sequence-parallel", "use-distributed-optimizer", "bf16", "overlap-grad-reduce",
                 "overlap-param-gather", "untie-embeddings-and-output-weights"):
        assert flag in args
    assert "--nnodes=8 --nproc-per-node=8" in text
    llama = Plan(PRESETS["llama2-70b"], TrainingSpec(global_batch=64, dtype="bf16", recompute="full"),
                 parse_layout("dp=2,pp=4,tp=1d:8,mb=1"), "dgx-a100", 64, LaunchSpec(8, 8))
    text = export_plan(llama, "megatron").text
    for flag in ("--swiglu", "--normalization RMSNorm", "--position-embedding-type rope", "--group-query-attention",
                 "--num-query-groups 8", "--recompute-granularity full", "--recompute-method uniform"):
        assert flag in text
    assert "--use-distributed-optimizer" not in text and "--sequence-parallel" not in text


def test_deepspeed_config_batch_arithmetic() -> None:
    plan = plan_for("deepspeed")
    text = export_plan(plan, "deepspeed").text
    config = json.loads(text.split("<<'JSON'\n")[1].split("\nJSON\n")[0])
    dp = plan.layout.dp
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                          * config["gradient_accumulation_steps"] * dp) == 512
    assert config["zero_optimization"]["stage"] == 1 and config["bf16"]["enabled"] is True
    assert config["zero_optimization"]["overlap_comm"] is True  # the layout's `overlap`
    assert "activation_checkpointing" in config and "--zero-stage 1" in text


def test_torchtitan_dp_shard_or_replicate() -> None:
    # zero=1 with pipelines: FSDP over all of dp, never resharded (pipelining keeps parameters and gradients
    # unsharded across micro-batches: ZeRO-1's memory; runtimes/torchtitan.py)
    text = export_plan(plan_13b(), "torchtitan").text
    assert "--parallelism.data_parallel_replicate_degree 1" in text
    assert "--parallelism.data_parallel_shard_degree 4" in text
    assert "--parallelism.fsdp_reshard_after_forward never" in text and "no ZeRO-1" not in text
    ddp = export_plan(plan_13b(LAYOUT_13B.replace("zero=1", "zero=0")), "torchtitan").text
    assert "--parallelism.data_parallel_replicate_degree 4" in ddp
    assert "--parallelism.data_parallel_shard_degree 1" in ddp
    assert "fsdp_reshard_after_forward" not in ddp
    replicated = export_plan(plan_13b("dp=16,tp=1d:4,mb=1,zero=1"), "torchtitan").text  # pp = 1: DDP, said so
    assert "--parallelism.data_parallel_replicate_degree 16" in replicated and "no ZeRO-1" in replicated
    assert "--parallelism.pipeline_parallel_schedule Interleaved1F1B" in text
    assert "--parallelism.enable_sequence_parallel \\\n" in text and text.endswith("activation_checkpoint:selective\n")
    fsdp = export_plan(plan_13b("dp=16,tp=1d:4,mb=1,zero=3"), "torchtitan").text
    assert "--parallelism.data_parallel_shard_degree 16" in fsdp and "replicate_degree 1" in fsdp
    assert "--parallelism.fsdp_reshard_after_forward always" in fsdp
    assert "pipeline_parallel_schedule" not in fsdp and "--parallelism.no_enable_sequence_parallel" in fsdp
    hsdp = export_plan(plan_13b("dp=16,tp=1d:4,mb=1,zero=2,shard=4"), "torchtitan").text
    assert "--parallelism.data_parallel_shard_degree 4" in hsdp and "replicate_degree 4" in hsdp
    assert "--parallelism.fsdp_reshard_after_forward never" in hsdp


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_writes_the_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = plan_13b().save(tmp_path / "p.json")
    out = tmp_path / "run.sh"
    code, _, err = run_cli(capsys, "export", str(plan_file), "--to", "megatron", "-o", str(out))
    assert code == 0 and "wrote" in err
    assert out.read_text() == export_plan(load_plan(plan_file), "megatron").text
    ds_file = plan_for("deepspeed").save(tmp_path / "ds.json")
    code, printed, _ = run_cli(capsys, "export", str(ds_file), "--to", "deepspeed")
    assert code == 0 and printed == export_plan(load_plan(ds_file), "deepspeed").text


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("paracube: error: ") and "Traceback" not in err
    return err


def test_refusals_are_one_line_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two_d = default_plan("dp=2,tp=2d:2x2,mb=2").save(tmp_path / "2d.json")
    out = tmp_path / "x.sh"
    for target in ("megatron", "torchtitan", "deepspeed"):
        err = refusal(capsys, "export", str(two_d), "--to", target, "-o", str(out))
        assert "tensor mode 2d" in err and "targets that run it: torchrun, slurm" in err
    pipelined = plan_13b().save(tmp_path / "13b.json")
    tied = replace(plan_13b(), model=replace(PRESETS["gpt3-13b"], tied_embeddings=True)).save(tmp_path / "t.json")
    # Tied embeddings with pp > 1 run at zero=1 (the copies summed before the reduce-scatter) and zero=0.
    assert run_cli(capsys, "export", str(tied), "--to", "torchrun", "-o", str(tmp_path / "t.sh"))[0] == 0
    tied0 = replace(plan_13b(LAYOUT_13B.replace("zero=1", "zero=0")),
                    model=replace(PRESETS["gpt3-13b"], tied_embeddings=True)).save(tmp_path / "t0.json")
    assert run_cli(capsys, "export", str(tied0), "--to", "torchrun", "-o", str(tmp_path / "t0.sh"))[0] == 0
    zero2 = plan_13b("dp=4,pp=4,tp=1d:4,mb=1,zero=2").save(tmp_path / "z2.json")
    err = refusal(capsys, "export", str(zero2), "--to", "deepspeed", "-o", str(out))
    assert "ZeRO stage 2 does not combine" in err and "targets that run it: megatron, torchtitan" in err
    err = refusal(capsys, "export", str(pipelined), "--to", "deepspeed", "-o", str(out))
    assert "without interleaving (v=1, not v=2)" in err
    two_d_zero = default_plan("dp=1,pp=2,tp=2.5d:2x2x2,mb=4,zero=3",  # zero=3, pp>1, tied: not run by paracube
                              replace(PRESETS["tiny"], tied_embeddings=True)).save(tmp_path / "2d-zero.json")
    assert "no export target runs it" in refusal(capsys, "export", str(two_d_zero), "--to", "slurm")
    assert "unknown export target 'nemo'" in refusal(capsys, "export", str(pipelined), "--to", "nemo", "-o", str(out))
    data = json.loads(pipelined.read_text())
    data["schema_version"] = 99
    (tmp_path / "v99.json").write_text(json.dumps(data))
    err = refusal(capsys, "export", str(tmp_path / "v99.json"), "--to", "megatron", "-o", str(out))
    assert "schema_version=99" in err
    err = refusal(capsys, "export", str(pipelined), "--to", "megatron", "-o", str(tmp_path / "nodir" / "x.sh"))
    assert "nodir" in err and "does not exist" in err
    assert not out.exists() and not (tmp_path / "nodir").exists()


def test_export_imports_no_torch(tmp_path: Path) -> None:
    """The export and schema modules never import torch (the CLI's own lazy import is tested with it)."""
    plan_file = plan_13b(LAYOUT_13B_V1).save(tmp_path / "p.json")  # a plan all three frameworks run
    code = ("import sys, argparse; import paracube.cli.export_cmd as e, paracube.cli.schema_cmd as s; "
            "from paracube.export import export_plan, TARGETS; from paracube.plan import load_plan; "
            f"p = load_plan({str(plan_file)!r}); [export_plan(p, t) for t in TARGETS[:3]]; "
            f"e.export_cmd(argparse.Namespace(plan={str(plan_file)!r}, to='megatron', out=None, steps=1, "
            "force=False)); "
            "s.schema_cmd(argparse.Namespace(which='plan')); "
            "assert not [m for m in sys.modules if m.startswith('torch')], 'torch imported'")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)


def test_every_plan_is_rechecked_against_the_target_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """A paracube plan (runtime paracube, as every plan before runtimes) is re-checked against the target's
    runtime too: zero=1 is refused by torchtitan (FSDP2 has no distributed optimizer), an interleaved pipeline by
    DeepSpeed; one line naming what the target's runtime cannot run, how to plan for it, nothing written."""
    out = tmp_path / "x.sh"
    zero1 = default_plan("dp=4,tp=1d:2,sp,mb=2,zero=1").save(tmp_path / "z1.json")
    err = refusal(capsys, "export", str(zero1), "--to", "torchtitan", "-o", str(out))
    assert "runtime torchtitan (FSDP2 + DTensor TP) does not run zero=1; valid: zero=0/3" in err
    assert "(made for runtime paracube; plan with --runtime torchtitan)" in err
    assert not out.exists()
    ok = default_plan("dp=4,tp=1d:2,sp,mb=2").save(tmp_path / "z0.json")
    assert run_cli(capsys, "export", str(ok), "--to", "torchtitan", "-o", str(out))[0] == 0 and out.exists()


@pytest.mark.parametrize(("runtime", "model", "gpus", "batch", "seq"), [
    ("torchtitan", "qwen3-30b-a3b", 64, 1024, None),  # its experts fold over dp_shard x cp x tp only
    ("torchtitan", "qwen3-30b-a3b", 256, 1024, None),  # its layers_per_stage split: not every interleaving
    ("megatron", "deepseek-v3", 1024, 512, None),  # 61 blocks on 8 x 7 virtual stages: --pipeline-model-parallel-layout
    # long sequences, so the MoE search takes cp: with the exchanges the stack runs (torchtitan's all-gather;
    # Transformer Engine's all-gather for sliding windows), where it wrote an unpinned cpc, priced as the ring
    ("torchtitan", "qwen3-30b-a3b", 64, 256, 32768),
    ("megatron", "gpt-oss-20b", 64, 256, 32768),
])
def test_a_plan_made_for_a_runtime_exports_to_it(runtime: str, model: str, gpus: int, batch: int,
                                                 seq: int | None) -> None:
    """The search offers only what the runtime's stack builds (runtimes/torchtitan_limits.py declares torchtitan's
    expert folding and pipeline split once, for its Runtime and its export): every ranked plan made for a runtime
    exports to that runtime's target."""
    from paracube.planner import search
    from paracube.runtimes import RUNTIMES
    from paracube.topologies import load_topology

    rt, spec = RUNTIMES[runtime], PRESETS[model]
    training = TrainingSpec(global_batch=batch, dtype="bf16", seq_len=seq)
    ranked = search(spec, training, load_topology("dgx-h100", gpus=gpus), gpus, runtime=rt,
                    recomputes=["none", "selective", "full"], memory_headroom=0.1).ranked
    assert ranked and (seq is None or any(lay.cp > 1 for lay, _ in ranked))
    for lay, _ in ranked:
        plan = Plan(spec, training, lay, "dgx-h100", gpus, LaunchSpec(nproc_per_node=8, nnodes=gpus // 8),
                    runtime=runtime)
        assert export_plan(plan, rt.export_target).text


def test_torchtitan_refuses_a_split_it_cannot_build_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3's 61 blocks on 8 x 7 virtual stages (1, 2 x 5, 1 x 50): torchtitan's layers_per_stage split
    cannot place them; its runtime says so in one line (exit 2), before any pricing."""
    code = main(["simulate", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "256", "--runtime",
                 "torchtitan", "--layout", "dp=32,pp=8,ep=8,tp=none,mb=1,v=7,zero=1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "runtime torchtitan" in err and "1, 2 x 5, 1 x 50" in err
