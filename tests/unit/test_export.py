"""autoplan export: golden files per launcher, the launchers' own parsers on the exports,
refusals that name the plan file and field, shell quoting, and search -> export.

Regenerate the golden files (tests/data/exports/) and the committed examples
(examples/exports/) after an intended change with ``AUTOPLAN_REGEN_GOLDEN=1 pytest
tests/unit/test_export.py``, then read the diff.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from autoplan.descriptors.library import resolve_model
from autoplan.descriptors.pipeline_layout import from_stage_lists
from autoplan.descriptors.strict import read_yaml
from autoplan.errors import InputError
from autoplan.export import Launcher, Target, export, refusals
from autoplan.parallel.rules import plan_problems
from autoplan.plan import Plan
from autoplan.plans.file import read_plan
from autoplan.schedules import Schedule
from autoplan.vocab import (
    Activation,
    CpComm,
    Dtype,
    MasterWeights,
    MoeDispatch,
    Offload,
    Recompute,
    RecomputeModule,
    StateDtype,
    ZeroStage,
)
from tests.helpers import autoplan, make_plan

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "exports"
EXAMPLES = ROOT / "examples"
REGEN = os.environ.get("AUTOPLAN_REGEN_GOLDEN") == "1"
EVIL = 'x"; rm -rf / #$(id)'


def plan_file(name: str) -> Plan:
    path = EXAMPLES / "plans" / name
    return read_plan(read_yaml(path), str(path))


# each case: a plan, and the targets it exports to (slurm with its launcher)
CASES: dict[str, tuple[Callable[[], Plan], list[tuple[Target, Launcher]]]] = {
    "llama3-8b-64xh100-megatron-best": (
        lambda: plan_file("llama3-8b-64xh100-megatron-best.yaml"),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON),
         (Target.SLURM, Launcher.MEGATRON)]),
    "deepseek-v3-2048xh100-megatron": (
        lambda: plan_file("deepseek-v3-2048xh100-megatron.yaml"),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON)]),
    "llama3-70b-64xh100-interleaved-fp8": (
        lambda: make_plan("llama3-70b", gpus=64, global_batch=256, seq_len=4096, dtype=Dtype.FP8,
                          dp=2, tp=8, pp=4, vpp=2, schedule=Schedule.INTERLEAVED,
                          recompute=Recompute.FULL, sequence_parallel=True),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON)]),
    "deepseek-v3-2048xh100-pp16vpp2-layout": (
        lambda: plan_file("deepseek-v3-2048xh100-pp16vpp2-layout.yaml"),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON)]),
    "deepseek-v3-2048xh100-deepep-ep-overlap": (
        lambda: dataclasses.replace(
            plan_file("deepseek-v3-2048xh100-pp16vpp2-layout.yaml"), recompute=Recompute.SELECTIVE,
            recompute_modules=(RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM),
            moe_dispatch=MoeDispatch.DEEPEP, ep_overlap=True),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON)]),
    "llama3-8b-16xh100-megatron-chunks": (
        lambda: dataclasses.replace(
            make_plan("llama3-8b", gpus=16, global_batch=64, dp=2, tp=2, pp=4, vpp=2,
                      schedule=Schedule.INTERLEAVED, sequence_parallel=True),
            chunks=from_stage_lists([[3, 5], [4, 4], [4, 4], [5, 3]])),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON)]),
    "llama3-8b-16xh100-torchtitan-chunks": (
        lambda: dataclasses.replace(
            make_plan("llama3-8b", gpus=16, global_batch=64, dp=2, tp=2, pp=4, vpp=2,
                      schedule=Schedule.INTERLEAVED, zero=ZeroStage.OPTIMIZER,
                      sequence_parallel=True),
            chunks=from_stage_lists([[3, 5], [4, 4], [4, 4], [5, 3]])),
        [(Target.TORCHTITAN, Launcher.MEGATRON)]),
    "llama3-8b-48xh100-megatron-pp6-layout": (
        lambda: make_plan("llama3-8b", gpus=48, global_batch=64, dp=8, pp=6),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON)]),
    "llama3-70b-8xh100-megatron-offload": (
        lambda: make_plan("llama3-70b", gpus=8, global_batch=64, seq_len=8192, dp=1, tp=8,
                          sequence_parallel=True, offload=Offload(optimizer=True)),
        [(Target.MEGATRON, Launcher.MEGATRON), (Target.NEMO, Launcher.MEGATRON),
         (Target.SLURM, Launcher.MEGATRON)]),
    "llama3-70b-64xh100-megatron-bf16-states": (
        lambda: dataclasses.replace(
            (p := make_plan("llama3-70b", gpus=64, global_batch=256, dp=8, tp=8,
                            sequence_parallel=True)),
            job=dataclasses.replace(p.job, main_grads=StateDtype.BF16,
                                    optimizer_states=StateDtype.BF16)),
        [(Target.MEGATRON, Launcher.MEGATRON)]),
    "llama3-70b-8xh100-deepspeed-offload": (
        lambda: make_plan("llama3-70b", gpus=8, global_batch=64, seq_len=8192, dp=8,
                          recompute=Recompute.FULL, zero=ZeroStage.PARAMETERS,
                          offload=Offload(optimizer=True)),
        [(Target.DEEPSPEED, Launcher.MEGATRON), (Target.SLURM, Launcher.DEEPSPEED)]),
    "llama3-8b-16xh100-deepspeed-pp2": (
        lambda: make_plan("llama3-8b", gpus=16, global_batch=64, dp=8, pp=2, micro_batch=2,
                          recompute=Recompute.FULL, zero=ZeroStage.OPTIMIZER),
        [(Target.DEEPSPEED, Launcher.MEGATRON), (Target.SLURM, Launcher.DEEPSPEED)]),
    "llama3-8b-16xh100-torchtitan-interleaved": (
        lambda: make_plan("llama3-8b", gpus=16, global_batch=64, dp=2, tp=2, pp=2, vpp=2,
                          schedule=Schedule.INTERLEAVED, recompute=Recompute.SELECTIVE,
                          zero=ZeroStage.OPTIMIZER, sequence_parallel=True),
        [(Target.TORCHTITAN, Launcher.MEGATRON), (Target.SLURM, Launcher.TORCHTITAN)]),
    "llama3-8b-16xh100-accelerate-hsdp": (
        lambda: dataclasses.replace(
            (p := make_plan("llama3-8b", gpus=16, global_batch=64, dp=16, micro_batch=2,
                            recompute=Recompute.FULL, zero=ZeroStage.PARAMETERS)),
            layout=dataclasses.replace(p.layout, dp_shard=8)),
        [(Target.ACCELERATE, Launcher.MEGATRON)]),
    "llama3-8b-32xh100-torchtitan-uneven-cp": (
        lambda: make_plan("llama3-8b", gpus=32, global_batch=64, seq_len=8192, dp=4, pp=4, cp=2,
                          stages=(7, 9, 9, 7), recompute=Recompute.FULL, zero=ZeroStage.OPTIMIZER),
        [(Target.TORCHTITAN, Launcher.MEGATRON)]),
}


def _export_dir(case: str, target: Target, launcher: Launcher) -> str:
    return f"{case}/{target.value}" + (f"-{launcher.value}" if target is Target.SLURM else "")


GOLDEN_PARAMS = [pytest.param(case, t, lch, id=_export_dir(case, t, lch))
                 for case, (_, targets) in CASES.items() for t, lch in targets]


def exported(case: str, target: Target, launcher: Launcher = Launcher.MEGATRON) -> dict[str, str]:
    return export(CASES[case][0](), target, case, launcher)


# --------------------------------------------------------------------------- golden files

@pytest.mark.parametrize(("case", "target", "launcher"), GOLDEN_PARAMS)
def test_each_export_matches_its_golden_files(case: str, target: Target, launcher: Launcher) -> None:
    files = exported(case, target, launcher)
    where = GOLDEN / _export_dir(case, target, launcher)
    if REGEN:
        where.mkdir(parents=True, exist_ok=True)
        for old in where.iterdir():
            old.unlink()
        for name, text in files.items():
            (where / name).write_text(text, encoding="utf-8")
    assert sorted(p.name for p in where.iterdir()) == sorted(files), "regenerate the golden files"
    for name, text in files.items():
        assert (where / name).read_text(encoding="utf-8") == text, f"{where / name} differs"


def test_the_same_plan_exports_the_same_bytes_twice() -> None:
    for case, target, launcher in (("deepseek-v3-2048xh100-megatron", Target.MEGATRON, Launcher.MEGATRON),
                                   ("llama3-8b-16xh100-deepspeed-pp2", Target.SLURM, Launcher.DEEPSPEED)):
        assert exported(case, target, launcher) == exported(case, target, launcher)


# --------------------------------------------------------------------------- running the scripts

STUBS = r"""
_record() { printf '%s\0' "$@" >> "$STUB_LOG"; printf '\001' >> "$STUB_LOG"; }
torchrun() { _record torchrun "$@"; }
srun() { _record srun "$@"; }
deepspeed() { _record deepspeed "$@"; }
scontrol() { printf 'node001\nnode002\n'; }
"""


def run_script(tmp_path: Path, files: dict[str, str], script: str,
               extra_env: dict[str, str] | None = None) -> tuple[list[list[str]], str]:
    """Run an exported script with torchrun/srun/deepspeed/scontrol replaced by functions
    that record their arguments; (each recorded command's words, stderr)."""
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "stubs.sh").write_text(STUBS, encoding="utf-8")
    log = tmp_path / "commands.log"
    log.write_bytes(b"")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "BASH_ENV": str(tmp_path / "stubs.sh"),
           "STUB_LOG": str(log), "SLURM_JOB_NODELIST": "node[001-002]", "SLURM_JOB_ID": "42",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_SUBMIT_DIR": str(tmp_path), **(extra_env or {})}
    result = subprocess.run(["bash", str(tmp_path / script)], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    records = [r.split(b"\0")[:-1] for r in log.read_bytes().split(b"\1") if r]
    return [[w.decode() for w in rec] for rec in records], result.stderr


def torchrun_args(words: list[str]) -> argparse.Namespace:
    """torchrun's own parser (torch.distributed.run) on the recorded words."""
    pytest.importorskip("torch")
    from torch.distributed.run import get_args_parser

    start = words.index("torchrun")
    return get_args_parser().parse_args(words[start + 1:])


def flags(words: list[str]) -> dict[str, list[str]]:
    """``--a-b 1 --c`` as {"a_b": ["1"], "c": []} (argparse dest names), in order."""
    out: dict[str, list[str]] = {}
    key = None
    for word in words:
        if word.startswith("--"):
            key = word[2:].replace("-", "_")
            assert key not in out, f"{word} given twice"
            out[key] = []
        else:
            assert key is not None, word
            out[key].append(word)
    return out


def test_every_script_passes_bash_syntax_check(tmp_path: Path) -> None:
    for case, target, launcher in ((p.values[0], p.values[1], p.values[2]) for p in GOLDEN_PARAMS):
        for name, text in exported(case, target, launcher).items():
            if name.endswith((".sh", ".sbatch")):
                path = tmp_path / name
                path.write_text(text, encoding="utf-8")
                result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                                        check=False)
                assert result.returncode == 0, (case, name, result.stderr)


def evil_plan(base: Plan) -> Plan:
    return dataclasses.replace(base, model=dataclasses.replace(base.model, name=EVIL))


@pytest.mark.parametrize(("target", "launcher", "script", "base"), [
    (Target.MEGATRON, Launcher.MEGATRON, "pretrain_megatron.sh", "llama3-8b-64xh100-megatron-best"),
    (Target.DEEPSPEED, Launcher.MEGATRON, "launch.sh", "llama3-8b-16xh100-deepspeed-pp2"),
    (Target.SLURM, Launcher.MEGATRON, "job.sbatch", "llama3-8b-64xh100-megatron-best"),
    (Target.SLURM, Launcher.DEEPSPEED, "job.sbatch", "llama3-8b-16xh100-deepspeed-pp2"),
    (Target.SLURM, Launcher.TORCHTITAN, "job.sbatch", "llama3-8b-16xh100-torchtitan-interleaved"),
])
def test_a_model_name_with_quotes_and_dollars_stays_a_literal_word(
        tmp_path: Path, target: Target, launcher: Launcher, script: str, base: str) -> None:
    files = export(evil_plan(CASES[base][0]()), target, "<evil>", launcher)
    path = tmp_path / script
    path.write_text(files[script], encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    commands, stderr = run_script(tmp_path, files, script, {"WANDB_PROJECT": "p"})
    assert EVIL in stderr  # the banner names the run literally
    assert "uid=" not in stderr and all("uid=" not in w for c in commands for w in c)
    if target is Target.MEGATRON or (target is Target.SLURM and launcher is Launcher.MEGATRON):
        words = commands[0]
        assert words[words.index("--wandb-exp-name") + 1] == EVIL
    assert "#$(id)" not in files[script].split("\n#SBATCH --job-name=")[-1].split("\n")[0]


def test_the_toml_and_yaml_exports_keep_an_odd_model_name_as_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    plan = evil_plan(make_plan("llama3-8b", gpus=16, global_batch=64, dp=16, zero=ZeroStage.PARAMETERS))
    toml = tomllib.loads(export(plan, Target.TORCHTITAN)["torchtitan.toml"])
    assert toml["job"]["description"].startswith(EVIL)
    nemo = export(dataclasses.replace(plan, zero=ZeroStage.OPTIMIZER), Target.NEMO)["nemo_overrides.yaml"]
    assert yaml.safe_load(nemo)["train"]["global_batch_size"] == 64


# --------------------------------------------------------------------------- Megatron-LM

# Megatron-LM's core_transformer_config_from_args copies every argument whose dest names a
# TransformerConfig field; these are the arguments it renames or translates.
MEGATRON_RENAMES = {"num_experts": "num_moe_experts",
                    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
                    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
                    "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size",
                    "fp8_format": "fp8"}
# arguments of training, data, checkpointing and the model's embedding, not of TransformerConfig
MEGATRON_TRAINING = {"seq_length", "max_position_embeddings", "position_embedding_type",
                     "untie_embeddings_and_output_weights", "multi_latent_attention",
                     "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
                     "micro_batch_size", "global_batch_size", "train_iters", "lr", "log_interval",
                     "save", "save_interval", "load", "wandb_exp_name", "wandb_project",
                     "eval_interval", "eval_iters", "mock_data", "tokenizer_type", "vocab_size",
                     "group_query_attention", "swiglu", "squared_relu", "disable_bias_linear"}
# arguments Megatron-LM turns into its OptimizerConfig (megatron/training/training.py)
MEGATRON_OFFLOAD = {"optimizer_cpu_offload", "optimizer_offload_fraction",
                    "use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d"}
MEGATRON_OPTIMIZER = MEGATRON_OFFLOAD | {"exp_avg_dtype", "exp_avg_sq_dtype", "grad_reduce_in_bf16"}


def megatron_config(args: dict[str, list[str]]) -> Any:
    """Megatron-Core's TransformerConfig (or MLATransformerConfig) from pretrain_gpt.py
    arguments, as Megatron-LM builds it; its __post_init__ checks the parallel layout."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    import torch.nn.functional as F
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    cls = MLATransformerConfig if "multi_latent_attention" in args else TransformerConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {}
    for name, values in args.items():
        if name in MEGATRON_TRAINING | MEGATRON_OPTIMIZER:
            continue
        field = MEGATRON_RENAMES.get(name, name)
        assert field in fields, f"--{name.replace('_', '-')} is no {cls.__name__} field"
        if not values:
            kw[field] = True
        elif field == "recompute_modules":  # nargs='*': the module names
            kw[field] = list(values)
        elif field == "moe_layer_freq":  # Megatron-LM's moe_freq_type evaluates the pattern
            m = re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\*(\d+)\)", values[0])
            assert m, values[0]
            kw[field] = [0] * int(m[1]) + [1] * int(m[2])
        else:
            kw[field] = _number(values[0])
    if "swiglu" in args:
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if "disable_bias_linear" in args:
        kw["add_bias_linear"] = False
    dtype = torch.float16 if "fp16" in args else torch.bfloat16
    return cls(**kw, params_dtype=dtype, pipeline_dtype=dtype)


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


MEGATRON_CASES = [c for c in CASES if (Target.MEGATRON, Launcher.MEGATRON) in CASES[c][1]]


def validate_args_problems(args: dict[str, list[str]], world: int, env: dict[str, str]) -> list[str]:
    """What Megatron-LM would refuse of these pretrain_gpt.py arguments, at start-up
    (``validate_args`` in megatron/training/arguments.py, NVIDIA/Megatron-LM main at
    d98e8a64, August 2026: A:line) or when it builds the model and trains (the config
    dataclasses and training loop: file:line). Each rule for a flag the export emits."""
    def val(name: str, default: str | None = None) -> str | None:
        return args[name][0] if args.get(name) else default

    def num(name: str, default: int | None = None) -> int | None:
        v = val(name)
        return int(v) if v is not None else default

    out = []
    tp, pp, cp = (num("tensor_model_parallel_size", 1), num("pipeline_model_parallel_size", 1),
                  num("context_parallel_size", 1))
    assert tp and pp and cp
    if world % (tp * pp * cp):  # A:427-434
        out.append("world size % (tp*pp*cp)")
    dp = world // (tp * pp * cp)  # A:448
    for required in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings",
                     "seq_length", "micro_batch_size", "lr"):  # A:1314-1317, A:693, scheduler
        if val(required) is None:
            out.append(f"--{required} missing")
    if val("train_iters") is None:  # training.py:2586
        out.append("--train-iters missing")
    mbs, gbs = num("micro_batch_size", 1), num("global_batch_size")
    assert mbs
    if gbs is not None and gbs % (mbs * dp):  # A:715, num_microbatches_calculator.py:381
        out.append("global batch % (micro batch * dp)")
    seq = num("seq_length")
    if seq is not None and (num("max_position_embeddings") or 0) < seq:  # A:1353-1356
        out.append("max_position_embeddings < seq_length")
    if seq is not None and cp > 1 and seq % (2 * cp):  # A:1335-1338
        out.append("seq_length % (2*cp)")
    if "save" in args and (num("save_interval") or 0) <= 0:  # A:1361-1363
        out.append("--save without a positive --save-interval")
    if val("train_iters") is not None and val("eval_interval") is None:  # training.py:5436
        out.append("--eval-interval missing: train_iters // None")
    if "wandb_exp_name" in args and "wandb_project" not in args:  # global_vars.py:258
        out.append("--wandb-exp-name without --wandb-project does nothing")
    if "fp16" in args and "bf16" in args:  # A:1195-1217
        out.append("--fp16 with --bf16")
    if "squared_relu" in args and "swiglu" in args:  # argument_utils.py:320
        out.append("--squared-relu with --swiglu")
    if "multi_latent_attention" in args and "group_query_attention" in args:  # A:1973
        out.append("MLA with GQA")
    if ("group_query_attention" in args) != ("num_query_groups" in args):  # argument_utils.py:330
        out.append("--group-query-attention and --num-query-groups go together")
    if "mtp_num_layers" in args and val("position_embedding_type", "learned_absolute") not in (
            "rope", "none"):  # A:882-886
        out.append("MTP needs rope or no position embedding")
    if "tokenizer_type" in args and val("tokenizer_type") == "NullTokenizer" and "vocab_size" not in args:
        out.append("NullTokenizer needs --vocab-size")  # null_tokenizer.py:16
    vpp = num("num_virtual_stages_per_pipeline_rank")
    layout = val("pipeline_model_parallel_layout")
    if vpp is not None and layout is not None:  # A:928-939
        out.append("--num-virtual-stages-per-pipeline-rank with a layout")
    first_last = "decoder_first_pipeline_num_layers" in args or "decoder_last_pipeline_num_layers" in args
    if layout is not None and first_last:  # transformer_config.py:2242-2258
        out.append("a layout with --decoder-first/last-pipeline-num-layers")
    layers = num("num_layers", 0) or 0
    if vpp and vpp > 1:
        if pp < 2:  # A:1000-1008
            out.append("virtual stages need pp > 1")
        if not first_last and layers % (pp * vpp):  # transformer_block.py:157-176
            out.append("num_layers % (pp*vpp)")
        if gbs is not None:  # schedules.py:1160-1180 (group size pp)
            m = gbs // (mbs * dp)
            if m < pp or m % pp:
                out.append("interleaved: microbatches >= pp and % pp")
    if layout is None and vpp is None and not first_last and layers % pp:  # A:980-998
        out.append("num_layers % pp")
    granularity = val("recompute_granularity")
    if granularity == "selective" and ("recompute_method" in args or "recompute_num_layers" in args):
        out.append("selective recompute takes no method or layer count")  # A:1425, tc:1901-1932
    if granularity == "full" and not ("recompute_method" in args and "recompute_num_layers" in args):
        out.append("full recompute needs --recompute-method and --recompute-num-layers")
    if "overlap_param_gather" in args and not (
            "use_distributed_optimizer" in args and "overlap_grad_reduce" in args):  # A:1024-1029
        out.append("--overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce")
    for kind in args.get("cp_comm_type", []):  # transformer_engine.py:2153 passes it to TE
        if kind not in ("p2p", "all_gather", "a2a", "a2a+p2p"):
            out.append(f"--cp-comm-type {kind}")
    if (tp > 1 or cp > 1) and env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":  # A:1453-1479
        out.append("tp or cp > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1 (Hopper and older)")
    if "num_experts" in args:
        experts, ep = num("num_experts", 0) or 0, num("expert_model_parallel_size", 1) or 1
        if experts % ep:  # A:1655-1658
            out.append("num_experts % ep")
        if tp > 1 and "sequence_parallel" not in args:  # moe_layer.py:636
            out.append("MoE with tp > 1 needs --sequence-parallel")
        etp = num("expert_tensor_parallel_size", tp) or tp  # A:587-588
        if etp > 1 and "disable_bias_linear" not in args:  # transformer_config.py:2612
            out.append("MoE with etp > 1 needs --disable-bias-linear")
        if num("moe_router_topk", 2) == 1 and "moe_router_pre_softmax" not in args:
            out.append("top-1 routing needs --moe-router-pre-softmax")  # tc:2661-2669
        if world % ((etp or 1) * ep * pp):  # parallel_state.py:881
            out.append("world % (etp*ep*pp)")
    return out


@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_megatron_arguments_pass_megatron_lms_validate_args_rules(tmp_path: Path, case: str) -> None:
    """Megatron-LM's own start-up checks, encoded for every flag the export emits (the
    training script ships in no package, so they are restated here from its source)."""
    plan = CASES[case][0]()
    files = exported(case, Target.MEGATRON)
    commands, _ = run_script(tmp_path, files, "pretrain_megatron.sh")
    (words,) = commands
    run = torchrun_args(words)
    args = flags(run.training_script_args)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if "export CUDA_DEVICE_MAX_CONNECTIONS=1" in \
        files["pretrain_megatron.sh"] else {}
    assert validate_args_problems(args, plan.cluster.gpus, env) == []
    assert "wandb_exp_name" not in args  # only with WANDB_PROJECT set


def test_the_validate_args_rules_catch_what_megatron_refuses() -> None:
    """The rules above are not vacuous: each refusal that bit a real export."""
    ok = {"num_layers": ["32"], "hidden_size": ["4096"], "num_attention_heads": ["32"],
          "max_position_embeddings": ["8192"], "seq_length": ["8192"], "micro_batch_size": ["1"],
          "global_batch_size": ["64"], "lr": ["3e-4"], "train_iters": ["100"],
          "eval_interval": ["100"], "tensor_model_parallel_size": ["2"]}
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert validate_args_problems(ok, 16, env) == []
    assert validate_args_problems({**ok, "save": ["ckpt"]}, 16, env) == [
        "--save without a positive --save-interval"]
    assert validate_args_problems({k: v for k, v in ok.items() if k != "eval_interval"}, 16, env) == [
        "--eval-interval missing: train_iters // None"]
    assert validate_args_problems(ok, 16, {}) == [
        "tp or cp > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1 (Hopper and older)"]
    assert validate_args_problems({**ok, "wandb_exp_name": ["x"]}, 16, env) == [
        "--wandb-exp-name without --wandb-project does nothing"]
    # 6 sequences over dp = 16 / (2 * 4) = 2: 3 microbatches, fewer than pp = 4
    assert validate_args_problems({**ok, "num_virtual_stages_per_pipeline_rank": ["2"],
                                   "pipeline_model_parallel_size": ["4"],
                                   "global_batch_size": ["6"]}, 16, env) == [
        "interleaved: microbatches >= pp and % pp"]


@pytest.mark.parametrize("case", MEGATRON_CASES)
@pytest.mark.torch
def test_megatron_script_arguments_build_a_megatron_core_config(tmp_path: Path, case: str) -> None:
    plan = CASES[case][0]()
    commands, _ = run_script(tmp_path, exported(case, Target.MEGATRON), "pretrain_megatron.sh")
    (words,) = commands
    run = torchrun_args(words)
    assert (run.nnodes, run.nproc_per_node) == (str(plan.cluster.nodes), str(plan.cluster.gpus_per_node))
    assert run.training_script.endswith("/pretrain_gpt.py")
    args = flags(run.training_script_args)
    cfg = megatron_config(args)
    lay = plan.layout
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size,
            cfg.context_parallel_size) == (lay.tp, lay.pp, lay.cp)
    assert cfg.virtual_pipeline_model_parallel_size == (lay.vpp if lay.vpp > 1 else None)
    assert cfg.sequence_parallel is plan.sequence_parallel
    assert cfg.num_layers == plan.model.layers
    assert cfg.recompute_granularity == (None if plan.recompute is Recompute.NONE else plan.recompute.value)
    gpus = plan.cluster.gpus
    assert int(args["global_batch_size"][0]) % (int(args["micro_batch_size"][0]) * gpus
                                                // (lay.tp * lay.pp * lay.cp)) == 0
    assert ("use_distributed_optimizer" in args) is (plan.zero is ZeroStage.OPTIMIZER)
    if plan.model.is_moe:
        assert (cfg.num_moe_experts, cfg.moe_router_topk) == (plan.model.experts, plan.model.top_k)
        assert (cfg.expert_model_parallel_size, cfg.expert_tensor_parallel_size) == (lay.ep, lay.etp)
        assert sum(cfg.moe_layer_freq) == plan.model.moe_layers
    if plan.chunks is not None:  # Megatron-Core reads back every chunk of the layout
        ranks = cfg.pipeline_model_parallel_layout.layout  # [pp rank][virtual stage][layer]
        for vs, chunk in enumerate(plan.chunks):
            kinds = [x.name for x in ranks[vs % lay.pp][vs // lay.pp]]
            assert (kinds.count("decoder"), kinds.count("mtp"), "embedding" in kinds,
                    "loss" in kinds) == (chunk.layers, chunk.mtp, chunk.embedding, chunk.loss)
    elif len(set(plan.stage_layers[1:-1])) > 1:  # only a layout can place the uniform split
        ranks = cfg.pipeline_model_parallel_layout.layout  # [pp rank][virtual stage][layer]
        assert [sum(x.name == "decoder" for x in rank[0]) for rank in ranks] == list(plan.stage_layers)
    elif len(set(plan.stage_layers)) > 1:
        assert (cfg.num_layers_in_first_pipeline_stage,
                cfg.num_layers_in_last_pipeline_stage) == (plan.stage_layers[0], plan.stage_layers[-1])
    if plan.job.dtype is Dtype.FP8:
        assert cfg.fp8 == "hybrid" and cfg.bf16


@pytest.mark.torch
def test_megatron_core_rejects_a_split_the_middle_stages_cannot_share(tmp_path: Path) -> None:
    """The check above has teeth: a first/last split leaving uneven middle stages fails."""
    commands, _ = run_script(tmp_path, exported("deepseek-v3-2048xh100-megatron", Target.MEGATRON),
                             "pretrain_megatron.sh")
    args = flags(torchrun_args(commands[0]).training_script_args)
    args["decoder_last_pipeline_num_layers"] = ["2"]
    with pytest.raises((ValueError, AssertionError)):
        megatron_config(args)


def test_megatron_exports_cp_all_to_all_and_dense_models_without_moe_flags() -> None:
    plan = make_plan("llama3-8b", gpus=16, global_batch=64, seq_len=8192, dp=4, tp=2, cp=2,
                     cp_comm=CpComm.A2A, sequence_parallel=True)
    text = export(plan, Target.MEGATRON)["pretrain_megatron.sh"]
    assert "--cp-comm-type a2a" in text and "--context-parallel-size 2" in text
    assert "--num-experts" not in text and "MOE_ARGS" not in text


# --------------------------------------------------------------------------- NeMo / Megatron-Bridge

NEMO_CASES = [c for c in CASES if (Target.NEMO, Launcher.MEGATRON) in CASES[c][1]]


@pytest.mark.parametrize("case", NEMO_CASES)
@pytest.mark.torch
@pytest.mark.usefixtures("te_version")
def test_nemo_overrides_are_megatron_core_config_fields(case: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer import TransformerConfig
    plan = CASES[case][0]()
    doc = yaml.safe_load(exported(case, Target.NEMO)["nemo_overrides.yaml"])
    assert set(doc) == {"model", "train", "optimizer", "ddp", "dataset", "mixed_precision"}
    m = plan.model
    model = {k: v for k, v in doc["model"].items() if k != "seq_length"}  # GPTModelProvider's own
    cfg = TransformerConfig(num_layers=m.layers, hidden_size=m.hidden, num_attention_heads=m.heads,
                            num_moe_experts=m.experts or None, moe_ffn_hidden_size=m.expert_width
                            if m.is_moe else None, pipeline_dtype=torch.bfloat16, bf16=True,
                            **{"moe_token_dispatcher_type": "alltoall", **model})
    assert cfg.tensor_model_parallel_size == plan.layout.tp
    DistributedDataParallelConfig(**doc["ddp"])
    OptimizerConfig(**doc["optimizer"])
    assert doc["train"] == {"global_batch_size": plan.job.global_batch, "micro_batch_size": plan.micro_batch}
    assert doc["mixed_precision"] in ("bf16_mixed", "fp16_mixed", "bf16_with_fp8_delayed_scaling_mixed")


# --------------------------------------------------------------------------- DeepSpeed

class _FakeMpu:
    """Just enough of a model-parallel unit for DeepSpeedConfig to know the DP size."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture
def ds_config_class(monkeypatch: pytest.MonkeyPatch) -> Any:
    """DeepSpeedConfig as rank 0 of a job: without a process group it would take the
    data-parallel size as 1 and skip the mpu that says what it is."""
    pytest.importorskip("deepspeed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.runtime import config

    monkeypatch.setattr(config.dist, "get_rank", lambda *a, **k: 0)
    return config.DeepSpeedConfig


@pytest.mark.torch
def test_ds_config_is_read_by_deepspeeds_own_config_classes(ds_config_class: Any) -> None:
    DeepSpeedConfig = ds_config_class
    plan = CASES["llama3-8b-16xh100-deepspeed-pp2"][0]()
    raw = json.loads(exported("llama3-8b-16xh100-deepspeed-pp2", Target.DEEPSPEED)["ds_config.json"])
    cfg = DeepSpeedConfig(raw, mpu=_FakeMpu(plan.layout.dp))  # asserts train = micro x accum x dp
    assert cfg.train_batch_size == plan.job.global_batch
    assert cfg.train_micro_batch_size_per_gpu == plan.micro_batch
    assert cfg.gradient_accumulation_steps == plan.num_microbatches
    assert cfg.zero_optimization_stage == int(plan.zero)
    assert cfg.bfloat16_config.enabled and not cfg.float16_config.enabled
    assert cfg.pipeline["stages"] == plan.layout.pp
    assert cfg.pipeline["activation_checkpoint_interval"] == 1


@pytest.mark.parametrize("zero", list(ZeroStage))
@pytest.mark.torch
def test_every_zero_stage_and_fp16_parse_in_deepspeed(ds_config_class: Any, zero: ZeroStage) -> None:
    DeepSpeedConfig = ds_config_class
    plan = make_plan("llama3-8b", gpus=16, global_batch=64, dp=16, micro_batch=2, zero=zero,
                     dtype=Dtype.FP16)
    cfg = DeepSpeedConfig(json.loads(export(plan, Target.DEEPSPEED)["ds_config.json"]), mpu=_FakeMpu(16))
    assert cfg.zero_optimization_stage == int(zero)
    assert cfg.float16_config.enabled and not cfg.bfloat16_config.enabled
    assert cfg.gradient_accumulation_steps == 2


@pytest.mark.torch
def test_deepspeed_launch_line_parses_with_deepspeeds_launcher(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import deepspeed
        from deepspeed.launcher.runner import parse_args
    files = exported("llama3-8b-16xh100-deepspeed-pp2", Target.DEEPSPEED)
    commands, _ = run_script(tmp_path, files, "launch.sh")
    (words,) = commands
    run = parse_args(words[1:])
    assert (run.num_nodes, run.num_gpus, run.hostfile) == (2, 8, "hostfile")
    assert run.user_script == "train.py"
    user = deepspeed.add_config_arguments(argparse.ArgumentParser())
    user.add_argument("--pipeline-parallel-size", type=int)
    ns = user.parse_args(run.user_args)
    assert ns.deepspeed and ns.deepspeed_config == str(tmp_path / "ds_config.json")
    assert ns.pipeline_parallel_size == 2


# --------------------------------------------------------------------------- torchtitan

def torchtitan_config(path: Path) -> Any:
    """torchtitan's ConfigManager on the exported TOML. torchtitan's package __init__
    imports its tokenizer (tokenizers, huggingface_hub); its config module needs only
    tyro, so the package is entered without running that __init__."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    if spec is None or importlib.util.find_spec("tyro") is None:
        pytest.skip("torchtitan (and tyro) not installed")
    saved = {k: v for k, v in sys.modules.items() if k == "torchtitan" or k.startswith("torchtitan.")}
    package = types.ModuleType("torchtitan")
    package.__path__ = list(spec.submodule_search_locations or [])
    sys.modules["torchtitan"] = package
    try:
        try:
            from torchtitan.config import ConfigManager
        except ImportError as exc:
            pytest.skip(f"torchtitan's config module does not import: {exc}")
        return ConfigManager().parse_args(["--job.config_file", str(path)])
    finally:
        for k in [k for k in sys.modules if k == "torchtitan" or k.startswith("torchtitan.")]:
            del sys.modules[k]
        sys.modules.update(saved)


TORCHTITAN_CASES = [c for c in CASES if (Target.TORCHTITAN, Launcher.MEGATRON) in CASES[c][1]]


@pytest.mark.parametrize("case", TORCHTITAN_CASES)
@pytest.mark.torch
def test_torchtitan_toml_is_read_by_torchtitans_config_manager(tmp_path: Path, case: str) -> None:
    plan = CASES[case][0]()
    path = tmp_path / "torchtitan.toml"
    path.write_text(exported(case, Target.TORCHTITAN)["torchtitan.toml"], encoding="utf-8")
    cfg = torchtitan_config(path)
    par, lay = cfg.parallelism, plan.layout
    assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == lay.dp
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree,
            par.context_parallel_degree) == (lay.tp, lay.pp, lay.cp)
    assert cfg.activation_checkpoint.mode == plan.recompute.value
    assert cfg.training.global_batch_size == plan.job.global_batch
    assert cfg.training.seq_len == plan.job.seq_len
    if lay.pp > 1:
        parts = par.module_fqns_per_model_part
        assert len(parts) == lay.pp * lay.vpp
        assert sum(len([m for m in p if m.startswith("layers.")]) for p in parts) == plan.model.layers
        if plan.chunks is not None:  # part i is virtual stage i, as in Megatron's order
            assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [
                c.layers for c in plan.chunks]
        elif lay.vpp == 1:
            assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == list(plan.stage_layers)
        micro = par.pipeline_parallel_microbatch_size
        assert cfg.training.local_batch_size // micro == plan.num_microbatches  # per DP rank
        from torch.distributed.pipelining.schedules import get_schedule_class

        get_schedule_class(par.pipeline_parallel_schedule)  # a schedule torch knows
    else:
        assert cfg.training.local_batch_size == plan.micro_batch


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED,
                                      Schedule.ZB_V])
@pytest.mark.torch
def test_every_torchtitan_schedule_is_a_torch_pipelining_schedule(schedule: Schedule) -> None:
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import get_schedule_class

    from autoplan.export.torchtitan import schedule_name

    assert get_schedule_class(schedule_name(schedule)) is not None


# --------------------------------------------------------------------------- Slurm

@pytest.mark.parametrize("launcher", list(Launcher))
@pytest.mark.torch
def test_slurm_runs_one_torchrun_per_node_with_c10d_rendezvous_on_the_first_host(
        tmp_path: Path, launcher: Launcher) -> None:
    case = {Launcher.MEGATRON: "llama3-8b-64xh100-megatron-best",
            Launcher.DEEPSPEED: "llama3-8b-16xh100-deepspeed-pp2",
            Launcher.TORCHTITAN: "llama3-8b-16xh100-torchtitan-interleaved"}[launcher]
    plan = CASES[case][0]()
    files = exported(case, Target.SLURM, launcher)
    text = files["job.sbatch"]
    assert f"#SBATCH --nodes={plan.cluster.nodes}\n" in text
    assert f"#SBATCH --gpus-per-node={plan.cluster.gpus_per_node}\n" in text
    commands, _ = run_script(tmp_path, files, "job.sbatch")
    (words,) = commands
    assert words[0] == "srun"
    run = torchrun_args(words)
    assert (run.rdzv_backend, run.rdzv_endpoint, run.rdzv_id) == ("c10d", "node001:29500", "42")
    assert (run.nnodes, run.nproc_per_node) == (str(plan.cluster.nodes), str(plan.cluster.gpus_per_node))
    if launcher is Launcher.DEEPSPEED:
        assert run.training_script_args[:3] == ["--deepspeed", "--deepspeed_config",
                                                str(tmp_path / "ds_config.json")]
        assert set(files) == {"job.sbatch", "ds_config.json"}
    if launcher is Launcher.TORCHTITAN:
        assert run.module and run.training_script == "torchtitan.train"
        assert run.training_script_args == ["--job.config_file", str(tmp_path / "torchtitan.toml")]


# --------------------------------------------------------------------------- refusals

def test_a_plan_outside_the_launchers_space_is_refused_naming_each_field() -> None:
    plan = plan_file("deepseek-v3-2048xh100-megatron.yaml")
    with pytest.raises(InputError) as err:
        export(plan, Target.DEEPSPEED, "plans/dsv3.yaml")
    fields = {p.field for p in err.value.problems}
    assert {"layout.tp", "layout.cp", "layout.ep", "sequence_parallel", "stages"} <= fields
    assert all(p.source == "plans/dsv3.yaml" for p in err.value.problems)
    assert "searchspace/deepspeed.yaml" in str(err.value)


@pytest.fixture
def te_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """OptimizerConfig's precision-aware checks ask Transformer Engine's version, which every
    Megatron-Core GPU install has and this CPU test environment has not: taken as current."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.optimizer import optimizer_config
    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda *a, **k: True)


@pytest.mark.usefixtures("te_version")
def test_an_offloaded_optimizer_exports_megatron_cores_cpu_offload_options(tmp_path: Path) -> None:
    """The megatron script's offload flags build Megatron-Core's OptimizerConfig (whose
    checks need the distributed optimizer for the precision-aware CPU optimizer), with
    every state on the CPU and the copies overlapped, as the cost model's stack assumes."""
    from megatron.core.optimizer import OptimizerConfig
    case = "llama3-70b-8xh100-megatron-offload"
    commands, _ = run_script(tmp_path, exported(case, Target.MEGATRON), "pretrain_megatron.sh")
    args = flags(torchrun_args(commands[0]).training_script_args)
    kw = {name: True if not values else _number(values[0])
          for name, values in args.items() if name in MEGATRON_OPTIMIZER}
    assert set(kw) == MEGATRON_OFFLOAD
    cfg = OptimizerConfig(optimizer="adam", bf16=True, use_distributed_optimizer=True, **kw)
    assert cfg.optimizer_cpu_offload and cfg.optimizer_offload_fraction == 1.0
    assert cfg.overlap_cpu_optimizer_d2h_h2d
    assert "use_distributed_optimizer" in args
    nemo = yaml.safe_load(exported(case, Target.NEMO)["nemo_overrides.yaml"])["optimizer"]
    assert OptimizerConfig(optimizer="adam", bf16=True, **nemo).optimizer_cpu_offload


@pytest.mark.torch
def test_bf16_gradients_and_moments_export_megatrons_precision_aware_optimizer(tmp_path: Path) -> None:
    """--grad-reduce-in-bf16 and the precision-aware optimizer's bf16 moments (master weights
    fp32) build Megatron-Core's OptimizerConfig, as Megatron-LM maps the dtype names."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.optimizer import OptimizerConfig
    case = "llama3-70b-64xh100-megatron-bf16-states"
    commands, _ = run_script(tmp_path, exported(case, Target.MEGATRON), "pretrain_megatron.sh")
    args = flags(torchrun_args(commands[0]).training_script_args)
    assert args["exp_avg_dtype"] == args["exp_avg_sq_dtype"] == ["bf16"]
    assert "grad_reduce_in_bf16" in args and "use_distributed_optimizer" in args
    # OptimizerConfig's fields (building one needs Transformer Engine's FusedAdam); the
    # master weights stay fp32 by default
    fields = {f.name: f for f in dataclasses.fields(OptimizerConfig)}
    assert {"exp_avg_dtype", "exp_avg_sq_dtype", "use_precision_aware_optimizer"} <= set(fields)
    assert fields["main_params_dtype"].default == torch.float32
    plan = CASES[case][0]()
    assert not refusals(plan, Target.NEMO)  # Bridge's optimizer is the same OptimizerConfig
    optimizer = yaml.safe_load(exported(case, Target.NEMO)["nemo_overrides.yaml"])["optimizer"]
    assert optimizer["use_precision_aware_optimizer"] and optimizer["exp_avg_dtype"] == "bf16"
    assert set(optimizer) <= set(fields)
    assert dict(refusals(dataclasses.replace(plan, zero=ZeroStage.NONE),
                         Target.MEGATRON))["job.optimizer_states"].endswith("zero >= 1")


def _states(plan: Plan, stack: str | None = None, **job: Any) -> Plan:
    from autoplan.descriptors.library import builtin_stack

    plan = dataclasses.replace(plan, job=dataclasses.replace(plan.job, **job))
    return plan if stack is None else dataclasses.replace(plan, stack=builtin_stack(stack))


@pytest.mark.torch
def test_int16_master_remainders_export_as_the_precision_aware_optimizer(tmp_path: Path) -> None:
    """Megatron-Core's precision-aware optimizer keeps the fp32 master as int16 remainders of
    bf16 weights (OptimizerConfig.store_param_remainders, default True): a plan keeping them
    exports --use-precision-aware-optimizer (moments left fp32), Bridge's optimizer says
    store_param_remainders as the plan keeps it; below the distributed optimizer they are a
    full fp32 copy."""
    pytest.importorskip("megatron.core")
    from megatron.core.optimizer import OptimizerConfig
    fields = {f.name: f for f in dataclasses.fields(OptimizerConfig)}
    assert fields["store_param_remainders"].default is True
    plan = _states(make_plan("llama3-70b", gpus=64, global_batch=256, dp=8, tp=8,
                             sequence_parallel=True), master_weights=MasterWeights.REMAINDERS)
    commands, _ = run_script(tmp_path, export(plan, Target.MEGATRON), "pretrain_megatron.sh")
    args = flags(torchrun_args(commands[0]).training_script_args)
    assert "use_precision_aware_optimizer" in args and "use_distributed_optimizer" in args
    assert "exp_avg_dtype" not in args and "grad_reduce_in_bf16" not in args
    optimizer = yaml.safe_load(export(plan, Target.NEMO)["nemo_overrides.yaml"])["optimizer"]
    assert optimizer["use_precision_aware_optimizer"] and optimizer["store_param_remainders"] is True
    assert set(optimizer) <= set(fields)
    # bf16 moments over an fp32 master: Bridge told to keep the fp32 copy the plan counts
    both = yaml.safe_load(exported("llama3-70b-64xh100-megatron-bf16-states",
                                   Target.NEMO)["nemo_overrides.yaml"])
    assert both["optimizer"]["store_param_remainders"] is False
    assert both["ddp"]["grad_reduce_in_fp32"] is False  # bf16 gradients
    # without the distributed optimizer the remainders are an fp32 copy (StatePrecision.effective)
    plain = dataclasses.replace(plan, zero=ZeroStage.NONE)
    assert plain.states.master_weights is MasterWeights.FP32
    assert "use_precision_aware_optimizer" not in flags(torchrun_args(run_script(
        tmp_path, export(plain, Target.MEGATRON), "pretrain_megatron.sh")[0][0]).training_script_args)


# what NeMo 1.x's megatron_gpt config has (NeMo v1.23.0 d2283e36
# examples/nlp/language_modeling/conf/megatron_gpt_config.yaml: trainer L9-12, model L58-185,
# optim L260-261; context_parallel_size: megatron_base_model.py L196 and the Launcher 24.07 recipes,
# nemotron_340b.yaml L59; optim's distributed_fused_adam keys: nemotron_340b.yaml L158-165)
NEMO1_TRAINER = {"num_nodes", "devices", "precision"}
NEMO1_MODEL = {"mcore_gpt", "micro_batch_size", "global_batch_size", "tensor_model_parallel_size",
               "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
               "context_parallel_size", "sequence_parallel", "encoder_seq_length", "megatron_amp_O2",
               "transformer_engine", "fp8", "activations_checkpoint_granularity",
               "activations_checkpoint_method", "activations_checkpoint_num_layers", "optim"}
NEMO1_OPTIM = {"name", "dtype", "grad_sync_dtype", "overlap_grad_sync", "overlap_param_sync",
               "contiguous_grad_buffer"}


def _nemotron_recipe(**job: Any) -> Plan:
    plan = make_plan("nemotron-4-340b", gpus=128, global_batch=64, dp=2, tp=8, pp=8, vpp=4,
                     schedule=Schedule.INTERLEAVED, recompute=Recompute.SELECTIVE,
                     sequence_parallel=True)
    return _states(plan, "nemo-1", **job)


def test_a_nemo_1_plan_exports_nemo_1x_megatron_gpt_config_with_its_optimizers_dtypes() -> None:
    """On the nemo-1 stack the nemo export writes NeMo 1.x's megatron_gpt config: the
    Nemotron-4-340B recipe's optim block (grad_sync_dtype bf16, dtype bf16: no master) for
    its states, distributed_fused_adam's defaults (fp32, fp32: int16 remainders) for the
    stack's, fused_adam without the distributed optimizer."""
    recipe = _nemotron_recipe(main_grads=StateDtype.BF16, master_weights=MasterWeights.NONE,
                              optimizer_states=StateDtype.BF16)
    assert not refusals(recipe, Target.NEMO)
    text = export(recipe, Target.NEMO)["nemo_overrides.yaml"]
    assert text.startswith("# NeMo 1.x megatron_gpt overrides for nemotron-4-340b")
    doc = yaml.safe_load(text)
    assert set(doc) == {"trainer", "model"}
    assert set(doc["trainer"]) <= NEMO1_TRAINER and set(doc["model"]) <= NEMO1_MODEL
    assert doc["trainer"] == {"num_nodes": 16, "devices": 8, "precision": "bf16"}
    model = doc["model"]
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"],
            model["virtual_pipeline_model_parallel_size"]) == (8, 8, 4)
    assert model["activations_checkpoint_granularity"] == "selective" and model["megatron_amp_O2"]
    assert set(model["optim"]) <= NEMO1_OPTIM
    assert model["optim"] == {"name": "distributed_fused_adam", "dtype": "bf16", "grad_sync_dtype": "bf16",
                              "overlap_grad_sync": True, "overlap_param_sync": True,
                              "contiguous_grad_buffer": True}
    defaults = yaml.safe_load(export(_nemotron_recipe(), Target.NEMO)["nemo_overrides.yaml"])
    assert (defaults["model"]["optim"]["dtype"], defaults["model"]["optim"]["grad_sync_dtype"]) == \
        ("fp32", "fp32")
    plain = dataclasses.replace(_nemotron_recipe(), zero=ZeroStage.NONE)
    assert yaml.safe_load(export(plain, Target.NEMO)["nemo_overrides.yaml"])["model"]["optim"] == \
        {"name": "fused_adam"}


def test_a_nemo_1_plan_nemo_1x_cannot_run_is_refused_naming_the_field() -> None:
    def why(plan: Plan) -> dict[str, str]:
        return dict(refusals(plan, Target.NEMO))

    # bf16 moments are optim.dtype bf16, which keeps no master: remainders cannot go with them
    assert "keeps no master" in why(_nemotron_recipe(optimizer_states=StateDtype.BF16))["job.master_weights"]
    # an fp32 optimizer over bf16 weights keeps remainders, not a full fp32 copy
    fp32 = why(_nemotron_recipe(master_weights=MasterWeights.FP32))["job.master_weights"]
    assert "store_param_remainders" in fp32
    plain = dataclasses.replace(_nemotron_recipe(main_grads=StateDtype.BF16), zero=ZeroStage.NONE)
    assert "MainParamsOptimizerWrapper" in why(plain)["job"]
    modules = dataclasses.replace(_nemotron_recipe(), recompute_modules=(RecomputeModule.MLP,))
    assert "recompute_modules" in why(modules)
    assert "job.dtype" in why(_states(make_plan(dtype=Dtype.FP16), "nemo-1"))
    moe = _states(make_plan("mixtral-8x7b", gpus=8, dp=8, ep=8), "nemo-1")
    assert "model" in why(moe)


def test_exporting_a_nemo_1_plan_from_the_command_line(tmp_path: Path) -> None:
    plan = _nemotron_recipe(main_grads=StateDtype.BF16, master_weights=MasterWeights.NONE,
                            optimizer_states=StateDtype.BF16)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan.to_dict(builtin_model=True, builtin_cluster=True,
                                                builtin_stack=True), sort_keys=False))
    doc = yaml.safe_load(path.read_text())
    assert doc["stack"] == "nemo-1"
    assert {k: doc["job"][k] for k in ("main_grads", "master_weights", "optimizer_states")} == \
        {"main_grads": "bf16", "master_weights": "none", "optimizer_states": "bf16"}
    result = autoplan("export", path, "--to", "nemo", "-o", tmp_path / "n.yaml")
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load((tmp_path / "n.yaml").read_text())
    assert written["model"]["optim"]["dtype"] == "bf16"
    result = autoplan("export", path, "--to", "megatron", "-o", tmp_path / "m.sh")
    assert result.returncode == 2
    assert f"{path}: job.master_weights: cannot export to megatron: Megatron-Core keeps a master" \
        in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "m.sh").exists()


@pytest.mark.torch
def test_an_offloaded_optimizer_is_zero_offload_in_ds_config(ds_config_class: Any) -> None:
    raw = json.loads(exported("llama3-70b-8xh100-deepspeed-offload", Target.DEEPSPEED)["ds_config.json"])
    cfg = ds_config_class(raw, mpu=_FakeMpu(8))
    offload = cfg.zero_config.offload_optimizer
    assert offload is not None and offload.device == "cpu" and offload.pin_memory
    assert cfg.zero_optimization_stage == 3


@pytest.mark.parametrize(("offload", "target"), [
    (Offload(optimizer=True), Target.TORCHTITAN),   # FSDP2's CPUOffloadPolicy moves params too
    (Offload(activations=0.5), Target.MEGATRON),    # TE's --cpu-offloading refuses pp > 1
    (Offload(activations=0.5), Target.DEEPSPEED),
    (Offload(activations=0.5), Target.NEMO),
])
def test_offload_a_launcher_cannot_run_is_refused_with_its_field(offload: Offload,
                                                                 target: Target) -> None:
    zero = ZeroStage.PARAMETERS if target is Target.TORCHTITAN else ZeroStage.OPTIMIZER
    plan = make_plan("llama3-8b", gpus=8, global_batch=64, dp=4, pp=2, zero=zero, offload=offload)
    found = dict(refusals(plan, target))
    assert "offload" in found and "offload" in found["offload"], found


@pytest.mark.parametrize(("plan_kwargs", "target", "field"), [
    (dict(zero=ZeroStage.GRADIENTS), Target.MEGATRON, "zero"),
    (dict(pp=2, dp=4, schedule=Schedule.GPIPE), Target.MEGATRON, "schedule"),
    (dict(pp=2, dp=4, schedule=Schedule.ZB_V, vpp=2), Target.NEMO, "schedule"),
    (dict(pp=2, dp=4, zero=ZeroStage.GRADIENTS), Target.DEEPSPEED, "zero"),
    (dict(recompute=Recompute.SELECTIVE), Target.DEEPSPEED, "recompute"),
    (dict(dtype=Dtype.FP8), Target.DEEPSPEED, "job.dtype"),
    (dict(zero=ZeroStage.OPTIMIZER), Target.TORCHTITAN, "zero"),
    (dict(dtype=Dtype.FP16, zero=ZeroStage.PARAMETERS), Target.TORCHTITAN, "job.dtype"),
    (dict(tp=2, dp=4, zero=ZeroStage.NONE, sequence_parallel=True), Target.TORCHTITAN, "zero"),
    (dict(tp=2, dp=4, zero=ZeroStage.PARAMETERS), Target.TORCHTITAN, "sequence_parallel"),
    (dict(pp=4, dp=2, stages=(7, 9, 8, 8)), Target.MEGATRON, "stages"),
    (dict(pp=4, dp=2, stages=(7, 9, 9, 7), zero=ZeroStage.OPTIMIZER), Target.DEEPSPEED, "stages"),
])
def test_each_launcher_rule_is_refused_with_its_field(plan_kwargs: dict[str, Any], target: Target,
                                                      field: str) -> None:
    kwargs: dict[str, Any] = dict(gpus=8, global_batch=64, dp=8)
    kwargs.update(plan_kwargs)
    plan = make_plan("llama3-8b", **kwargs)
    assert field in {f for f, _ in refusals(plan, target)}


def test_megatron_refuses_a_geglu_model_it_has_no_flag_for() -> None:
    plan = make_plan("llama3-8b", gpus=8, global_batch=64, dp=8)
    geglu = dataclasses.replace(plan, model=dataclasses.replace(plan.model, activation=Activation.GEGLU))
    assert "model.activation" in {f for f, _ in refusals(geglu, Target.MEGATRON)}
    assert refusals(geglu, Target.NEMO) == []  # the recipe, not the overrides, sets the activation


# --------------------------------------------------------------------------- the command line
# (in this process: tests.helpers.autoplan)

def test_export_prints_to_stdout_and_writes_an_executable_script_with_o(tmp_path: Path) -> None:
    plan = EXAMPLES / "plans" / "llama3-8b-64xh100-megatron-best.yaml"
    shown = autoplan("export", plan, "--to", "megatron")
    assert shown.returncode == 0, shown.stderr
    expected = exported("llama3-8b-64xh100-megatron-best", Target.MEGATRON)
    assert shown.stdout == expected["pretrain_megatron.sh"]
    out = tmp_path / "run" / "train.sh"
    written = autoplan("export", plan, "--to", "megatron", "-o", out)
    assert written.returncode == 0, written.stderr
    assert out.read_text(encoding="utf-8") == shown.stdout
    assert out.stat().st_mode & stat.S_IXUSR
    assert [p.name for p in out.parent.iterdir()] == ["train.sh"]  # no temporary left behind


def test_a_multi_file_export_with_o_fills_a_directory(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(_plan_doc(CASES["llama3-8b-16xh100-deepspeed-pp2"][0]())),
                    encoding="utf-8")
    result = autoplan("export", plan, "--to", "slurm", "--launcher", "deepspeed", "-o", tmp_path / "job")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["ds_config.json", "job.sbatch"]
    assert (tmp_path / "job" / "job.sbatch").stat().st_mode & stat.S_IXUSR


def _plan_doc(plan: Plan) -> dict[str, Any]:
    from autoplan.plans.file import plan_document

    return plan_document(plan)


def test_a_refused_export_exits_2_naming_the_file_and_field_and_writes_nothing(tmp_path: Path) -> None:
    plan = EXAMPLES / "plans" / "llama3-70b-256xh100-tp8pp2.yaml"
    out = tmp_path / "ds"
    result = autoplan("export", plan, "--to", "deepspeed", "-o", out)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{plan}: layout.tp: cannot export to deepspeed" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("args", [["--to", "fairscale"], ["--to", "megatron", "--launcher", "deepspeed"],
                                  ["--to", "slurm", "--launcher", "nemo"]])
def test_a_bad_target_or_launcher_exits_2_without_a_traceback(args: list[str]) -> None:
    result = autoplan("export", EXAMPLES / "plans" / "llama3-8b-64xh100-megatron-best.yaml", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--to" in result.stderr or "--launcher" in result.stderr


def test_a_missing_plan_file_exits_2(tmp_path: Path) -> None:
    result = autoplan("export", tmp_path / "nope.yaml", "--to", "megatron")
    assert result.returncode == 2 and "Traceback" not in result.stderr


# --------------------------------------------------------------------------- search -> export

@pytest.mark.parametrize("space", ["megatron", "deepspeed", "torchtitan"])
def test_the_best_plan_of_a_launchers_space_exports_to_that_launcher(tmp_path: Path, space: str) -> None:
    best = tmp_path / "best.yaml"
    found = autoplan("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", 64,
                     "--global-batch", 256, "--seq-len", 4096, "--space", space, "--top", 1,
                     "--out", best, "--format", "json")
    assert found.returncode == 0, found.stderr
    result = autoplan("export", best, "--to", space)
    assert result.returncode == 0, result.stderr
    slurm = autoplan("export", best, "--to", "slurm", "--launcher", space)
    assert slurm.returncode == 0, slurm.stderr


# --------------------------------------------------------------------------- examples

# (plan, target, launcher, output) as examples/exports/README.md lists them
EXAMPLE_EXPORTS = [
    ("llama3-8b-64xh100-megatron-best.yaml", Target.MEGATRON, Launcher.MEGATRON,
     "llama3-8b-64xh100-megatron.sh"),
    ("llama3-8b-64xh100-megatron-best.yaml", Target.NEMO, Launcher.MEGATRON,
     "llama3-8b-64xh100-nemo.yaml"),
    ("llama3-8b-64xh100-megatron-best.yaml", Target.SLURM, Launcher.MEGATRON,
     "llama3-8b-64xh100-megatron.sbatch"),
    ("deepseek-v3-2048xh100-megatron.yaml", Target.MEGATRON, Launcher.MEGATRON,
     "deepseek-v3-2048xh100-megatron.sh"),
    ("llama3-70b-64xh100-deepspeed.yaml", Target.DEEPSPEED, Launcher.MEGATRON,
     "llama3-70b-64xh100-deepspeed"),
    ("llama3-70b-64xh100-torchtitan.yaml", Target.TORCHTITAN, Launcher.MEGATRON,
     "llama3-70b-64xh100-torchtitan.toml"),
    ("llama3-70b-64xh100-torchtitan.yaml", Target.SLURM, Launcher.TORCHTITAN,
     "llama3-70b-64xh100-torchtitan-slurm"),
]


@pytest.mark.parametrize(("plan", "target", "launcher", "out"), EXAMPLE_EXPORTS,
                         ids=[e[3] for e in EXAMPLE_EXPORTS])
def test_the_committed_example_exports_are_current(plan: str, target: Target, launcher: Launcher,
                                                   out: str) -> None:
    files = export(plan_file(plan), target, plan, launcher)
    where = EXAMPLES / "exports" / out
    paths = {name: where / name for name in files} if len(files) > 1 else {next(iter(files)): where}
    if REGEN:
        for name, path in paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[name], encoding="utf-8")
            if name.endswith((".sh", ".sbatch")):
                path.chmod(0o755)
    for name, path in paths.items():
        assert path.read_text(encoding="utf-8") == files[name], f"{path} is stale"
    readme = (EXAMPLES / "exports" / "README.md").read_text(encoding="utf-8")
    assert out in readme and plan in readme


def test_megatron_refuses_biased_experts_split_by_expert_tensor_parallelism() -> None:
    """Megatron-Core asserts etp == 1 for an MoE model with biased linear layers
    (transformer_config.py, add_bias_linear); the export says so instead of a script
    that fails at start-up."""
    moe = dataclasses.replace(resolve_model("mixtral-8x7b"), bias=True)
    plan = make_plan(moe, gpus=16, dp=4, tp=4, global_batch=64, sequence_parallel=True, etp=4)
    with pytest.raises(InputError, match="layout.etp: cannot export to megatron: "
                                         "Megatron-Core splits biased expert layers"):
        export(plan, Target.MEGATRON)
    assert export(dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, etp=1)),
                  Target.MEGATRON)


def test_a_comment_line_holds_no_line_break_of_any_kind() -> None:
    """YAML reads U+2028, U+2029 and U+0085 as line breaks: none may survive in a comment a
    plan built in code could carry (loaded names refuse them: Fields.name)."""
    from autoplan.shell import comment
    text = comment("a\u2028b\u2029c\u0085d\re\nf\x1b[2Jg\u202eh")
    assert text == "# a b c d e f [2Jg h"
    assert len(yaml.safe_load(f"{text}\nkey: 1")) == 1


# --------------------------------------------------------------------------- schedule CSV

CSV_SCHEDULES = [s for s in Schedule if s.spec.torchtitan is None]


@pytest.mark.parametrize("schedule", CSV_SCHEDULES, ids=lambda s: s.value)
@pytest.mark.parametrize(("pp", "m"), [(4, 8), (2, 7)])
@pytest.mark.torch
def test_a_schedule_torch_has_no_class_for_exports_as_a_csv_torch_validates_and_runs(
        schedule: Schedule, pp: int, m: int) -> None:
    """The exported order (torchtitan's pipeline_parallel_schedule_csv) is the simulator's
    own, and torch takes it: its _validate_schedule (every W after its I after its F, one
    rank per stage) and, lowered with its sends and receives, its dry-run simulation, which
    raises on a deadlock."""
    from torch.distributed.pipelining.schedules import (
        _Action,
        _add_send_recv,
        _simulate_comms_compute,
        _validate_schedule,
    )

    from autoplan.export import torchtitan
    from autoplan.schedules import orders

    v = 2 if schedule.v_shape else 1
    plan = make_plan("llama3-8b", gpus=8 * pp, dp=8, pp=pp, vpp=v, schedule=schedule,
                     global_batch=8 * m, micro_batch=1)
    assert not plan_problems(plan), plan_problems(plan)
    files = torchtitan.export(plan)
    text = files[torchtitan.CSV_FILENAME]
    config = tomllib.loads(files[torchtitan.FILENAME])["parallelism"]
    assert config["pipeline_parallel_schedule_csv"] == torchtitan.CSV_FILENAME
    rows = [[_Action.from_str(cell) for cell in line.split(",")] for line in text.splitlines()]
    actions = dict(enumerate(rows))
    stages = pp * v
    stage_to_rank = _validate_schedule(actions, pp, stages, m)
    # torchtitan places the stages as the class it names does: a V, or a loop
    placed = {s: (s if s < pp else 2 * pp - 1 - s) if schedule.v_shape else s % pp
              for s in range(stages)}
    assert stage_to_rank == placed
    # exactly the simulator's order
    ops = orders.stage_orders(schedule, pp, m, v)
    assert [len(r) for r in rows] == [len(o) for o in ops]
    assert all(a.microbatch_index == mb for r, o in zip(rows, ops, strict=True)
               for a, (_, mb, _) in zip(r, o, strict=True))
    with_comms = _add_send_recv(actions, stage_to_rank=lambda s: stage_to_rank[s], num_stages=stages)
    _simulate_comms_compute(with_comms, stage_to_rank=lambda s: stage_to_rank[s], num_stages=stages)


def test_launchers_names_every_target_that_exports_the_plan_and_no_other() -> None:
    from autoplan.export import LAUNCHERS, launchers

    zb = make_plan("llama3-8b", gpus=32, dp=8, pp=4, schedule=Schedule.ZB_H2, micro_batch=1,
                   zero=ZeroStage.OPTIMIZER, sequence_parallel=False)
    plain = make_plan("llama3-8b", gpus=8, dp=8, zero=ZeroStage.OPTIMIZER)
    for plan in (zb, plain):
        on = launchers(plan)
        for target in LAUNCHERS:
            assert (target.value in on) == (not refusals(plan, target))
    assert launchers(zb) == ("torchtitan",)  # only torchtitan runs zb-h2 (from its CSV)
    assert "megatron" in launchers(plain)


def test_a_search_says_which_launchers_run_each_plan(tmp_path: Path) -> None:
    out = tmp_path / "best.yaml"
    r = autoplan("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                 "--global-batch", "64", "--seq-len", "4096", "--top", "3", "--out", out,
                 "--format", "json")
    assert r.returncode == 0, r.stderr
    from autoplan.export.launcher import names

    for doc in json.loads(r.stdout)["plans"]:  # in the registry's order
        assert doc["launchers"] == [n for n in names() if n in doc["launchers"]]
    assert autoplan("evaluate", out).returncode == 0  # the plan file reads with its launchers
    table = autoplan("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                     "--global-batch", "64", "--seq-len", "4096", "--top", "3", "--space", "any")
    assert "runs on (export --to): 1 " in table.stdout
