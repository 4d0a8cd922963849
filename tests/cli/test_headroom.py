"""search --min-headroom: every plan leaves that much free per GPU (by default 5% of
the device, for the allocator); the table shows why a plan won: microbatches, bubble
and exposed communication."""

from __future__ import annotations

import json

import pytest
import yaml

from autoplan.kernels.memory import DEFAULT_HEADROOM_FRACTION
from tests.helpers import autoplan

SEARCH = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "-b", "64", "-s", "8192",
          "-f", "json")


def _headrooms(*extra: str) -> list[float]:
    r = autoplan(*SEARCH, *extra)
    assert r.returncode == 0, r.stderr
    return [p["prediction"]["capacity_gib"] - p["prediction"]["memory_gib"]["peak"]
            for p in json.loads(r.stdout)["plans"]]


def test_the_default_leaves_five_percent_and_the_flag_more() -> None:
    default = _headrooms()
    capacity = json.loads(autoplan(*SEARCH).stdout)["plans"][0]["prediction"]["capacity_gib"]
    assert min(default) >= DEFAULT_HEADROOM_FRACTION * capacity - 1e-6
    strict = _headrooms("--min-headroom", "30")
    assert min(strict) >= 30 - 1e-6
    assert _headrooms("--min-headroom", "0")  # no reserve at all: still plans


def test_a_headroom_the_size_of_the_device_is_refused() -> None:
    r = autoplan(*SEARCH, "--min-headroom", "80")
    assert r.returncode == 2 and "--min-headroom" in r.stderr


@pytest.mark.parametrize("column", ["micro", "bubble", "comm s"])
def test_the_table_shows_why_a_plan_won(column: str) -> None:
    r = autoplan(*SEARCH[:-2], "--top", "2")
    assert r.returncode == 0 and column in r.stdout and "free per GPU" in r.stdout


def test_where_nothing_fits_the_headroom_in_force_is_named() -> None:
    r = autoplan("search", "-m", "llama3-70b", "-c", "dgx-h100", "--gpus", "8", "-b", "8", "-s",
                 "4096", "--min-headroom", "10", "--no-offload")
    assert r.returncode == 1
    assert "plans must leave 10.0 GiB free per GPU" in r.stderr


SPACE_DP_ONLY = """searchspace:
  name: dp-only
  launcher: any
  tp: {max: 1, within_nvlink: true}
  pp_max: 1
  cp_max: 1
  vpp_max: 1
  micro_batch: [1, 2]
  schedules: [1f1b]
  recompute: [none, selective, full]
  zero: [0, 1, 2, 3]
  zero_max_with_pp: 3
  sequence_parallel: [false]
  stages: uniform
  recompute_modules: [layernorm]
"""


def test_search_recompute_modules_from_the_space_or_the_option_reach_the_plan(tmp_path):
    """Llama 3 8B at 16K tokens on data parallelism alone fits only with recompute: the
    space's layernorm alone saves too little (full recompute wins), --recompute-modules
    mlp,layernorm saves enough and beats full recompute."""
    space = tmp_path / "space.yaml"
    space.write_text(SPACE_DP_ONLY)
    args = ("search", "-m", "llama3-8b", "-c", "dgx-a100", "-n", "8", "-b", "16", "-s", "16384",
            "--space", str(space), "--top", "1", "-o")
    r = autoplan(*args, str(tmp_path / "space.yaml.out"))
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "space.yaml.out").read_text())["recompute"] == "full"
    r = autoplan(*args, str(tmp_path / "b.yaml"), "--recompute-modules", "mlp,layernorm")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load((tmp_path / "b.yaml").read_text())
    assert (doc["recompute"], doc["recompute_modules"]) == ("selective", ["mlp", "layernorm"])
    bad = autoplan("search", "-m", "llama3-8b", "-c", "dgx-a100", "-n", "8", "-b", "16", "-s",
                   "4096", "--recompute-modules", "mlp,foo")
    assert bad.returncode == 2 and "--recompute-modules" in bad.stderr and "foo" in bad.stderr
    assert "Traceback" not in bad.stderr
