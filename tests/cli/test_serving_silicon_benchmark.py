"""Smoke test of benchmarks/serving_silicon.py on a tiny synthetic CSV in the columns of
shared/data/serving_silicon.csv.

The rows are invented (plausible shapes, made-up measurements): they check that the loader
drops the systems reserved for validation before anything reads them, counts a repeated
measurement once, turns an aggregated and a disaggregated row into closed-loop plans, and
says why a row cannot be expressed. They say nothing about accuracy."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
COLUMNS = ("id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,"
           "gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,"
           "moe_ep_size,prefill_batch_size,prefill_num_workers,prefill_tp_size,prefill_pp_size,"
           "prefill_attention_dp_size,prefill_moe_tp_size,prefill_moe_ep_size,decode_batch_size,"
           "decode_num_workers,decode_tp_size,decode_pp_size,decode_attention_dp_size,decode_moe_tp_size,"
           "decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms").split(",")
AGG = dict(id="a", silicon_data_source="x; silicon_concurrency=8", backend="vllm", backend_version="0.19.0",
           model_path="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", mode="agg",
           isl="1024", osl="128",
           batch_size="8", tp_size="1", pp_size="1", silicon_ttft_ms="60", silicon_tpot_ms="7")
ROWS = [
    AGG,
    {**AGG, "id": "a-again"},  # the same measurement exported twice: counted once
    {**AGG, "id": "reserved", "system": "h200_sxm", "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"},
    {**AGG, "id": "later", "model_path": "acme/Future-1", "silicon_ttft_ms": "70"},
    dict(id="d", silicon_data_source="y; silicon_concurrency=16", backend="sglang", backend_version="0.5.9",
         model_path="Qwen/Qwen3-32B", system="b200_sxm", mode="disagg", isl="1024", osl="256",
         prefill_num_workers="1", prefill_tp_size="2", decode_num_workers="1", decode_tp_size="2",
         silicon_ttft_ms="90", silicon_tpot_ms="12"),
    dict(id="d-unsized", silicon_data_source="z; silicon_concurrency=16", backend="trtllm",
         model_path="Qwen/Qwen3-32B", system="gb200", mode="disagg", isl="1024", osl="256",
         prefill_tp_size="2", decode_tp_size="2", silicon_ttft_ms="80", silicon_tpot_ms="11"),
]


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "silicon.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for row in ROWS:
            w.writerow({c: row.get(c, "") for c in COLUMNS})
    return path


def _bench() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import serving_silicon
    finally:
        sys.path.remove(str(BENCH))
    return serving_silicon


# an architecture the benchmark maps to no built-in yet (LATER: empty since issue 51 modelled
# Qwen3.5's linear and GLM-5's sparse attention)
LATER = {"acme/Future-1": "a future architecture"}


def test_the_loader_never_returns_a_reserved_system_and_counts_a_measurement_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serving_silicon = _bench()
    monkeypatch.setattr(serving_silicon, "LATER", LATER)
    rows = serving_silicon.load_rows(_csv(tmp_path))
    assert [r["id"] for r in rows] == ["a", "later", "d", "d-unsized"]
    cases = {r["id"]: serving_silicon.case_of(r) for r in rows}
    assert cases["a"].plan is not None and cases["a"].plan.workload.arrival.concurrency == 8
    assert cases["d"].plan is not None and cases["d"].plan.deployment.disaggregated is not None
    assert "not modelled yet" in cases["later"].why
    assert "worker counts not recorded" in cases["d-unsized"].why
    # GLM-5 and Qwen3.5, "not modelled yet" before issue 51, are built-ins now
    glm = {c: "" for c in COLUMNS} | {**AGG, "model_path": "zhipuai/GLM-5", "tp_size": "8"}
    assert "not modelled" not in serving_silicon.case_of(glm).why


def test_the_benchmark_prints_the_table_and_why_rows_were_left_out(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()  # its report, in process (the script's main only parses flags around it)
    bench.report(bench.load_rows(_csv(tmp_path)))
    out = capsys.readouterr().out
    assert "TTFT MAPE" in out and "expressible: 2 of 4 distinct measurements" in out
    assert "worker counts not recorded" in out and "h200" not in out


def test_rows_at_inferencex_lengths_are_simulated_with_that_clients_draws_and_prompts() -> None:
    """InferenceX's client draws each length uniform in [int(0.8 L), L] and sends 10C prompts;
    rows at other lengths (AIConfigurator's own sweeps) keep fixed lengths and 20C."""
    from autoplan.serving.deployment import Dist

    bench = _bench()
    ix = bench.case_of({**{c: "" for c in COLUMNS}, **AGG, "isl": "8192", "osl": "1024"})
    assert ix.plan is not None
    w = ix.plan.workload
    assert (w.input_len.dist, w.input_len.low, w.input_len.high) == (Dist.UNIFORM, 6553, 8192)
    assert (w.output_len.low, w.output_len.high) == (819, 1024)
    assert w.requests == max(64, 10 * 8)
    fixed = bench.case_of({**{c: "" for c in COLUMNS}, **AGG})  # 1024 x 128: not InferenceX's
    assert fixed.plan is not None
    assert fixed.plan.workload.input_len.dist is Dist.FIXED
    assert fixed.plan.workload.requests == max(64, 20 * 8)


def test_repeatability_scores_each_repeated_measurement_against_the_median_of_the_others() -> None:
    bench = _bench()
    row = {**{c: "" for c in COLUMNS}, **AGG}
    rows = [{**row, "silicon_ttft_ms": t, "silicon_tpot_ms": "10"} for t in ("100", "100", "200")]
    rows.append({**row, "isl": "2048", "silicon_ttft_ms": "50"})  # measured once: not counted
    n, ttft, tpot = bench.repeatability(rows)["vllm"]
    # 100 against median(100, 200) = 150 twice (50%), 200 against 100 (50%)
    assert n == 3 and ttft == pytest.approx(0.5) and tpot == 0.0
