"""NeMo / Megatron-Bridge: recipe overrides (YAML) for a Megatron-Core pretraining recipe.

The file follows Megatron-Bridge's ``ConfigContainer`` (megatron/bridge/training/config.py):
``model`` is a GPTModelProvider, a Megatron-Core ``TransformerConfig`` (so
tensor_model_parallel_size, pipeline_model_parallel_size,
virtual_pipeline_model_parallel_size, context_parallel_size, cp_comm_type,
expert_model_parallel_size, expert_tensor_parallel_size, sequence_parallel,
num_layers_in_first/last_pipeline_stage, pipeline_model_parallel_layout,
recompute_granularity/method/num_layers, tp_comm_overlap (Transformer Engine's comm-GEMM
overlap, where the plan's stack runs it) and seq_length are that dataclass's fields,
which the tests construct with megatron-core);
``train`` takes global_batch_size and micro_batch_size; ``optimizer`` and ``ddp`` are
Megatron-Core's ``OptimizerConfig`` and ``DistributedDataParallelConfig``;
``mixed_precision`` names one of Bridge's recipes (bf16_mixed, fp16_mixed,
bf16_with_fp8_delayed_scaling_mixed, bf16_with_fp8_current_scaling_mixed). Pass it as
``--config-file`` to a Bridge model's pretrain script (examples/models/...; the
examples/recipes folder was removed in January 2026), or its values as ``KEY=VALUE`` to
scripts/training/run_recipe.py. NeMo 2's ``nemo llm pretrain`` recipes take
the same parallel sizes as ``trainer.strategy.<name>=<value>`` and the batch sizes as
``data.micro_batch_size`` / ``data.global_batch_size``; the header lists them.

NeMo runs Megatron-Core, so a plan must fit the megatron search space to export here.

A plan on the ``nemo-1`` stack (NeMo 1.x as the 2024 NeMo-Framework-Launcher recipes ran
it, with apex's distributed_fused_adam) is written instead as NeMo 1.x's megatron_gpt
config (``trainer`` and ``model`` fields, ``model.optim`` naming the optimizer and its
dtypes): ``render_nemo1``; what that config cannot say is refused (``nemo1_problems``).
"""

from __future__ import annotations

from typing import Any

import yaml

from autoplan.cost.stage import tp_overlap_in
from autoplan.descriptors.model import Model
from autoplan.descriptors.precision import FP32_STATES
from autoplan.export.launcher import (
    EP_OVERLAP,
    MAIN_GRADS,
    MASTER_WEIGHTS,
    OPTIMIZER_STATES,
    RECOMPUTE_MODULES,
    LauncherSpec,
)
from autoplan.export.megatron import (
    fp8_needs_current_scaling,
    layout_string,
    precision_aware_problems,
)
from autoplan.export.megatron import master_problems as megatron_master_problems
from autoplan.export.megatron import model_problems as megatron_model_problems
from autoplan.plan import Plan
from autoplan.shell import comment
from autoplan.vocab import (
    CpComm,
    Dtype,
    MasterWeights,
    MoeDispatch,
    Recompute,
    StateDtype,
    TpOverlap,
    ZeroStage,
)

FILENAME = "nemo_overrides.yaml"

_PRECISION = {Dtype.BF16: "bf16_mixed", Dtype.FP16: "fp16_mixed",
              Dtype.FP8: "bf16_with_fp8_delayed_scaling_mixed"}




def model_overrides(plan: Plan) -> dict[str, Any]:
    """Megatron-Core TransformerConfig fields of the plan."""
    lay = plan.layout
    out: dict[str, Any] = {
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
        "context_parallel_size": lay.cp,
        "sequence_parallel": plan.sequence_parallel,
        "seq_length": plan.job.seq_len,
    }
    if lay.cp > 1:
        out["cp_comm_type"] = "a2a" if plan.cp_comm is CpComm.A2A else "p2p"
    if tp_overlap_in(plan) is TpOverlap.USERBUFFERS:  # ModelParallelConfig.tp_comm_overlap
        out["tp_comm_overlap"] = True
    if plan.model.is_moe:
        out["expert_model_parallel_size"] = lay.ep
        out["expert_tensor_parallel_size"] = lay.etp
        out["moe_grouped_gemm"] = True  # the experts' GEMMs as the cost model runs them
        # the dispatcher the plan was costed on (recipes pick their own otherwise)
        if plan.moe_dispatch is MoeDispatch.DEEPEP:
            out.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep")
        else:
            out["moe_token_dispatcher_type"] = "alltoall"
        if plan.ep_overlap:
            out.update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    if plan.model.mtp_layers:  # the layout counts them (Megatron-Core checks the two agree)
        out["mtp_num_layers"] = plan.model.mtp_layers
    layers = plan.stage_layers
    if plan.chunks is not None or len(set(layers[1:-1])) > 1:
        out["pipeline_model_parallel_layout"] = layout_string(plan)
    elif len(set(layers)) > 1:
        out["num_layers_in_first_pipeline_stage"] = layers[0]
        out["num_layers_in_last_pipeline_stage"] = layers[-1]
    if plan.recompute is Recompute.SELECTIVE:
        out["recompute_granularity"] = "selective"
        if plan.recompute_modules:
            out["recompute_modules"] = [m.value for m in plan.recompute_modules]
    elif plan.recompute is Recompute.FULL:
        out.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    else:
        out["recompute_granularity"] = None
    return out


def overrides(plan: Plan) -> dict[str, Any]:
    distributed = plan.zero >= ZeroStage.OPTIMIZER
    states = plan.states
    optimizer: dict[str, Any] = {"use_distributed_optimizer": distributed}
    if plan.offload.optimizer:
        optimizer.update(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
                         use_precision_aware_optimizer=True, overlap_cpu_optimizer_d2h_h2d=True)
    if states.optimizer_states is StateDtype.BF16:
        # Megatron-Core's OptimizerConfig, which Bridge's optimizer is; "bf16" strings become
        # torch dtypes (Bridge training/utils/omegaconf_utils.py, utils/activation_map.py)
        optimizer.update(use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                         exp_avg_sq_dtype="bf16")
    remainders = states.master_weights is MasterWeights.REMAINDERS
    if remainders or (states.optimizer_states is StateDtype.BF16 and not plan.offload.optimizer):
        # the precision-aware optimizer keeps the fp32 master as int16 remainders of bf16
        # weights unless told not to (OptimizerConfig.store_param_remainders, default True:
        # Megatron-LM d98e8a64 megatron/core/optimizer/optimizer_config.py L192): said as
        # the plan keeps it
        optimizer.update(use_precision_aware_optimizer=True, store_param_remainders=remainders)
    ddp: dict[str, Any] = {"use_distributed_optimizer": distributed, "overlap_grad_reduce": True,
                           "overlap_param_gather": distributed,
                           "grad_reduce_in_fp32": states.main_grads is StateDtype.FP32}
    if plan.layout.dp_replicas > 1:  # HSDP: Megatron-Core's DistributedDataParallelConfig
        ddp["num_distributed_optimizer_instances"] = plan.layout.dp_replicas
    return {
        "model": model_overrides(plan),
        "train": {"global_batch_size": plan.job.global_batch, "micro_batch_size": plan.micro_batch},
        "optimizer": optimizer,
        "ddp": ddp,
        "dataset": {"sequence_length": plan.job.seq_len},
        # Bridge's current-scaling recipe where delayed scaling refuses the recompute modules
        "mixed_precision": ("bf16_with_fp8_current_scaling_mixed"
                            if fp8_needs_current_scaling(plan) else _PRECISION[plan.job.dtype]),
    }


def nemo2_overrides(plan: Plan) -> list[str]:
    """The same plan as NeMo 2 ``nemo llm pretrain`` dotted overrides."""
    model = model_overrides(plan)
    strategy = [k for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                            "virtual_pipeline_model_parallel_size", "context_parallel_size",
                            "sequence_parallel", "expert_model_parallel_size",
                            "expert_tensor_parallel_size") if k in model]
    out = [f"trainer.strategy.{k}={_dotted(model[k])}" for k in strategy]
    if plan.layout.dp_replicas > 1:  # MegatronStrategy(num_distributed_optimizer_instances=)
        out.append(f"trainer.strategy.num_distributed_optimizer_instances={plan.layout.dp_replicas}")
    return out + [f"data.micro_batch_size={plan.micro_batch}",
                  f"data.global_batch_size={plan.job.global_batch}",
                  f"data.seq_length={plan.job.seq_len}"]


def _dotted(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --------------------------------------------------------------------------- NeMo 1.x

# The stack of NeMo 1.x as its 2024 Launcher recipes ran it (profiles/stacks/nemo-1.yaml):
# a plan on it is exported as NeMo 1.x's megatron_gpt config, not as Bridge's.
NEMO1_STACK = "nemo-1"
NEMO1_PRECISION = {Dtype.BF16: "bf16", Dtype.FP8: "bf16"}  # fp8: model.fp8 on bf16 weights


def is_nemo1(plan: Plan) -> bool:
    return plan.stack.name == NEMO1_STACK


def nemo1_problems(plan: Plan) -> list[tuple[str, str]]:
    """What NeMo 1.x's megatron_gpt config (NeMo v1.23.0 d2283e36,
    examples/nlp/language_modeling/conf/megatron_gpt_config.yaml, as the NeMo-Framework-
    Launcher 24.07 recipes set it) cannot say of a plan: the states its optimizers keep
    are fixed by megatron_base_model.py ``setup_optimization`` (L718-752) and
    ``configure_optimizers`` (L756-799)."""
    out: list[tuple[str, str]] = []
    states = plan.states
    if plan.job.dtype not in NEMO1_PRECISION:
        out.append(("job.dtype", "NeMo 1.x's recipes train bf16 weights (megatron_amp_O2; fp16 "
                                 "O2 raises without distributed_fused_adam, megatron_base_model.py "
                                 "L768)"))
    if plan.model.is_moe:
        out.append(("model", "the nemo-1 stack exports dense models; a mixture of experts exports "
                             "to Megatron-Bridge (the megatron-core stack)"))
    if plan.zero > ZeroStage.OPTIMIZER:
        out.append(("zero", "NeMo 1.x shards the optimizer (distributed_fused_adam, zero 1) or "
                            "nothing (fused_adam, zero 0)"))
    elif plan.zero is ZeroStage.NONE:
        if states != FP32_STATES:
            out.append(("job", "without distributed_fused_adam NeMo 1.x keeps fp32 gradients and an "
                               "fp32 master with fp32 moments (MainParamsOptimizerWrapper, "
                               "megatron_base_model.py L760-799): zero 1 for other states"))
    elif states.optimizer_states is StateDtype.FP32 and (
            states.master_weights is not MasterWeights.REMAINDERS):
        out.append(("job.master_weights", "distributed_fused_adam's fp32 optimizer over bf16 weights "
                                          "keeps int16 remainders (megatron_base_model.py "
                                          "L748-750: store_param_remainders)"))
    elif states.optimizer_states is StateDtype.BF16 and (
            states.master_weights is not MasterWeights.NONE):
        out.append(("job.master_weights", "distributed_fused_adam with optim.dtype bf16, the model's "
                                          "dtype, keeps no master (megatron_base_model.py L746-747: "
                                          "store_params False): master_weights none"))
    if plan.recompute_modules:
        out.append(("recompute_modules", "NeMo 1.x's selective recompute is the attention core "
                                         "(activations_checkpoint_granularity: selective)"))
    if plan.chunks is not None or len(set(plan.stage_layers)) > 1:
        out.append(("stages", "NeMo 1.x splits the layers evenly over the pipeline stages"))
    if plan.layout.cp > 1 and plan.cp_comm is CpComm.A2A:
        out.append(("cp_comm", "NeMo 1.x's context parallelism is Transformer Engine's ring (p2p)"))
    if plan.offload.any:
        out.append(("offload", "NeMo 1.x's distributed_fused_adam keeps its states on the GPU"))
    if plan.layout.dp_replicas > 1:
        out.append(("layout.dp_shard", "distributed_fused_adam shards over the whole data-parallel "
                                       "group (distributed_adam.py L72-73)"))
    return out


def nemo1_overrides(plan: Plan) -> dict[str, Any]:
    """The plan as NeMo 1.x megatron_gpt config fields (``trainer`` and ``model``, each a
    key of megatron_gpt_config.yaml or of the Launcher 24.07 recipes' training configs:
    launcher_scripts/conf/training/nemotron/nemotron_340b.yaml L11-165)."""
    lay, c, states = plan.layout, plan.cluster, plan.states
    model: dict[str, Any] = {
        "mcore_gpt": True,
        "micro_batch_size": plan.micro_batch,
        "global_batch_size": plan.job.global_batch,
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
        "context_parallel_size": lay.cp,
        "sequence_parallel": plan.sequence_parallel,
        "encoder_seq_length": plan.job.seq_len,
        "megatron_amp_O2": True,
        "transformer_engine": True,
        "fp8": plan.job.dtype is Dtype.FP8,
    }
    if plan.recompute is Recompute.SELECTIVE:
        model.update(activations_checkpoint_granularity="selective",
                     activations_checkpoint_method=None, activations_checkpoint_num_layers=None)
    elif plan.recompute is Recompute.FULL:
        model.update(activations_checkpoint_granularity="full",
                     activations_checkpoint_method="uniform", activations_checkpoint_num_layers=1)
    else:
        model["activations_checkpoint_granularity"] = None
    if plan.zero is ZeroStage.NONE:  # megatron_gpt_config.yaml L261
        model["optim"] = {"name": "fused_adam"}
    else:
        # dtype: Adam's moments (and, equal to the model's, no master); grad_sync_dtype: the
        # contiguous grad buffer's (apex DistributedFusedAdam: grad_sync_dtype defaults to
        # dtype); the rest as the Nemotron-4-340B recipe (nemotron_340b.yaml L158-165)
        model["optim"] = {
            "name": "distributed_fused_adam",
            "dtype": "bf16" if states.optimizer_states is StateDtype.BF16 else "fp32",
            "grad_sync_dtype": "bf16" if states.main_grads is StateDtype.BF16 else "fp32",
            "overlap_grad_sync": True, "overlap_param_sync": True, "contiguous_grad_buffer": True,
        }
    return {"trainer": {"num_nodes": c.nodes, "devices": c.gpus_per_node,
                        "precision": NEMO1_PRECISION.get(plan.job.dtype, "bf16")},
            "model": model}


def render_nemo1(plan: Plan) -> str:
    c = plan.cluster
    head = [
        comment(f"NeMo 1.x megatron_gpt overrides for {plan.model.name} on {c.gpus} x "
                f"{c.device.name} ({c.nodes} x {c.gpus_per_node} GPUs, {c.name}), exported by "
                f"autoplan ({plan.states.label()})."),
        comment("NeMo-Framework-Launcher: merge into a training config "
                "(launcher_scripts/conf/training/...) under `training:`; NeMo 1.x alone: give each "
                "as trainer.KEY=VALUE / model.KEY=VALUE to "
                "examples/nlp/language_modeling/megatron_gpt_pretraining.py"),
    ]
    body = yaml.safe_dump(nemo1_overrides(plan), sort_keys=False, default_flow_style=False)
    return "\n".join(head) + "\n" + body


# --------------------------------------------------------------------------- the launcher


def problems(plan: Plan) -> list[tuple[str, str]]:
    return (nemo1_problems(plan) if is_nemo1(plan) else []) + model_problems(plan.model)


def model_problems(m: Model) -> list[tuple[str, str]]:
    """The export writes GPT model overrides (a recipe's GPTConfig / GPTModelProvider
    fields): a model whose layers differ or slide needs its family's own provider
    (Megatron-Bridge's NemotronH, Qwen3-Next, ... providers), which these overrides do not
    select. A multimodal model's language model is what the plan trains."""
    if m.mixers or m.mlps:
        # send to megatron only what megatron builds (Gemma 3's GeGLU and sandwich norms not)
        instead = "; export to megatron (pretrain_hybrid.py)" if not megatron_model_problems(m) else ""
        return [("model.mixers", f"{m.name} has layers of different kinds (model.mixers / "
                                 f"model.mlps): the nemo export writes GPT overrides, not its "
                                 f"family's Megatron-Bridge provider{instead}")]
    return []


def master_problems(plan: Plan) -> list[tuple[str, str]]:
    """A master other than fp32: NeMo 1.x's (``nemo1_problems``), or Megatron-Core's as
    Megatron-LM's (``megatron.master_problems``)."""
    return [] if is_nemo1(plan) else megatron_master_problems(plan)


def render(plan: Plan) -> str:
    if is_nemo1(plan):
        return render_nemo1(plan)
    c = plan.cluster
    head = [
        comment(f"NeMo / Megatron-Bridge overrides for {plan.model.name} on {c.gpus} x "
                f"{c.device.name} ({c.nodes} x {c.gpus_per_node} GPUs, {c.name}), exported by autoplan."),
        comment("Megatron-Bridge: a model's pretrain script that takes --config-file "
                f"{FILENAME} (examples/models/...), or scripts/training/run_recipe.py with these "
                "values as KEY=VALUE overrides"),
        comment("NeMo 2 (nemo llm pretrain --factory <recipe>) takes the same values as:"),
        *(comment("  " + line) for line in nemo2_overrides(plan)),
    ]
    body = yaml.safe_dump(overrides(plan), sort_keys=False, default_flow_style=False)
    return "\n".join(head) + "\n" + body


def export(plan: Plan) -> dict[str, str]:
    return {FILENAME: render(plan)}


LAUNCHER = LauncherSpec(
    name="nemo",
    summary="NeMo 2 / Megatron-Bridge: recipe overrides (YAML) for Megatron-Core",
    space="megatron",  # NeMo and Megatron-Bridge run Megatron-Core
    stack="megatron-core",
    export=export,
    source="NVIDIA-NeMo/Megatron-Bridge megatron/bridge/training/config.py",
    # a plan on the nemo-1 stack: NeMo 1.x's megatron_gpt config (``nemo1_problems``)
    problems=problems,
    model_problems=model_problems,
    # TransformerConfig's recompute_modules and overlap_moe_expert_parallel_comm, DDP's
    # grad_reduce_in_fp32 and num_distributed_optimizer_instances, OptimizerConfig's
    # precision-aware optimizer (inside the distributed optimizer, as Megatron-LM's) and its
    # master's remainders; NeMo 1.x's optim.grad_sync_dtype and optim.dtype
    runs={RECOMPUTE_MODULES: None, MAIN_GRADS: None, EP_OVERLAP: None,
          MASTER_WEIGHTS: master_problems, OPTIMIZER_STATES: precision_aware_problems},
    order=20,
)
