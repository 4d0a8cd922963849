"""Smoke tests of benchmarks/accuracy.py on a tiny synthetic CSV.

The rows below are invented (plausible shapes, made-up timings): they check that
the script reads the calibration CSV's columns, predicts, skips what it cannot
build and prints MAPE. They say nothing about accuracy.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy.py"

COLUMNS = (
    "row_id,source,source_table,source_ref,framework,framework_version,model,model_type,"
    "num_layers,hidden_size,num_attention_heads,num_kv_heads,ffn_hidden_size,vocab_size,seq_len,"
    "num_experts,moe_topk,gpu_type,num_gpus,tp,pp,dp,ep,etp,cp,sequence_parallel,vp,fsdp,"
    "micro_batch_size,global_batch_size,grad_accum_steps,recompute,pipeline_schedule,precision,"
    "measured_step_time_s,measured_tokens_per_s,measured_tokens_per_s_per_gpu,"
    "measured_tflops_per_gpu,measured_mfu_pct,measured_hfu_pct,measured_memory_gib,arch_source,"
    "config_completeness,trust,validation_ready,notes"
).split(",")

ROWS = [
    # FSDP Llama on 8 A100-80GB, step time given
    dict(row_id="T-1", source="synthetic torchtitan", source_table="t", model="Llama-test-1B",
         framework="torchtitan (FSDP2)",
         model_type="dense", num_layers="16", hidden_size="2048", num_attention_heads="16",
         num_kv_heads="8", ffn_hidden_size="8192", vocab_size="32000", seq_len="2048",
         gpu_type="A100-80GB", num_gpus="8", tp="1", pp="1", dp="8", fsdp="FSDP2 over 8 GPUs",
         micro_batch_size="2", global_batch_size="16", recompute="none", precision="bf16",
         measured_step_time_s="1.5", validation_ready="yes"),
    # Megatron GPT on 16 H100 with TP and PP, only hardware TFLOP/s given
    dict(row_id="T-2", source="Megatron-LM SC'21", source_table="Table 1 row x",
         framework="Megatron-LM",
         model="GPT-test-3B", model_type="dense", num_layers="24", hidden_size="3072",
         num_attention_heads="24", vocab_size="51200", seq_len="2048", gpu_type="H100-80GB-SXM",
         num_gpus="16", tp="2", pp="2", dp="4", micro_batch_size="2", global_batch_size="64",
         recompute="full", pipeline_schedule="1F1B", precision="FP16 (mixed)",
         measured_tflops_per_gpu="300", validation_ready="yes",
         notes="TFLOP/s count the recompute (hardware FLOPs)"),
    # a GPU autoplan has no profile for: skipped, with the reason printed
    dict(row_id="T-3", source="synthetic", source_table="t", model="Llama-test-1B",
         framework="torchtitan",
         model_type="dense", num_layers="16", hidden_size="2048", num_attention_heads="16",
         ffn_hidden_size="8192", vocab_size="32000", seq_len="2048", gpu_type="V100-32GB",
         num_gpus="8", tp="1", pp="1", dp="8", micro_batch_size="2", global_batch_size="16",
         recompute="none", precision="fp16", measured_step_time_s="4.0", validation_ready="yes"),
    # not validation-ready: never predicted
    dict(row_id="T-4", source="synthetic", model="Llama-test-1B", validation_ready="no"),
]


def write_csv(path: Path) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(ROWS)
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_script(SCRIPT, *args)


def test_benchmark_predicts_the_ready_rows_and_prints_mape(tmp_path):
    result = run("--csv", str(write_csv(tmp_path / "runs.csv")))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "MAPE overall" in out
    assert "4 rows, 3 validation-ready, 2 predicted, 1 skipped" in out
    assert "T-1" in out and "T-2" in out
    assert "HFU TFLOP/s inverted with SC'21 eq. 3" in out
    assert "'V100-32GB' is not among the built-in devices" in out


def test_markdown_names_the_command_and_tells_validation_from_calibration(tmp_path):
    result = run("--csv", str(write_csv(tmp_path / "runs.csv")), "--markdown")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# Prediction accuracy")
    assert "python benchmarks/accuracy.py --markdown" in result.stdout
    assert "**Held out** is the validation claim" in result.stdout
    assert "**Files** is a calibration result" in result.stdout
    assert "| **overall** | 2 |" in result.stdout


def test_a_missing_csv_exits_2_naming_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "calibration_runs.csv"
    result = run("--csv", str(missing))
    assert result.returncode == 2
    assert str(missing) in result.stderr
    assert "Traceback" not in result.stderr


def test_a_csv_without_a_usable_row_exits_2(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text(",".join(COLUMNS) + "\n", encoding="utf-8")
    result = run("--csv", str(path))
    assert result.returncode == 2
    assert "no validation-ready row" in result.stderr


def test_fit_prints_the_lines_for_the_stack_files(tmp_path):
    result = run("--csv", str(write_csv(tmp_path / "runs.csv")), "--fit")
    assert result.returncode == 0, result.stderr
    assert "profiles/stacks/*.yaml (calibration, not validation" in result.stdout
    assert "megatron-lm: step_overhead_ms: " in result.stdout
    assert "compute_efficiency: " in result.stdout


def test_the_report_holds_each_source_out_of_its_own_fit(tmp_path):
    result = run("--csv", str(write_csv(tmp_path / "runs.csv")))
    assert result.returncode == 0, result.stderr
    assert "held out" in result.stdout
    assert "parameters fitted per fold (without the source named):" in result.stdout


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("accuracy_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["accuracy_benchmark"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_a_held_out_prediction_never_depends_on_its_own_measurements(tmp_path):
    """Scaling one source's measured times changes nothing it is predicted with."""
    import dataclasses

    acc = _module()
    rows = acc.read_rows(write_csv(tmp_path / "runs.csv"))
    cases = [c for c in (acc.build_case(r) for r in rows
                         if r["validation_ready"] == "yes") if isinstance(c, acc.Case)]
    assert {c.source for c in cases} == {"torchtitan", "Megatron-LM SC'21"}
    held, folds = acc.cross_validate(cases)
    moved = [dataclasses.replace(c, measured_s=c.measured_s * 3)
             if c.source == "Megatron-LM SC'21" else c for c in cases]
    held2, folds2 = acc.cross_validate(moved)
    mine = [r.predicted_s for r in held if r.case.source == "Megatron-LM SC'21"]
    assert mine == [r.predicted_s for r in held2 if r.case.source == "Megatron-LM SC'21"]
    assert folds["Megatron-LM SC'21"] == folds2["Megatron-LM SC'21"]
    # the other source's fit did see the change
    assert folds["torchtitan"] != folds2["torchtitan"]


def test_spearman_and_regret_against_hand_numbers():
    acc = _module()
    assert acc.spearman([1, 2, 3], [10, 20, 30]) == 1.0
    assert acc.spearman([1, 2, 3], [30, 20, 10]) == -1.0
    assert acc.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)  # ties: average ranks
    assert acc.spearman([1, 1], [1, 2]) is None


@pytest.mark.parametrize(("framework", "version", "stack"), [
    ("NeMo 1.23", "", "nemo-1"),
    ("NeMo (24.05)", "", "nemo-1"),
    ("nemo 1.x", "", "nemo-1"),
    ("NeMo Framework Launcher", "", "nemo-1"),
    ("NeMo Megatron", "", "nemo-1"),
    ("NeMo", "24.07", "nemo-1"),
    ("NeMo", "v1.22.0", "nemo-1"),
    ("NeMo", "24.12", "megatron-core"),  # NeMo 2.0's recipes: Megatron-Core's optimizer
    ("NeMo 2.0", "", "megatron-core"),
    ("Megatron-Core", "r0.8.0", "megatron-core"),
    ("Megatron-LM", "2022", "megatron-lm"),
])
def test_a_framework_naming_nemo_1x_runs_on_the_nemo_1_stack(framework, version, stack):
    acc = _module()
    row = {"framework": framework, "framework_version": version, "notes": ""}
    assert acc.stack_of(row) == stack


def test_a_nemotron_4_340b_row_on_nemo_1x_keeps_its_recipes_states():
    """The invented row below (made-up timing) names NeMo 1.x and Nemotron-4-340B: the plan
    runs on the nemo-1 stack with the Launcher recipe's optim block (grad_sync_dtype bf16,
    dtype bf16: no master), which the stack's defaults would not say."""
    from autoplan.descriptors.precision import StatePrecision
    from autoplan.vocab import MasterWeights, StateDtype

    acc = _module()
    row = {c: "" for c in COLUMNS} | dict(
        row_id="T-9", source="synthetic", source_table="t", framework="NeMo (24.05)",
        model="Nemotron-4-340B", model_type="dense", num_layers="96", hidden_size="18432",
        num_attention_heads="96", num_kv_heads="8", ffn_hidden_size="73728", vocab_size="256000",
        seq_len="4096", gpu_type="H100-80GB-SXM", num_gpus="128", tp="8", pp="8", dp="2", vp="12",
        sequence_parallel="yes", micro_batch_size="1", global_batch_size="64",
        recompute="selective", precision="bf16", measured_step_time_s="10", validation_ready="yes")
    case = acc.build_case(row)
    assert isinstance(case, acc.Case), case
    assert case.plan.stack.name == "nemo-1"
    assert case.plan.states == StatePrecision(main_grads=StateDtype.BF16,
                                              master_weights=MasterWeights.NONE,
                                              optimizer_states=StateDtype.BF16)
    other = acc.build_case(row | {"model": "Llama-3-70B", "num_layers": "80", "hidden_size": "8192",
                                  "num_attention_heads": "64", "ffn_hidden_size": "28672",
                                  "vocab_size": "128256", "vp": "5"})
    assert isinstance(other, acc.Case), other
    assert other.plan.states == StatePrecision(master_weights=MasterWeights.REMAINDERS)
