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
         model_type="dense", num_layers="16", hidden_size="2048", num_attention_heads="16",
         num_kv_heads="8", ffn_hidden_size="8192", vocab_size="32000", seq_len="2048",
         gpu_type="A100-80GB", num_gpus="8", tp="1", pp="1", dp="8", fsdp="FSDP2 over 8 GPUs",
         micro_batch_size="2", global_batch_size="16", recompute="none", precision="bf16",
         measured_step_time_s="1.5", validation_ready="yes"),
    # Megatron GPT on 16 H100 with TP and PP, only hardware TFLOP/s given
    dict(row_id="T-2", source="synthetic Narayanan", source_table="Table 1 row x",
         model="GPT-test-3B", model_type="dense", num_layers="24", hidden_size="3072",
         num_attention_heads="24", vocab_size="51200", seq_len="2048", gpu_type="H100-80GB-SXM",
         num_gpus="16", tp="2", pp="2", dp="4", micro_batch_size="2", global_batch_size="64",
         recompute="full", pipeline_schedule="1F1B", precision="FP16 (mixed)",
         measured_tflops_per_gpu="300", validation_ready="yes",
         notes="TFLOP/s count the recompute (hardware FLOPs)"),
    # a GPU autoplan has no profile for: skipped, with the reason printed
    dict(row_id="T-3", source="synthetic", source_table="t", model="Llama-test-1B",
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
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)


def test_benchmark_predicts_the_ready_rows_and_prints_mape(tmp_path):
    result = run("--csv", str(write_csv(tmp_path / "runs.csv")))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "MAPE overall" in out
    assert "4 rows, 3 validation-ready, 2 predicted, 1 skipped" in out
    assert "T-1" in out and "T-2" in out
    assert "HFU TFLOP/s inverted with SC'21 eq. 3" in out
    assert "'V100-32GB' is not among the built-in devices" in out


def test_markdown_names_the_command_and_says_calibration_not_validation(tmp_path):
    result = run("--csv", str(write_csv(tmp_path / "runs.csv")), "--markdown")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# Prediction accuracy")
    assert "python benchmarks/accuracy.py --markdown" in result.stdout
    assert "calibration result, not a validation result" in result.stdout
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


def test_fit_prints_the_efficiency_block_for_the_device_files(tmp_path):
    result = run("--csv", str(write_csv(tmp_path / "runs.csv")), "--fit")
    assert result.returncode == 0, result.stderr
    assert "efficiency: {gemm: " in result.stdout
    assert "calibration, not validation" in result.stdout
