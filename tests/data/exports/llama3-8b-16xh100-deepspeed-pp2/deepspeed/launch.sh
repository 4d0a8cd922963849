#!/usr/bin/env bash
# DeepSpeed training for llama3-8b on 16 x h100-sxm (2 x 8 GPUs, dgx-h100), exported by autoplan.
# plan: dp=8 tp=1 pp=2 cp=1, micro batch 2, global batch 64 x 4096 tokens, bf16, 1f1b, recompute full, zero 1, stages [16, 16]
# Extra arguments after the script name go to pretrain_gpt.py last (they win).
# The training script builds deepspeed.pipe.PipelineModule(..., num_stages=2, partition_method="type:<your layer class>"): the plan's split is
# [16, 16] transformer layers per stage (DeepSpeed's own balancing gives the same when the layers divide evenly).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # calls deepspeed.initialize(args=...)
HOSTFILE="${HOSTFILE:-hostfile}"  # 2 lines of "<host> slots=8"
RUN_NAME=llama3-8b

echo "autoplan: launching $RUN_NAME" >&2
deepspeed \
    --hostfile "$HOSTFILE" \
    --num_nodes 2 \
    --num_gpus 8 \
    "$TRAIN_SCRIPT" \
    --deepspeed \
    --deepspeed_config "$HERE/ds_config.json" \
    --pipeline-parallel-size 2 \
    "$@"
