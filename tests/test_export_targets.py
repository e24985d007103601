"""The exports fed to their targets' own code (the `[targets]` extra: torchtitan 0.3.0, deepspeed 0.19.8,
megatron-core 0.16.1; `pip install -e ".[targets]"`, see pyproject.toml and .ci/run).

For every plan in PLANS and every framework target: either the export is refused in one line naming the target
(and the refusal is the one EXPECTED_REFUSALS lists), or the exported text is parsed back (the argument list the
script runs, shell variables expanded; the ds_config its heredoc writes) and handed to the target's validator:
- torchtitan: `ConfigManager().parse_args(args)` (tyro: an unknown or misplaced flag exits), then its
  ParallelDims (degrees x = world), its pipeline stage split (`_get_pipeline_metadata`, the check `torchtitan.train`
  runs before building stages) and its schedule name lookup;
- DeepSpeed: DeepSpeedConfig's checks (deepspeed_config below) with the plan's dp world size (batch arithmetic,
  ZeRO options; its pydantic models forbid unknown keys), and every top-level / activation-checkpointing key is
  one DeepSpeed names in its constants (DeepSpeedConfig ignores unknown top-level keys);
- megatron-core: each `--flag` of the Megatron script is looked up in MEGATRON_FLAGS (a flag not in the table
  fails the test) and set on TransformerConfig (ModelParallelConfig's fields included), DistributedDataParallelConfig
  or OptimizerConfig, whose __post_init__ checks run; flags read by Megatron-LM's training loop only (not shipped
  in megatron-core) are listed with that reason.
Then the parsed values are compared with the plan (every knob the target has is written and read back).
Without the extra, the tests are skipped with that reason, unless PARACUBE_TARGETS=1 (.ci/run sets it) makes a
missing target an error.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from paracube.cost_models.moe_dispatch import dispatch_of
from paracube.errors import ParacubeError
from paracube.export import export_plan
from paracube.export.common import EXPRESSIBLE, accumulation_steps
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.buckets import BUCKET_BYTES, GRAD_BYTES
from paracube.modes.stages import chunk_layers
from paracube.plan import LaunchSpec, Plan
from paracube.runtimes import get_runtime
from paracube.workload import TrainingSpec

FRAMEWORKS = ("torchtitan", "deepspeed", "megatron")


def make(model: str, layout: str, batch: int = 512, dtype: str = "bf16", recompute: str = "selective",
         tied: bool | None = None, runtime: str = "paracube") -> Plan:
    spec = PRESETS[model] if tied is None else replace(PRESETS[model], tied_embeddings=tied)
    lay = parse_layout(layout)
    return Plan(spec, TrainingSpec(global_batch=batch, dtype=dtype, recompute=recompute), lay, "dgx-a100",
                lay.world_size, LaunchSpec(nproc_per_node=8, nnodes=max(1, lay.world_size // 8)), runtime=runtime)


PLANS: dict[str, Plan] = {
    "issue-13b-pp-sp": make("gpt3-13b", "dp=4,pp=2,tp=1d:8,mb=1,sp"),
    "interleave-zero1-overlap": make("gpt3-13b", "dp=4,pp=4,tp=1d:4,mb=1,v=2,sp,zero=1,overlap"),
    "zero1-hsdp-pp": make("gpt3-13b", "dp=8,pp=2,tp=1d:4,mb=1,zero=1,shard=4,overlap", recompute="full"),
    "zero2-overlap": make("gpt3-6.7b", "dp=8,tp=1d:8,mb=2,sp,zero=2,overlap", batch=256),
    "zero3": make("gpt3-13b", "dp=16,tp=1d:4,mb=1,zero=3"),
    "zero3-hsdp-overlap": make("llama2-13b", "dp=16,tp=1d:4,mb=1,zero=3,shard=4,overlap", batch=256),
    "tpo-pp": make("gpt3-13b", "dp=2,pp=2,tp=1d:8,mb=1,sp,tpo", batch=64),
    "tpo-without-sp": make("gpt3-13b", "dp=8,tp=1d:8,mb=1,tpo", batch=64),
    "fp16-full": make("gpt3-13b", "dp=8,pp=2,tp=1d:4,mb=2", batch=256, dtype="fp16", recompute="full"),
    "llama-gqa-full": make("llama2-70b", "dp=2,pp=4,tp=1d:8,mb=1", batch=64, recompute="full"),
    "llama-tied-zero1": make("llama2-7b", "dp=4,tp=1d:2,mb=2,sp,zero=1,overlap", batch=64, tied=True),
    "gpt-tied-fp32-dp": make("gpt3-1.3b", "dp=8,mb=4,fa=0", batch=64, dtype="fp32", recompute="none", tied=True),
    # MoE (cost_models/moe.py; export/moe_flags.py): Qwen3's experts with ep, DeepSeek-V3's MLA, shared expert,
    # dense first blocks and sigmoid routing with ep x etp folded over dp x tp
    "moe-qwen3-ep": make("qwen3-30b-a3b", "dp=8,pp=2,ep=4,tp=1d:2,mb=1,sp,zero=1,overlap", batch=256),
    # a capacity factor (token drop): Megatron drops and pads, Megatron-DeepSpeed takes it, torchtitan refuses it
    "moe-token-drop": replace(make("mixtral-8x7b", "dp=8,ep=8,tp=1d:2,mb=1,sp,zero=1,overlap", batch=256,
                                   runtime="megatron"),
                              model=replace(PRESETS["mixtral-8x7b"], moe=replace(PRESETS["mixtral-8x7b"].moe,
                                                                                 capacity_factor=1.25))),
    "moe-qwen3-fsdp-ep": make("qwen3-30b-a3b", "dp=8,ep=8,tp=1d:2,mb=1,sp,zero=3,overlap", batch=256),
    # tpo with MoE blocks (a pinned tpo the MoE search keeps; no shared expert: no MLP ring, moe_unshared.py)
    "moe-qwen3-tpo": make("qwen3-30b-a3b", "dp=8,pp=2,ep=8,tp=1d:4,mb=1,sp,zero=1,overlap,tpo", batch=256),
    "moe-deepseek-mla-etp": make("deepseek-v3", "dp=16,ep=8,etp=2,tp=1d:2,mb=1,sp,zero=1,overlap", batch=256),
    # what `paracube plan --model deepseek-v3 --cluster dgx-h100 --gpus 1024` chose with paracube's runtime before
    # the all_to_all crossed nodes through each rank's own NIC (cost_models/moe_a2a.py; it now keeps ep in a node)
    "moe-deepseek-paracube": make("deepseek-v3", "dp=128,ep=256,tp=1d:8,mb=2,sp,zero=1,overlap", recompute="none"),
    # made for megatron: DeepEP's flex dispatcher and DeepSeek-V3's node-limited routing (cost_models/moe_dispatch.py)
    "moe-deepseek-megatron-deepep": make("deepseek-v3", "dp=16,ep=8,tp=1d:2,mb=1,sp,zero=1,overlap", batch=256,
                                         runtime="megatron"),
    # context parallelism (issue #24): the ring (megatron's p2p) and the all-gather (megatron's all_gather,
    # torchtitan's allgather rotation), with pipelines; fp8 alone and with cp
    "cp-ring-fp8": make("llama2-7b", "dp=4,cp=2,tp=1d:2,mb=1,sp", batch=64, dtype="fp8"),
    "cp-ag-pp": make("llama2-13b", "dp=2,pp=2,cp=4,cpc=ag,tp=1d:2,mb=1", batch=64),
    "cp-ag-fp8-tpo": make("llama2-7b", "dp=2,cp=2,cpc=ag,tp=1d:4,mb=1,sp,tpo", batch=64, dtype="fp8"),
    "fp8-zero1": make("gpt3-13b", "dp=8,tp=1d:8,mb=1,sp,zero=1,overlap", batch=64, dtype="fp8"),
    # the MoE all_to_alls overlapped with another micro-batch's compute (megatron's combined 1F1B, interleaved)
    "moe-a2a-overlap": make("qwen3-30b-a3b", "dp=8,pp=2,v=2,ep=4,tp=1d:2,mb=1,sp,zero=1,overlap,a2ao", batch=256,
                            runtime="megatron"),
    # sliding-window attention (export/window_flags.py): GPT-OSS's "WF" as the published 26.04 run's layout, and
    # folded for torchtitan's gpt_oss module; a dense model windowed in every block with cp (all-gather)
    "window-gpt-oss-pp-ep": make("gpt-oss-120b", "dp=16,pp=4,ep=8,tp=none,mb=1,zero=1,overlap", batch=1280,
                                 recompute="none", runtime="megatron"),
    "window-gpt-oss-fsdp-ep": make("gpt-oss-20b", "dp=8,ep=8,tp=none,mb=1,zero=3,overlap", batch=256),
    "window-all-cp-ag": replace(make("llama2-7b", "dp=2,cp=2,cpc=ag,tp=1d:2,mb=1,sp", batch=64),
                                model=replace(PRESETS["llama2-7b"], sliding_window=1024)),
    # Llama 4 (export/llama4_flags.py): Scout's NoPE every 4th block and L2 q / k norm, Maverick's MoE at odd blocks
    # (--moe-layer-freq as a list), a shared expert, sigmoid top-1 routing
    "llama4-scout-ep": make("llama4-scout", "dp=8,ep=8,tp=none,mb=1,zero=3,overlap", batch=256),
    "llama4-maverick-pp-ep": make("llama4-maverick", "dp=8,pp=2,ep=8,tp=1d:2,mb=1,sp,zero=1,overlap", batch=256,
                                  runtime="megatron"),
    # activation offloading (Layout off=N, runtimes/offload.py): Megatron-core's first N < layers layers without
    # recomputation; DeepSpeed's cpu_checkpointing, every checkpoint but the last, with full recomputation only
    "offload-megatron": make("llama2-7b", "dp=8,tp=none,mb=1,off=16", batch=64, recompute="none", runtime="megatron"),
    "offload-deepspeed": make("llama2-7b", "dp=8,tp=1d:2,mb=1,off=31", batch=64, recompute="full",
                              runtime="deepspeed"),
    # selective recomputation by module (rcm=, recompute_modules.py): Megatron-core's --recompute-modules, as
    # NVIDIA's GPT-OSS / Qwen3 recipes run it; torchtitan and DeepSpeed have none
    "rcm-qwen3-megatron": make("qwen3-30b-a3b", "dp=8,ep=8,tp=none,mb=1,zero=3,overlap,rcm=layernorm+moe_act",
                               batch=256, runtime="megatron"),
    # uneven pipeline splits (modes/stages.py; export/pipeline_split.py): Llama 3 405B's 126 blocks on 16 stages (one
    # less on the first and the last), interleaved and not; DeepSeek-V3's 61 blocks on 8 x 7 virtual stages (what
    # the MoE search picks for 1024 H100s: 1, 2 x 5, 1 x 50), which torchtitan's split cannot place
    "uneven-pp": make("llama3-405b", "dp=2,pp=16,tp=1d:8,mb=1,sp,zero=1", batch=64),
    "uneven-pp-interleaved": make("llama3-405b", "dp=2,pp=16,tp=1d:8,mb=1,v=4,sp,zero=1", batch=64),
    "uneven-moe-interleaved": make("deepseek-v3", "dp=16,pp=8,ep=8,tp=1d:2,mb=1,v=7,sp,zero=1,overlap", batch=256,
                                   runtime="megatron"),
}

# (plan, target) -> a phrase of the one-line refusal; every other pair must export and validate.
EXPECTED_REFUSALS: dict[tuple[str, str], str] = {
    ("interleave-zero1-overlap", "deepspeed"): "without interleaving",
    ("zero1-hsdp-pp", "deepspeed"): "zero=3 only",
    ("zero3-hsdp-overlap", "megatron"): "partial distributed optimizer",
    ("tpo-pp", "deepspeed"): "(tpo)",
    ("tpo-without-sp", "deepspeed"): "(tpo)",
    ("tpo-without-sp", "megatron"): "needs sequence parallelism",
    ("tpo-without-sp", "torchtitan"): "it needs sp",
    ("fp16-full", "torchtitan"): "not fp16",
    ("moe-deepseek-mla-etp", "torchtitan"): "no tensor parallelism inside experts",
    ("moe-a2a-overlap", "torchtitan"): "(a2ao)",
    ("moe-token-drop", "torchtitan"): "its MoE blocks run dropless, without a capacity factor (capacity_factor=1.25)",
    ("moe-qwen3-tpo", "deepspeed"): "(tpo)",
    ("moe-a2a-overlap", "deepspeed"): "without interleaving",
    ("moe-deepseek-mla-etp", "deepspeed"): "no tensor parallelism inside experts",
    ("moe-deepseek-paracube", "torchtitan"): "its experts fold over dp_shard x cp x tp",
    ("moe-deepseek-paracube", "deepspeed"): "no multi-head latent attention",
    ("moe-deepseek-megatron-deepep", "torchtitan"): "its experts fold over dp_shard x cp x tp",
    ("moe-deepseek-megatron-deepep", "deepspeed"): "no multi-head latent attention",
    ("cp-ring-fp8", "torchtitan"): "cpc=ag, not cpc=p2p",
    ("cp-ring-fp8", "deepspeed"): "no context parallelism",
    ("cp-ag-pp", "deepspeed"): "no context parallelism",
    ("cp-ag-fp8-tpo", "deepspeed"): "(tpo)",
    ("fp8-zero1", "deepspeed"): "it has no FP8 training",
    ("window-gpt-oss-pp-ep", "deepspeed"): "no sliding-window attention",
    ("window-gpt-oss-fsdp-ep", "deepspeed"): "no sliding-window attention",
    ("window-all-cp-ag", "torchtitan"): "its only sliding windows are its gpt_oss module's",
    ("window-all-cp-ag", "deepspeed"): "no context parallelism",
    ("llama4-scout-ep", "deepspeed"): "no NoPE blocks or the L2 q / k norm",
    ("llama4-maverick-pp-ep", "deepspeed"): "no NoPE blocks or router scores on the experts' input",
    ("offload-megatron", "torchtitan"): "does not offload activations to the host (off=16)",
    ("offload-megatron", "deepspeed"): "offloads activations with rc=full only, not rc=none (off=16)",
    ("offload-deepspeed", "torchtitan"): "does not offload activations to the host (off=31)",
    ("offload-deepspeed", "megatron"): "offloads activations with rc=none only, not rc=full (off=31)",
    ("rcm-qwen3-megatron", "torchtitan"): "no recomputation by module (rcm=layernorm+moe_act",
    ("rcm-qwen3-megatron", "deepspeed"): "no recomputation by module (rcm=layernorm+moe_act",
    ("uneven-pp-interleaved", "deepspeed"): "without interleaving",
    ("uneven-moe-interleaved", "torchtitan"): "the first / last stage's less layers: 1, 2 x 5, 1 x 50;",
    ("uneven-moe-interleaved", "deepspeed"): "without interleaving",
}

TARGET_MODULES = {"torchtitan": "torchtitan.config", "deepspeed": "deepspeed.runtime.config",
                  "megatron": "megatron.core.transformer.transformer_config"}


def need(target: str) -> None:
    """Import the target or skip (fail when PARACUBE_TARGETS=1: CI installs the extra)."""
    if target == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read at deepspeed's import; this machine has no GPU
    try:
        importlib.import_module(TARGET_MODULES[target])
    except ImportError as e:
        if os.environ.get("PARACUBE_TARGETS") == "1":
            raise
        pytest.skip(f"{target} is not installed (pip install -e '.[targets]'): {e}")


# --- reading the export back ------------------------------------------------------------------------------

def script_words(text: str, after: str, env: dict[str, str]) -> list[str]:
    """The words of the command following `after` in the script, as bash would pass them: line continuations
    joined, "$VAR" from `env`, "${VAR:-default}" as its default (the variables the script leaves to the user)."""
    command = text[text.index(after) + len(after):].replace("\\\n", " ")
    command = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), command)
    command = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], command)
    return shlex.split(command)


MANY_VALUES = ("--recompute-modules",)  # Megatron-LM's nargs="*" flags the export writes


def flag_values(words: list[str]) -> list[tuple[str, str | None]]:
    """[(--flag, value or None)] in order; a value is a word that does not start with --."""
    out: list[tuple[str, str | None]] = []
    for word in words:
        if word.startswith("--"):
            out.append((word, None))
        else:
            many = out and out[-1][0] in MANY_VALUES  # a list-valued flag (nargs="*"): its words joined by spaces
            assert out and (out[-1][1] is None or many), f"stray word {word!r} in the Megatron command"
            out[-1] = (out[-1][0], word if out[-1][1] is None else f"{out[-1][1]} {word}")
    return out


def exported(plan_name: str, target: str) -> str | None:
    """The export's text, or None where EXPECTED_REFUSALS says the target refuses the plan."""
    if (plan_name, target) in EXPECTED_REFUSALS:
        return None
    return export_plan(PLANS[plan_name], target).text


@pytest.mark.parametrize("target", FRAMEWORKS)
def test_each_target_refuses_exactly_the_expected_plans(target: str) -> None:
    """Runs without the extra: which (plan, target) pairs are refused, each in one line naming the target."""
    for name, plan in PLANS.items():
        expected = EXPECTED_REFUSALS.get((name, target))
        if expected is None:
            assert EXPRESSIBLE[target](plan) is None, f"{target} refuses {name}: {EXPRESSIBLE[target](plan)}"
            continue
        with pytest.raises(ParacubeError) as refused:
            export_plan(plan, target)
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"{target} cannot run layout") and expected in message


# --- torchtitan 0.3.0 --------------------------------------------------------------------------------------

def torchtitan_parse(args: list[str]) -> Any:
    from torchtitan.config import ConfigManager

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            return ConfigManager().parse_args(args)
    except SystemExit:  # tyro's way of refusing a flag or a value
        pytest.fail(f"torchtitan's ConfigManager refused the export's arguments:\n{err.getvalue()[-3000:]}")


@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan_config_manager_accepts_the_export(name: str) -> None:
    need("torchtitan")
    text = exported(name, "torchtitan")
    if text is None:
        return
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    plan = PLANS[name]
    lay, t = plan.layout, plan.training
    # llama3_debugmodel stands for the user's MODEL_CONFIG: the flags override what the plan sets; a windowed model
    # runs in the gpt_oss module (its only one with sliding windows: export/window_flags.py), gpt_oss_20b standing in
    windowed = plan.model.sliding_window is not None
    module = {"MODEL_MODULE": "gpt_oss", "MODEL_CONFIG": "gpt_oss_20b"} if windowed else {
        "MODEL_MODULE": "llama3", "MODEL_CONFIG": "llama3_debugmodel"}
    config = torchtitan_parse(script_words(text, "-m torchtitan.train", module))
    if windowed:  # its blocks' windows are the plan's (over GPT-OSS-20B's 24 blocks; a 120B plan has 36)
        blocks = config.model_spec.model.layers
        assert len(blocks) == plan.model.layers or plan.model.layers > len(blocks) == 24
        assert [block.attention.sliding_window_size for block in blocks] == [
            plan.model.attention_window(i) for i in range(len(blocks))]
    par, tr = config.parallelism, config.training
    dims = ParallelDims.from_config(par, world_size=plan.gpus)  # asserts the degrees multiply to the world
    # FSDP at zero=2/3, and at zero=1 with pipelines (kept unsharded across micro-batches: runtimes/torchtitan.py)
    shard = lay.shard_size if lay.zero >= 2 else lay.dp if lay.zero == 1 and lay.pp > 1 else 1
    assert (dims.dp_shard, dims.dp_replicate, dims.tp, dims.pp) == (shard, lay.dp // shard, lay.tensor_size, lay.pp)
    assert dims.ep == lay.ep and dims.cp == lay.cp
    assert par.enable_sequence_parallel == lay.sequence_parallel
    fsdp_stage = lay.zero if lay.zero >= 2 else 2 if shard > 1 else 0
    assert par.fsdp_reshard_after_forward == {2: "never", 3: "always"}.get(fsdp_stage, "default")
    assert config.compile.enable_async_tensor_parallel == lay.tpo and config.compile.enable == lay.tpo
    assert tr.seq_len == plan.seq_len and tr.global_batch_size == t.global_batch
    assert tr.mixed_precision_param == {"bf16": "bfloat16", "fp32": "float32", "fp8": "bfloat16"}[t.dtype]
    assert ("Float8LinearConverter" in text) == (t.dtype == "fp8")
    if t.dtype == "fp8":
        torchtitan_float8(text)
    ac = type(config.activation_checkpoint).__qualname__ if config.activation_checkpoint is not None else "None"
    assert ac == {"none": "None", "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[t.recompute]
    # torchtitan's batch arithmetic (trainer.py): accumulation = global / (local x dp), micro-batches = local / mb.
    accumulation = t.global_batch // (tr.local_batch_size * lay.dp)
    assert accumulation * tr.local_batch_size * lay.dp == t.global_batch
    if lay.pp > 1:
        assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == accumulation_steps(plan)
        assert par.pipeline_parallel_microbatch_size == plan.micro_batch and accumulation == 1
        schedule = get_schedule_class(par.pipeline_parallel_schedule)
        assert (schedule.__name__ == "ScheduleInterleaved1F1B") == (lay.interleave > 1)
        stages, layers, first, last = _get_pipeline_metadata(dims, par,
                                                             SimpleNamespace(layers=[None] * plan.model.layers))
        assert (stages, layers) == (lay.pp * lay.interleave, plan.model.layers)
        # torchtitan's own split places paracube's blocks per virtual stage (modes/stages.py)
        from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part
        parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
        assert [sum(name.startswith("layers.") for name in part) for part in parts] == chunk_layers(
            plan.model.layers, lay.pp, lay.interleave)
    else:
        assert tr.local_batch_size == plan.micro_batch and accumulation == accumulation_steps(plan)


def torchtitan_float8(text: str) -> None:
    """The converter list the fp8 export asks MODEL_CONFIG's model_registry for, built with torchtitan's own
    classes: a Float8LinearConverter.Config whose recipe is one its Literal offers (rowwise: dynamic scaling, the
    scaling the export notes as differing), in an order its validate_converter_order accepts, whose filter (its
    module_filter_fn) keeps the head bf16, as paracube prices it, and converts the block linears. (Building the
    converter needs torchao and an FP8 GPU; the config is what the script hands it.)"""
    import typing

    from torchtitan.components.quantization import Float8LinearConverter
    from torchtitan.components.quantization.utils import module_filter_fn
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.utils import validate_converter_order

    listed = re.search(r"converters=(\[.*?\]) \(", text)
    assert listed, "the fp8 export names no converters list"
    converters = eval(listed.group(1), {"Float8LinearConverter": Float8LinearConverter})  # noqa: S307
    validate_converter_order(converters)
    (config,) = converters
    assert isinstance(config, Float8LinearConverter.Config)
    recipes = typing.get_args(typing.get_type_hints(Float8LinearConverter.Config)["recipe_name"])
    assert config.recipe_name in recipes and config.recipe_name == "rowwise"
    block, head = Linear.Config(in_features=4096, out_features=4096), Linear.Config(in_features=4096,
                                                                                      out_features=32000)
    assert module_filter_fn(block, "layers.0.attention.wq", config.filter_fqns)
    assert not module_filter_fn(head, "lm_head", config.filter_fqns)
    assert "delayed scaling" in text and "dynamically" in text  # the export says the recipe differs


def test_torchtitan_refuses_what_the_old_export_wrote() -> None:
    """The issue's rejected flags stay rejected by torchtitan itself: the check above can fail."""
    need("torchtitan")
    from torchtitan.config import ConfigManager

    base = ["--module", "llama3", "--config", "llama3_debugmodel"]
    for bad in (["--parallelism.enable_sequence_parallel", "True"], ["--parallelism.num_pp_microbatches", "16"],
                ["--activation_checkpoint.mode", "none"]):
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
            ConfigManager().parse_args(base + bad)


# --- DeepSpeed 0.19.8 --------------------------------------------------------------------------------------

def deepspeed_config(config: dict, dp: int) -> Any:
    """DeepSpeedConfig(config, mpu) with `dp` as the data-parallel world size that mpu reports.

    DeepSpeedConfig.__init__ (deepspeed/runtime/config.py, 0.19.8) asks deepspeed.comm for the rank before it
    reads mpu, and an initialised deepspeed.comm on a CPU machine JIT-compiles DeepSpeed's shared-memory C++ op
    (minutes on a loaded machine, and a killed build leaves a lock later runs wait on). So this runs the body of
    __init__ that follows that query, unchanged and in its order: the removed-key check, then _initialize_params,
    _configure_train_batch_size and _do_sanity_check, with world_size = dp as __init__ sets it from mpu."""
    from deepspeed.runtime.config import DeepSpeedConfig, _reject_removed_config_keys

    ds = DeepSpeedConfig.__new__(DeepSpeedConfig)
    ds._param_dict = config
    _reject_removed_config_keys(config)
    ds.global_rank, ds.world_size = 0, dp
    ds._initialize_params(copy.copy(config))
    ds._configure_train_batch_size()
    ds._do_sanity_check()
    return ds


def deepspeed_names(*modules: str) -> set[str]:
    names: set[str] = set()
    for module in modules:
        names |= {v for k, v in vars(importlib.import_module(module)).items() if k.isupper() and isinstance(v, str)}
    return names


@pytest.mark.parametrize("name", list(PLANS))
def test_deepspeed_config_accepts_the_export(name: str) -> None:
    need("deepspeed")
    text = exported(name, "deepspeed")
    if text is None:
        return
    plan = PLANS[name]
    lay = plan.layout
    config = json.loads(text.split("<<'JSON'\n")[1].split("\nJSON\n")[0])
    top = deepspeed_names("deepspeed.runtime.constants", "deepspeed.runtime.zero.config",
                          "deepspeed.runtime.precision_config", "deepspeed.runtime.activation_checkpointing.config")
    assert set(config) <= top, f"keys DeepSpeed does not read: {set(config) - top}"
    checkpointing = deepspeed_names("deepspeed.runtime.activation_checkpointing.config")
    assert set(config.get("activation_checkpointing", {})) <= checkpointing
    ds = deepspeed_config(config, lay.dp)
    assert ds.world_size == lay.dp
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (
        plan.training.global_batch, plan.micro_batch, accumulation_steps(plan))
    zero = ds.zero_config
    assert int(zero.stage) == lay.zero
    assert (ds.bfloat16_config.enabled, ds.float16_config.enabled) == (plan.training.dtype == "bf16",
                                                                       plan.training.dtype == "fp16")
    if lay.zero:
        assert zero.overlap_comm == lay.overlap and zero.reduce_scatter
        assert zero.contiguous_gradients or lay.zero < 2
        assert zero.reduce_bucket_size == BUCKET_BYTES // GRAD_BYTES
        assert zero.zero_hpz_partition_size == (lay.shard or 1)
    assert ("--deepspeed-activation-checkpointing" in text) == (plan.training.recompute == "full")
    assert config.get("activation_checkpointing", {}).get("cpu_checkpointing", False) == bool(lay.offload)


def test_deepspeed_refuses_a_wrong_config() -> None:
    """DeepSpeedConfig's checks bite: a batch that is not micro x accumulation x dp, an unknown ZeRO option, a
    removed one (MiCS)."""
    need("deepspeed")
    good = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
            "zero_optimization": {"stage": 2}}
    assert deepspeed_config(good, 8).world_size == 8
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        deepspeed_config(good, 4)
    with pytest.raises(ValueError, match="made_up"):  # pydantic's ValidationError is a ValueError
        deepspeed_config({**good, "zero_optimization": {"stage": 2, "made_up": 1}}, 8)
    with pytest.raises(Exception, match="mics_shard_size"):
        deepspeed_config({**good, "zero_optimization": {"stage": 3, "mics_shard_size": 2}}, 8)


# --- megatron-core 0.16.1 ----------------------------------------------------------------------------------

def _int(v: str | None) -> int:
    assert v is not None
    return int(v)


def _float(v: str | None) -> float:
    assert v is not None
    return float(v)


def _str(v: str | None) -> str:
    assert v is not None
    return v


def _on(v: str | None) -> bool:
    assert v is None, f"a switch takes no value ({v!r})"
    return True


def _off(v: str | None) -> bool:
    return not _on(v)


def _backend(v: str | None) -> Any:
    from megatron.core.transformer.enums import AttnBackend

    return AttnBackend[_str(v)]


def _quick_gelu(v: str | None) -> Any:
    from megatron.core.activations import quick_gelu

    _on(v)
    return quick_gelu


def _silu(v: str | None) -> Any:
    import torch.nn.functional as F

    _on(v)
    return F.silu


def _literal(field: str, v: str) -> str:
    """v, one of the values TransformerConfig's Literal annotation of `field` offers (its __post_init__ does not
    check them: Transformer Engine would, on a GPU)."""
    import typing

    from megatron.core.transformer.transformer_config import TransformerConfig

    offered = [a for arg in typing.get_args(typing.get_type_hints(TransformerConfig)[field])
               for a in (typing.get_args(arg) or (arg,))]
    assert v in offered, f"TransformerConfig.{field} takes {offered}, not {v!r}"
    return v


def _documented_cp_comm_type(v: str) -> str:
    """v, one of the cp_comm_type values TransformerConfig's source documents (a str, unchecked there; Transformer
    Engine's attention dispatches on these names)."""
    import inspect

    from megatron.core.transformer.transformer_config import TransformerConfig

    line = re.search(r"cp_comm_type of each layer can be (.*)\.", inspect.getsource(TransformerConfig))
    assert line, "megatron-core no longer documents cp_comm_type's values"
    valid = re.findall(r'"([^"]+)"', line.group(1))
    assert v in valid, f"cp_comm_type takes {valid}, not {v!r}"
    return v


# --flag -> [(config, field, value from the flag's text)]; config: "tc" TransformerConfig (with
# ModelParallelConfig's fields), "ddp" DistributedDataParallelConfig, "opt" OptimizerConfig, "model" GPTModel's
# constructor arguments (checked against its signature), "derived" a field computed from the flag (below), "run"
# read only by Megatron-LM's training loop, rank mapping, data or tokenizer code, which megatron-core 0.16.1 does
# not ship (their values are checked against the plan where the plan has them). Mirrors Megatron-LM's
# core_transformer_config_from_args.
Conv = Callable[[str | None], Any]
MEGATRON_FLAGS: dict[str, list[tuple[str, str, Conv]]] = {
    "--tensor-model-parallel-size": [("tc", "tensor_model_parallel_size", _int)],
    "--pipeline-model-parallel-size": [("tc", "pipeline_model_parallel_size", _int)],
    "--num-layers-per-virtual-pipeline-stage": [("derived", "virtual_pipeline_model_parallel_size", _int)],
    "--pipeline-model-parallel-layout": [("tc", "pipeline_model_parallel_layout", _str)],
    "--sequence-parallel": [("tc", "sequence_parallel", _on)],
    "--tp-comm-overlap": [("tc", "tp_comm_overlap", _on)],
    "--use-tp-pp-dp-mapping": [("run", "use_tp_pp_dp_mapping", _on)],
    "--micro-batch-size": [("run", "micro_batch_size", _int)],
    "--global-batch-size": [("run", "global_batch_size", _int)],
    "--recompute-granularity": [("tc", "recompute_granularity", _str)],
    "--recompute-method": [("tc", "recompute_method", _str)],
    "--recompute-num-layers": [("tc", "recompute_num_layers", _int)],
    "--recompute-modules": [("tc", "recompute_modules", lambda v: _str(v).split())],
    "--attention-backend": [("tc", "attention_backend", _backend)],
    "--bf16": [("tc", "bf16", _on), ("opt", "bf16", _on)],
    "--fp16": [("tc", "fp16", _on), ("opt", "fp16", _on)],
    "--accumulate-allreduce-grads-in-fp32": [("ddp", "grad_reduce_in_fp32", _on)],
    "--ddp-bucket-size": [("ddp", "bucket_size", _int)],
    "--use-distributed-optimizer": [("ddp", "use_distributed_optimizer", _on), ("opt", "use_distributed_optimizer",
                                                                                 _on)],
    "--num-distributed-optimizer-instances": [("ddp", "num_distributed_optimizer_instances", _int)],
    "--use-megatron-fsdp": [("ddp", "use_megatron_fsdp", _on)],
    "--data-parallel-sharding-strategy": [("ddp", "data_parallel_sharding_strategy", _str)],
    "--overlap-grad-reduce": [("ddp", "overlap_grad_reduce", _on)],
    "--overlap-param-gather": [("ddp", "overlap_param_gather", _on)],
    "--num-layers": [("tc", "num_layers", _int)],
    "--hidden-size": [("tc", "hidden_size", _int)],
    "--num-attention-heads": [("tc", "num_attention_heads", _int)],
    "--ffn-hidden-size": [("tc", "ffn_hidden_size", _int)],
    "--hidden-dropout": [("tc", "hidden_dropout", _float)],
    "--attention-dropout": [("tc", "attention_dropout", _float)],
    "--normalization": [("tc", "normalization", _str)],
    "--swiglu": [("tc", "gated_linear_unit", _on), ("tc", "activation_func", _silu)],
    "--disable-bias-linear": [("tc", "add_bias_linear", _off)],
    # GPT-OSS (export/oss_flags.py): Megatron-LM's --quick-geglu sets gated_linear_unit and activation_func quick_gelu
    "--softmax-type": [("tc", "softmax_type", _str)],
    "--quick-geglu": [("tc", "gated_linear_unit", _on), ("tc", "activation_func", _quick_gelu)],
    "--glu-linear-offset": [("tc", "glu_linear_offset", _float)],
    "--activation-func-clamp-value": [("tc", "activation_func_clamp_value", _float)],
    "--group-query-attention": [("run", "group_query_attention", _on)],
    "--num-query-groups": [("tc", "num_query_groups", _int)],
    "--seq-length": [("model", "max_sequence_length", _int)],
    "--max-position-embeddings": [("run", "max_position_embeddings", _int)],
    "--position-embedding-type": [("model", "position_embedding_type", _str)],
    "--untie-embeddings-and-output-weights": [("model", "share_embeddings_and_output_weights", _off)],
    "--make-vocab-size-divisible-by": [("run", "make_vocab_size_divisible_by", _int)],
    "--tokenizer-type": [("run", "tokenizer_type", _str)],
    "--tokenizer-model": [("run", "tokenizer_model", _str)],
    "--vocab-file": [("run", "vocab_file", _str)],
    "--merge-file": [("run", "merge_file", _str)],
    "--data-path": [("run", "data_path", _str)],
    "--split": [("run", "split", _str)],
    "--train-iters": [("run", "train_iters", _int)],
    "--lr": [("opt", "lr", _float)],
    "--min-lr": [("opt", "min_lr", _float)],
    "--lr-decay-style": [("run", "lr_decay_style", _str)],
    "--lr-warmup-fraction": [("run", "lr_warmup_fraction", _float)],
    "--weight-decay": [("opt", "weight_decay", _float)],
    "--adam-beta1": [("opt", "adam_beta1", _float)],
    "--adam-beta2": [("opt", "adam_beta2", _float)],
    "--clip-grad": [("opt", "clip_grad", _float)],
    "--log-interval": [("run", "log_interval", _int)],
    "--eval-interval": [("run", "eval_interval", _int)],
    "--eval-iters": [("run", "eval_iters", _int)],
    "--num-experts": [("tc", "num_moe_experts", _int)],
    "--moe-router-topk": [("tc", "moe_router_topk", _int)],
    "--expert-model-parallel-size": [("tc", "expert_model_parallel_size", _int)],
    "--expert-tensor-parallel-size": [("tc", "expert_tensor_parallel_size", _int)],
    "--moe-ffn-hidden-size": [("tc", "moe_ffn_hidden_size", _int)],
    "--moe-shared-expert-intermediate-size": [("tc", "moe_shared_expert_intermediate_size", _int)],
    "--moe-router-score-function": [("tc", "moe_router_score_function", _str)],
    "--moe-router-load-balancing-type": [("tc", "moe_router_load_balancing_type", _str)],
    "--moe-aux-loss-coeff": [("tc", "moe_aux_loss_coeff", _float)],
    "--moe-token-dispatcher-type": [("tc", "moe_token_dispatcher_type", _str)],
    "--moe-flex-dispatcher-backend": [("tc", "moe_flex_dispatcher_backend", _str)],
    "--moe-router-num-groups": [("tc", "moe_router_num_groups", _int)],
    "--moe-router-group-topk": [("tc", "moe_router_group_topk", _int)],
    "--moe-grouped-gemm": [("tc", "moe_grouped_gemm", _on)],
    "--moe-layer-freq": [("tc", "moe_layer_freq", lambda v: [int(x) for x in _str(v).strip("[]").split(",")])],
    "--moe-expert-capacity-factor": [("tc", "moe_expert_capacity_factor", _float)],
    "--moe-pad-expert-input-to-capacity": [("tc", "moe_pad_expert_input_to_capacity", _on)],
    "--multi-latent-attention": [("tc", "multi_latent_attention", _on)],
    "--q-lora-rank": [("tc", "q_lora_rank", _int)],
    "--kv-lora-rank": [("tc", "kv_lora_rank", _int)],
    "--qk-head-dim": [("tc", "qk_head_dim", _int)],
    "--qk-pos-emb-head-dim": [("tc", "qk_pos_emb_head_dim", _int)],
    "--v-head-dim": [("tc", "v_head_dim", _int)],
    "--kv-channels": [("tc", "kv_channels", _int)],
    "--qk-layernorm": [("tc", "qk_layernorm", _on)],
    "--context-parallel-size": [("tc", "context_parallel_size", _int)],
    "--cp-comm-type": [("tc", "cp_comm_type", lambda v: _documented_cp_comm_type(_str(v)))],
    "--fp8-format": [("tc", "fp8", lambda v: _literal("fp8", _str(v)))],
    "--fp8-recipe": [("tc", "fp8_recipe", lambda v: _literal("fp8_recipe", _str(v)))],
    # Megatron-LM's core_transformer_config_from_args sets TransformerConfig.fp8_param from --fp8-param-gather
    "--fp8-param-gather": [("ddp", "fp8_param_gather", _on), ("tc", "fp8_param", _on)],
    "--overlap-moe-expert-parallel-comm": [("tc", "overlap_moe_expert_parallel_comm", _on)],
    "--window-size": [("tc", "window_size", lambda v: tuple(int(x) for x in _str(v).split(",")))],
    "--window-attn-skip-freq": [("tc", "window_attn_skip_freq", _int)],
    # Megatron-LM parses --no-rope-freq as --moe-layer-freq (an integer or a Python list)
    "--no-rope-freq": [("tc", "no_rope_freq", lambda v: [int(x) for x in _str(v).strip("[]").split(",")]
                        if _str(v).startswith("[") else _int(v))],
    "--qk-l2-norm": [("tc", "qk_l2_norm", _on)],
    "--cpu-offloading": [("tc", "cpu_offloading", _on)],
    "--cpu-offloading-num-layers": [("tc", "cpu_offloading_num_layers", _int)],
    "--moe-apply-probs-on-input": [("tc", "moe_apply_probs_on_input", _on)],
}


def megatron_configs(words: list[str]) -> dict[str, dict[str, Any]]:
    """The keyword arguments per config that the script's flags set (an unknown flag fails)."""
    kwargs: dict[str, dict[str, Any]] = {"tc": {}, "ddp": {}, "opt": {}, "model": {}, "run": {}, "derived": {}}
    for flag, value in flag_values(words):
        assert flag in MEGATRON_FLAGS, f"the Megatron export writes {flag}, which the test does not map"
        for config, field, convert in MEGATRON_FLAGS[flag]:
            kwargs[config][field] = convert(value)
    return kwargs


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_core_configs_accept_the_export(name: str) -> None:
    need("megatron")
    text = exported(name, "megatron")
    if text is None:
        return
    import inspect

    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    plan = PLANS[name]
    lay, m = plan.layout, plan.model
    env = {"MEGATRON_LM": "/megatron", "DATA_PATH": "/data", "TOKENIZER_MODEL": "/tok", "VOCAB_FILE": "/v",
           "MERGE_FILE": "/m", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    kwargs = megatron_configs(script_words(text, '"$MEGATRON_LM/pretrain_gpt.py"', env))
    tc = dict(kwargs["tc"])
    # As Megatron-LM's core_transformer_config_from_args: params / pipeline dtype from the precision flag,
    # the virtual pipeline size from layers per virtual stage.
    dtype = torch.bfloat16 if tc.get("bf16") else torch.float16 if tc.get("fp16") else torch.float32
    tc.update(params_dtype=dtype, pipeline_dtype=dtype)
    if "virtual_pipeline_model_parallel_size" in kwargs["derived"]:
        per_stage = kwargs["derived"]["virtual_pipeline_model_parallel_size"]
        tc["virtual_pipeline_model_parallel_size"] = m.layers // (lay.pp * per_stage)
    # Megatron-LM builds MLATransformerConfig where --multi-latent-attention is given (its MoE / MLA checks run
    # in __post_init__: topk <= experts, ep x etp against the ranks, the MLA head widths)
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    transformer = (MLATransformerConfig if tc.get("multi_latent_attention") else TransformerConfig)(**tc)
    if m.moe is not None:
        assert (transformer.num_moe_experts, transformer.moe_router_topk) == (m.moe.experts, m.moe.top_k)
        assert (transformer.expert_model_parallel_size, transformer.expert_tensor_parallel_size) == (lay.ep, lay.etp)
        # the dispatch the plan was priced with (its runtime's, moe_dispatch.dispatch_of) and the routing groups
        deepep = dispatch_of(m.moe, get_runtime(plan.runtime).moe_dispatch).dedup
        assert (transformer.moe_token_dispatcher_type, transformer.moe_flex_dispatcher_backend if deepep else None) \
            == (("flex", "deepep") if deepep else ("alltoall", None))
        assert (transformer.moe_router_num_groups or 1, transformer.moe_router_group_topk or 1) == (
            m.moe.groups, m.moe.group_topk)
        # a capacity factor: drop and pad, as the megatron runtime prices it (Runtime.moe_capacity "pad")
        assert (transformer.moe_expert_capacity_factor, transformer.moe_pad_expert_input_to_capacity) == (
            (m.moe.capacity_factor, True) if m.moe.capacity_factor is not None else (None, False))
    ddp = DistributedDataParallelConfig(**kwargs["ddp"])
    OptimizerConfig(**kwargs["opt"])
    unknown = set(kwargs["model"]) - set(inspect.signature(GPTModel.__init__).parameters)
    assert not unknown, f"GPTModel has no arguments {unknown}"
    assert (transformer.tensor_model_parallel_size, transformer.pipeline_model_parallel_size) == (lay.tensor_size,
                                                                                                  lay.pp)
    assert (transformer.virtual_pipeline_model_parallel_size or 1) == lay.interleave
    # Megatron-core builds paracube's blocks per virtual stage (modes/stages.py): its layout's decoder entries, else
    # the even split
    split = transformer.pipeline_model_parallel_layout
    got = ([[x.name for x in split.layout[j % lay.pp][j // lay.pp]].count("decoder")
            for j in range(lay.pp * lay.interleave)] if split is not None
           else [m.layers // (lay.pp * lay.interleave)] * (lay.pp * lay.interleave))
    assert got == chunk_layers(m.layers, lay.pp, lay.interleave)
    assert transformer.sequence_parallel == lay.sequence_parallel and transformer.tp_comm_overlap == lay.tpo
    assert transformer.context_parallel_size == lay.cp
    if lay.cp > 1:
        assert transformer.cp_comm_type == {"p2p": "p2p", "ag": "all_gather"}[lay.cp_comm or "p2p"]
    fp8 = plan.training.dtype == "fp8"
    assert transformer.overlap_moe_expert_parallel_comm == lay.a2ao
    # rcm=: selective recomputation of exactly these modules (TransformerConfig's own names and checks)
    assert transformer.recompute_modules == (list(lay.recompute_modules) if lay.recompute_modules else ["core_attn"])
    assert transformer.recompute_granularity == ("selective" if lay.recompute_modules else
                                                 {"none": None}.get(plan.training.recompute, plan.training.recompute))
    assert (transformer.fp8, transformer.bf16) == (("hybrid", True) if fp8 else (None, plan.training.dtype == "bf16"))
    assert not fp8 or transformer.fp8_recipe == "delayed"  # Transformer Engine's delayed scaling, as paracube's
    # FP8 weights held and gathered in FP8, as the megatron runtime prices them (Runtime.fp8_param_gather)
    assert (ddp.fp8_param_gather, transformer.fp8_param) == (fp8, fp8)
    assert (transformer.num_query_groups or m.heads) == m.num_kv_heads
    # sliding windows: Megatron's own rule of which blocks (numbered from 1) are windowed, and (w - 1, 0) keys
    from megatron.core.transformer.utils import is_layer_window_attention
    assert [is_layer_window_attention(transformer.window_size, transformer.window_attn_skip_freq, i + 1)
            for i in range(m.layers)] == [m.sliding_window is not None and m.attention_window(i) is not None
                                          for i in range(m.layers)]  # (Llama 4's chunks: not windows)
    assert transformer.window_size == (None if m.sliding_window is None else (m.sliding_window - 1, 0))
    assert transformer.gated_linear_unit == (m.family == "llama")
    # GPT-OSS's sinks, biases and clamped SwiGLU (oss_flags.py), as megatron-core reads them
    clamp = m.moe.swiglu_limit if m.moe is not None else None
    assert (transformer.softmax_type, transformer.add_bias_linear) == (
        "learnable" if m.attention_sinks else "vanilla", m.attention_bias or m.family == "gpt")
    assert (transformer.activation_func_clamp_value, transformer.glu_linear_offset) == (clamp, 1.0 if clamp else 0.0)
    # Llama 4: Megatron's per-block rotary skip (no_rope_freq, expanded in __post_init__: 1 = NoPE) and the L2 norm;
    # MoE blocks by Megatron's own list (1 = MoE) against the model's
    from paracube.attention_chunk import uses_rope
    assert (transformer.no_rope_freq or [0] * m.layers) == [int(not uses_rope(m, i)) for i in range(m.layers)]
    assert transformer.qk_l2_norm == m.qk_l2_norm
    if m.moe is not None:
        freq = transformer.moe_layer_freq
        assert (freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(m.layers)]) == [
            int(m.moe.is_moe_layer(i)) for i in range(m.layers)]
        assert (transformer.moe_shared_expert_intermediate_size or 0, transformer.moe_router_score_function,
                transformer.moe_apply_probs_on_input) == (m.moe.shared_ffn, m.moe.router, m.moe.probs_on_input)
    assert (transformer.recompute_granularity or "none") == plan.training.recompute
    # activation offloading: TransformerConfig's own checks ran (N < layers, pp = 1, no recomputation)
    assert (transformer.cpu_offloading, transformer.cpu_offloading_num_layers,
            transformer.cpu_offloading_activations) == (bool(lay.offload), lay.offload or 0, True)
    assert kwargs["model"].get("share_embeddings_and_output_weights", True) == m.tied_embeddings
    assert ddp.use_distributed_optimizer == (lay.zero == 1)
    assert ddp.use_megatron_fsdp == (lay.zero >= 2)
    assert ddp.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}.get(lay.zero,
                                                                                                  "no_shard")
    assert ddp.num_distributed_optimizer_instances == lay.dp // lay.shard_size
    assert ddp.overlap_grad_reduce == (lay.overlap and lay.dp > 1)
    assert ddp.overlap_param_gather == (lay.overlap and lay.dp > 1 and lay.zero >= 1)
    assert ddp.bucket_size == BUCKET_BYTES // GRAD_BYTES
    assert (kwargs["run"]["micro_batch_size"], kwargs["run"]["global_batch_size"]) == (plan.micro_batch,
                                                                                   plan.training.global_batch)


def test_megatron_table_refuses_an_unknown_flag() -> None:
    """The table is the gate: a flag the export might add without a mapping fails the check above."""
    with pytest.raises(AssertionError, match="--made-up-flag"):
        megatron_configs(["--num-layers", "2", "--made-up-flag"])
