"""search --min-headroom: every plan leaves that much free per GPU (by default 5% of
the device, for the allocator); the table shows why a plan won: microbatches, bubble
and exposed communication."""

from __future__ import annotations

import json

import pytest

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
