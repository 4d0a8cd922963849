"""HF Accelerate with PyTorch FSDP: ``accelerate_config.yaml`` and a ``launch.sh`` running
``accelerate launch --config_file accelerate_config.yaml train.py`` (the launcher users
of HF Trainer run).

Keys checked against huggingface/accelerate (1.15.0.dev0, commit 16cb6eb, read through
the code search):

- ``src/accelerate/commands/config/config_args.py``: the file is a ``ClusterConfig``
  (``compute_environment``, ``distributed_type``, ``mixed_precision``, ``use_cpu``,
  ``debug``, ``num_processes``, ``num_machines``, ``machine_rank``, ``rdzv_backend``,
  ``same_network``, ``main_training_function``, ``fsdp_config``); ``from_yaml_file``
  refuses any other top-level key.
- ``src/accelerate/commands/launch.py``: ``fsdp_config``'s keys are the ``--fsdp_*``
  launch options it copies them to (``fsdp_version``, ``fsdp_sharding_strategy``,
  ``fsdp_auto_wrap_policy``, ``fsdp_backward_prefetch``, ``fsdp_forward_prefetch``,
  ``fsdp_offload_params``, ``fsdp_activation_checkpointing``, ``fsdp_state_dict_type``,
  ``fsdp_use_orig_params``, ``fsdp_sync_module_states``, ``fsdp_cpu_ram_efficient_loading``);
  ``--mixed_precision`` takes no, fp16, bf16 or fp8; ``--machine_rank``,
  ``--main_process_ip`` and ``--main_process_port`` name a node of several.
- ``src/accelerate/utils/constants.py`` ``FSDP_SHARDING_STRATEGY``: FULL_SHARD,
  SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, read under ``fsdp_version: 1``
  (``utils/dataclasses.py`` ``FullyShardedDataParallelPlugin.__post_init__``). FSDP1 is
  written because it names every sharding the fsdp space searches: FSDP2 has no NO_SHARD
  and sets HSDP through ``parallelism_config`` instead.

The search space is ``searchspace/fsdp.yaml``: data parallel only; zero 0, 2, 3 are
NO_SHARD, SHARD_GRAD_OP and FULL_SHARD; HSDP is HYBRID_SHARD (zero 3) or
HYBRID_SHARD_ZERO2 (zero 2), which shard within one node (torch's
``torch/distributed/fsdp/_init_utils.py`` ``_init_intra_and_inter_node_groups``);
activation checkpointing is whole layers (``fsdp_activation_checkpointing``). The
micro-batch and gradient accumulation are the training script's: ``launch.sh`` passes
them as HF Trainer's ``TrainingArguments`` (``--per_device_train_batch_size``,
``--gradient_accumulation_steps``) in ``TRAIN_ARGS``, to edit for a script of one's own.
"""

from __future__ import annotations

from typing import Any

import yaml

from autoplan.export.launcher import LauncherSpec
from autoplan.export.megatron import header
from autoplan.plan import Plan
from autoplan.shell import bash_array, comment, launch_tail
from autoplan.vocab import Dtype, Recompute, ZeroStage

CONFIG = "accelerate_config.yaml"
LAUNCH = "launch.sh"

_SHARDING = {ZeroStage.NONE: "NO_SHARD", ZeroStage.GRADIENTS: "SHARD_GRAD_OP",
             ZeroStage.PARAMETERS: "FULL_SHARD"}
_HYBRID = {ZeroStage.GRADIENTS: "HYBRID_SHARD_ZERO2", ZeroStage.PARAMETERS: "HYBRID_SHARD"}
_PRECISION = {Dtype.BF16: "bf16", Dtype.FP16: "fp16"}


def problems(plan: Plan) -> list[tuple[str, str]]:
    """What the config cannot express beyond the fsdp search space's rules."""
    out = []
    if plan.job.dtype not in _PRECISION:
        out.append(("job.dtype", "the accelerate export writes bf16 or fp16 mixed precision (fp8 "
                                 "needs an fp8_config backend in the training script's model)"))
    lay = plan.layout
    if lay.dp_replicas > 1 and (lay.dp_shard != plan.cluster.gpus_per_node or plan.zero not in _HYBRID):
        out.append(("layout.dp_shard", f"FSDP's HYBRID_SHARD shards over one node's "
                                       f"{plan.cluster.gpus_per_node} GPUs (torch's "
                                       f"_init_intra_and_inter_node_groups), with zero 2 or 3; "
                                       f"this plan shards over {lay.dp_shard} at zero {int(plan.zero)}"))
    return out


def sharding(plan: Plan) -> str:
    """``fsdp_sharding_strategy`` of the plan's ZeRO stage (HSDP: within a node)."""
    if plan.layout.dp_replicas > 1:
        return _HYBRID[plan.zero]
    return _SHARDING[plan.zero]


def config(plan: Plan) -> dict[str, Any]:
    """The accelerate config mapping, in ClusterConfig's key names."""
    c = plan.cluster
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": _PRECISION[plan.job.dtype],
        "num_machines": c.nodes,
        "num_processes": plan.layout.gpus,  # every process of every machine
        "machine_rank": 0,  # launch.sh passes each node's own
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "use_cpu": False,
        "debug": False,
        "fsdp_config": {
            "fsdp_version": 1,
            "fsdp_sharding_strategy": sharding(plan),
            # wrap each transformer layer (the model's _no_split_modules): the unit the cost
            # model gathers and frees, as FSDP's layer-by-layer all-gather
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",  # the next layer's gather under backward
            "fsdp_forward_prefetch": False,
            "fsdp_offload_params": False,
            "fsdp_activation_checkpointing": plan.recompute is Recompute.FULL,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_use_orig_params": True,
            "fsdp_sync_module_states": True,
            "fsdp_cpu_ram_efficient_loading": True,
        },
    }


def render_config(plan: Plan) -> str:
    head = comment(f"HF Accelerate (FSDP) configuration for {plan.model.name}, exported by "
                   f"autoplan: accelerate launch --config_file {CONFIG} train.py")
    return head + "\n" + yaml.safe_dump(config(plan), sort_keys=False, default_flow_style=False)


def launch(plan: Plan) -> str:
    c = plan.cluster
    batch = [("--per_device_train_batch_size", str(plan.micro_batch)),
             ("--gradient_accumulation_steps", str(plan.num_microbatches)),
             (f"--{_PRECISION.get(plan.job.dtype, 'bf16')}",)]
    words = ["accelerate launch", f'--config_file "$HERE/{CONFIG}"']
    if c.nodes > 1:
        words += ['--machine_rank "$NODE_RANK"', '--main_process_ip "$MASTER_ADDR"',
                  '--main_process_port "$MASTER_PORT"']
    words += ['"$TRAIN_SCRIPT"', '"${TRAIN_ARGS[@]}"', '"$@"']
    lines = [
        "#!/usr/bin/env bash",
        *header(plan, "HF Accelerate (FSDP) training", "the training script"),
        comment("The training script builds its model and data; these are HF Trainer's arguments "
                "for the plan's batch (a script of your own: edit TRAIN_ARGS to its own)."),
        "set -euo pipefail",
        "",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # an HF Trainer or Accelerator script',
        bash_array("TRAIN_ARGS", batch),
    ]
    if c.nodes > 1:
        lines += [comment(f"Run it on each of the {c.nodes} nodes with NODE_RANK and MASTER_ADDR set."),
                  'NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
                  'MASTER_PORT="${MASTER_PORT:-29500}"']
    lines += launch_tail(plan.model.name, words)
    return "\n".join(lines)


def export(plan: Plan) -> dict[str, str]:
    return {CONFIG: render_config(plan), LAUNCH: launch(plan)}


LAUNCHER = LauncherSpec(
    name="accelerate",
    summary="HF Accelerate with FSDP: accelerate_config.yaml and the accelerate launch line",
    space="fsdp",
    stack="fsdp",
    export=export,
    source="huggingface/accelerate src/accelerate/commands/config/config_args.py, "
           "src/accelerate/commands/launch.py",
    problems=problems,
)
