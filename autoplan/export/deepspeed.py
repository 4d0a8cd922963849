"""DeepSpeed: ``ds_config.json`` and a ``launch.sh`` with the ``deepspeed`` launcher line.

Keys checked against DeepSpeed 0.19.8's own parser (``deepspeed.runtime.config``,
``deepspeed.runtime.zero.config.DeepSpeedZeroConfig``,
``deepspeed.runtime.activation_checkpointing.config``): ``train_batch_size``,
``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps`` (DeepSpeed asserts
train = micro x accumulation x data-parallel ranks), ``zero_optimization.stage`` and
``.overlap_comm``, ``.offload_optimizer`` (``device``, ``pin_memory``),
``bf16.enabled``, ``fp16.enabled``, ``activation_checkpointing``, and
``pipeline`` (``get_pipeline_config``: ``stages``,
``activation_checkpoint_interval``, which the pipeline engine applies to every layer).
The launcher's options (--hostfile, --num_nodes, --num_gpus) are
``deepspeed.launcher.runner.parse_args``'s, and --deepspeed/--deepspeed_config come from
``deepspeed.add_config_arguments``; the tests parse the exported line with both.

What ds_config cannot carry stays with the training script, and launch.sh says so: the
pipeline module (``deepspeed.pipe.PipelineModule(num_stages=pp)``) and where activation
checkpoints go without a pipeline.
"""

from __future__ import annotations

import json
from typing import Any

from autoplan.export.launcher import LauncherSpec, SlurmProgram
from autoplan.export.megatron import header
from autoplan.plan import Plan
from autoplan.shell import comment, launch_tail
from autoplan.vocab import Dtype, Recompute

CONFIG = "ds_config.json"
LAUNCH = "launch.sh"


def problems(plan: Plan) -> list[tuple[str, str]]:
    """What ds_config cannot express beyond the deepspeed search space's rules."""
    out = []
    if plan.job.dtype is Dtype.FP8:
        out.append(("job.dtype", "ds_config has no fp8 training (bf16 or fp16 only; FP8 GEMMs "
                                 "need Transformer Engine in the model code)"))
    if plan.layout.dp_replicas > 1:
        out.append(("layout.dp_shard", "DeepSpeed's hierarchical ZeRO++ (zero_hpz_partition_size) "
                                       "keeps a second copy of the weights within a node; it does "
                                       "not shard the optimizer states over part of dp as this plan "
                                       "does (export to torchtitan or megatron)"))
    return out


def config(plan: Plan) -> dict[str, Any]:
    """The ds_config mapping, in DeepSpeed's key names."""
    lay = plan.layout
    zero: dict[str, Any] = {"stage": int(plan.zero)}
    if plan.zero:
        zero["overlap_comm"] = True  # the cost model overlaps the DP traffic with backward
    if plan.offload.optimizer:  # ZeRO-Offload: optimizer states and the CPU Adam step on the host
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    out: dict[str, Any] = {
        "train_batch_size": plan.job.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": zero,
    }
    if plan.job.dtype is Dtype.FP16:
        out["fp16"] = {"enabled": True}
    else:
        out["bf16"] = {"enabled": True}
    full = plan.recompute is Recompute.FULL
    if full:
        out["activation_checkpointing"] = {"partition_activations": False,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    if lay.pp > 1:
        out["pipeline"] = {"stages": lay.pp, "activation_checkpoint_interval": 1 if full else 0}
    out["steps_per_print"] = 1
    return out


def launch(plan: Plan) -> str:
    c, lay = plan.cluster, plan.layout
    words = ["deepspeed"]
    if c.nodes > 1:
        words.append('--hostfile "$HOSTFILE"')
    words += [f"--num_nodes {c.nodes}", f"--num_gpus {c.gpus_per_node}", '"$TRAIN_SCRIPT"',
              "--deepspeed", '--deepspeed_config "$HERE/ds_config.json"']
    if lay.pp > 1:
        words.append(f"--pipeline-parallel-size {lay.pp}")
    words.append('"$@"')
    notes = []
    if lay.pp > 1:
        notes += [comment(f"The training script builds deepspeed.pipe.PipelineModule(..., "
                          f"num_stages={lay.pp}, partition_method=\"type:<your layer class>\"): "
                          "the plan's split is"),
                  comment(f"{list(plan.stage_layers)} transformer layers per stage (DeepSpeed's own "
                          "balancing gives the same when the layers divide evenly).")]
    elif plan.recompute is Recompute.FULL:
        notes.append(comment("Full recompute: the training script wraps each transformer layer in "
                             "deepspeed.checkpointing.checkpoint."))
    lines = [
        "#!/usr/bin/env bash",
        *header(plan, "DeepSpeed training"),
        *notes,
        "set -euo pipefail",
        "",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # calls deepspeed.initialize(args=...)',
    ]
    if c.nodes > 1:
        lines.append(f'HOSTFILE="${{HOSTFILE:-hostfile}}"  # {c.nodes} lines of "<host> slots='
                     f'{c.gpus_per_node}"')
    lines += launch_tail(plan.model.name, words)
    return "\n".join(lines)


def export(plan: Plan) -> dict[str, str]:
    return {CONFIG: json.dumps(config(plan), indent=2) + "\n", LAUNCH: launch(plan)}


def slurm_program(plan: Plan) -> SlurmProgram:
    """The training script under the Slurm job's torchrun: deepspeed.initialize reads
    torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR), and ds_config beside the job."""
    setup = ('TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # calls deepspeed.initialize(args=...)',
             'DS_CONFIG="${DS_CONFIG:-$SLURM_SUBMIT_DIR/ds_config.json}"')
    words = ['"$TRAIN_SCRIPT"', "--deepspeed", '--deepspeed_config "$DS_CONFIG"']
    if plan.layout.pp > 1:
        words.append(f"--pipeline-parallel-size {plan.layout.pp}")
    return SlurmProgram(setup=setup, words=(*words, '"$@"'),
                        files={CONFIG: json.dumps(config(plan), indent=2) + "\n"})


LAUNCHER = LauncherSpec(
    name="deepspeed",
    summary="DeepSpeed: ds_config.json and the deepspeed launcher line",
    space="deepspeed",
    stack="deepspeed",
    export=export,
    source="deepspeed/runtime/config.py, deepspeed/runtime/zero/config.py (DeepSpeed 0.19.8)",
    problems=problems,
    slurm=slurm_program,
    order=30,
)
