#!/usr/bin/env bash
# Megatron-LM pretraining for llama3-8b on 64 x h100-sxm (8 x 8 GPUs, dgx-h100), exported by autoplan.
# plan: dp=32 tp=1 pp=1 cp=2, micro batch 1, global batch 512 x 8192 tokens, bf16, 1f1b, recompute none, zero 1, stages [32]
# Extra arguments after the script name go to pretrain_gpt.py last (they win).
# Run it on each of the 8 nodes with NODE_RANK and MASTER_ADDR set (or use the slurm export).
set -euo pipefail

# Paths and data are not part of the plan: override them from the environment.
MEGATRON_LM="${MEGATRON_LM:-/opt/Megatron-LM}"  # a checkout of NVIDIA/Megatron-LM
RUN_NAME=llama3-8b
CHECKPOINT_DIR="${CHECKPOINT_DIR:-checkpoints/llama3-8b}"
# mock data and a null tokenizer of the model's vocabulary unless DATA_ARGS is set
DATA_ARGS="${DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size 128256}"
TRAIN_ITERS="${TRAIN_ITERS:-100}"
RUN_ARGS=(
    --train-iters "$TRAIN_ITERS"
    --lr "${LR:-3e-4}"
    --log-interval 1
    --eval-interval "${EVAL_INTERVAL:-$TRAIN_ITERS}"
    --eval-iters "${EVAL_ITERS:-0}"
    --save "$CHECKPOINT_DIR"
    --save-interval "${SAVE_INTERVAL:-$TRAIN_ITERS}"
    --load "$CHECKPOINT_DIR"
)
# Weights & Biases logs only with a project (--wandb-exp-name alone does nothing)
if [ -n "${WANDB_PROJECT:-}" ]; then
    RUN_ARGS+=(--wandb-project "$WANDB_PROJECT" --wandb-exp-name "$RUN_NAME")
fi
# validate_args: tensor or context parallelism on Hopper and older needs one CUDA connection (kernels and their communication ordered)
export CUDA_DEVICE_MAX_CONNECTIONS=1
NNODES="${NNODES:-8}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"

MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --context-parallel-size 2
    --cp-comm-type p2p
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)
BATCH_ARGS=(
    --micro-batch-size 1
    --global-batch-size 512
)
PRECISION_ARGS=(
    --bf16
)

echo "autoplan: launching $RUN_NAME on node $NODE_RANK of $NNODES" >&2
# shellcheck disable=SC2086  # DATA_ARGS is a list of words
torchrun \
    --nnodes "$NNODES" \
    --nproc-per-node 8 \
    --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" \
    --master-port "$MASTER_PORT" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    "${MODEL_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" \
    "${BATCH_ARGS[@]}" \
    "${PRECISION_ARGS[@]}" \
    "${RUN_ARGS[@]}" \
    $DATA_ARGS \
    "$@"
