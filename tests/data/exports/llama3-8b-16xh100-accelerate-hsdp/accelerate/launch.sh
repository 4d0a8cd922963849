#!/usr/bin/env bash
# HF Accelerate (FSDP) training for llama3-8b on 16 x h100-sxm (2 x 8 GPUs, dgx-h100), exported by autoplan.
# plan: dp=16 tp=1 pp=1 cp=1, micro batch 2, global batch 64 x 4096 tokens, bf16, 1f1b, recompute full, zero 3, stages [32]
# Extra arguments after the script name go to the training script last (they win).
# The training script builds its model and data; these are HF Trainer's arguments for the plan's batch (a script of your own: edit TRAIN_ARGS to its own).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # an HF Trainer or Accelerator script
TRAIN_ARGS=(
    --per_device_train_batch_size 2
    --gradient_accumulation_steps 2
    --bf16
)
# Run it on each of the 2 nodes with NODE_RANK and MASTER_ADDR set.
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"
RUN_NAME=llama3-8b

echo "autoplan: launching $RUN_NAME" >&2
accelerate launch \
    --config_file "$HERE/accelerate_config.yaml" \
    --machine_rank "$NODE_RANK" \
    --main_process_ip "$MASTER_ADDR" \
    --main_process_port "$MASTER_PORT" \
    "$TRAIN_SCRIPT" \
    "${TRAIN_ARGS[@]}" \
    "$@"
