"""Export a plan to torchtitan: a shell script running `torchtitan.train` with the `--section.option`
flags torchtitan still accepts (frozen, but stable; its newer Python recipes take the same fields).

Mapping (torchtitan's ParallelismConfig): tp -> tensor_parallel_degree, sp -> enable_sequence_parallel,
pp -> pipeline_parallel_degree with schedule 1F1B (v = 1) or Interleaved1F1B (v > 1,
pipeline_parallel_layers_per_stage = layers / (pp x v)), dp -> data_parallel_shard_degree for zero=3
(FSDP2) else data_parallel_replicate_degree (DDP; torchtitan has no ZeRO-1, so zero=1 keeps the
optimizer state replicated). Batch: without pp, local_batch_size = the micro-batch and torchtitan
accumulates gradients up to global_batch_size; with pp, local_batch_size = global / dp split into
num_pp_microbatches = global / (dp x mb). Recompute -> activation_checkpoint.mode.
"""

from __future__ import annotations

from paracube.export.common import (
    EXPRESSIBLE,
    Export,
    comment,
    header,
    one_d_only,
    refuse_unless_expressible,
    shell_command,
    tensor_size,
)
from paracube.export.megatron import big_axes
from paracube.plan import Plan

WRITTEN_FOR = "torchtitan (main, 2026: `torchtitan.train` with --section.option flags)"
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def why_not(plan: Plan) -> str | None:
    return one_d_only(plan)


EXPRESSIBLE["torchtitan"] = why_not


def parallelism_flags(plan: Plan) -> tuple[list[str], list[str]]:
    """(flags, notes)."""
    lay = plan.layout
    shard = lay.dp if lay.zero == 3 else 1
    replicate = 1 if lay.zero == 3 else lay.dp
    flags = [f"--parallelism.data_parallel_replicate_degree {replicate}",
             f"--parallelism.data_parallel_shard_degree {shard}",
             f"--parallelism.tensor_parallel_degree {tensor_size(plan)}",
             f"--parallelism.enable_sequence_parallel {lay.sequence_parallel}",
             f"--parallelism.pipeline_parallel_degree {lay.pp}"]
    notes = []
    if lay.zero == 1:
        notes.append("torchtitan has no ZeRO-1: dp replicates the optimizer state, as with zero=0")
    if lay.pp > 1:
        schedule = "Interleaved1F1B" if lay.interleave > 1 else "1F1B"
        flags += [f"--parallelism.pipeline_parallel_schedule {schedule}",
                  f"--parallelism.pipeline_parallel_layers_per_stage {plan.model.layers // (lay.pp * lay.interleave)}",
                  f"--parallelism.num_pp_microbatches {plan.training.global_batch // (lay.dp * plan.micro_batch)}"]
    tensor = lay.tensor_axes
    if big_axes(plan, lay.effective_placement) != big_axes(plan, (*tensor, "dp", "pp")):
        notes.append("torchtitan's device mesh puts tp innermost, then dp, then pp: the plan's placement "
                     f"{'.'.join(big_axes(plan, lay.effective_placement))} is not kept")
    return flags, notes


def training_flags(plan: Plan) -> list[str]:
    lay, t = plan.layout, plan.training
    local = t.global_batch // lay.dp if lay.pp > 1 else plan.micro_batch
    flags = [f"--training.local_batch_size {local}", f"--training.global_batch_size {t.global_batch}",
             f"--training.seq_len {plan.seq_len}", f"--training.mixed_precision_param {TORCH_DTYPES[t.dtype]}",
             "--training.mixed_precision_reduce float32", "--training.max_norm 1.0",
             '--training.steps "${TRAIN_STEPS:-1000}"', f"--activation_checkpoint.mode {t.recompute}"]
    if t.recompute == "selective":
        flags.append("--activation_checkpoint.selective_ac_option op")
    return flags


def attention_notes(plan: Plan) -> list[str]:
    """torchtitan's attention is scaled_dot_product_attention (flash) without dropout: say what differs."""
    m, notes = plan.model, []
    if not plan.layout.uses_flash:
        notes.append("torchtitan runs flash attention (SDPA); the plan prices unfused attention (fa=0)")
    if max(m.dropout, m.attention_dropout, m.embedding_dropout) > 0:
        notes.append(f"torchtitan trains without dropout; the model sets dropout {m.dropout:g}, attention dropout "
                     f"{m.attention_dropout:g}")
    return notes


def export(plan: Plan) -> Export:
    refuse_unless_expressible("torchtitan", plan)
    m = plan.model
    flags, notes = parallelism_flags(plan)
    notes = notes + attention_notes(plan)
    shape = (f"model shape: {m.family}, {m.layers} layers, hidden {m.hidden}, {m.heads} heads "
             f"({m.num_kv_heads} kv), ffn {m.ffn_hidden}, vocab {m.vocab}: choose or add a torchtitan model "
             "flavor of this shape (MODEL_NAME, MODEL_FLAVOR)")
    lines = ["#!/bin/bash", comment([*header(plan, "torchtitan", WRITTEN_FOR, notes), shape]).rstrip("\n"),
             "# run on every node (NODE_RANK=0..nnodes-1, MASTER_ADDR = node 0) from a torchtitan checkout",
             "set -euo pipefail", ': "${MODEL_NAME:?set MODEL_NAME (e.g. llama3)}"',
             ': "${MODEL_FLAVOR:?set MODEL_FLAVOR (a flavor with the shape above)}"',
             'NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"',
             'MASTER_PORT="${MASTER_PORT:-29500}"']
    words = ["torchrun", f"--nnodes={plan.launch.nnodes}", f"--nproc-per-node={plan.launch.nproc_per_node}",
             '--node-rank="$NODE_RANK"', '--master-addr="$MASTER_ADDR"', '--master-port="$MASTER_PORT"',
             "-m torchtitan.train"]
    args = ['--model.name "$MODEL_NAME"', '--model.flavor "$MODEL_FLAVOR"', *flags, *training_flags(plan)]
    return Export("torchtitan", "\n".join(lines) + "\n" + shell_command(words, args), tuple(notes))


__all__ = ["WRITTEN_FOR", "export", "parallelism_flags", "training_flags", "why_not"]
