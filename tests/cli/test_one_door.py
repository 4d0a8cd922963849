"""One door for measured profiles (``autoplan.measured.door``): a plan on a device with a
shipped profile (the H200's, ``profiles/measured/``) gets one predicted step time in every
command that costs it: search (the plan it returns), evaluate, explain, check and diff;
serve and a serving plan's evaluate read the same corrected cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autoplan.descriptors.library import resolve_cluster, with_gpus
from autoplan.measured.door import corrected
from autoplan.measured.shipped import shipped_profile
from tests.helpers import autoplan

SEARCH = ("search", "--model", "llama3-8b", "--cluster", "dgx-h200", "--gpus", "8",
          "--global-batch", "64", "--seq-len", "4096", "--top", "1")


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The search's best plan on 8 H200 (written with --out) and the step time it reported."""
    out = tmp_path_factory.mktemp("door") / "plan.yaml"
    result = autoplan(*SEARCH, "--out", out, "--format", "json")
    assert result.returncode == 0, result.stderr
    return out, json.loads(result.stdout)["plans"][0]["prediction"]["step_time_s"]


def test_the_h200_has_a_shipped_profile_that_corrects_its_cluster():
    cluster = with_gpus(resolve_cluster("dgx-h200"), 8)
    assert shipped_profile("h200") is not None
    door = corrected(cluster)
    assert door.profile is not None and door.cluster.device.correction is not None
    assert door.note is None  # taken on the device it corrects
    assert corrected(with_gpus(resolve_cluster("dgx-h100"), 8)).profile is None or \
        shipped_profile("h100-sxm") is not None


def test_every_command_predicts_the_same_step_for_the_same_plan(searched):
    plan, from_search = searched
    ev = autoplan("evaluate", plan, "--format", "json")
    assert ev.returncode == 0, ev.stderr
    step = json.loads(ev.stdout)["plans"][0]["prediction"]["step_time_s"]
    assert "uncertainty" in json.loads(ev.stdout)["plans"][0]["prediction"]  # the profile's band
    chk = autoplan("check", plan, "--format", "json")
    assert chk.returncode == 0, chk.stderr
    dif = autoplan("diff", plan, plan, "--format", "json")
    assert dif.returncode == 0, dif.stderr
    deltas = {d["metric"]: d for d in json.loads(dif.stdout)["deltas"]}
    exp = autoplan("explain", plan)
    assert exp.returncode == 0, exp.stderr
    shown = float(re.search(r"step ([0-9.]+) s", exp.stdout).group(1))
    assert step == from_search
    assert json.loads(chk.stdout)["prediction"]["step_time_s"] == step
    assert deltas["step_time_s"]["a"] == deltas["step_time_s"]["b"] == step
    assert shown == round(step, 3)


def test_the_shipped_profile_moves_the_prediction_it_is_applied_to(searched):
    """The door is not a no-op: with the profile's correction the step differs from the
    analytic one (a profile given on the command line replaces the shipped one)."""
    from autoplan.cost.evaluate import evaluate
    from autoplan.descriptors.strict import read_yaml
    from autoplan.plans.file import read_plan

    plan, step = searched
    analytic = evaluate(read_plan(read_yaml(plan), str(plan), correct=False)).step_time_s
    assert analytic != pytest.approx(step, rel=1e-6)


def test_serve_and_a_serving_plans_evaluate_read_the_same_corrected_cluster(tmp_path):
    out = tmp_path / "serving.yaml"
    served = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h200", "--gpus", "8",
                      "--input-len", "512", "--output-len", "64", "--rate", "4", "--requests", "100",
                      "--out", out, "--format", "json")
    assert served.returncode == 0, served.stderr
    best = json.loads(served.stdout)["plans"][0]["prediction"]
    ev = autoplan("evaluate", out, "--format", "json")
    assert ev.returncode == 0, ev.stderr
    again = json.loads(ev.stdout)["plans"][0]["prediction"]
    assert again["ttft_ms"] == best["ttft_ms"] and again["tpot_ms"] == best["tpot_ms"]
