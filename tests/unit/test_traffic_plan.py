"""Planning a deployment per period of a day's traffic (autoplan.serving.traffic_plan), and
the ``autoscale`` block it writes into the plan file, read back strictly
(autoplan.serving.planfile)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import yaml

from autoplan.errors import InputError
from autoplan.serving.autoscale import HPA_TOLERANCE, ScalingMetric
from autoplan.serving.deployment import Arrival, ArrivalKind, Deployment
from autoplan.serving.evaluate import serving_document
from autoplan.serving.planfile import read_serving_plan
from autoplan.serving.request import ServeOptions, ServeRequest, build_serve_request, check_serve_options
from autoplan.serving.traffic import parse_traffic
from autoplan.serving.traffic_plan import (
    CAPACITY_TOLERANCE,
    TrafficPlan,
    _Evaluator,
    plan_traffic,
)

# rates of a small day: none at night, then rising; a closed loop in the evening
DAY = "start,rate_rps,concurrency\n00:00,0,\n06:00,4,\n09:00,12,\n12:00,30,\n15:00,40,\n20:00,,96\n"


def _request() -> ServeRequest:
    given = ServeOptions(model="llama3.1-8b", cluster="dgx-h100", input_len=1024, output_len=256, rate=1.0,
                         ttft_slo=1000, tpot_slo=40)
    return build_serve_request(None, check_serve_options(None, given), given)


@pytest.fixture(scope="module")
def day() -> TrafficPlan:
    tp = plan_traffic(_request(), parse_traffic(DAY, "day.csv"), budget_gpus=2)
    assert tp is not None
    return tp


def test_one_replica_shape_serves_the_day_and_each_period_gets_the_fewest_replicas(day: TrafficPlan) -> None:
    cap = day.shape.rate_rps
    assert day.shape.deployment.replicas == 1
    for pp in day.periods:
        assert pp.meets_slo, pp.period.label()
        assert pp.gpus == pp.replicas * day.shape.deployment.gpus
        if pp.period.rate_rps:
            # enough replicas for the rate, and one fewer would not be (within the search's tolerance)
            assert pp.replicas * cap >= pp.period.rate_rps
            assert pp.replicas == 1 or (pp.replicas - 1) * cap * (1 + CAPACITY_TOLERANCE) < pp.period.rate_rps
            assert 0 < pp.utilization <= 1.0
    night = day.periods[0]
    assert (night.replicas, night.prediction, night.utilization) == (1, None, 0.0)


def test_replicas_rise_with_the_rate(day: TrafficPlan) -> None:
    rated = sorted((pp.period.rate_rps, pp.replicas) for pp in day.periods if pp.period.rate_rps is not None)
    assert [n for _, n in rated] == sorted(n for _, n in rated)
    assert rated[-1][1] > rated[0][1]


def test_static_peak_provisioning_costs_at_least_what_scaling_does(day: TrafficPlan) -> None:
    most = max(pp.replicas for pp in day.periods)
    gpr = day.shape.deployment.gpus
    assert day.static.gpu_hours == pytest.approx(most * gpr * 24.0)
    assert day.scaled.gpu_hours == pytest.approx(sum(pp.gpus * pp.period.hours for pp in day.periods))
    assert day.static.gpu_hours > day.scaled.gpu_hours
    assert day.static.energy_kwh is not None and day.scaled.energy_kwh is not None
    assert day.static.energy_kwh > day.scaled.energy_kwh > 0
    price = day.price_per_gpu_hour
    assert price is not None and day.saving.cost_usd == pytest.approx((day.static.gpu_hours
                                                                       - day.scaled.gpu_hours) * price)


def test_energy_charges_idle_power_where_nothing_arrives(day: TrafficPlan) -> None:
    dev = day.plan.cluster.device
    assert dev.power_idle_W is not None
    night = day.periods[0]
    assert night.energy_kwh == pytest.approx(dev.power_idle_W * day.plan.cluster.pue * 6.0 / 1e3)


def test_the_thresholds_are_the_replica_at_its_capacity(day: TrafficPlan) -> None:
    a, cap = day.autoscale, day.shape
    # Little's law: requests in flight = rate x time in the system
    assert a.requests_in_flight == pytest.approx(cap.rate_rps * cap.prediction.e2e_ms.mean / 1e3)
    assert a.capacity_rps == cap.rate_rps
    assert a.metric is ScalingMetric.REQUESTS_IN_FLIGHT
    assert a.target == pytest.approx(a.requests_in_flight / (1 + HPA_TOLERANCE))
    assert 0 < a.kv_cache_usage < 1
    assert (a.min_replicas, a.max_replicas) == (1, max(pp.replicas for pp in day.periods))
    assert a.max_replicas * cap.rate_rps >= max(pp.period.rate_rps or 0 for pp in day.periods)
    assert [p.replicas for p in a.periods] == [pp.replicas for pp in day.periods]


def test_a_closed_loop_period_gets_replicas_by_the_requests_in_flight_at_capacity(day: TrafficPlan) -> None:
    evening = day.periods[-1]
    assert evening.period.concurrency == 96
    assert evening.replicas >= math.ceil(96 / day.autoscale.requests_in_flight)
    assert evening.prediction is not None and evening.prediction.meets_slo
    assert evening.offered_rps == pytest.approx(evening.prediction.requests_per_s)
    # the fewest: one replica fewer falls short (the burst of 96 first requests at once)
    assert evening.replicas > 1
    one_fewer = dataclasses.replace(day.shape.deployment, replicas=evening.replicas - 1)
    fewer = _Evaluator(_request()).run(one_fewer, evening.lengths,
                                       Arrival(ArrivalKind.CONCURRENCY, concurrency=96))
    assert not fewer.meets_slo


def test_each_scheduler_of_a_replica_is_simulated_for_the_jobs_requests() -> None:
    """A pipelined replica runs a scheduler per stage: simulated for 1000 requests among all
    four, each saw 250, ended before a queue could grow, and looked four times the capacity
    of four one-GPU replicas."""
    ev = _Evaluator(_request())
    for d, requests in ((Deployment(replicas=1, tp=1, pp=4), 4000), (Deployment(replicas=3, tp=2), 3000)):
        plan = ev.plan(d, (1024.0, 256.0), Arrival(ArrivalKind.RATE, rate_rps=50.0))
        assert plan.workload.requests == requests


def test_a_replica_at_its_capacity_meets_the_slo_and_a_little_more_does_not(day: TrafficPlan) -> None:
    found = day.shape
    assert found.prediction.meets_slo
    ev = _Evaluator(_request())
    above = found.rate_rps * (1 + 2 * CAPACITY_TOLERANCE)
    assert not ev.rate(found.deployment, found.lengths, above).meets_slo
    assert ev.rate(found.deployment, found.lengths, found.rate_rps).meets_slo


def test_the_plan_file_holds_the_busiest_period_with_its_autoscale_block_and_reads_back(
        day: TrafficPlan) -> None:
    doc = serving_document(day.plan, day.prediction)
    text = yaml.safe_dump(doc, sort_keys=False)
    back = read_serving_plan(yaml.safe_load(text), "day-plan.yaml")
    assert back.autoscale == day.autoscale
    assert back.deployment.replicas == day.autoscale.max_replicas
    assert serving_document(back, day.prediction)["autoscale"] == doc["autoscale"]
    assert doc["workload"]["arrival"] == {"rate_rps": 40.0}  # the busiest period's
    assert day.plan.workload.arrival.kind is ArrivalKind.RATE


def test_a_plan_without_the_block_reads_as_before(day: TrafficPlan) -> None:
    doc = serving_document(dataclasses.replace(day.plan, autoscale=None), day.prediction)
    assert "autoscale" not in doc
    assert read_serving_plan(doc, "plan.yaml").autoscale is None


@pytest.mark.parametrize("edit, words", [
    (lambda a: a.update(min_replicas=5), "min_replicas: expected at most max_replicas"),
    (lambda a: a.update(metric="cpu"), "autoscale.metric"),
    (lambda a: a.update(target=0), "autoscale.target"),
    (lambda a: a.update(spare=1), "autoscale.spare: unknown field"),
    (lambda a: a["at_capacity"].update(kv_cache_usage=1.5), "autoscale.at_capacity.kv_cache_usage"),
    (lambda a: a["periods"][1].update(start_h=99), "autoscale.periods[1].start_h"),
    (lambda a: a["periods"][0].update(replicas=99), "autoscale.periods[0].replicas"),
    (lambda a: a.update(periods=[]), "autoscale.periods: expected a list"),
    (lambda a: a.update(max_replicas=a["max_replicas"] + 1), "deployment.replicas"),
])
def test_a_wrong_autoscale_block_is_refused_naming_its_field(day: TrafficPlan, edit, words: str) -> None:
    doc = copy.deepcopy(serving_document(day.plan, day.prediction))
    edit(doc["autoscale"])
    with pytest.raises(InputError) as caught:
        read_serving_plan(doc, "day-plan.yaml")
    assert words in str(caught.value)


def test_an_autoscaled_plan_names_the_nodes_that_hold_its_replicas(day: TrafficPlan) -> None:
    doc = copy.deepcopy(serving_document(day.plan, day.prediction))
    doc["cluster"] = {"name": "dgx-h100", "nodes": 1}
    with pytest.raises(InputError, match="expected the nodes that hold them"):
        read_serving_plan(doc, "day-plan.yaml")


def test_traffic_with_no_requests_is_refused() -> None:
    with pytest.raises(InputError, match="no requests in any period"):
        plan_traffic(_request(), parse_traffic("start,rate_rps\n0,0\n", "none.csv"))


def test_a_period_past_the_models_context_is_refused_naming_its_line() -> None:
    with pytest.raises(InputError, match=r"long.csv: line 3, input_len: .*max_seq_len"):
        plan_traffic(_request(), parse_traffic("start,rate_rps,input_len\n0,1,\n6,2,200000\n", "long.csv"))
