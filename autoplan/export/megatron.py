"""Megatron-LM: a bash script that runs ``torchrun pretrain_gpt.py`` with the plan's flags.

Flag names were checked against NVIDIA/Megatron-LM ``megatron/training/arguments.py``
(main branch, commit 000c4ac, read through the code search), function by function:

- ``_add_network_size_args``: --num-layers, --hidden-size, --ffn-hidden-size,
  --num-attention-heads, --kv-channels, --group-query-attention, --num-query-groups,
  --max-position-embeddings, --position-embedding-type {learned_absolute, rope, none},
  --normalization {LayerNorm, RMSNorm}, --swiglu, --squared-relu,
  --untie-embeddings-and-output-weights, --multi-latent-attention, --mtp-num-layers.
  There is no GeGLU flag (only --quick-geglu, a different function), so a GeGLU
  model is refused.
- ``_add_regularization_args``: --attention-dropout, --hidden-dropout.
- ``_add_training_args``: --micro-batch-size, --global-batch-size,
  --recompute-granularity {full, selective} (selective recomputes --recompute-modules,
  default core_attn: the attention core, as autoplan's ``selective``),
  --recompute-method {uniform, block}, --recompute-num-layers, --sequence-parallel,
  --disable-bias-linear, --train-iters, --lr.
- ``_add_mixed_precision_args``: --bf16, --fp16. ``_add_transformer_engine_args``:
  --fp8-format {e4m3, hybrid} (dest fp8; FP8 GEMMs inside a bf16 model).
- ``_add_distributed_args``: --tensor-model-parallel-size, --pipeline-model-parallel-size,
  --decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers,
  --pipeline-model-parallel-layout (E, t, m, L and ``|`` between stages: autoplan's
  uniform split when its extra layers sit in the middle stages, which first/last cannot say),
  --num-virtual-stages-per-pipeline-rank (the current spelling of the virtual pipeline
  size; --num-layers-per-virtual-pipeline-stage is the older one), --use-distributed-optimizer,
  --overlap-grad-reduce, --overlap-param-gather (the overlaps the cost model assumes),
  --tp-comm-overlap (Transformer Engine's comm-GEMM overlap, where the plan's stack runs it:
  ``cost.stage.tp_overlap_in``), --context-parallel-size, --cp-comm-type {p2p, a2a, allgather, a2a+p2p}.
- ``_add_data_args``: --seq-length, --mock-data. ``_add_tokenizer_args``: --tokenizer-type
  NullTokenizer, --vocab-size. ``_add_checkpointing_args``: --save, --save-interval, --load.
  ``_add_logging_args``: --log-interval, --wandb-project, --wandb-exp-name.
  ``_add_validation_args``: --eval-interval, --eval-iters.
- ``_add_moe_args``: --num-experts, --moe-router-topk, --moe-ffn-hidden-size,
  --expert-model-parallel-size, --expert-tensor-parallel-size,
  --moe-shared-expert-intermediate-size (all shared experts together), --moe-layer-freq
  (a pattern such as ``([0]*3+[1]*58)`` for dense-first layers), --moe-grouped-gemm,
  --moe-token-dispatcher-type alltoall | flex with --moe-flex-dispatcher-backend deepep,
  --moe-router-num-groups, --moe-router-group-topk (group-limited routing),
  --overlap-moe-expert-parallel-comm with --delay-wgrad-compute (EP A2A overlap, MCore
  0.14), --moe-expert-capacity-factor.
- ``_add_mla_args``: --q-lora-rank, --kv-lora-rank, --qk-head-dim (the no-RoPE part),
  --qk-pos-emb-head-dim (the RoPE part), --v-head-dim. ``_add_vision_args``: --qk-layernorm.

Models whose layers differ (``Model.mixers``/``mlps``, DeepSeek sparse attention) run
``pretrain_hybrid.py`` with ``--hybrid-layer-pattern`` (``add_experimental_args``): one
symbol per sublayer, M Mamba-2, G Gated DeltaNet, * attention (+ MLA), D DeepSeek sparse
attention, - MLP, E MoE, ``|`` between pipeline segments (pp x vpp of them: the stage
split and virtual stages) and ``/`` before each MTP depth's pattern
(megatron/core/models/hybrid/hybrid_layer_allocation.py, Symbols). The layers' sizes are
TransformerConfig fields, which Megatron-LM turns into flags (ArgumentGroupFactory):
--mamba-state-dim, --mamba-head-dim, --mamba-num-groups, --mamba-num-heads,
--linear-key-head-dim, --linear-value-head-dim, --linear-num-key-heads,
--linear-num-value-heads, --linear-conv-kernel-dim, --experimental-attention-variant,
--dsa-indexer-n-heads, --dsa-indexer-head-dim, --dsa-indexer-topk, --attention-output-gate,
--moe-shared-expert-gate, --softmax-type learnable (attention sinks, gpt-oss) and, for a
model of sliding layers with a full one every N, --window-size and --window-attn-skip-freq.

The torchrun options are torch.distributed.run's (--nnodes, --nproc-per-node,
--node-rank, --master-addr, --master-port); the tests parse them with its parser.
"""

from __future__ import annotations

from pathlib import Path

from autoplan.cost.stage import tp_overlap_in
from autoplan.descriptors import pipeline_layout
from autoplan.descriptors.model import (
    COMPRESSED_MIXERS,
    DENSE,
    FULL,
    GDN,
    KDA,
    MAMBA,
    MOE,
    NO_MIXER,
    NO_MLP,
    SLIDING,
    SPARSE,
    Model,
)
from autoplan.export import nodes
from autoplan.export.launcher import (
    EP_OVERLAP,
    MAIN_GRADS,
    MASTER_WEIGHTS,
    OPTIMIZER_STATES,
    PLACEMENT,
    RECOMPUTE_MODULES,
    LauncherSpec,
    SlurmProgram,
    TuneLaunch,
)
from autoplan.export.nodes import launch, pool_lines
from autoplan.plan import Plan
from autoplan.shell import Arg, bash_array, comment, continued, quote, slug
from autoplan.vocab import (
    Activation,
    CpComm,
    Dtype,
    MasterWeights,
    MoeDispatch,
    Norm,
    Position,
    Recompute,
    StateDtype,
    TpOverlap,
    ZeroStage,
)

FILENAME = "pretrain_megatron.sh"


def problems(plan: Plan) -> list[tuple[str, str]]:
    """What Megatron-LM cannot express beyond its search space's rules."""
    out = model_problems(plan.model)
    m, lay = plan.model, plan.layout
    if GDN in m.mixers and (m.linear_key_heads % (lay.tp * lay.cp) or m.linear_heads % (lay.tp * lay.cp)):
        # transformer_config.py __post_init__: GDN heads split over tp x cp
        out.append(("layout.tp", f"Megatron-Core splits GDN's {m.linear_key_heads} key and "
                                 f"{m.linear_heads} value heads over tp x cp = {lay.tp * lay.cp}: "
                                 f"it must divide both"))
    if MAMBA in m.mixers and m.mamba_heads % lay.tp:  # mamba_mixer.py: nheads % tp == 0
        out.append(("layout.tp", f"Megatron-Core splits Mamba's {m.mamba_heads} heads over tp "
                                 f"= {lay.tp}: it must divide them"))
    if plan.model.is_moe and plan.model.bias and plan.layout.etp > 1:
        # transformer_config.py: num_moe_experts with add_bias_linear asserts etp == 1
        out.append(("layout.etp", "Megatron-Core splits biased expert layers over no "
                                  "expert tensor parallelism (etp must be 1)"))
    return out


# Megatron-Core's hybrid symbol of each mixer (hybrid_layer_allocation.py Symbols); KDA
# and sliding windows have none
_HYBRID_MIXERS = {FULL: "*", MAMBA: "M", GDN: "G", SPARSE: "D", NO_MIXER: ""}
_HYBRID_MLPS = {DENSE: "-", MOE: "E", NO_MLP: ""}


def uses_hybrid(model: Model) -> bool:
    """Runs as Megatron-LM's hybrid model (pretrain_hybrid.py): its layers differ, or
    its attention is DeepSeek's sparse attention; sliding windows alone run as GPT."""
    return bool(set(model.mixers) - {FULL, SLIDING}) or NO_MLP in model.mlps


def model_problems(model: Model) -> list[tuple[str, str]]:
    """The model's layers and parts Megatron-LM has no way to build, by name, whatever
    the plan."""
    out = []
    if model.activation in (Activation.GEGLU, Activation.SITU):
        name = "GeGLU" if model.activation is Activation.GEGLU else "SiTU"
        out.append(("model.activation", f"Megatron-LM has no {name} flag (--swiglu, "
                                        f"--squared-relu, --quick-geglu or the default GeLU)"))
    if model.attn_res_block:
        out.append(("model.attn_res_block", "Megatron-LM has no attention residuals (Kimi-K3's "
                                            "block mixes of earlier layers' outputs)"))
    if model.moe_latent_norm:
        out.append(("model.moe_latent_norm", "Megatron-LM's latent experts (--moe-latent-size) have "
                                             "no norm between them and the up projection"))
    mixers = set(model.mixers)
    if model.is_v4_attention or mixers & COMPRESSED_MIXERS:
        out.append(("model.mixers", "Megatron-LM has no DeepSeek-V4 attention (compressed sparse "
                                    "and heavily compressed layers, the grouped low-rank output) "
                                    "in main: Megatron-Bridge's DeepSeek-V4 recipes need a dev "
                                    "Megatron-LM with PR 4839 (examples/models/deepseek_v4); "
                                    "DeepSeek-V4 is not launchable with this export"))
    if KDA in mixers:
        out.append(("model.mixers", "Megatron-LM has no Kimi Delta Attention layer (its hybrid "
                                    "layers are M, G, *, D, -, E: hybrid_layer_allocation.py); "
                                    "Kimi Linear is not launchable with Megatron-LM"))
    if SLIDING in mixers and not model.is_v4_attention and (
            uses_hybrid(model) or window_skip_freq(model) is None):
        out.append(("model.mixers", "Megatron-LM sets sliding windows for every layer but each "
                                    "N-th (--window-size, --window-attn-skip-freq N), in GPT "
                                    "models only: this model's pattern is not that"))
    if model.global_head_dim or model.global_kv_heads or model.global_k_eq_v:
        out.append(("model.global_head_dim", "Megatron-LM gives every attention layer the same "
                                             "heads: Gemma 4's wider global layers cannot be set"))
    if model.sandwich_norms:
        out.append(("model.sandwich_norms", "Megatron-LM's layers have no norm after each block "
                                            "(Gemma's sandwich norms)"))
    if (GDN in mixers or SPARSE in mixers) and MAMBA in mixers:
        out.append(("model.mixers", "Megatron-LM's hybrid model sizes Mamba and one attention "
                                    "variant (experimental_attention_variant), not both"))
    return out


def window_skip_freq(model: Model) -> int | None:
    """N where every N-th layer is full attention and the others slide (Megatron-LM's
    --window-attn-skip-freq N: "(N-1) SWA layers, then one full"); None if not so."""
    pattern = model.mixers
    if not pattern or set(pattern) - {FULL, SLIDING}:
        return None
    n = pattern.index(FULL) + 1 if FULL in pattern else 0
    if not n or len(pattern) % n or pattern != (SLIDING * (n - 1) + FULL) * (len(pattern) // n):
        return None
    return n


def hybrid_pattern(plan: Plan) -> str:
    """--hybrid-layer-pattern of the plan: each layer's mixer and MLP symbols, ``|``
    between the pipeline's virtual stages in model order, ``/`` and one MTP layer's
    symbols per MTP depth."""
    m = plan.model
    attention = "+" if m.is_mla else "*"

    def layer(i: int) -> str:
        mixer = _HYBRID_MIXERS[m.mixer(i)] if m.mixer(i) != FULL else attention
        return mixer + _HYBRID_MLPS[m.mlp(i)]

    if plan.chunks is not None:
        sizes = [c.layers for c in plan.chunks]
    elif plan.layout.vpp > 1:
        sizes = [m.layers // (plan.layout.pp * plan.layout.vpp)] * (plan.layout.pp * plan.layout.vpp)
    else:
        sizes = list(plan.stage_layers)
    segments, start = [], 0
    for n in sizes:
        segments.append("".join(layer(i) for i in range(start, start + n)))
        start += n
    mixer, mlp = m.mtp_kind
    mtp = (_HYBRID_MIXERS[mixer] if mixer != FULL else attention) + _HYBRID_MLPS[mlp]
    return "|".join(segments) + "".join("/" + mtp for _ in range(m.mtp_layers))


def hybrid_sublayers(model: Model) -> int:
    """Sublayers of the hybrid pattern (a mixer and an MLP each count one)."""
    return sum((model.mixer(i) != NO_MIXER) + (model.mlp(i) != NO_MLP) for i in range(model.layers))


def hybrid_args(plan: Plan) -> list[Arg]:
    """The hybrid layers' pattern and sizes (module doc)."""
    m = plan.model
    out: list[Arg] = []
    if uses_hybrid(m):
        out.append(("--hybrid-layer-pattern", hybrid_pattern(plan)))
    mixers = set(m.mixers)
    if MAMBA in mixers:
        out += [("--mamba-state-dim", str(m.ssm_state)), ("--mamba-head-dim", str(m.mamba_head_dim)),
                ("--mamba-num-groups", str(m.ssm_groups)), ("--mamba-num-heads", str(m.mamba_heads))]
    if GDN in mixers:  # the pattern's G builds GDN; the variant flag would ask for the GPT
        # route's linear_attention_freq (transformer_config.py __post_init__)
        out += [("--linear-key-head-dim", str(m.linear_key_dim)),
                ("--linear-value-head-dim", str(m.linear_value_dim)),
                ("--linear-num-key-heads", str(m.linear_key_heads)),
                ("--linear-num-value-heads", str(m.linear_heads)),
                ("--linear-conv-kernel-dim", str(m.conv_kernel))]
    if SPARSE in mixers:
        out += [("--experimental-attention-variant", "dsa"),
                ("--dsa-indexer-n-heads", str(m.index_heads)),
                ("--dsa-indexer-head-dim", str(m.index_head_dim)),
                ("--dsa-indexer-topk", str(m.index_topk))]
    if SLIDING in mixers:
        skip = window_skip_freq(m)
        out += [("--window-size", f"{m.sliding_window},0"), ("--window-attn-skip-freq", str(skip))]
    if m.attn_output_gate:
        out.append(("--attention-output-gate",))
    if m.attention_sinks:
        out += [("--softmax-type", "learnable")]
    if m.shared_expert_gate:
        out.append(("--moe-shared-expert-gate",))
    return out


def precision_aware_problems(plan: Plan) -> list[tuple[str, str]]:
    """bf16 optimizer states: Megatron-Core's precision-aware optimizer, which runs inside
    the distributed optimizer (megatron/core/optimizer/optimizer_config.py, __post_init__:
    "--use-precision-aware-optimizer only supported with distributed optimizer")."""
    if plan.zero < ZeroStage.OPTIMIZER:
        return [("job.optimizer_states", "Megatron-LM's precision-aware optimizer runs "
                                         "inside the distributed optimizer: zero >= 1")]
    return []


def master_problems(plan: Plan) -> list[tuple[str, str]]:
    """Master weights other than fp32 under Megatron-Core: int16 remainders are what the
    precision-aware optimizer keeps of bf16 weights, inside the distributed optimizer; no
    master at all it cannot run (--main-params-dtype takes fp32 or fp16:
    megatron/training/arguments.py L3673). Read at Megatron-LM d98e8a64:
    optimizer_config.py L192 ``store_param_remainders: bool = True``; __init__.py L587-588
    passes it to Transformer Engine's FusedAdam (TE >= 2.1), which stores remainders only
    with an fp32 master of bf16 parameters (TE d0067d0d fused_adam.py L213-214, L626); FP8
    recipes other than delayed scaling keep the master in Megatron-Core
    (optimizer_config.py L407-414)."""
    master = plan.states.master_weights
    if master is MasterWeights.NONE:
        return [("job.master_weights", "Megatron-Core keeps a master copy (--main-params-dtype "
                                       "fp32 or fp16): none is NeMo 1.x's distributed_fused_adam "
                                       "with optim.dtype bf16 (stack nemo-1, export to nemo)")]
    if master is MasterWeights.REMAINDERS:  # zero >= 1 and not fp16 (StatePrecision.effective)
        if plan.job.dtype is Dtype.FP8 and fp8_needs_current_scaling(plan):
            return [("job.master_weights", "under fp8 current scaling Megatron-Core keeps an fp32 "
                                           "master (optimizer_config.py "
                                           "use_precision_aware_optimizer_no_fp8_or_ds_fp8)")]
    return []


def model_args(plan: Plan) -> list[Arg]:
    m, job = plan.model, plan.job
    out: list[Arg] = [
        # a hybrid's layers are its pattern's sublayers (pretrain_hybrid.py counts them)
        ("--num-layers", str(hybrid_sublayers(m) if uses_hybrid(m) else m.layers)),
        ("--hidden-size", str(m.hidden)),
        ("--ffn-hidden-size", str(m.ffn_hidden)),
        ("--num-attention-heads", str(m.heads)),
    ]
    if m.is_mla:
        out.append(("--multi-latent-attention",))
        if m.q_lora_rank:
            out.append(("--q-lora-rank", str(m.q_lora_rank)))
        out += [("--kv-lora-rank", str(m.kv_lora_rank)), ("--qk-head-dim", str(m.qk_nope_head_dim)),
                ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)), ("--v-head-dim", str(m.v_head_dim))]
    else:
        if m.head_dim and m.head_dim != m.hidden // m.heads:
            out.append(("--kv-channels", str(m.head_dim)))
        if m.kv_heads < m.heads:
            out += [("--group-query-attention",), ("--num-query-groups", str(m.kv_heads))]
    if m.qk_norm:
        out.append(("--qk-layernorm",))
    out += [
        ("--seq-length", str(job.seq_len)),
        ("--max-position-embeddings", str(max(m.max_seq_len, job.seq_len))),
        ("--position-embedding-type", {Position.ROPE: "rope", Position.NONE: "none"}.get(
            m.position, "learned_absolute")),
        ("--normalization", "RMSNorm" if m.norm is Norm.RMSNORM else "LayerNorm"),
    ]
    if m.activation is Activation.SWIGLU:
        out.append(("--swiglu",))
    elif m.activation is Activation.RELU2:
        out.append(("--squared-relu",))
    if not m.tied_embeddings:
        out.append(("--untie-embeddings-and-output-weights",))
    if not m.bias:
        out.append(("--disable-bias-linear",))
    if m.qkv_bias and not m.bias:  # Qwen2's: biases on Q, K and V alone (megatron arguments.py)
        out.append(("--add-qkv-bias",))
    if not m.dropout:
        out += [("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0")]
    if m.mtp_layers:
        out.append(("--mtp-num-layers", str(m.mtp_layers)))
    return out + hybrid_args(plan)


def moe_args(plan: Plan) -> list[Arg]:
    m, lay = plan.model, plan.layout
    if not m.is_moe:
        return []
    out: list[Arg] = [
        ("--num-experts", str(m.experts)),
        ("--moe-router-topk", str(m.top_k)),
        ("--moe-ffn-hidden-size", str(m.expert_width)),
        ("--expert-model-parallel-size", str(lay.ep)),
        ("--expert-tensor-parallel-size", str(lay.etp)),
        *dispatcher_args(plan),
        ("--moe-grouped-gemm",),
    ]
    if m.route_groups:  # group-limited (DeepSeek's node-limited) routing
        out += [("--moe-router-num-groups", str(m.route_groups)),
                ("--moe-router-group-topk", str(m.route_group_topk))]
    if m.top_k == 1:  # TransformerConfig: top-1 with the softmax router needs pre-softmax
        out.append(("--moe-router-pre-softmax",))
    if m.shared_experts:
        out.append(("--moe-shared-expert-intermediate-size", str(m.shared_experts * m.shared_width)))
    if m.moe_latent:  # TransformerConfig.moe_latent_size: fc1/fc2_latent_proj around the experts
        out.append(("--moe-latent-size", str(m.moe_latent)))
    if m.dense_layers and not uses_hybrid(m):  # a hybrid's pattern places its E layers
        out.append(("--moe-layer-freq", f"([0]*{m.dense_layers}+[1]*{m.moe_layers})"))
    if m.capacity_factor:
        out.append(("--moe-expert-capacity-factor", f"{m.capacity_factor:g}"))
    return out


def dispatcher_args(plan: Plan) -> list[Arg]:
    """The token dispatcher (Megatron-Core: alltoall, or flex with the DeepEP backend) and
    the EP A2A overlap with its delayed weight gradients (MCore 0.14)."""
    out: list[Arg] = (
        [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")]
        if plan.moe_dispatch is MoeDispatch.DEEPEP
        else [("--moe-token-dispatcher-type", "alltoall")])
    if plan.ep_overlap:
        out += [("--overlap-moe-expert-parallel-comm",), ("--delay-wgrad-compute",)]
    return out


def parallel_args(plan: Plan) -> list[Arg]:
    lay = plan.layout
    out: list[Arg] = [
        ("--tensor-model-parallel-size", str(lay.tp)),
        ("--pipeline-model-parallel-size", str(lay.pp)),
    ]
    layers = plan.stage_layers
    if uses_hybrid(plan.model):  # the pattern's | segments split the stages and chunks
        pass
    elif plan.chunks is not None:  # the layout sets vpp (Megatron takes one or the other)
        out.append(("--pipeline-model-parallel-layout", layout_string(plan)))
    else:
        if lay.vpp > 1:
            out.append(("--num-virtual-stages-per-pipeline-rank", str(lay.vpp)))
        if len(set(layers[1:-1])) > 1:  # only the uniform split, extra layers in the middle
            out.append(("--pipeline-model-parallel-layout", layout_string(plan)))
        elif len(set(layers)) > 1:  # middle stages equal (the space's first_last rule)
            out += [("--decoder-first-pipeline-num-layers", str(layers[0])),
                    ("--decoder-last-pipeline-num-layers", str(layers[-1]))]
    if lay.cp > 1:
        out += [("--context-parallel-size", str(lay.cp)),
                ("--cp-comm-type", "a2a" if plan.cp_comm is CpComm.A2A else "p2p")]
    if plan.sequence_parallel:
        out.append(("--sequence-parallel",))
    if tp_overlap_in(plan) is TpOverlap.USERBUFFERS:  # Transformer Engine's comm-GEMM overlap
        out.append(("--tp-comm-overlap",))
    if plan.zero >= ZeroStage.OPTIMIZER:
        out.append(("--use-distributed-optimizer",))
        if lay.dp_replicas > 1:  # hybrid sharding: the optimizer sharded within dp_shard ranks
            out.append(("--num-distributed-optimizer-instances", str(lay.dp_replicas)))
    if plan.offload.optimizer:  # Megatron-Core's HybridDeviceOptimizer, all states on the CPU
        out += [("--optimizer-cpu-offload",), ("--optimizer-offload-fraction", "1.0"),
                ("--overlap-cpu-optimizer-d2h-h2d",)]
    states = plan.states
    remainders = states.master_weights is MasterWeights.REMAINDERS
    if plan.offload.optimizer or states.optimizer_states is StateDtype.BF16 or remainders:
        # TE's FusedAdam keeps the master: with --main-params-dtype fp32 (the default) as
        # int16 remainders of bf16 weights (OptimizerConfig.store_param_remainders=True,
        # TE >= 2.1: megatron/core/optimizer/__init__.py L587-588)
        out.append(("--use-precision-aware-optimizer",))
    if states.optimizer_states is StateDtype.BF16:  # Adam's moments in bf16
        out += [("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    if states.main_grads is StateDtype.BF16:  # else Megatron-LM accumulates bf16 grads in fp32
        out.append(("--grad-reduce-in-bf16",))
    if lay.dp > 1 or lay.cp > 1:
        out.append(("--overlap-grad-reduce",))
        if plan.zero >= ZeroStage.OPTIMIZER:
            out.append(("--overlap-param-gather",))
    return out


def layout_string(plan: Plan) -> str:
    """Megatron-Core's pipeline layout for a per-chunk layout, or a split whose middle
    stages differ: stages split by ``|``, E the embedding, t a transformer layer (``t*5``
    five), m an MTP layer and L the loss, on the first and last stage."""
    if plan.chunks is not None:
        return pipeline_layout.render_layout(plan.chunks)
    stages = [f"t*{n}" for n in plan.stage_layers]
    return "E" + "|".join(stages) + "m" * plan.model.mtp_layers + "L"


def batch_args(plan: Plan) -> list[Arg]:
    out: list[Arg] = [("--micro-batch-size", str(plan.micro_batch)),
                      ("--global-batch-size", str(plan.job.global_batch))]
    if plan.recompute is Recompute.SELECTIVE:
        out.append(("--recompute-granularity", "selective"))
        if plan.recompute_modules:  # Megatron-Core's submodules (default: core_attn)
            out.append(("--recompute-modules", *(m.value for m in plan.recompute_modules)))
    elif plan.recompute is Recompute.FULL:
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", "1")]
    return out


def precision_args(plan: Plan) -> list[Arg]:
    dtype = plan.job.dtype
    if dtype is Dtype.FP16:
        return [("--fp16",)]
    if dtype is Dtype.FP8:
        # E4M3 forward, E5M2 gradients (Transformer Engine's hybrid recipe) in a bf16 model
        out: list[Arg] = [("--bf16",), ("--fp8-format", "hybrid")]
        if fp8_needs_current_scaling(plan):
            out.append(("--fp8-recipe", "tensorwise"))
        return out
    return [("--bf16",)]


def fp8_needs_current_scaling(plan: Plan) -> bool:
    """Megatron-Core refuses moe_act and layernorm recompute under fp8's default delayed
    scaling ("Delayed scaling does not support moe_act and layernorm recompute for fp8",
    megatron/core/transformer/transformer_config.py __post_init__): such a plan runs the
    per-tensor current-scaling recipe."""
    return plan.job.dtype is Dtype.FP8 and any(
        m.value in ("moe_act", "layernorm") for m in plan.recompute_modules)


def arrays(plan: Plan) -> str:
    """The bash arrays of pretrain_gpt.py arguments (shared with the Slurm export)."""
    parts = [
        bash_array("MODEL_ARGS", model_args(plan)),
        bash_array("PARALLEL_ARGS", parallel_args(plan)),
        bash_array("BATCH_ARGS", batch_args(plan)),
        bash_array("PRECISION_ARGS", precision_args(plan)),
    ]
    if plan.model.is_moe:
        parts.append(bash_array("MOE_ARGS", moe_args(plan)))
    return "\n".join(parts)


def program_words(plan: Plan) -> list[str]:
    """pretrain_gpt.py and its arguments, as words of the torchrun command."""
    words = [f'"$MEGATRON_LM/{program(plan)}"', '"${MODEL_ARGS[@]}"', '"${PARALLEL_ARGS[@]}"',
             '"${BATCH_ARGS[@]}"', '"${PRECISION_ARGS[@]}"']
    if plan.model.is_moe:
        words.append('"${MOE_ARGS[@]}"')
    return words + ['"${RUN_ARGS[@]}"', "$DATA_ARGS", '"$@"']


def program(plan: Plan) -> str:
    """The Megatron-LM entry point: the hybrid model's where its layers differ."""
    return "pretrain_hybrid.py" if uses_hybrid(plan.model) else "pretrain_gpt.py"


def _save_interval(plan: Plan) -> str:
    """Steps between checkpoints: Daly's optimum for the cluster's failure rate and
    storage (autoplan/cost/reliability.py) where its file gives them, else once at the end."""
    from autoplan.cost.reliability import checkpoint_steps

    steps = checkpoint_steps(plan) if plan.placement is None else None
    return "$TRAIN_ITERS" if steps is None else str(steps)


def settings(plan: Plan) -> str:
    """Variables the user may override from the environment: paths, data, run length."""
    m = plan.model
    return "\n".join([
        comment("Paths and data are not part of the plan: override them from the environment."),
        'MEGATRON_LM="${MEGATRON_LM:-/opt/Megatron-LM}"  # a checkout of NVIDIA/Megatron-LM',
        f"RUN_NAME={quote(m.name)}",
        f'CHECKPOINT_DIR="${{CHECKPOINT_DIR:-checkpoints/{slug(m.name)}}}"',
        comment("mock data and a null tokenizer of the model's vocabulary unless DATA_ARGS is set"),
        f'DATA_ARGS="${{DATA_ARGS:---mock-data --tokenizer-type NullTokenizer --vocab-size {m.vocab}}}"',
        'TRAIN_ITERS="${TRAIN_ITERS:-100}"',
        "RUN_ARGS=(",
        '    --train-iters "$TRAIN_ITERS"',
        '    --lr "${LR:-3e-4}"',
        "    --log-interval 1",
        # training.py divides train_iters by eval_interval (None by default): evaluate
        # once, at the end, on EVAL_ITERS batches (0: none)
        '    --eval-interval "${EVAL_INTERVAL:-$TRAIN_ITERS}"',
        '    --eval-iters "${EVAL_ITERS:-0}"',
        '    --save "$CHECKPOINT_DIR"',
        # validate_args: --save needs a positive --save-interval (default: once, at the end;
        # on a cluster that gives its failure rate, the optimum interval: _save_interval)
        f'    --save-interval "${{SAVE_INTERVAL:-{_save_interval(plan)}}}"',
        '    --load "$CHECKPOINT_DIR"',
        ")",
        comment("Weights & Biases logs only with a project (--wandb-exp-name alone does nothing)"),
        'if [ -n "${WANDB_PROJECT:-}" ]; then',
        '    RUN_ARGS+=(--wandb-project "$WANDB_PROJECT" --wandb-exp-name "$RUN_NAME")',
        "fi",
        comment("validate_args: tensor or context parallelism on Hopper and older needs one "
                "CUDA connection (kernels and their communication ordered)"),
        "export CUDA_DEVICE_MAX_CONNECTIONS=1",
    ])


def header(plan: Plan, what: str, program: str = "pretrain_gpt.py") -> list[str]:
    m, lay = plan.model, plan.layout
    layout = (f"dp={lay.dp} tp={lay.tp} pp={lay.pp} cp={lay.cp}"
              + (f" ep={lay.ep} etp={lay.etp}" if m.is_moe else "")
              + (f" vpp={lay.vpp}" if lay.vpp > 1 else ""))
    where = launch(plan)
    return [
        comment(f"{what} for {m.name} on {where.what}, exported by autoplan."),
        *pool_lines(where),
        comment(f"plan: {layout}, micro batch {plan.micro_batch}, global batch "
                f"{plan.job.global_batch} x {plan.job.seq_len} tokens, {plan.job.dtype.value}, "
                f"{plan.schedule.value}, recompute {plan.recompute_label}, zero {int(plan.zero)}, "
                f"stages {list(plan.stage_layers)}"),
        comment(f"Extra arguments after the script name go to {program} last (they win)."),
        *([comment(f"{m.name}'s vision tower ({m.vision.params / 1e6:,.0f}M parameters) is not "
                   "part of this run: the plan trains its language model, as the cost model does")]
          if m.vision is not None else []),
    ]


def script(plan: Plan) -> str:
    c = launch(plan)
    torchrun = [
        "torchrun",
        '--nnodes "$NNODES"',
        f"--nproc-per-node {c.gpus_per_node}",
        '--node-rank "$NODE_RANK"',
        '--master-addr "$MASTER_ADDR"',
        '--master-port "$MASTER_PORT"',
        *program_words(plan),
    ]
    lines = [
        "#!/usr/bin/env bash",
        *header(plan, "Megatron-LM pretraining", program(plan)),
        comment(f"Run it on each of the {c.nodes} nodes with NODE_RANK and MASTER_ADDR set"
                " (or use the slurm export)."),
        "set -euo pipefail",
        "",
        settings(plan),
        f'NNODES="${{NNODES:-{c.nodes}}}"',
        'NODE_RANK="${NODE_RANK:-0}"',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
        'MASTER_PORT="${MASTER_PORT:-29500}"',
        "",
        arrays(plan),
        "",
        'echo "autoplan: launching $RUN_NAME on node $NODE_RANK of $NNODES" >&2',
        "# shellcheck disable=SC2086  # DATA_ARGS is a list of words",
        continued(torchrun),
        "",
    ]
    return "\n".join(lines)


def export(plan: Plan) -> dict[str, str]:
    return {FILENAME: script(plan)}


def slurm_program(plan: Plan) -> SlurmProgram:
    """pretrain_gpt.py under the Slurm job's torchrun: the same settings and arrays."""
    return SlurmProgram(setup=(settings(plan), "", arrays(plan)), words=tuple(program_words(plan)),
                        names_run=True,  # settings() sets RUN_NAME
                        before=("# shellcheck disable=SC2086  # DATA_ARGS is a list of words",))


def _tune_environment(steps: int, workdir: Path) -> dict[str, str]:
    """The script's overrides (settings()): run ``steps`` iterations, evaluate and save
    never before the end, checkpoints in the trial's folder."""
    return {"TRAIN_ITERS": str(steps), "EVAL_ITERS": "0", "EVAL_INTERVAL": str(steps),
            "SAVE_INTERVAL": str(10**9), "CHECKPOINT_DIR": str(workdir / "checkpoints")}


LAUNCHER = LauncherSpec(
    name="megatron",
    summary="Megatron-LM: a bash script running torchrun pretrain_gpt.py",
    space="megatron",
    stack="megatron-core",
    export=export,
    source="NVIDIA/Megatron-LM megatron/training/arguments.py",
    problems=problems,
    model_problems=model_problems,
    runs={RECOMPUTE_MODULES: None, MAIN_GRADS: None, MASTER_WEIGHTS: master_problems,
          OPTIMIZER_STATES: precision_aware_problems, EP_OVERLAP: None, PLACEMENT: nodes.problems},
    slurm=slurm_program,
    tune=TuneLaunch(
        log_format="megatron",  # training.py training_log (tune/logs.py)
        note="Megatron-LM's pretrain_gpt.py; set MEGATRON_LM",
        command=lambda plan, steps, workdir: ["bash", str(workdir / FILENAME)],
        job_args=lambda steps: [],
        environment=_tune_environment),
    order=10,
)
