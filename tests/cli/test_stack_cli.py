"""The software stack on the command line and in plan files: --stack, `stack:`, and
what evaluate reports it assumed."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.helpers import REPO, autoplan

PLAN = REPO / "examples" / "plans" / "llama3-8b-32xh100-1f1b.yaml"


def _plan_file(tmp_path: Path, **changes: object) -> Path:
    doc = yaml.safe_load(PLAN.read_text())
    doc.pop("prediction", None)
    doc.update(changes)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_evaluate_says_which_stack_it_assumed_and_another_stack_changes_the_prediction():
    default = autoplan("evaluate", PLAN, "--format", "json")
    titan = autoplan("evaluate", PLAN, "--format", "json", "--stack", "torchtitan")
    assert default.returncode == titan.returncode == 0, default.stderr + titan.stderr
    a = json.loads(default.stdout)["plans"][0]
    b = json.loads(titan.stdout)["plans"][0]
    assert a["prediction"]["stack"] == "megatron-core"
    assert b["prediction"]["stack"] == "torchtitan" and b["stack"] == "torchtitan"
    assert a["prediction"]["step_time_s"] != b["prediction"]["step_time_s"]
    table = autoplan("evaluate", PLAN, "--stack", "deepspeed")
    assert "stack: deepspeed" in table.stdout


def test_a_plan_naming_a_stack_round_trips(tmp_path: Path):
    path = _plan_file(tmp_path, stack="fsdp")
    out = autoplan("evaluate", path, "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)["plans"][0]
    assert doc["stack"] == "fsdp" and doc["prediction"]["stack"] == "fsdp"


def test_an_unknown_stack_is_bad_input_with_a_suggestion(tmp_path: Path):
    out = autoplan("evaluate", PLAN, "--stack", "megatron-cor")
    assert out.returncode == 2
    assert "--stack" in out.stderr and "did you mean 'megatron-core'" in out.stderr
    assert "Traceback" not in out.stderr
    bad = autoplan("evaluate", _plan_file(tmp_path, stack="nemo2"))
    assert bad.returncode == 2 and "stack" in bad.stderr and "Traceback" not in bad.stderr


def test_a_stack_file_with_a_bad_field_names_the_file_and_the_field(tmp_path: Path):
    stack = tmp_path / "mine.yaml"
    stack.write_text("stack:\n  name: mine\n  attention: flash9\n  host_kernel_us: -3\n")
    out = autoplan("evaluate", PLAN, "--stack", stack)
    assert out.returncode == 2
    assert str(stack) in out.stderr
    assert "stack.attention" in out.stderr and "stack.host_kernel_us" in out.stderr
    assert "Traceback" not in out.stderr


def test_search_runs_on_the_stack_its_space_implies_and_says_so():
    out = autoplan("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                   "--global-batch", "64", "--seq-len", "4096", "--space", "torchtitan",
                   "--top", "1", "--format", "json")
    assert out.returncode == 0, out.stderr
    best = json.loads(out.stdout)["plans"][0]
    assert best["stack"] == "torchtitan" and best["prediction"]["stack"] == "torchtitan"
    named = autoplan("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                     "--global-batch", "64", "--seq-len", "4096", "--stack", "fsdp", "--top", "1")
    assert named.returncode == 0 and "stacks fsdp)" in " ".join(named.stdout.split())


def test_diff_names_a_change_of_stack(tmp_path: Path):
    a = _plan_file(tmp_path)
    b = tmp_path / "b.yaml"
    doc = yaml.safe_load(a.read_text())
    doc["stack"] = "torchtitan"
    b.write_text(yaml.safe_dump(doc))
    out = autoplan("diff", a, b, "--format", "json")
    assert out.returncode in (0, 1), out.stderr
    changes = {c["field"]: (c["a"], c["b"]) for c in json.loads(out.stdout)["changes"]}
    assert changes["stack.name"] == ("megatron-core", "torchtitan")
    assert changes["stack.attention"] == ("flash3", "flash2")


def test_explain_says_which_stack_it_assumed():
    out = autoplan("explain", PLAN)
    assert out.returncode == 0, out.stderr
    assert "stack: megatron-core" in out.stdout


def test_a_job_file_may_name_the_stack(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ngpus: 8\n"
                   "job: {global_batch: 64, seq_len: 4096}\nstack: megatron-lm\n")
    out = autoplan("search", job, "--top", "1", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plans"][0]["prediction"]["stack"] == "megatron-lm"
    bad = tmp_path / "bad.yaml"
    bad.write_text(job.read_text().replace("megatron-lm", "megatron-lmm"))
    out = autoplan("search", bad)
    assert out.returncode == 2 and "stack" in out.stderr and "Traceback" not in out.stderr
