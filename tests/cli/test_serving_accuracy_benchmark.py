"""Smoke test of benchmarks/serving_accuracy.py on a tiny synthetic CSV.

The rows are invented (plausible shapes, made-up measurements): they check that the script
reads the serving calibration CSV's columns, builds each scenario, skips what it cannot
express with the reason, and prints MAPE. They say nothing about accuracy.
"""

from __future__ import annotations

import csv
from pathlib import Path

from tests.helpers import run_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving_accuracy.py"
COLUMNS = (
    "row_id,source,source_table,source_ref,engine,engine_version,model,model_type,gpu_type,num_gpus,"
    "tp,pp,ep,dp_replicas,weight_precision,kv_precision,max_batch_or_concurrency,max_batched_tokens,"
    "chunked_prefill,disaggregation,scenario,input_len,output_len,workload,num_requests,"
    "request_rate_rps,concurrency,ttft_mean_ms,ttft_p50_ms,ttft_p99_ms,tpot_mean_ms,tpot_p50_ms,"
    "tpot_p99_ms,itl_mean_ms,itl_p50_ms,itl_p99_ms,e2e_mean_ms,e2e_p50_ms,e2e_p99_ms,output_tok_s,"
    "total_tok_s,output_tok_s_per_gpu,req_s,trust,complete,notes"
).split(",")
ROWS = [
    dict(row_id="OFF-1", engine="TensorRT-LLM", model="Llama-3.1-8B", gpu_type="H100-SXM-80GB",
         num_gpus="1", tp="1", pp="1", dp_replicas="1", weight_precision="fp8", kv_precision="fp8",
         scenario="offline max throughput", input_len="128", output_len="128", num_requests="500",
         output_tok_s="20000", complete="yes"),
    dict(row_id="STATIC-1", engine="not stated", model="Llama-2-70B", gpu_type="A100-80GB (DGX-A100)",
         num_gpus="8", tp="8", pp="1", max_batch_or_concurrency="4",
         scenario="static batch: B identical requests", input_len="512", output_len="64",
         ttft_mean_ms="150", tpot_mean_ms="40", complete="no"),
    dict(row_id="SKIP-1", engine="vLLM", model="BLOOM-176B", gpu_type="A100-80GB", num_gpus="8", tp="8",
         scenario="offline", input_len="128", output_len="128", output_tok_s="100", complete="yes"),
    dict(row_id="SKIP-2", engine="vLLM", model="Llama-3.1-8B", gpu_type="H100-SXM-80GB", num_gpus="1",
         tp="1", scenario="all requests at once", output_tok_s="100", complete="yes"),
]


def test_the_benchmark_prints_mape_and_why_rows_were_left_out(tmp_path: Path) -> None:
    path = tmp_path / "serving.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in ROWS:
            writer.writerow({c: row.get(c, "") for c in COLUMNS})
    result = run_script(SCRIPT, "--csv", path, "--rows")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "OFF-1" in out and "throughput" in out and "STATIC-1" in out and "tpot_ms" in out
    assert "expressible: 2 of 4 rows (50%)" in out
    assert "model BLOOM-176B not built in" in out and "input or output length not published" in out
    assert "complete rows" in out and "%" in out.split("complete rows")[1]
