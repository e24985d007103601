#!/bin/bash
# written by paracube 0.1.0 (`paracube export --to deepspeed`) for DeepSpeed 0.19.8 (ds_config) with Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed, pretrain_gpt.py)
# plan: gpt3-13b on 64 x dgx-a100, layout dp=4,pp=4,tp=1d:4,mb=1,sp,zero=1,overlap
# global batch 512 x 2048 tokens, bf16, recompute selective
# run on node 0 from a Megatron-DeepSpeed checkout; HOSTFILE lists the nodes (`host slots=N`)
set -euo pipefail
: "${DATA_PATH:?set DATA_PATH}"
: "${VOCAB_FILE:?set VOCAB_FILE}"
: "${MERGE_FILE:?set MERGE_FILE}"
DS_CONFIG="${DS_CONFIG:-ds_config.json}"
HOSTFILE="${HOSTFILE:-hostfile}"
cat > "$DS_CONFIG" <<'JSON'
{
  "train_batch_size": 512,
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 128,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 1,
    "overlap_comm": true,
    "reduce_scatter": true,
    "reduce_bucket_size": 6553600,
    "allgather_bucket_size": 6553600
  },
  "steps_per_print": 10,
  "wall_clock_breakdown": false,
  "bf16": {
    "enabled": true
  },
  "data_types": {
    "grad_accum_dtype": "fp32"
  },
  "activation_checkpointing": {
    "partition_activations": false,
    "contiguous_memory_optimization": false,
    "cpu_checkpointing": false
  }
}
JSON
deepspeed --hostfile "$HOSTFILE" --num_nodes 8 --num_gpus 8 pretrain_gpt.py \
    --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 4 \
    --sequence-parallel \
    --micro-batch-size 1 \
    --global-batch-size 512 \
    --recompute-granularity selective \
    --use-flash-attn \
    --bf16 \
    --deepspeed \
    --deepspeed_config "$DS_CONFIG" \
    --zero-stage 1 \
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
