"""Export a plan to Megatron-LM: a shell script that runs `pretrain_gpt.py` with torchrun.

Argument names are those of Megatron-LM's `megatron/training/arguments.py` (core_r0.16.1); the parallel, model
and data-parallel settings are the fields of megatron-core 0.16.1's TransformerConfig / ModelParallelConfig /
DistributedDataParallelConfig, which tests/test_export_targets.py builds from the script's flags.
Tensor / pipeline sizes, `--num-layers-per-virtual-pipeline-stage` = layers / (pp x v) (interleaved 1F1B,
Narayanan et al. 2021; an uneven split: `--pipeline-model-parallel-layout`, export/pipeline_split.py),
`--sequence-parallel` (Korthikanti et al. 2022), `--tp-comm-overlap` for tpo (Transformer Engine's userbuffer
overlap; needs sp). Data parallelism by zero: 1 `--use-distributed-optimizer` (optimizer
state and fp32 master weights sharded over dp; shard=N: `--num-distributed-optimizer-instances dp/N`, Megatron's
partial distributed optimizer), 2 / 3 Megatron-FSDP (`--use-megatron-fsdp --data-parallel-sharding-strategy
optim_grads` / `optim_grads_params`; no hybrid shard=N there); `overlap` -> `--overlap-grad-reduce`, plus
`--overlap-param-gather` from zero=1; `--ddp-bucket-size` = paracube's priced gradient bucket (modes/buckets.py,
in elements). Megatron orders ranks tp, then dp,
then pp (innermost first), or tp, pp, dp with `--use-tp-pp-dp-mapping`; another placement is written
with a note (the same training, other communication costs). Model shape from the plan's ModelSpec;
family llama adds rotary positions, RMSNorm, SwiGLU, no biases and grouped-query attention.
"""

from __future__ import annotations

from paracube.export.common import (
    EXPRESSIBLE,
    Export,
    accumulation_steps,
    comment,
    header,
    offload_why,
    one_d_only,
    quote,
    refuse_unless_expressible,
    shell_command,
    tensor_size,
)
from paracube.export.llama4_flags import chunk_export_refusal, megatron_llama4_args, megatron_llama4_refusal
from paracube.export.moe_flags import megatron_moe_args
from paracube.export.oss_flags import megatron_oss_args, megatron_oss_refusal
from paracube.export.pipeline_split import megatron_layout
from paracube.export.window_flags import megatron_window_args, megatron_window_refusal
from paracube.modes.buckets import BUCKET_BYTES, GRAD_BYTES
from paracube.plan import Plan
from paracube.runtimes import get_runtime

WRITTEN_FOR = "Megatron-LM core_r0.16.1 (pretrain_gpt.py arguments; megatron-core 0.16.1 configs)"
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}  # zero -> Megatron-FSDP's data_parallel_sharding_strategy
VOCAB_DIVISOR = 128  # Megatron's default --make-vocab-size-divisible-by


def why_not(plan: Plan) -> str | None:
    if (why := one_d_only(plan) or offload_why(plan, "megatron")) is not None:
        return why
    lay = plan.layout
    if lay.shard is not None and lay.zero >= 2:
        return (f"its hybrid sharding is the partial distributed optimizer (zero=1, shard=N): zero={lay.zero} "
                f"with shard={lay.shard} is not written")
    if lay.tpo and not lay.sequence_parallel:
        return "its tensor-parallel overlap (--tp-comm-overlap) needs sequence parallelism (sp)"
    if lay.a2ao:  # --overlap-moe-expert-parallel-comm's own checks (Runtime.a2a_overlap_refusal)
        return get_runtime("megatron").a2a_overlap_refusal(lay, plan.training.dtype)
    # window_flags.py, llama4_flags.py, oss_flags.py
    return (megatron_window_refusal(plan) or megatron_llama4_refusal(plan.model) or megatron_oss_refusal(plan.model)
            or chunk_export_refusal(plan, "megatron"))


CP_COMM_TYPE = {"p2p": "p2p", "ag": "all_gather"}  # cpc -> megatron-core TransformerConfig.cp_comm_type


def context_args(plan: Plan) -> list[str]:
    """Context parallelism (Layout cp, cpc): --context-parallel-size and --cp-comm-type (an unpinned cpc: p2p,
    what paracube priced and Megatron's default)."""
    lay = plan.layout
    if lay.cp == 1:
        return []
    return [f"--context-parallel-size {lay.cp}", f"--cp-comm-type {CP_COMM_TYPE[lay.cp_comm or 'p2p']}"]


EXPRESSIBLE["megatron"] = why_not


def big_axes(plan: Plan, order: tuple[str, ...]) -> tuple[str, ...]:
    """`order` (innermost first) without the axes of size 1, which do not change any group."""
    return tuple(a for a in order if plan.layout.axis_size(a) > 1)


def placement_args(plan: Plan) -> tuple[list[str], list[str]]:
    """(arguments, notes) for the plan's rank placement."""
    lay = plan.layout
    if lay.mode == "none":
        tensor: tuple[str, ...] = ()
    else:
        tensor = ("tp",)
    have = big_axes(plan, lay.effective_placement)
    if have == big_axes(plan, (*tensor, "cp", "dp", "pp")):  # Megatron's order tp-cp-dp-pp
        return [], []
    if have == big_axes(plan, (*tensor, "cp", "pp", "dp")):
        return ["--use-tp-pp-dp-mapping"], []
    return [], [f"the plan places ranks {'.'.join(have)} (innermost first); Megatron orders them tp, cp, dp, pp: "
                "the same training, other communication costs than predicted"]


def parallel_args(plan: Plan) -> tuple[list[str], list[str]]:
    """(arguments, notes): parallel sizes, batch, recomputation and precision."""
    lay, t = plan.layout, plan.training
    args = [f"--tensor-model-parallel-size {tensor_size(plan)}", f"--pipeline-model-parallel-size {lay.pp}"]
    notes: list[str] = []
    layout = megatron_layout(plan.model.layers, lay.pp, lay.interleave)  # an uneven split: each stage's blocks
    if layout is not None:
        args.append(f"--pipeline-model-parallel-layout {quote(layout)}")
    elif lay.interleave > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {plan.model.layers // (lay.pp * lay.interleave)}")
    if lay.interleave > 1 and accumulation_steps(plan) % lay.pp:
        notes.append(f"interleaving needs micro-batches per step ({accumulation_steps(plan)}) divisible by pp")
    if lay.sequence_parallel:
        args.append("--sequence-parallel")
    args += context_args(plan)
    if lay.tpo:
        args.append("--tp-comm-overlap")
        notes.append("--tp-comm-overlap runs with Transformer Engine (its userbuffers)")
    placement, more = placement_args(plan)
    args += placement
    notes += more
    args += [f"--micro-batch-size {plan.micro_batch}", f"--global-batch-size {t.global_batch}"]
    if lay.recompute_modules:  # rcm=: selective by module (recompute_modules.py: Megatron-core's own names)
        args += ["--recompute-granularity selective", f"--recompute-modules {' '.join(lay.recompute_modules)}"]
    elif t.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif t.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if lay.offload:  # activation offloading (off=N): the first N layers' activations to the host (runtimes/offload.py)
        args += ["--cpu-offloading", f"--cpu-offloading-num-layers {lay.offload}"]
    # Attention kernel (layout fa): flash, or Megatron's own core attention ("local": QK^T, fused masked softmax,
    # dropout, x V), the unfused one paracube prices for fa=0.
    args.append(f"--attention-backend {'flash' if lay.uses_flash else 'local'}")
    if t.dtype == "fp8":  # Transformer Engine: bf16 parameters and activations, FP8 GEMM inputs (e4m3 / e5m2)
        args += ["--bf16", "--fp8-format hybrid", "--fp8-recipe delayed"]
        if get_runtime("megatron").fp8_param_gather:  # FP8 weights held and gathered in FP8, as priced
            args.append("--fp8-param-gather")
    elif t.dtype != "fp32":
        args.append(f"--{t.dtype}")
    if t.dtype in ("bf16", "fp8"):
        args.append("--accumulate-allreduce-grads-in-fp32")  # paracube keeps fp32 gradients
    return args, notes


def data_parallel_args(plan: Plan) -> list[str]:
    """zero, shard, overlap and the gradient bucket (module docstring)."""
    lay = plan.layout
    args = [f"--ddp-bucket-size {BUCKET_BYTES // GRAD_BYTES}"]
    if lay.zero == 1:
        args.append("--use-distributed-optimizer")
        if lay.shard is not None and lay.shard < lay.dp:
            args.append(f"--num-distributed-optimizer-instances {lay.dp // lay.shard}")
    elif lay.zero >= 2:
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {SHARDING[lay.zero]}"]
    if lay.dp > 1 and lay.overlap:  # as the plan was priced (layout option `overlap`)
        args.append("--overlap-grad-reduce")
        if lay.zero >= 1:
            args.append("--overlap-param-gather")
    return args


def model_args(plan: Plan) -> list[str]:
    m = plan.model
    args = [f"--num-layers {m.layers}", f"--hidden-size {m.hidden}", f"--num-attention-heads {m.heads}",
            f"--ffn-hidden-size {m.ffn_hidden}", f"--seq-length {plan.seq_len}",
            f"--max-position-embeddings {m.seq_len}", f"--make-vocab-size-divisible-by {VOCAB_DIVISOR}",
            f"--hidden-dropout {m.dropout:g}", f"--attention-dropout {m.attention_dropout:g}"]
    if m.family == "llama":
        # --swiglu --disable-bias-linear, or GPT-OSS's activation, biases and sinks (oss_flags.py)
        args += ["--position-embedding-type rope", "--normalization RMSNorm", *megatron_oss_args(m)]
        if m.num_kv_heads != m.heads:
            args += ["--group-query-attention", f"--num-query-groups {m.num_kv_heads}"]
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args + megatron_window_args(m) + megatron_llama4_args(m)


def tokenizer_args(plan: Plan) -> tuple[list[str], list[str]]:
    """(variables the user must set, arguments)."""
    if plan.model.family == "llama":
        return ["TOKENIZER_MODEL"], ["--tokenizer-type Llama2Tokenizer", '--tokenizer-model "$TOKENIZER_MODEL"']
    return (["VOCAB_FILE", "MERGE_FILE"],
            ["--tokenizer-type GPT2BPETokenizer", '--vocab-file "$VOCAB_FILE"', '--merge-file "$MERGE_FILE"'])


TRAINING_ARGS = ['--data-path "$DATA_PATH"', "--split 949,50,1", '--train-iters "${TRAIN_ITERS:-1000}"',
                 '--lr "${LR:-1.5e-4}"', "--min-lr 1.5e-5", "--lr-decay-style cosine", "--lr-warmup-fraction 0.01",
                 "--weight-decay 0.1", "--adam-beta1 0.9", "--adam-beta2 0.95", "--clip-grad 1.0",
                 "--log-interval 10", "--eval-interval 1000", "--eval-iters 10"]


def torchrun_prologue(plan: Plan, needed: list[str]) -> list[str]:
    """Shell lines before the command: required variables, the node's rank and the rendezvous."""
    lines = ["set -euo pipefail"]
    lines += [f': "${{{v}:?set {v}}}"' for v in needed]
    lines += ['NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"',
              'MASTER_PORT="${MASTER_PORT:-29500}"',
              "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron: orders tensor-parallel communication before compute"]
    return lines


def torchrun_words(plan: Plan) -> list[str]:
    return ["torchrun", f"--nnodes={plan.launch.nnodes}", f"--nproc-per-node={plan.launch.nproc_per_node}",
            '--node-rank="$NODE_RANK"', '--master-addr="$MASTER_ADDR"', '--master-port="$MASTER_PORT"']


def export(plan: Plan) -> Export:
    refuse_unless_expressible("megatron", plan)
    m = plan.model
    parallel, notes = parallel_args(plan)
    parallel += data_parallel_args(plan)
    split = tensor_size(plan) * VOCAB_DIVISOR
    info = f"Megatron pads the vocabulary {m.vocab} to {-(-m.vocab // split) * split} (a multiple of 128 x tp)"
    needed, tokenizer = tokenizer_args(plan)
    lines = ["#!/bin/bash", comment([*header(plan, "megatron", WRITTEN_FOR, notes), info]).rstrip("\n"),
             "# run on every node (NODE_RANK=0..nnodes-1, MASTER_ADDR = node 0) from a Megatron-LM checkout",
             *torchrun_prologue(plan, ["MEGATRON_LM", "DATA_PATH", *needed])]
    command = shell_command([*torchrun_words(plan), '"$MEGATRON_LM/pretrain_gpt.py"'],
                            [*parallel, *model_args(plan), *megatron_moe_args(plan), *tokenizer, *TRAINING_ARGS])
    return Export("megatron", "\n".join(lines) + "\n" + command, tuple(notes))


__all__ = ["SHARDING", "WRITTEN_FOR", "data_parallel_args", "export", "model_args", "parallel_args",
           "torchrun_prologue", "torchrun_words", "why_not"]
