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
"""

from __future__ import annotations

from typing import Any

import yaml

from autoplan.cost.stage import tp_overlap_in
from autoplan.export.launcher import (
    EP_OVERLAP,
    MAIN_GRADS,
    OPTIMIZER_STATES,
    RECOMPUTE_MODULES,
    LauncherSpec,
)
from autoplan.export.megatron import fp8_needs_current_scaling, layout_string, precision_aware_problems
from autoplan.export.shell import comment
from autoplan.plan import Plan
from autoplan.vocab import CpComm, Dtype, MoeDispatch, Recompute, StateDtype, TpOverlap, ZeroStage

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
    optimizer: dict[str, Any] = {"use_distributed_optimizer": distributed}
    if plan.offload.optimizer:
        optimizer.update(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
                         use_precision_aware_optimizer=True, overlap_cpu_optimizer_d2h_h2d=True)
    if plan.job.optimizer_states is StateDtype.BF16:
        # Megatron-Core's OptimizerConfig, which Bridge's optimizer is; "bf16" strings become
        # torch dtypes (Bridge training/utils/omegaconf_utils.py, utils/activation_map.py)
        optimizer.update(use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                         exp_avg_sq_dtype="bf16")
    ddp: dict[str, Any] = {"use_distributed_optimizer": distributed, "overlap_grad_reduce": True,
                           "overlap_param_gather": distributed,
                           "grad_reduce_in_fp32": plan.job.main_grads is StateDtype.FP32}
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


def render(plan: Plan) -> str:
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
    # TransformerConfig's recompute_modules and overlap_moe_expert_parallel_comm, DDP's
    # grad_reduce_in_fp32 and num_distributed_optimizer_instances, OptimizerConfig's
    # precision-aware optimizer (inside the distributed optimizer, as Megatron-LM's)
    runs={RECOMPUTE_MODULES: None, MAIN_GRADS: None, EP_OVERLAP: None,
          OPTIMIZER_STATES: precision_aware_problems},
    order=20,
)
