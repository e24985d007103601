#!/bin/bash
#SBATCH --job-name=paracube
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
#SBATCH --gpus-per-node=4
# written by paracube 0.1.0 (`paracube export --to slurm`) for paracube's executor (python -m paracube.executor.launch.worker --worker) under torchrun, torch >= 2.4 via srun
# plan: tiny on 8 x dgx-a100, layout dp=2,tp=2d:2x2,mb=2
# global batch 8 x 64 tokens, fp32, recompute none
set -euo pipefail
# layout dp=2,tp=2d:2x2,mb=2: 8 ranks = 2 nodes x 4 per node
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=29500
export MASTER_ADDR MASTER_PORT
srun --kill-on-bad-exit=1 python -m torch.distributed.run --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" --max-restarts=0 -m paracube.executor.launch.worker --worker /jobs/plan.json --steps 50
