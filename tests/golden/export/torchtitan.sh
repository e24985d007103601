#!/bin/bash
# written by paracube 0.1.0 (`paracube export --to torchtitan`) for torchtitan 0.3.0 (`torchtitan.train` --module/--config with --section.option flags)
# plan: gpt3-13b on 64 x dgx-a100, layout dp=4,pp=4,tp=1d:4,mb=1,v=2,sp,zero=1,overlap
# global batch 512 x 2048 tokens, bf16, recompute selective
# note: torchtitan trains without dropout; the model sets dropout 0.1, attention dropout 0.1
# model shape: gpt, 40 layers, hidden 5120, 40 heads (40 kv), ffn 20480, vocab 50257, untied embeddings: choose or add a torchtitan config_registry function of this shape (MODEL_MODULE, MODEL_CONFIG)
# run on every node (NODE_RANK=0..nnodes-1, MASTER_ADDR = node 0) where torchtitan 0.3.0 is installed
set -euo pipefail
: "${MODEL_MODULE:?set MODEL_MODULE (e.g. llama3)}"
: "${MODEL_CONFIG:?set MODEL_CONFIG (a config_registry function with the shape above)}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
torchrun --nnodes=8 --nproc-per-node=8 --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" -m torchtitan.train \
    --module "$MODEL_MODULE" \
    --config "$MODEL_CONFIG" \
    --parallelism.data_parallel_replicate_degree 1 \
    --parallelism.data_parallel_shard_degree 4 \
    --parallelism.fsdp_reshard_after_forward never \
    --parallelism.tensor_parallel_degree 4 \
    --parallelism.enable_sequence_parallel \
    --parallelism.pipeline_parallel_degree 4 \
    --parallelism.pipeline_parallel_schedule Interleaved1F1B \
    --parallelism.pipeline_parallel_layers_per_stage 5 \
    --parallelism.pipeline_parallel_first_stage_less_layers 0 \
    --parallelism.pipeline_parallel_last_stage_less_layers 0 \
    --parallelism.pipeline_parallel_microbatch_size 1 \
    --training.local_batch_size 128 \
    --training.disable_cuda_graphs \
    --training.global_batch_size 512 \
    --training.seq_len 2048 \
    --training.mixed_precision_param bfloat16 \
    --training.mixed_precision_reduce float32 \
    --training.max_norm 1.0 \
    --training.steps "${TRAIN_STEPS:-1000}" \
    activation_checkpoint:selective
