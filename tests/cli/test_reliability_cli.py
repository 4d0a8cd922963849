"""Failures and checkpoints on the command line: a cluster file with ``reliability`` and
``storage`` makes the what-if's days count them (goodput), ``evaluate`` says what they
cost a run, ``--async-checkpoint`` saves behind training; and its reject paths."""

from __future__ import annotations

import json

from tests.helpers import ROOT, autoplan

FAILING = ROOT / "examples" / "clusters" / "dgx-h100-failures.yaml"
SWEEP = ["--model", "llama3-8b", "--gpus", "64,128", "--global-batch", "512", "--seq-len", "8192",
         "--train-tokens", "1e12", "--format", "json"]


def test_the_sweep_counts_failures_restarts_and_checkpoints_in_days_and_dollars():
    steady = json.loads(autoplan("search", "--cluster", "dgx-h100", *SWEEP).stdout)["pareto"]
    fails = json.loads(autoplan("search", "--cluster", FAILING, *SWEEP).stdout)["pareto"]
    for a, b in zip(steady, fails, strict=True):
        assert "reliability" not in a
        goodput = b["reliability"]["goodput"]
        assert 0.9 < goodput < 1 and b["reliability"]["asynchronous"] is False
        assert b["train_days"] * goodput == a["train_days"] * b["step_time_s"] / a["step_time_s"]
    # more GPUs fail more often: the larger job loses a larger share
    assert fails[1]["reliability"]["goodput"] < fails[0]["reliability"]["goodput"]
    table = autoplan("search", "--cluster", FAILING, *SWEEP[:-2], "--async-checkpoint")
    assert table.returncode == 0 and "goodput" in table.stdout


def test_evaluate_says_what_failures_and_checkpoints_cost_a_run(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(f"autoplan: 1\nmodel: llama3-8b\ncluster: {{name: {FAILING}, nodes: 8}}\n"
                    "job: {global_batch: 512, seq_len: 8192}\nlayout: {dp: 64, tp: 1, pp: 1}\n"
                    "micro_batch: 1\nzero: 1\nrecompute: full\n")
    table = autoplan("evaluate", plan)
    assert table.returncode == 0, table.stderr
    assert "failures: one every" in table.stdout and "saved asynchronously" in table.stdout
    doc = json.loads(autoplan("evaluate", plan, "--format", "json").stdout)
    found = doc["plans"][0]["prediction"]["reliability"]
    assert set(found) == {"synchronous", "asynchronous"}
    assert found["asynchronous"]["checkpoint_stall_s"] < found["synchronous"]["checkpoint_stall_s"]


def test_async_checkpoints_need_the_run_and_a_cluster_that_fails():
    alone = autoplan("search", "--cluster", FAILING, *SWEEP[:8], "--async-checkpoint")
    assert alone.returncode == 2 and "needs --train-tokens" in alone.stderr
    steady = autoplan("search", "--cluster", "dgx-h100", *SWEEP[:-2], "--async-checkpoint")
    assert steady.returncode == 2 and "gives no reliability" in steady.stderr
