"""Export a plan to DeepSpeed: a shell script that writes the ds_config JSON and runs Megatron-DeepSpeed's
`pretrain_gpt.py` with the `deepspeed` launcher.

ds_config (DeepSpeed's config JSON): train_batch_size = micro x accumulation x dp,
train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping, zero_optimization.stage
(the layout's zero: 0, 1 or 3), bf16 / fp16 (loss_scale 0 = dynamic), activation_checkpointing.
Tensor and pipeline sizes go to Megatron-DeepSpeed's own arguments. DeepSpeed's pipeline engine runs
plain 1F1B: a plan with v > 1 runs without interleaving (more bubble than predicted), and ZeRO stages
above 1 do not combine with its pipeline (zero=3 needs pp=1). Ranks are ordered model (tp), data, pipe
(innermost first), as in Megatron.
"""

from __future__ import annotations

import json

from paracube.export.common import (
    EXPRESSIBLE,
    Export,
    accumulation_steps,
    comment,
    header,
    one_d_only,
    refuse_unless_expressible,
    shell_command,
    tensor_size,
)
from paracube.export.megatron import TRAINING_ARGS, big_axes, tokenizer_args
from paracube.plan import Plan

WRITTEN_FOR = "DeepSpeed 0.16 (ds_config) with Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed, pretrain_gpt.py)"
CONFIG_FILE = "ds_config.json"


def why_not(plan: Plan) -> str | None:
    if (why := one_d_only(plan)) is not None:
        return why
    if plan.layout.zero == 3 and plan.layout.pp > 1:
        return "ZeRO stage 3 does not combine with DeepSpeed's pipeline engine (use pp=1 or zero<=1)"
    return None


EXPRESSIBLE["deepspeed"] = why_not


def ds_config(plan: Plan) -> dict:
    t = plan.training
    config: dict = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": accumulation_steps(plan),
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": plan.layout.zero},
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
                                              "cpu_checkpointing": False}
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
    if lay.interleave > 1:
        notes.append(f"DeepSpeed's pipeline engine does not interleave: v={lay.interleave} runs as v=1 "
                     "(a larger pipeline bubble than predicted)")
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
    command = shell_command(words, [*parallel, *model_args(plan), *tokenizer, *TRAINING_ARGS])
    return Export("deepspeed", "\n".join(lines) + "\n" + command, tuple(notes))


__all__ = ["CONFIG_FILE", "WRITTEN_FOR", "ds_config", "export", "why_not"]
