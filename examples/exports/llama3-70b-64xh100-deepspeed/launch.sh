#!/usr/bin/env bash
# DeepSpeed training for llama3-70b on 64 x h100-sxm (8 x 8 GPUs, dgx-h100), exported by autoplan.
# plan: dp=64 tp=1 pp=1 cp=1, micro batch 4, global batch 256 x 4096 tokens, bf16, 1f1b, recompute full, zero 3, stages [80]
# Extra arguments after the script name go to pretrain_gpt.py last (they win).
# Full recompute: the training script wraps each transformer layer in deepspeed.checkpointing.checkpoint.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # calls deepspeed.initialize(args=...)
HOSTFILE="${HOSTFILE:-hostfile}"  # 8 lines of "<host> slots=8"
RUN_NAME=llama3-70b

echo "autoplan: launching $RUN_NAME" >&2
deepspeed \
    --hostfile "$HOSTFILE" \
    --num_nodes 8 \
    --num_gpus 8 \
    "$TRAIN_SCRIPT" \
    --deepspeed \
    --deepspeed_config "$HERE/ds_config.json" \
    "$@"
