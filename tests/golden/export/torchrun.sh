#!/bin/bash
# written by paracube 0.1.0 (`paracube export --to torchrun`) for paracube's executor (python -m paracube.executor.launch.worker --worker) under torchrun, torch >= 2.4
# plan: tiny on 8 x dgx-a100, layout dp=2,tp=2d:2x2,mb=2
# global batch 8 x 64 tokens, fp32, recompute none
set -euo pipefail
# layout dp=2,tp=2d:2x2,mb=2: 8 ranks = 2 node(s) x 4 per node
# run on every node: NODE_RANK=0..N-1, MASTER_ADDR = the address of node 0
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"
: "${NODE_RANK:?set NODE_RANK to the rank of this node, 0 on the master}"
MASTER_PORT="${MASTER_PORT:-29500}"
python -m torch.distributed.run --nnodes=2 --nproc-per-node=4 --node-rank="$NODE_RANK" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --max-restarts=0 -m paracube.executor.launch.worker --worker /jobs/plan.json --steps 50
