"""Export a plan to torchtitan 0.3.0: a shell script running `torchtitan.train` with `--module` / `--config`
(a config_registry function of the model's shape, chosen by the user) and the `--section.option` flags its
ConfigManager (tyro) parses; tests/test_export_targets.py feeds the script's own argument list to it.

Mapping (torchtitan's ParallelismConfig, torchtitan/config/configs.py):
- tp -> tensor_parallel_degree; sp -> the boolean flag enable_sequence_parallel / no_enable_sequence_parallel
  (tyro writes booleans as flags, not values).
- dp from zero and shard (torchtitan's data parallelism is FSDP2 over a (replicate, shard) mesh):
  zero=0/1 -> replicate = dp, shard = 1 (torchtitan has no ZeRO-1: the optimizer state stays replicated);
  zero=2/3 -> shard = shard_size (shard=N, else dp), replicate = dp / shard_size (HSDP when both > 1), with
  fsdp_reshard_after_forward `never` for zero=2 (parameters stay gathered from forward to the end of backward:
  gradients and optimizer state sharded, ZeRO-2's traffic) and `always` for zero=3; with pipelines zero=1 is FSDP
  over all of dp, `never` (torchtitan's default with pp: pipelining keeps parameters and gradients unsharded
  across micro-batches, ZeRO-1; runtimes/torchtitan.py, torchtitan_limits.fsdp_shard).
- pp -> pipeline_parallel_degree, schedule 1F1B (v = 1) or Interleaved1F1B (v > 1; torch.distributed.pipelining
  names), pipeline_parallel_layers_per_stage and the first / last stage's "less layers" under which torchtitan
  builds paracube's blocks per stage (runtimes/torchtitan_limits.py: layers / (pp x v) and 0, 0 for an even split;
  torchtitan counts the embedding and the head as one layer each by default, paracube does not).
- Batch: local_batch_size is per data-parallel rank per accumulation step; without pp it is the micro-batch
  (torchtitan accumulates up to global_batch_size); with pp it is global / dp, split into micro-batches of
  pipeline_parallel_microbatch_size = mb (global / (dp x mb) of them, no accumulation).
- tpo -> compile.enable + compile.enable_async_tensor_parallel (torchtitan's async TP is an inductor pass over
  the sequence-parallel all-gather / reduce-scatter: it needs sp).
- Recompute -> the activation-checkpoint subcommand (`activation_checkpoint:none|selective|full`), written last
  because tyro reads the options after a subcommand as that subcommand's.
- Precision: mixed_precision_param bfloat16 or float32 (torchtitan has no fp16 training), reduce in float32.
- fp8: bf16 (mixed_precision_param bfloat16) with the block linears converted to float8. torchtitan 0.3.0 has
  float8 as a model converter only, no flag (its `--help` lists none; torchtitan/components/quantization/float8.py):
  the MODEL_CONFIG function passes `converters=[FP8_CONVERTER]` to its model_registry. Its recipes are "rowwise"
  and "rowwise_with_gw_hp" (no tensorwise one), both dynamic: torchao scales each tensor from its own amax at
  every cast. The head is filtered out (`lm_head`), as paracube keeps it bf16. The export says that paracube's
  delayed scaling (an amax history, reduced once per step) differs; runtime torchtitan prices the dynamic
  recipe (Runtime.fp8_scaling, cost_models/fp8.py).
"""

from __future__ import annotations

from paracube.export.common import (
    EXPRESSIBLE,
    Export,
    comment,
    header,
    offload_why,
    one_d_only,
    refuse_unless_expressible,
    shell_command,
    tensor_size,
)
from paracube.export.llama4_flags import chunk_export_refusal
from paracube.export.megatron import big_axes
from paracube.export.moe_flags import torchtitan_moe_flags
from paracube.export.oss_flags import torchtitan_oss_notes, torchtitan_oss_refusal
from paracube.export.window_flags import torchtitan_window_notes, torchtitan_window_refusal
from paracube.plan import Plan
from paracube.recompute_modules import modules_text
from paracube.runtimes import get_runtime
from paracube.runtimes.torchtitan_limits import fold_refusal, fsdp_shard, split, split_refusal

WRITTEN_FOR = "torchtitan 0.3.0 (`torchtitan.train` --module/--config with --section.option flags)"
# torchtitan's mixed_precision_param per paracube dtype (fp8: bf16 with float8 block linears, FP8_CONVERTER)
TORCH_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp8": "bfloat16"}
# torchtitan 0.3.0's float8 converter as the MODEL_CONFIG function's model_registry(converters=[...]) takes it
FP8_CONVERTER = 'Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"])'
RESHARD = {2: "never", 3: "always"}  # zero -> fsdp_reshard_after_forward


def why_not(plan: Plan) -> str | None:
    if (why := one_d_only(plan) or offload_why(plan, "torchtitan")) is not None:
        return why
    if plan.training.dtype not in TORCH_DTYPES:
        return (f"it trains in bf16 or fp32 (mixed_precision_param) or fp8 (its float8 converter), not "
                f"{plan.training.dtype}; valid: {', '.join(TORCH_DTYPES)}")
    if plan.layout.tpo and not plan.layout.sequence_parallel:
        return "its async tensor parallelism (tpo) overlaps the sequence-parallel collectives: it needs sp"
    lay = plan.layout
    if lay.cp > 1 and lay.cp_comm != "ag":
        return ("its context parallelism all-gathers keys and values (torch's rotate method allgather): "
                f"cpc=ag, not cpc={lay.cp_comm or 'p2p (unpinned)'}")
    if lay.etp > 1:
        return f"it has no tensor parallelism inside experts (etp={lay.etp}); valid: etp=1"
    if lay.a2ao:
        return "it does not overlap its MoE all_to_alls with another micro-batch's compute (a2ao); drop a2ao"
    moe = plan.model.moe
    if moe is not None and moe.capacity_factor is not None and get_runtime("torchtitan").moe_capacity == "none":
        return (f"its MoE blocks run dropless, without a capacity factor (capacity_factor="
                f"{moe.capacity_factor:g}); valid: a dropless plan (--capacity-factor dropless)")
    if lay.recompute_modules:  # 0.3.0's activation_checkpoint: none / selective (its per-op rule) / full
        return (f"it has no recomputation by module (rcm={modules_text(lay.recompute_modules)}: Megatron-core's "
                "--recompute-modules); valid: rc=none/selective/full without rcm=")
    if (why_window := torchtitan_window_refusal(plan.model) or torchtitan_oss_refusal(plan.model)
                      or chunk_export_refusal(plan, "torchtitan")) is not None:
        return why_window
    # what its runtime declares it cannot build (runtimes/torchtitan_limits.py): the planner offers neither
    why_split = split_refusal(plan.model.layers, lay.pp, lay.interleave)
    return f"it {why_split}" if why_split else fold_refusal(lay)


EXPRESSIBLE["torchtitan"] = why_not


def flag(name: str, on: bool) -> str:
    """A tyro boolean: `--section.name` or `--section.no_name`."""
    section, field = name.rsplit(".", 1)
    return f"--{section}.{field}" if on else f"--{section}.no_{field}"


def data_parallel_flags(plan: Plan) -> tuple[list[str], list[str]]:
    lay = plan.layout
    notes = []
    shard = fsdp_shard(lay)
    if lay.zero == 1 and lay.pp == 1:
        notes.append("torchtitan has no ZeRO-1: dp replicates the optimizer state, as with zero=0")
    flags = [f"--parallelism.data_parallel_replicate_degree {lay.dp // shard}",
             f"--parallelism.data_parallel_shard_degree {shard}"]
    if lay.zero >= 2 or shard > 1:  # zero=1 with pipelines: FSDP, unsharded across micro-batches (torchtitan.py)
        flags.append(f"--parallelism.fsdp_reshard_after_forward {RESHARD[max(lay.zero, 2)]}")
    return flags, notes


def parallelism_flags(plan: Plan) -> tuple[list[str], list[str]]:
    """(flags, notes)."""
    lay = plan.layout
    flags, notes = data_parallel_flags(plan)
    flags += [f"--parallelism.tensor_parallel_degree {tensor_size(plan)}",
              flag("parallelism.enable_sequence_parallel", lay.sequence_parallel),
              f"--parallelism.pipeline_parallel_degree {lay.pp}"]
    if lay.cp > 1:  # torch's context_parallel, head-tail load balancing (the chunks paracube priced)
        flags.append(f"--parallelism.context_parallel_degree {lay.cp}")
    if lay.pp > 1:
        schedule = "Interleaved1F1B" if lay.interleave > 1 else "1F1B"
        stages = split(plan.model.layers, lay.pp, lay.interleave)  # why_not refused any other
        assert stages is not None
        flags += [f"--parallelism.pipeline_parallel_schedule {schedule}",
                  f"--parallelism.pipeline_parallel_layers_per_stage {stages[0]}",
                  f"--parallelism.pipeline_parallel_first_stage_less_layers {stages[1]}",
                  f"--parallelism.pipeline_parallel_last_stage_less_layers {stages[2]}",
                  f"--parallelism.pipeline_parallel_microbatch_size {plan.micro_batch}"]
    if lay.tpo:
        flags += ["--compile.enable", "--compile.enable_async_tensor_parallel"]
        notes.append("torchtitan's async tensor parallelism runs under torch.compile (compile.enable)")
    tensor = lay.tensor_axes
    if big_axes(plan, lay.effective_placement) != big_axes(plan, (*tensor, "cp", "dp", "pp")):
        notes.append("torchtitan's device mesh puts tp innermost, then cp, dp, pp: the plan's placement "
                     f"{'.'.join(big_axes(plan, lay.effective_placement))} is not kept")
    return flags, notes


def training_flags(plan: Plan) -> list[str]:
    """Training options, then the activation-checkpoint subcommand (last: see the module docstring)."""
    lay, t = plan.layout, plan.training
    local = t.global_batch // lay.dp if lay.pp > 1 else plan.micro_batch
    # torchtitan 0.3.0 captures CUDA graphs by default and refuses them with pp ("Set --training.disable_cuda_graphs"),
    # and with expert parallelism on its default all-to-all dispatcher, which synchronises with the CPU (trainer.py:
    # "CUDA graphs support only expert parallel token dispatcher configurations without CPU synchronization"; the
    # runtime prices that sync, Runtime.moe_host_sync)
    graphs = ["--training.disable_cuda_graphs"] if lay.pp > 1 or lay.ep > 1 else []
    return [f"--training.local_batch_size {local}", *graphs, f"--training.global_batch_size {t.global_batch}",
            f"--training.seq_len {plan.seq_len}", f"--training.mixed_precision_param {TORCH_DTYPES[t.dtype]}",
            "--training.mixed_precision_reduce float32", "--training.max_norm 1.0",
            '--training.steps "${TRAIN_STEPS:-1000}"', f"activation_checkpoint:{t.recompute}"]


def attention_notes(plan: Plan) -> list[str]:
    """torchtitan's attention is scaled_dot_product_attention (flash) without dropout: say what differs."""
    m, notes = plan.model, []
    if not plan.layout.uses_flash:
        notes.append("torchtitan runs flash attention (SDPA); the plan prices unfused attention (fa=0)")
    if max(m.dropout, m.attention_dropout, m.embedding_dropout) > 0:
        notes.append(f"torchtitan trains without dropout; the model sets dropout {m.dropout:g}, attention dropout "
                     f"{m.attention_dropout:g}")
    return notes + torchtitan_window_notes(plan) + torchtitan_oss_notes(m)


def fp8_notes(plan: Plan) -> tuple[list[str], list[str]]:
    """(notes, what MODEL_CONFIG must do) for an fp8 plan (module docstring); nothing otherwise."""
    if plan.training.dtype != "fp8":
        return [], []
    notes = ["fp8 scaling differs: torchtitan's float8 (torchao, recipe rowwise) scales each tensor dynamically "
             "from its own amax at every cast, with no amax history, no amax all-reduce and no FP8 weight copies "
             "held (the weights are cast every micro-batch); paracube's executor uses delayed scaling (Transformer "
             "Engine's recipe, an amax history of 16 reduced once per step): price it with --runtime torchtitan"]
    config = [f"fp8: torchtitan 0.3.0 has no float8 flag; MODEL_CONFIG's model_registry(...) must take "
              f"converters=[{FP8_CONVERTER}] (torchtitan.components.quantization; needs torchao), as its "
              "llama3_debugmodel_float8 does"]
    return notes, config


def export(plan: Plan) -> Export:
    refuse_unless_expressible("torchtitan", plan)
    m = plan.model
    flags, notes = parallelism_flags(plan)
    precision, converter = fp8_notes(plan)
    notes = notes + attention_notes(plan) + precision
    shape = (f"model shape: {m.family}, {m.layers} layers, hidden {m.hidden}, {m.heads} heads "
             f"({m.num_kv_heads} kv), ffn {m.ffn_hidden}, vocab {m.vocab}, "
             f"{'tied' if m.tied_embeddings else 'untied'} embeddings: choose or add a torchtitan config_registry "
             "function of this shape (MODEL_MODULE, MODEL_CONFIG)")
    lines = ["#!/bin/bash",
             comment([*header(plan, "torchtitan", WRITTEN_FOR, notes), shape, *converter]).rstrip("\n"),
             "# run on every node (NODE_RANK=0..nnodes-1, MASTER_ADDR = node 0) where torchtitan 0.3.0 is installed",
             "set -euo pipefail", ': "${MODEL_MODULE:?set MODEL_MODULE (e.g. llama3)}"',
             ': "${MODEL_CONFIG:?set MODEL_CONFIG (a config_registry function with the shape above)}"',
             'NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"',
             'MASTER_PORT="${MASTER_PORT:-29500}"']
    words = ["torchrun", f"--nnodes={plan.launch.nnodes}", f"--nproc-per-node={plan.launch.nproc_per_node}",
             '--node-rank="$NODE_RANK"', '--master-addr="$MASTER_ADDR"', '--master-port="$MASTER_PORT"',
             "-m torchtitan.train"]
    args = ['--module "$MODEL_MODULE"', '--config "$MODEL_CONFIG"', *flags, *torchtitan_moe_flags(plan),
            *training_flags(plan)]
    return Export("torchtitan", "\n".join(lines) + "\n" + shell_command(words, args), tuple(notes))


__all__ = ["FP8_CONVERTER", "RESHARD", "WRITTEN_FOR", "export", "flag", "fp8_notes", "parallelism_flags",
           "training_flags", "why_not"]
