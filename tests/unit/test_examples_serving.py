"""examples/serving/: each file is what examples/serving/README.md and the top-level README
say it is, and the commands they give run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import autoplan

HERE = Path(__file__).resolve().parents[2] / "examples" / "serving"
PLANS = ("chat-plan.yaml", "chat-eagle-plan.yaml", "chat-disaggregated-plan.yaml")


def test_the_folder_holds_what_its_readme_lists() -> None:
    listed = HERE.joinpath("README.md").read_text()
    for path in HERE.iterdir():
        if path.name != "README.md":
            assert f"`{path.name}`" in listed, path.name


@pytest.mark.parametrize("name", PLANS)
def test_every_example_plan_evaluates_and_meets_its_slo(name: str) -> None:
    got = autoplan("evaluate", HERE / name, "--format", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["plans"][0]["prediction"]["meets_slo"] is True


def test_the_committed_plans_still_hold() -> None:
    for name in ("chat-plan.yaml", "chat-eagle-plan.yaml"):
        got = autoplan("check", HERE / name, "--max-regression", "0.05")
        assert got.returncode == 0, (name, got.stdout, got.stderr)


def test_the_example_features_are_in_the_plans() -> None:
    from autoplan.descriptors.strict import read_yaml
    from autoplan.serving.planfile import read_serving_plan

    chat = read_serving_plan(read_yaml(HERE / "chat-plan.yaml"), "chat-plan.yaml")
    assert chat.workload.prefix is not None
    eagle = read_serving_plan(read_yaml(HERE / "chat-eagle-plan.yaml"), "chat-eagle-plan.yaml")
    assert eagle.deployment.speculative is not None
    split = read_serving_plan(read_yaml(HERE / "chat-disaggregated-plan.yaml"), "d.yaml")
    assert split.deployment.disaggregated is not None


@pytest.mark.parametrize("name", ["chat-job.yaml", "trace-job.yaml"])
def test_every_example_job_is_served(name: str) -> None:
    got = autoplan("serve", HERE / name, "--format", "json", "--top", "1")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["plans"][0]["prediction"]["meets_slo"] is True


def test_the_disaggregated_example_exports_a_launch_per_pool_and_a_router(tmp_path) -> None:
    out = tmp_path / "launch"
    got = autoplan("export", HERE / "chat-disaggregated-plan.yaml", "--to", "vllm", "--out", out)
    assert got.returncode == 0, got.stderr
    assert sorted(p.name for p in out.iterdir()) == ["router-vllm.sh", "serve-vllm-decode.sh",
                                                     "serve-vllm-prefill.sh"]


def test_the_trace_is_what_its_script_makes(tmp_path) -> None:
    out = tmp_path / "trace.csv"
    subprocess.run([sys.executable, str(HERE / "make_trace.py"), str(out)], check=True, timeout=60)
    assert out.read_bytes() == (HERE / "trace.csv").read_bytes()
