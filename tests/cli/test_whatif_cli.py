"""`autoplan search --gpus A,B,... --train-tokens N`: the JSON front, the table, the plot,
the deadline and budget, and every bad what-if option refused with exit 2."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import autoplan, cpu_seconds

SMALL = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "-b", "64", "-s", "4096", "--top", "3")


def _json(*extra: str) -> dict:
    r = autoplan(*SMALL, "--gpus", "8..32", "--train-tokens", "1e11", "-f", "json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_json_front_is_non_dominated_and_consistent() -> None:
    doc = _json()
    front = doc["pareto"]
    assert [p["gpus"] for p in front] == [8, 16, 32]
    for p in front:
        assert set(p) >= {"gpus", "plan", "step_time_s", "tokens_per_s", "train_days",
                          "gpu_hours", "cost_usd", "energy_mwh", "layout"}
        assert p["gpu_hours"] == pytest.approx(p["gpus"] * p["train_days"] * 24)
        assert p["train_days"] == pytest.approx(1e11 / p["tokens_per_s"] / 86400)
        assert p["cost_usd"] == pytest.approx(p["gpu_hours"] * 3.24)
        assert p["plan"]["cluster"]["nodes"] * 8 == p["gpus"] or p["gpus"] < 8
        for q in front:
            assert not (q["train_days"] <= p["train_days"] and q["cost_usd"] <= p["cost_usd"]
                        and (q["train_days"], q["cost_usd"]) != (p["train_days"], p["cost_usd"]))
    days = [p["train_days"] for p in front]
    assert days == sorted(days, reverse=True)
    train = doc["train"]
    assert train["objective"] == "time" and train["best_gpus"] == 32
    assert train["price_source"] == "device h100-sxm" and train["pue"] == 1.56
    # plans: ranked by days across every count, each with its own cluster size
    assert doc["plans"][0]["prediction"]["step_time_s"] == front[-1]["step_time_s"]
    assert _json() == doc  # deterministic


def test_objective_cost_and_price_override() -> None:
    doc = _json("--objective", "cost", "--price", "2")
    assert doc["train"]["best_gpus"] == 8 and doc["train"]["price_source"] == "--price"
    assert all(p["cost_usd"] == pytest.approx(p["gpu_hours"] * 2) for p in doc["pareto"])
    # plans ranked by GPU-hours: GPUs x step time (the tokens per step are the same)
    hours = [p["cluster"]["nodes"] * 8 * p["prediction"]["step_time_s"] for p in doc["plans"]]
    assert len(hours) == 3 and hours == sorted(hours)


def test_deadline_and_budget_filter_the_front_and_name_the_binding_one(tmp_path: Path) -> None:
    doc = _json("--objective", "cost", "--deadline", "10")
    assert [p["gpus"] for p in doc["pareto"]] == [16, 32]
    assert doc["train"]["binding"] == ["deadline"] and doc["train"]["best_gpus"] == 16
    doc = _json("--budget", "9200")
    assert [p["gpus"] for p in doc["pareto"]] == [8, 16]
    assert doc["train"]["binding"] == ["budget"] and doc["train"]["best_gpus"] == 16
    out = tmp_path / "best.yaml"
    r = autoplan(*SMALL, "--gpus", "8..32", "--train-tokens", "1e11", "--deadline", "1",
                 "--out", out)
    assert r.returncode == 1 and "no GPU count meets a 1-day deadline" in r.stderr
    assert not out.exists()


def test_table_and_plot(tmp_path: Path) -> None:
    svg = tmp_path / "front.svg"
    r = autoplan(*SMALL, "--gpus", "8,16,32", "--train-tokens", "1e11", "--plot", svg,
                 "--deadline", "30")
    assert r.returncode == 0, r.stderr
    assert "time to train, by GPU count" in r.stdout and "GPU-hours" in r.stdout
    assert "deadline does not bind" in r.stdout and "price $3.24 per GPU-hour" in r.stdout
    root = ET.fromstring(svg.read_text())
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert any(t.startswith("32 GPUs: dp") for t in texts)


def test_job_file_takes_a_list_of_counts(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ngpus: [8, 16]\n"
                   "job: {global_batch: 64, seq_len: 4096}\n")
    r = autoplan("search", job, "--train-tokens", "1e11", "-f", "json", "--top", "1")
    assert r.returncode == 0, r.stderr
    assert [p["gpus"] for p in json.loads(r.stdout)["pareto"]] == [8, 16]


def test_no_price_means_cost_by_gpu_hours(tmp_path: Path) -> None:
    r = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h200", "-b", "64", "-s", "4096",
                 "--gpus", "8,16", "--train-tokens", "1e11", "-f", "json", "--top", "1",
                 "--objective", "cost")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["train"]["price_per_gpu_hour"] is None
    assert all(p["cost_usd"] is None for p in doc["pareto"])
    assert doc["train"]["best_gpus"] == 8


POWERLESS = """\
device:
  name: nopower
  peak_tflops: {bf16: 989}
  mem_GiB: 80
  hbm_GBps: 3350
"""


@pytest.mark.parametrize(("args", "needle"), [
    (("--gpus", "8,16"), "--gpus: a sweep over GPU counts"),
    (("--objective", "cost"), "--objective: needs --train-tokens"),
    (("--plot", "x.svg"), "--plot: needs --train-tokens"),
    (("--train-tokens", "nan"), "--train-tokens: expected a number > 0"),
    (("--train-tokens", "inf"), "--train-tokens: expected a number > 0"),
    (("--train-tokens", "-5"), "--train-tokens: expected a number > 0"),
    (("--train-tokens", "1e30"), "--train-tokens: expected a number > 0 and <= 1e+18"),
    (("--train-tokens", "1e11", "--price", "0"), "--price: expected a number > 0"),
    (("--train-tokens", "1e11", "--deadline", "-1"), "--deadline: expected a number > 0"),
    (("--train-tokens", "1e11", "--budget", "1e300"), "--budget: expected a number > 0"),
    (("--train-tokens", "1e11", "--plot", "front.pdf"), "--plot: expected a .svg or .png file"),
    (("--train-tokens", "1e11", "--objective", "speed"), "speed"),
    (("--gpus", "1..100000000000", "--train-tokens", "1e11"), "--gpus: expected at most 16"),
    (("--gpus", "8,12", "--train-tokens", "1e11"), "--gpus: expected a multiple of dgx-h100"),
    (("--gpus", "8,2000000", "--train-tokens", "1e11"), "--gpus: expected GPU counts from 1"),
    (("--gpus", "8..", "--train-tokens", "1e11"), "--gpus: expected a GPU count"),
])
def test_bad_what_if_input_exits_2_fast(args: tuple[str, ...], needle: str) -> None:
    with cpu_seconds() as took:
        r = autoplan(*SMALL, *args)
    assert took[0] < 1.0
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_budget_needs_a_price_and_energy_needs_power(tmp_path: Path) -> None:
    r = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h200", "-b", "64", "-s", "4096",
                 "--gpus", "8", "--train-tokens", "1e11", "--budget", "1e6")
    assert r.returncode == 2 and "--budget: h200 has no price_per_gpu_hour" in r.stderr
    device = tmp_path / "nopower.yaml"
    device.write_text(POWERLESS)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"cluster:\n  name: c\n  device: {device}\n  gpus_per_node: 8\n"
                       "  intra_node: {bandwidth_GBps: 450, latency_us: 3}\n"
                       "  inter_node: {bandwidth_GBps: 50, latency_us: 10}\n")
    r = autoplan("search", "-m", "llama3-8b", "-c", cluster, "-b", "64", "-s", "4096",
                 "--gpus", "8", "--train-tokens", "1e11", "--objective", "energy")
    assert r.returncode == 2 and "energy needs nopower's power_W" in r.stderr


@pytest.mark.parametrize(("snippet", "needle"), [
    ("  power_W: {load: 100, idle: 200}\n", "power_W.idle: expected at most the load power"),
    ("  power_W: {load: -1, idle: 0}\n", "power_W.load: expected a number > 0"),
    ("  power_W: {lod: 100, idle: 0}\n", "power_W.lod"),
    ("  price_per_gpu_hour: -2\n", "price_per_gpu_hour: expected a number > 0"),
])
def test_bad_device_economics_fields(tmp_path: Path, snippet: str, needle: str) -> None:
    device = tmp_path / "d.yaml"
    device.write_text(POWERLESS + snippet)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"cluster:\n  name: c\n  device: {device}\n  gpus_per_node: 8\n"
                       "  intra_node: {bandwidth_GBps: 450, latency_us: 3}\n"
                       "  inter_node: {bandwidth_GBps: 50, latency_us: 10}\n  pue: 0.5\n")
    r = autoplan("search", "-m", "llama3-8b", "-c", cluster, "-b", "64", "-s", "4096",
                 "--gpus", "8")
    assert r.returncode == 2 and needle in r.stderr, r.stderr
