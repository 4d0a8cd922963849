"""``serve --gpus 8,16,32``: the serve search at each GPU count, the count an objective
prefers, and the front of tokens/s per GPU against tokens/s per user (as JSON and SVG)."""

from __future__ import annotations

import dataclasses
import json
import xml.dom.minidom

import pytest

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.errors import InputError
from autoplan.serving.deployment import Arrival, ArrivalKind, Lengths, Precision, Slo, Workload
from autoplan.serving.engine import Engine
from autoplan.serving.search import serve_search
from autoplan.serving.sweep import ServeObjective, objective_value, serve_sweep
from tests.helpers import autoplan

L8 = resolve_model("llama3-8b")
H100 = resolve_cluster("dgx-h100")
W = Workload(Lengths(1000), Lengths(200), Arrival(ArrivalKind.RATE, rate_rps=6.0), 200)
SLO = Slo(tpot_ms=30.0)
BF16 = (Precision.BF16,)


@pytest.fixture(scope="module")
def sweeps() -> dict[ServeObjective, object]:
    return {o: serve_sweep(L8, H100, (1, 2, 4), Engine.VLLM, W, SLO, BF16, BF16, objective=o)
            for o in ServeObjective}


def test_each_count_is_the_serve_search_at_that_count(sweeps) -> None:
    sweep = sweeps[ServeObjective.GOODPUT]
    assert [c.gpus for c in sweep.counts] == [1, 2, 4]
    for c in sweep.counts:
        alone = serve_search(L8, with_gpus(H100, c.gpus), Engine.VLLM, W, SLO, BF16, BF16)
        assert c.best is not None and alone.plans
        assert c.best.plan.deployment == alone.plans[0].plan.deployment
        assert c.best.prediction.goodput_rps == alone.plans[0].prediction.goodput_rps


@pytest.mark.parametrize("objective", list(ServeObjective))
def test_the_chosen_count_is_the_objectives_best_among_those_meeting_the_slo(sweeps, objective) -> None:
    sweep = sweeps[objective]
    meeting = [c for c in sweep.counts if c.best is not None and c.best.prediction.meets_slo]
    assert meeting
    values = {c.gpus: objective_value(c.best, objective, SLO) for c in meeting}
    assert sweep.chosen is not None and values[sweep.chosen.gpus] == min(values.values())
    if objective is ServeObjective.COST:  # dollars per million tokens: GPU-hours x price, by hand
        pm = sweep.chosen.best.prediction.per_million
        tokens_per_s = sweep.chosen.best.prediction.output_tokens_per_s
        gpu_hours = sweep.chosen.gpus * 1e6 / tokens_per_s / 3600
        assert pm.cost_usd == pytest.approx(gpu_hours * H100.device.price_per_gpu_hour)


def test_the_front_is_what_no_deployment_of_any_count_beats_on_both_axes(sweeps) -> None:
    sweep = sweeps[ServeObjective.GOODPUT]
    every = [r for c in sweep.counts for r in c.result.plans]
    assert sweep.front
    for f in sweep.front:
        assert not any(r.per_gpu > f.per_gpu and r.user_tokens_per_s > f.user_tokens_per_s for r in every)
    for r in every:  # every deployment off the front is beaten on both axes or tied on one
        if r not in sweep.front:
            assert any(f.per_gpu >= r.per_gpu and f.user_tokens_per_s >= r.user_tokens_per_s
                       for f in sweep.front)


def test_cost_needs_a_price_and_energy_a_power_figure() -> None:
    h200 = resolve_cluster("dgx-h200")  # its device file gives no price per GPU-hour
    with pytest.raises(InputError, match="--price"):
        serve_sweep(L8, h200, (1, 2), Engine.VLLM, W, SLO, BF16, BF16, objective=ServeObjective.COST)
    dark = dataclasses.replace(H100, device=dataclasses.replace(H100.device, power_load_W=None))
    with pytest.raises(InputError, match="power"):
        serve_sweep(L8, dark, (1, 2), Engine.VLLM, W, SLO, BF16, BF16, objective=ServeObjective.ENERGY)


SERVE = ("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--input-len", "1000", "--output-len",
         "200", "--rate", "6", "--requests", "200", "--tpot-slo", "30")


def test_serve_sweeps_gpu_counts_and_draws_the_front(tmp_path) -> None:
    plot, out = tmp_path / "front.svg", tmp_path / "best.yaml"
    got = autoplan(*SERVE, "--gpus", "1..4", "--objective", "cost", "--format", "json", "--plot", plot,
                   "--out", out)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert [r["gpus"] for r in doc["sweep"]] == [1, 2, 4] and doc["objective"] == "cost"
    chosen = [r for r in doc["sweep"] if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["gpus"] == doc["chosen_gpus"]
    assert chosen[0]["usd_per_million_tokens"] == min(r["usd_per_million_tokens"] for r in doc["sweep"]
                                                      if r["meets_slo"])
    assert doc["pareto"] and all({"gpus", "tokens_per_s_per_gpu", "tokens_per_s_per_user"} <= set(p)
                                 for p in doc["pareto"])
    svg = xml.dom.minidom.parse(str(plot))
    assert len(svg.getElementsByTagName("circle")) >= sum(1 for r in doc["sweep"] if r["fits"])
    assert "deployment" in out.read_text()
    table = autoplan(*SERVE, "--gpus", "1,2")
    assert table.returncode == 0 and "chosen by goodput" in table.stdout


def test_a_count_of_the_sweep_is_that_count_served_alone() -> None:
    """The sweep resizes the cluster as its file defines it: 8 GPUs after 1 are one whole
    node, not two nodes of one GPU each."""
    swept = json.loads(autoplan(*SERVE, "--gpus", "1,8", "--format", "json").stdout)
    alone = json.loads(autoplan(*SERVE, "--gpus", "8", "--format", "json").stdout)
    at8 = next(r for r in swept["sweep"] if r["gpus"] == 8)
    best = alone["plans"][0]
    assert at8["tokens_per_s_per_gpu"] == pytest.approx(best["prediction"]["output_tokens_per_s"] / 8)
    assert swept["plans"][-1]["cluster"] == best["cluster"] == {"name": "dgx-h100", "nodes": 1}


def test_one_count_draws_its_front_too(tmp_path) -> None:
    plot = tmp_path / "one.svg"
    got = autoplan(*SERVE, "--gpus", "2", "--plot", plot)
    assert got.returncode == 0, got.stderr
    xml.dom.minidom.parse(str(plot))


@pytest.mark.parametrize(("args", "flag"), [
    (("--gpus", "2", "--objective", "cost"), "--objective"),  # one count: nothing to choose
    (("--gpus", "1,2", "--objective", "speed"), "--objective"),
    (("--gpus", "1,2", "--plot", "front.pdf"), "--plot"),
    (("--gpus", "0,2"), "--gpus"),
    (("--gpus", "8..2"), "--gpus"),
    (("--gpus", "lots"), "--gpus"),
])
def test_serve_refuses_a_bad_sweep(args: tuple[str, ...], flag: str) -> None:
    got = autoplan(*SERVE, *args)
    assert got.returncode == 2 and flag in got.stderr and "Traceback" not in got.stderr


def test_a_plot_at_a_directory_is_refused_before_any_work(tmp_path) -> None:
    folder = tmp_path / "dir.svg"
    folder.mkdir()
    got = autoplan(*SERVE, "--gpus", "1,2", "--plot", folder)
    assert got.returncode == 2 and "cannot write: a directory" in got.stderr and "Traceback" not in got.stderr
    assert not got.stdout  # refused before the sweep ran
