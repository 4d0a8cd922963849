#!/usr/bin/env bash
# Megatron-LM pretraining for deepseek-v3 on 2048 x h100-sxm (256 x 8 GPUs, dgx-h100), exported by autoplan.
# plan: dp=32 tp=2 pp=16 cp=2 ep=8 etp=1 vpp=2, micro batch 1, global batch 15360 x 4096 tokens, bf16, interleaved, recompute selective (moe_act, layernorm), zero 1, stages [5, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2]
# Extra arguments after the script name go to pretrain_gpt.py last (they win).
# Run it on each of the 256 nodes with NODE_RANK and MASTER_ADDR set (or use the slurm export).
set -euo pipefail

# Paths and data are not part of the plan: override them from the environment.
MEGATRON_LM="${MEGATRON_LM:-/opt/Megatron-LM}"  # a checkout of NVIDIA/Megatron-LM
RUN_NAME=deepseek-v3
CHECKPOINT_DIR="${CHECKPOINT_DIR:-checkpoints/deepseek-v3}"
# mock data and a null tokenizer of the model's vocabulary unless DATA_ARGS is set
DATA_ARGS="${DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size 129280}"
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
NNODES="${NNODES:-256}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"

MODEL_ARGS=(
    --num-layers 61
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --multi-latent-attention
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --seq-length 4096
    --max-position-embeddings 163840
    --position-embedding-type rope
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --mtp-num-layers 1
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 16
    --pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'
    --context-parallel-size 2
    --cp-comm-type p2p
    --sequence-parallel
    --tp-comm-overlap
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)
BATCH_ARGS=(
    --micro-batch-size 1
    --global-batch-size 15360
    --recompute-granularity selective
    --recompute-modules moe_act layernorm
)
PRECISION_ARGS=(
    --bf16
)
MOE_ARGS=(
    --num-experts 256
    --moe-router-topk 8
    --moe-ffn-hidden-size 2048
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1
    --moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend deepep
    --overlap-moe-expert-parallel-comm
    --delay-wgrad-compute
    --moe-grouped-gemm
    --moe-router-num-groups 8
    --moe-router-group-topk 4
    --moe-shared-expert-intermediate-size 2048
    --moe-layer-freq '([0]*3+[1]*58)'
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
    "${MOE_ARGS[@]}" \
    "${RUN_ARGS[@]}" \
    $DATA_ARGS \
    "$@"
