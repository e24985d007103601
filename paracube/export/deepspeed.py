"""Export a plan to DeepSpeed: a shell script that writes the ds_config JSON and runs Megatron-DeepSpeed's
`pretrain_gpt.py` with the `deepspeed` launcher.

ds_config (DeepSpeed 0.19.8's config JSON, checked by its DeepSpeedConfig in tests/test_export_targets.py):
train_batch_size = micro x accumulation x dp, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
gradient_clipping, bf16 / fp16 (loss_scale 0 = dynamic), activation_checkpointing, and zero_optimization: stage =
the layout's zero (0-3), overlap_comm = the layout's `overlap`, reduce_scatter (gradient buckets reduce-scattered,
as priced), contiguous_gradients from stage 2, bucket sizes in elements = paracube's priced gradient bucket
(modes/buckets.py: 25 MiB of fp32), stage3_param_persistence_threshold 0 (every parameter sharded and gathered per
block, as priced), and for zero=3 with shard=N ZeRO++'s hierarchical partitioning zero_hpz_partition_size = N (a
secondary copy of the parameters within groups of N ranks, gathered there in backward; DeepSpeed 0.19.8 removed
MiCS, its other hybrid; noted, as its optimizer state stays sharded over all of dp). Tensor and pipeline sizes go to
Megatron-DeepSpeed's own arguments. Refused (one line): tensor modes other than 1D, interleaving (DeepSpeed's
pipeline engine runs plain 1F1B: v > 1 would run with a larger bubble than predicted), ZeRO stage 2/3 with pp > 1
(its PipelineEngine asserts stage < 2), shard=N below zero=3, tpo (Megatron-DeepSpeed has no tensor-parallel
communication overlap), and fp8 (its pretrain_gpt.py has no FP8 linears: --bf16 / --fp16 only). Ranks are ordered
model (tp), data, pipe (innermost first), as in Megatron.
"""

from __future__ import annotations

import json

from paracube.export.common import (
    EXPRESSIBLE,
    Export,
    accumulation_steps,
    comment,
    header,
    offload_why,
    one_d_only,
    refuse_unless_expressible,
    shell_command,
    tensor_size,
)
from paracube.export.llama4_flags import chunk_export_refusal, deepspeed_llama4_refusal
from paracube.export.megatron import TRAINING_ARGS, big_axes, tokenizer_args
from paracube.export.moe_flags import deepspeed_moe_args
from paracube.export.oss_flags import deepspeed_oss_refusal
from paracube.export.window_flags import deepspeed_window_refusal
from paracube.modes.buckets import BUCKET_BYTES, GRAD_BYTES
from paracube.modes.stages import chunk_layers, split_text
from paracube.plan import Plan
from paracube.recompute_modules import modules_text

WRITTEN_FOR = "DeepSpeed 0.19.8 (ds_config) with Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed, pretrain_gpt.py)"
CONFIG_FILE = "ds_config.json"


def why_not(plan: Plan) -> str | None:
    if (why := one_d_only(plan) or offload_why(plan, "deepspeed")) is not None:
        return why
    lay = plan.layout
    if lay.interleave > 1:
        return f"its pipeline engine runs 1F1B without interleaving (v=1, not v={lay.interleave})"
    if lay.zero >= 2 and lay.pp > 1:
        return f"ZeRO stage {lay.zero} does not combine with its pipeline engine (pp=1, or zero=0/1 with pp > 1)"
    if lay.shard is not None and lay.zero < 3:
        return f"its hybrid sharding (zero_hpz_partition_size) is for zero=3 only (shard={lay.shard}, zero={lay.zero})"
    if lay.tpo:
        return "Megatron-DeepSpeed does not overlap tensor-parallel communication with GEMMs (tpo)"
    if lay.a2ao:
        return "DeepSpeed-MoE does not overlap its all_to_alls with another micro-batch's compute (a2ao); drop a2ao"
    if lay.recompute_modules:  # Megatron-DeepSpeed's --recompute-granularity selective: the attention core only
        return (f"Megatron-DeepSpeed has no recomputation by module (rcm={modules_text(lay.recompute_modules)}: "
                "Megatron-core's --recompute-modules); valid: rc=none/selective/full without rcm=")
    if lay.cp > 1:
        return (f"it has no context parallelism (cp={lay.cp}): DeepSpeed-Ulysses all-to-alls heads, not a key / "
                "value ring")
    if lay.etp > 1:
        return f"DeepSpeed-MoE has no tensor parallelism inside experts (etp={lay.etp}); valid: etp=1"
    if plan.model.mla is not None:
        return "Megatron-DeepSpeed has no multi-head latent attention (MLA)"
    if (why_window := deepspeed_window_refusal(plan.model) or deepspeed_oss_refusal(plan.model)) is not None:
        return why_window
    if (why_llama4 := deepspeed_llama4_refusal(plan.model) or chunk_export_refusal(plan, "deepspeed")) is not None:
        return why_llama4
    if plan.training.dtype == "fp8":  # its pretrain_gpt.py has --bf16 / --fp16 only: no FP8 GEMMs to turn on
        return ("it has no FP8 training (Megatron-DeepSpeed's pretrain_gpt.py takes --bf16 or --fp16, no FP8 "
                "linears); valid: --dtype bf16, fp16 or fp32")
    return None


EXPRESSIBLE["deepspeed"] = why_not


def zero_config(plan: Plan) -> dict:
    """zero_optimization: the stage and the knobs the plan was priced with (module docstring)."""
    lay = plan.layout
    bucket = BUCKET_BYTES // GRAD_BYTES  # DeepSpeed's bucket sizes count elements
    config: dict = {"stage": lay.zero}
    if lay.zero == 0:
        return config
    # paracube prices reduce-scattered gradient buckets from zero=1 (cost_models/traffic.py)
    config.update(overlap_comm=lay.overlap, reduce_scatter=True, reduce_bucket_size=bucket)
    if lay.zero >= 2:
        config["contiguous_gradients"] = True
    if lay.zero < 3:
        config["allgather_bucket_size"] = bucket
    else:
        config.update(stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=0)
        if lay.shard is not None:
            config["zero_hpz_partition_size"] = lay.shard
    return config


def ds_config(plan: Plan) -> dict:
    t = plan.training
    config: dict = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": accumulation_steps(plan),
        "gradient_clipping": 1.0,
        "zero_optimization": zero_config(plan),
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if t.dtype == "bf16":
        config["bf16"] = {"enabled": True}
        config["data_types"] = {"grad_accum_dtype": "fp32"}  # paracube keeps fp32 gradients
    elif t.dtype == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    if t.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": bool(plan.layout.offload)}  # off=N (N = L - 1)
    return config


def model_args(plan: Plan) -> list[str]:
    """Megatron-DeepSpeed's names (its LLaMA flags differ from Megatron-LM's)."""
    m = plan.model
    args = [f"--num-layers {m.layers}", f"--hidden-size {m.hidden}", f"--num-attention-heads {m.heads}",
            f"--ffn-hidden-size {m.ffn_hidden}", f"--seq-length {plan.seq_len}",
            f"--max-position-embeddings {m.seq_len}", "--make-vocab-size-divisible-by 128",
            f"--hidden-dropout {m.dropout:g}", f"--attention-dropout {m.attention_dropout:g}"]
    if m.family == "llama":
        args += ["--use-rotary-position-embeddings", "--normalization rmsnorm", "--swiglu", "--disable-bias-linear",
                 f"--num-key-value-heads {m.num_kv_heads}"]
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args


def parallel_args(plan: Plan) -> tuple[list[str], list[str]]:
    lay, t = plan.layout, plan.training
    args = [f"--tensor-model-parallel-size {tensor_size(plan)}", f"--pipeline-model-parallel-size {lay.pp}"]
    notes = []
    if lay.pp == 1:
        args.append("--no-pipeline-parallel")
    elif len(set(chunk_layers(plan.model.layers, lay.pp))) > 1:
        notes.append(f"DeepSpeed's pipeline engine balances the {plan.model.layers} blocks over the {lay.pp} stages "
                     f"itself (PipelineModule partition_method type:transformer); the plan priced "
                     f"{split_text(plan.model.layers, lay.pp)} blocks per stage")
    if lay.shard is not None:
        notes.append(f"DeepSpeed's hpZ (zero_hpz_partition_size {lay.shard}) shards gradients and optimizer state over "
                     f"all dp={lay.dp} ranks and keeps a parameter copy per group of {lay.shard}; the plan priced "
                     f"HSDP (state sharded within groups of {lay.shard}, replicated across them)")
    if lay.overlap and lay.zero == 0 and lay.dp > 1:
        notes.append("DeepSpeed without ZeRO all-reduces gradients after backward: `overlap` is not kept")
    tensor = lay.tensor_axes
    if big_axes(plan, lay.effective_placement) != big_axes(plan, (*tensor, "dp", "pp")):
        notes.append("DeepSpeed orders ranks tp, dp, pp (innermost first): the plan's placement "
                     f"{'.'.join(big_axes(plan, lay.effective_placement))} is not kept")
    if lay.sequence_parallel:
        args.append("--sequence-parallel")
    args += [f"--micro-batch-size {plan.micro_batch}", f"--global-batch-size {t.global_batch}"]
    if t.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif t.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1",
                 "--deepspeed-activation-checkpointing"]
    if lay.uses_flash:  # else Megatron-DeepSpeed's own core attention (unfused, fused masked softmax)
        args.append("--use-flash-attn")
    if t.dtype != "fp32":
        args.append(f"--{t.dtype}")
    args += ["--deepspeed", '--deepspeed_config "$DS_CONFIG"', f"--zero-stage {lay.zero}"]
    return args, notes


def export(plan: Plan) -> Export:
    refuse_unless_expressible("deepspeed", plan)
    parallel, notes = parallel_args(plan)
    needed, tokenizer = tokenizer_args(plan)
    lines = ["#!/bin/bash", comment(header(plan, "deepspeed", WRITTEN_FOR, notes)).rstrip("\n"),
             "# run on node 0 from a Megatron-DeepSpeed checkout; HOSTFILE lists the nodes (`host slots=N`)",
             "set -euo pipefail", *[f': "${{{v}:?set {v}}}"' for v in ["DATA_PATH", *needed]],
             f'DS_CONFIG="${{DS_CONFIG:-{CONFIG_FILE}}}"', 'HOSTFILE="${HOSTFILE:-hostfile}"',
             "cat > \"$DS_CONFIG\" <<'JSON'", json.dumps(ds_config(plan), indent=2), "JSON"]
    hosts = [] if plan.launch.nnodes == 1 else ['--hostfile "$HOSTFILE"']
    words = ["deepspeed", *hosts, f"--num_nodes {plan.launch.nnodes}", f"--num_gpus {plan.launch.nproc_per_node}",
             "pretrain_gpt.py"]
    command = shell_command(words, [*parallel, *model_args(plan), *deepspeed_moe_args(plan), *tokenizer,
                                    *TRAINING_ARGS])
    return Export("deepspeed", "\n".join(lines) + "\n" + command, tuple(notes))


__all__ = ["CONFIG_FILE", "WRITTEN_FOR", "ds_config", "export", "why_not", "zero_config"]
