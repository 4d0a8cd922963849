"""Plan files remember the space they were searched in: `check --max-regression`
compares against it, and an export that refuses a plan names the space that searches
only plans the launcher can run."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.helpers import BEST, autoplan

SEARCH = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "64", "-b", "256", "-s", "4096",
          "--top", "1")


def test_search_records_its_space_and_check_compares_against_it(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    r = autoplan(*SEARCH, "--space", "megatron", "--out", path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(path.read_text())["space"] == "megatron"
    r = autoplan("check", path, "--max-regression", "0.0", "-f", "json")
    assert r.returncode == 0, r.stdout + r.stderr  # the best of its own space: no regression
    report = json.loads(r.stdout)
    assert report["regression"]["space"] == "megatron" and report["regression"]["gap"] <= 1e-9
    # told otherwise, check searches the space it is given (`default`: the launcher-free
    # space's former name, still read)
    r = autoplan("check", path, "--max-regression", "0.5", "--space", "default", "-f", "json")
    assert json.loads(r.stdout)["regression"]["space"] == "any"
    r = autoplan("check", path, "--max-regression", "0.5", "--launcher", "torchtitan", "-f", "json")
    assert json.loads(r.stdout)["regression"]["space"] == "torchtitan"


def test_a_plan_without_a_recorded_space_is_checked_against_the_launchable_plans(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    assert autoplan(*SEARCH, "--space", "megatron", "--out", path).returncode == 0
    doc = yaml.safe_load(path.read_text())
    del doc["space"]
    path.write_text(yaml.safe_dump(doc))
    r = autoplan("check", path, "--max-regression", "0.5", "-f", "json")
    assert json.loads(r.stdout)["regression"]["space"] == "launchable"


def test_a_recorded_space_that_is_not_built_in_is_named(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    assert autoplan(*SEARCH, "--out", path).returncode == 0
    doc = yaml.safe_load(path.read_text())
    doc["space"] = "my-space"
    path.write_text(yaml.safe_dump(doc))
    r = autoplan("check", path, "--max-regression", "0.05")
    assert r.returncode == 2 and f"{path}: space: unknown search space 'my-space'" in r.stderr


def test_json_plans_carry_their_space() -> None:
    r = autoplan(*SEARCH, "--space", "megatron", "-f", "json")
    assert json.loads(r.stdout)["plans"][0]["space"] == "megatron"


def test_an_export_refusal_names_the_space_to_search(tmp_path: Path) -> None:
    doc = yaml.safe_load(BEST.read_text())
    doc["zero"] = 3  # ZeRO-3: not in Megatron-LM's space
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = autoplan("export", path, "--to", "megatron")
    assert r.returncode == 2
    assert "`autoplan search --space megatron` searches only plans megatron can run" in r.stderr
