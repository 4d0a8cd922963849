"""Failures and checkpoints on the command line: a cluster file with ``reliability`` and
``storage`` makes the what-if's days count them (goodput), ``evaluate`` says what they
cost a run, ``--async-checkpoint`` saves behind training; and its reject paths."""

from __future__ import annotations

import json

import pytest

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
        assert b["train_days"] * goodput == pytest.approx(
            a["train_days"] * b["step_time_s"] / a["step_time_s"], rel=1e-12)
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


def test_exports_save_at_the_optimum_interval_where_the_cluster_fails(tmp_path):
    import re

    import tomllib

    from autoplan.cost.evaluate import evaluate
    from autoplan.plans.file import read_plan
    from autoplan.whatif.reliability import reliability

    def plan_with(zero: int) -> tuple[object, int]:
        doc = {"autoplan": 1, "model": "llama3-8b", "cluster": {"name": str(FAILING), "nodes": 8},
               "job": {"global_batch": 512, "seq_len": 8192}, "layout": {"dp": 64, "tp": 1, "pp": 1},
               "micro_batch": 1, "zero": zero, "recompute": "full"}
        path = tmp_path / f"zero{zero}.yaml"
        path.write_text(json.dumps(doc))
        plan = read_plan(doc, str(path))
        steps = round(reliability(plan).interval_s / evaluate(plan).step_time_s)
        assert steps > 1
        return path, steps

    megatron, steps = plan_with(1)
    assert autoplan("export", megatron, "--to", "megatron", "--out", tmp_path / "m.sh").returncode == 0
    script = (tmp_path / "m.sh").read_text()
    assert re.search(r'--save-interval "\$\{SAVE_INTERVAL:-(\d+)\}"', script).group(1) == str(steps)
    titan, steps = plan_with(3)  # torchtitan shards with FSDP2: zero 3
    r = autoplan("export", titan, "--to", "torchtitan", "--out", tmp_path / "t.toml")
    assert r.returncode == 0, r.stderr
    assert tomllib.loads((tmp_path / "t.toml").read_text())["checkpoint"] == {"enable": True,
                                                                              "interval": steps}
