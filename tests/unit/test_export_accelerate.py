"""export --to accelerate: HF Accelerate with FSDP (``autoplan/export/accelerate.py``).

The config's keys are checked against the names huggingface/accelerate reads them by
(1.15.0.dev0, commit 16cb6eb): the top-level keys are ``ClusterConfig``'s fields and its
``BaseConfig``'s (``src/accelerate/commands/config/config_args.py``: ``from_yaml_file``
refuses any other), ``fsdp_config``'s keys the ``--fsdp_*`` options of ``accelerate
launch`` they are copied to (``src/accelerate/commands/launch.py``), its values the
choices of ``src/accelerate/utils/constants.py`` and of ``--mixed_precision``. Accelerate
itself is not a dependency, so the names are written out here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from autoplan.export import export, launchers, refusals
from autoplan.export.accelerate import CONFIG, LAUNCH
from autoplan.plan import Plan
from autoplan.vocab import Dtype, Recompute, ZeroStage
from tests.helpers import autoplan, make_plan

# config_args.py: BaseConfig's and ClusterConfig's fields
CLUSTER_CONFIG = {
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
    "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip", "main_process_port",
    "rdzv_backend", "same_network", "main_training_function", "enable_cpu_affinity", "fp8_config",
    "deepspeed_config", "fsdp_config", "parallelism_config", "megatron_lm_config", "mpirun_config",
    "downcast_bf16", "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file",
    "commands", "tpu_vm", "tpu_env", "dynamo_config",
}
# launch.py: the FSDP arguments ("FSDP Arguments" group)
FSDP_OPTIONS = {
    "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_backward_prefetch", "fsdp_state_dict_type", "fsdp_forward_prefetch", "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "fsdp_activation_checkpointing",
}
# constants.py
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
MIXED_PRECISION = ["no", "fp16", "bf16", "fp8"]  # launch.py --mixed_precision choices


def fsdp_plan(**kwargs: object) -> Plan:
    args: dict = dict(gpus=16, global_batch=64, dp=16, zero=ZeroStage.PARAMETERS)
    args.update(kwargs)
    return make_plan("llama3-8b", **args)


def hsdp(zero: ZeroStage = ZeroStage.PARAMETERS, shard: int = 8) -> Plan:
    plan = fsdp_plan(zero=zero)
    return dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, dp_shard=shard))


def config_of(plan: Plan) -> dict:
    return yaml.safe_load(export(plan, "accelerate")[CONFIG])


@pytest.mark.parametrize(("plan", "strategy"), [
    (fsdp_plan(), "FULL_SHARD"),
    (fsdp_plan(zero=ZeroStage.GRADIENTS), "SHARD_GRAD_OP"),
    (fsdp_plan(zero=ZeroStage.NONE), "NO_SHARD"),
    (hsdp(), "HYBRID_SHARD"),
    (hsdp(ZeroStage.GRADIENTS), "HYBRID_SHARD_ZERO2"),
], ids=["zero3", "zero2", "zero0", "hsdp-zero3", "hsdp-zero2"])
def test_the_config_is_accelerates_own_keys_with_the_plans_sharding(plan: Plan, strategy: str) -> None:
    cfg = config_of(plan)
    assert set(cfg) <= CLUSTER_CONFIG
    assert set(cfg["fsdp_config"]) <= FSDP_OPTIONS
    assert cfg["distributed_type"] == "FSDP" and cfg["compute_environment"] == "LOCAL_MACHINE"
    assert cfg["mixed_precision"] in MIXED_PRECISION and cfg["mixed_precision"] == "bf16"
    assert (cfg["num_machines"], cfg["num_processes"]) == (2, 16)
    fsdp = cfg["fsdp_config"]
    assert fsdp["fsdp_version"] == 1  # the version whose sharding strategies these are
    assert fsdp["fsdp_sharding_strategy"] == strategy and strategy in FSDP_SHARDING_STRATEGY
    assert fsdp["fsdp_auto_wrap_policy"] in FSDP_AUTO_WRAP_POLICY
    assert fsdp["fsdp_backward_prefetch"] in FSDP_BACKWARD_PREFETCH
    assert fsdp["fsdp_state_dict_type"] in FSDP_STATE_DICT_TYPE
    assert fsdp["fsdp_activation_checkpointing"] is False
    # launch.py: cpu_ram_efficient_loading needs sync_module_states
    assert not fsdp["fsdp_cpu_ram_efficient_loading"] or fsdp["fsdp_sync_module_states"]
    assert "accelerate" in launchers(plan)


def test_full_recompute_is_fsdps_activation_checkpointing_and_fp16_its_mixed_precision() -> None:
    cfg = config_of(fsdp_plan(recompute=Recompute.FULL, dtype=Dtype.FP16))
    assert cfg["fsdp_config"]["fsdp_activation_checkpointing"] is True
    assert cfg["mixed_precision"] == "fp16"


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(dp=8, tp=2), "layout.tp"),
    (dict(dp=8, pp=2), "layout.pp"),
    (dict(dp=8, cp=2), "layout.cp"),
    (dict(zero=ZeroStage.OPTIMIZER), "zero"),
    (dict(recompute=Recompute.SELECTIVE), "recompute"),
    (dict(dtype=Dtype.FP8), "job.dtype"),
])
def test_plans_beyond_data_parallel_fsdp_are_refused_with_their_field(kwargs: dict, field: str) -> None:
    found = dict(refusals(fsdp_plan(**kwargs), "accelerate"))
    assert field in found, found
    if field.startswith("layout."):  # the space's rule, naming its file
        assert "searchspace/fsdp.yaml" in found[field]


def test_hsdp_over_other_than_one_node_is_refused() -> None:
    found = dict(refusals(hsdp(shard=4), "accelerate"))
    assert "one node's 8 GPUs" in found["layout.dp_shard"]
    assert refusals(hsdp(), "accelerate") == []


def test_export_to_accelerate_writes_the_config_and_a_launch_line(tmp_path: Path) -> None:
    from autoplan.plans.file import plan_document

    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(plan_document(fsdp_plan(micro_batch=2))))
    out = tmp_path / "launch"
    r = autoplan("export", plan_path, "--to", "accelerate", "--out", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [CONFIG, LAUNCH]
    stubs = tmp_path / "stubs.sh"
    stubs.write_text('accelerate() { printf "%s\\n" "$@" > "$STUB_LOG"; }\n')
    log = tmp_path / "words"
    env = {"PATH": os.environ["PATH"], "BASH_ENV": str(stubs), "STUB_LOG": str(log),
           "NODE_RANK": "1", "MASTER_ADDR": "node001"}
    done = subprocess.run(["bash", str(out / LAUNCH), "--max_steps", "10"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    words = log.read_text().splitlines()
    assert words[:3] == ["launch", "--config_file", str(out / CONFIG)]
    assert words[words.index("--machine_rank") + 1] == "1"
    assert words[words.index("--main_process_ip") + 1] == "node001"
    script = words.index("train.py")
    # HF Trainer's TrainingArguments: micro-batch 2 and 64 / (2 x 16) = 2 accumulation steps
    assert words[script + 1:] == ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps",
                                  "2", "--bf16", "--max_steps", "10"]
