"""`autoplan` on a cluster of pools: search ranks plans across pools and on each alone and
says which pools the best leaves out; evaluate, explain, check and diff show each stage's
pool; megatron and torchtitan exports name the node ranks of each pool; what cannot run a
plan across pools refuses it with exit 2, naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import autoplan

SMALL = {"cluster": {"name": "small-mix", "between_pools": {"bandwidth_GBps": 25, "latency_us": 10},
                     "pools": [{"name": "hopper", "cluster": "dgx-h100", "nodes": 1},
                               {"name": "ampere", "cluster": "dgx-a100", "nodes": 1}]}}
JOB = ("-m", "llama3-8b", "-b", "256", "-s", "4096", "--space", "megatron")


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """llama3-8b on one DGX H100 and one DGX A100: the search's JSON and best plan file."""
    where = tmp_path_factory.mktemp("pooled")
    cluster = where / "small.yaml"
    cluster.write_text(yaml.safe_dump(SMALL))
    plan = where / "plan.yaml"
    # --gpus the pools' own count is checked, not refused (issue 34, newcomer 4)
    r = autoplan("search", *JOB, "-c", cluster, "--gpus", "16", "--top", "3", "-o", plan, "--format", "json")
    assert r.returncode == 0, r.stderr
    return plan, json.loads(r.stdout)


def test_search_reports_the_pools_and_the_best_on_each_alone(found: tuple[Path, dict]) -> None:
    plan, doc = found
    pools = doc["pools"]
    assert pools["cluster"] == "small-mix"
    assert [a["pool"] for a in pools["alone"]] == ["hopper", "ampere"]
    assert all(a["tokens_per_s"] > 0 for a in pools["alone"])
    best = doc["plans"][0]
    assert [p["pool"] for p in best["placement"]] == ["ampere", "hopper"]
    assert best["prediction"]["tokens_per_s"] > pools["alone"][0]["tokens_per_s"]
    assert pools["verdict"].startswith("uses ampere (stage 0, layers ")
    assert [s["pool"] for s in best["prediction"]["stages"]] == ["ampere", "hopper"]
    assert yaml.safe_load(plan.read_text())["placement"] == best["placement"]


def test_the_table_shows_each_plans_pools_and_the_verdict(found: tuple[Path, dict],
                                                          tmp_path: Path) -> None:
    cluster = tmp_path / "small.yaml"
    cluster.write_text(yaml.safe_dump(SMALL))
    r = autoplan("search", *JOB, "-c", cluster, "--top", "3")
    assert r.returncode == 0, r.stderr
    assert "pools: layers" in r.stdout and "ampere 9, hopper 23" in r.stdout
    assert "pools: uses ampere" in r.stdout and "of the best on hopper alone" in r.stdout


def test_evaluate_and_explain_show_each_stages_pool(found: tuple[Path, dict]) -> None:
    plan, doc = found
    r = autoplan("evaluate", plan)
    assert r.returncode == 0, r.stderr
    assert "llama3-8b on small-mix: ampere 8 x a100-80gb, hopper 8 x h100-sxm" in r.stdout
    assert "pool" in r.stdout and "busy s" in r.stdout
    r = autoplan("evaluate", plan, "--format", "json")
    pred = json.loads(r.stdout)["plans"][0]["prediction"]
    assert pred["step_time_s"] == doc["plans"][0]["prediction"]["step_time_s"]
    assert autoplan("explain", plan).returncode == 0


def test_check_and_diff_take_a_placed_plan(found: tuple[Path, dict], tmp_path: Path) -> None:
    plan, _ = found
    r = autoplan("check", plan, "--max-regression", "5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the committed plan is the best known" in r.stdout
    other = yaml.safe_load(plan.read_text())
    other["placement"] = [{"stage": 0, "pool": "hopper"}, {"stage": 1, "pool": "ampere"}]
    swapped = tmp_path / "swapped.yaml"
    swapped.write_text(yaml.safe_dump(other))
    r = autoplan("diff", plan, swapped, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    changed = {c["field"] for c in json.loads(r.stdout)["changes"]}
    assert "placement" in changed


def test_megatron_and_torchtitan_exports_name_each_pools_node_ranks(found: tuple[Path, dict]) -> None:
    plan, _ = found
    r = autoplan("export", plan, "--to", "megatron", "-o", "-")
    assert r.returncode == 0, r.stderr
    assert "#   node ranks 0-0: pool ampere (a100-80gb), pipeline stage 0" in r.stdout
    assert "#   node ranks 1-1: pool hopper (h100-sxm), pipeline stage 1" in r.stdout
    assert "--pipeline-model-parallel-size 2" in r.stdout or "pipeline-model-parallel-size" in r.stdout
    assert 'NNODES="${NNODES:-2}"' in r.stdout


@pytest.mark.parametrize("target", ["deepspeed", "nemo", "slurm"])
def test_launchers_that_cannot_place_stages_refuse(found: tuple[Path, dict], target: str) -> None:
    plan, _ = found
    r = autoplan("export", plan, "--to", target, "-o", "-")
    assert r.returncode == 2
    assert f"{plan}: placement: cannot export to" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.torch  # validate asks for torch before it reads what the plan needs
def test_validate_refuses_a_plan_across_pools(found: tuple[Path, dict]) -> None:
    plan, _ = found
    r = autoplan("validate", plan, "--device", "cpu", "--slice")
    assert r.returncode == 2
    assert "placement: a plan across pools runs on several kinds of GPU" in r.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (("--gpus", "8"), "--gpus: cluster small-mix has pools of 16 GPUs in all, sized by their nodes"),
    (("--train-tokens", "1e12"), "--train-tokens: cluster small-mix has pools"),
])
def test_options_that_size_or_sweep_one_cluster_are_refused(tmp_path: Path, args: tuple[str, ...],
                                                            needle: str) -> None:
    cluster = tmp_path / "small.yaml"
    cluster.write_text(yaml.safe_dump(SMALL))
    r = autoplan("search", *JOB, "-c", cluster, *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_bad_pooled_cluster_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = {"cluster": {**SMALL["cluster"], "between_pools": {"bandwidth_GBps": 25}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    r = autoplan("search", *JOB, "-c", path)
    assert r.returncode == 2
    assert f"{path}: cluster.between_pools.latency_us: missing required field" in r.stderr


def test_serving_on_pools_puts_prefill_and_decode_on_different_ones(tmp_path: Path) -> None:
    cluster = tmp_path / "small.yaml"
    cluster.write_text(yaml.safe_dump(SMALL))
    r = autoplan("serve", "-m", "llama3-8b", "-c", cluster, "--rate", "10", "--input-len", "512",
                 "--output-len", "128", "--requests", "100", "--top", "2")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "@hopper" in r.stdout and "@ampere" in r.stdout
