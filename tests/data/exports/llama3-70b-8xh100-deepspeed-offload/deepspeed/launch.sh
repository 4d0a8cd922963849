#!/usr/bin/env bash
# DeepSpeed training for llama3-70b on 8 x h100-sxm (1 x 8 GPUs, dgx-h100), exported by autoplan.
# plan: dp=8 tp=1 pp=1 cp=1, micro batch 1, global batch 64 x 8192 tokens, bf16, 1f1b, recompute full, zero 3, stages [80]
# Extra arguments after the script name go to pretrain_gpt.py last (they win).
# Full recompute: the training script wraps each transformer layer in deepspeed.checkpointing.checkpoint.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # calls deepspeed.initialize(args=...)
RUN_NAME=llama3-70b

echo "autoplan: launching $RUN_NAME" >&2
deepspeed \
    --num_nodes 1 \
    --num_gpus 8 \
    "$TRAIN_SCRIPT" \
    --deepspeed \
    --deepspeed_config "$HERE/ds_config.json" \
    "$@"
