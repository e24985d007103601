#!/bin/bash
# written by paracube 0.1.0 (`paracube export --to megatron`) for Megatron-LM core_r0.16.1 (pretrain_gpt.py arguments; megatron-core 0.16.1 configs)
# plan: gpt3-13b on 64 x dgx-a100, layout dp=4,pp=4,tp=1d:4,mb=1,v=2,sp,zero=1,overlap
# global batch 512 x 2048 tokens, bf16, recompute selective
# Megatron pads the vocabulary 50257 to 50688 (a multiple of 128 x tp)
# run on every node (NODE_RANK=0..nnodes-1, MASTER_ADDR = node 0) from a Megatron-LM checkout
set -euo pipefail
: "${MEGATRON_LM:?set MEGATRON_LM}"
: "${DATA_PATH:?set DATA_PATH}"
: "${VOCAB_FILE:?set VOCAB_FILE}"
: "${MERGE_FILE:?set MERGE_FILE}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron: orders tensor-parallel communication before compute
torchrun --nnodes=8 --nproc-per-node=8 --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" "$MEGATRON_LM/pretrain_gpt.py" \
    --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 4 \
    --num-layers-per-virtual-pipeline-stage 5 \
    --sequence-parallel \
    --micro-batch-size 1 \
    --global-batch-size 512 \
    --recompute-granularity selective \
    --attention-backend flash \
    --bf16 \
    --accumulate-allreduce-grads-in-fp32 \
    --ddp-bucket-size 6553600 \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --num-layers 40 \
    --hidden-size 5120 \
    --num-attention-heads 40 \
    --ffn-hidden-size 20480 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --make-vocab-size-divisible-by 128 \
    --hidden-dropout 0.1 \
    --attention-dropout 0.1 \
    --untie-embeddings-and-output-weights \
    --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$VOCAB_FILE" \
    --merge-file "$MERGE_FILE" \
    --data-path "$DATA_PATH" \
    --split 949,50,1 \
    --train-iters "${TRAIN_ITERS:-1000}" \
    --lr "${LR:-1.5e-4}" \
    --min-lr 1.5e-5 \
    --lr-decay-style cosine \
    --lr-warmup-fraction 0.01 \
    --weight-decay 0.1 \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --clip-grad 1.0 \
    --log-interval 10 \
    --eval-interval 1000 \
    --eval-iters 10
