"""``autoplan serve --traffic FILE.csv``: the per-period plan on the command line, the plan
file with its autoscale block (``--out``), the autoscalers' settings (``--autoscale-out``),
and the refusals, each one line naming the flag or the file, line and column (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import autoplan

SMALL = ("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--input-len", "1024", "--output-len", "256",
         "--ttft-slo", "1000", "--tpot-slo", "40")
DAY = "start,rate_rps\n00:00,3\n08:00,30\n18:00,12\n"


def test_the_day_plan_writes_its_json_its_plan_and_the_autoscalers_settings(tmp_path: Path) -> None:
    traffic = tmp_path / "day.csv"
    traffic.write_text(DAY)
    got = autoplan("serve", *SMALL, "--gpus", "2", "--traffic", traffic, "--format", "json",
                   "--out", tmp_path / "plan.yaml", "--autoscale-out", tmp_path / "scale", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    day = doc["traffic"]
    assert [p["replicas"] for p in day["periods"]] == [1, 2, 1]
    assert day["static"]["gpu_hours"] == 48.0 > day["scaled"]["gpu_hours"]
    assert day["saving"]["gpu_hours"] == day["static"]["gpu_hours"] - day["scaled"]["gpu_hours"]
    assert day["autoscale"]["max_replicas"] == 2 and day["meets_slo"] is True
    assert doc["plans"][0]["autoscale"] == day["autoscale"]
    written = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert written["autoscale"]["periods"][1] == {"start_h": 8.0, "hours": 10.0, "rate_rps": 30.0,
                                                  "replicas": 2}
    assert sorted(p.name for p in (tmp_path / "scale").iterdir()) == [
        "dynamo-planner.yaml", "hpa.yaml", "keda-scaledobject.yaml"]
    hpa = yaml.safe_load((tmp_path / "scale" / "hpa.yaml").read_text())
    assert hpa["spec"]["maxReplicas"] == 2
    evaluated = autoplan("evaluate", tmp_path / "plan.yaml", "--format", "json")
    assert evaluated.returncode == 0, evaluated.stderr


def test_the_table_says_the_replica_the_saving_and_the_thresholds(tmp_path: Path) -> None:
    traffic = tmp_path / "day.csv"
    traffic.write_text("start,rate_rps\n00:00,0\n08:00,20\n")
    got = autoplan("serve", *SMALL, "--gpus", "1", "--traffic", traffic)
    assert got.returncode == 0, got.stderr
    for words in ("replicas", "static: 1 replica(s) all day", "scaled per period", "saving (0%)",
                  "replica: 1x tp1", "requests in flight per replica", "KV cache", "105 W idle"):
        assert words in got.stdout, words


def test_too_few_gpus_for_the_peak_exit_1_naming_the_periods(tmp_path: Path) -> None:
    traffic = tmp_path / "day.csv"
    traffic.write_text(DAY)
    got = autoplan("serve", *SMALL, "--gpus", "1", "--traffic", traffic)
    assert got.returncode == 1
    assert "periods 08:00 fall short of the SLO: --gpus 1 is too few" in got.stderr


@pytest.mark.parametrize("extra, words", [
    (("--rate", "3"), "--rate: --traffic plans each period of the traffic file: leave out --rate"),
    (("--disaggregated",), "leave out --disaggregated"),
    (("--top", "3"), "leave out --top"),
    (("--gpus", "2,4"), "--gpus: with --traffic, the most GPUs the deployment may scale to"),
])
def test_options_the_day_plan_does_not_take_are_refused(tmp_path: Path, extra: tuple[str, ...],
                                                        words: str) -> None:
    traffic = tmp_path / "day.csv"
    traffic.write_text(DAY)
    got = autoplan("serve", *SMALL, "--traffic", traffic, *extra)
    assert got.returncode == 2
    assert words in got.stderr and "Traceback" not in got.stderr


def test_a_bad_row_is_one_line_naming_the_file_line_and_column(tmp_path: Path) -> None:
    traffic = tmp_path / "day.csv"
    traffic.write_text("start,rate_rps\n00:00,3\n08:00,lots\n")
    got = autoplan("serve", *SMALL, "--traffic", traffic)
    assert got.returncode == 2
    said = f"autoplan: error: {traffic}: line 3, rate_rps: expected requests/s, got 'lots'"
    assert got.stderr.strip() == said


def test_autoscale_out_needs_the_traffic_and_a_folder(tmp_path: Path) -> None:
    got = autoplan("serve", *SMALL, "--rate", "3", "--autoscale-out", tmp_path / "scale")
    assert got.returncode == 2 and "--autoscale-out: writes the autoscaler settings" in got.stderr
    traffic = tmp_path / "day.csv"
    traffic.write_text(DAY)
    got = autoplan("serve", *SMALL, "--traffic", traffic, "--autoscale-out", traffic)
    assert got.returncode == 2 and "is not a directory" in got.stderr


def test_lengths_every_row_gives_need_no_flag(tmp_path: Path) -> None:
    traffic = tmp_path / "day.csv"
    traffic.write_text("start,rate_rps,input_len,output_len\n00:00,3,512,128\n")
    got = autoplan("serve", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "1",
                   "--traffic", traffic, "--ttft-slo", "2000", "--format", "json")
    assert got.returncode == 0, got.stderr
    periods = json.loads(got.stdout)["traffic"]["periods"]
    assert [(p["input_len"], p["output_len"]) for p in periods] == [(512, 128)]
