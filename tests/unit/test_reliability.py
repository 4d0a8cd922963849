"""Failures and checkpoints (autoplan/whatif/reliability.py): the optimum interval and the
expected wall clock against Young's and Daly's closed forms and a hand calculation, the
checkpoint's bytes against the parameter count, the Llama 3 run's failure rate against
what its paper reports, the stall of an asynchronous save by what a rank holds, and the
cluster file's fields read strictly."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.descriptors.library import resolve_cluster
from autoplan.errors import InputError
from autoplan.vocab import ZeroStage
from autoplan.whatif.economics import economics
from autoplan.whatif.reliability import (
    checkpoint_bytes,
    daly_interval,
    rank_state_bytes,
    reliability,
    wall_factor,
    young_interval,
)
from tests.helpers import ROOT, make_plan

FAILING = str(ROOT / "examples" / "clusters" / "dgx-h100-failures.yaml")


def failing(plan, **changes):
    """``plan`` on the example cluster that fails (DGX H100 with the Llama 3 run's rates)."""
    base = resolve_cluster(FAILING)
    cluster = dataclasses.replace(base, nodes=plan.cluster.nodes, **changes)
    return dataclasses.replace(plan, cluster=cluster)


def test_dalys_interval_is_youngs_less_the_checkpoint_where_it_is_short():
    # delta << M: sqrt(2 delta M) [1 + sqrt(delta/2M)/3 + (delta/2M)/9] - delta -> sqrt(2 delta M) - delta
    delta, mtbf = 10.0, 1e6
    assert daly_interval(delta, mtbf) == pytest.approx(young_interval(delta, mtbf) - delta, rel=1e-3)
    assert young_interval(50.0, 10_000.0) == pytest.approx(1000.0)  # sqrt(2 x 50 x 10,000)
    # by hand: delta = 50, M = 10,000: x = 0.0025, 1000 x (1 + 0.05/3 + 0.0025/9) - 50
    assert daly_interval(50.0, 10_000.0) == pytest.approx(1000 * (1 + 0.05 / 3 + 0.0025 / 9) - 50)
    assert daly_interval(30_000.0, 10_000.0) == 10_000.0  # delta >= 2M: the MTBF itself


def test_the_expected_wall_clock_is_dalys_and_near_the_first_order_sum():
    # M = 10,000 s, tau = 1,000, delta = 100, R = 500, by hand:
    # (10,000 / 1,000) e^0.05 (e^0.11 - 1) = 10 x 1.0512711 x 0.1162781 = 1.222398
    assert wall_factor(1000.0, 100.0, 500.0, 10_000.0) == pytest.approx(1.222398, rel=1e-6)
    # rare failures: 1 + delta/tau + (tau/2 + delta + R)/M to first order
    tau, delta, restart, mtbf = 600.0, 5.0, 300.0, 1e7
    first = 1 + delta / tau + (tau / 2 + delta + restart) / mtbf
    assert wall_factor(tau, delta, restart, mtbf) == pytest.approx(first, rel=1e-4)
    # Daly's interval minimises it
    best = daly_interval(delta, 20_000.0)
    at = wall_factor(best, delta, restart, 20_000.0)
    assert at <= wall_factor(best * 0.8, delta, restart, 20_000.0)
    assert at <= wall_factor(best * 1.25, delta, restart, 20_000.0)


def test_the_llama3_rate_gives_an_interruption_every_three_hours_at_16k_gpus():
    # The Llama 3 Herd of Models, Sec. 3.3.4: 419 unexpected interruptions in 54 days on 16,384
    # H100, "an interruption every ~3 hours"; the example cluster carries 419 / (54 x 24 x 16,384)
    assert 419 / (54 * 24 * 16384) == pytest.approx(1.97e-5, rel=0.01)
    plan = failing(make_plan("llama3-8b", gpus=16384, dp=16384, global_batch=16384, seq_len=2048))
    r = reliability(plan)
    assert r is not None and r.mtbf_s / 3600 == pytest.approx(3.1, abs=0.05)


def test_a_checkpoint_is_the_weights_and_the_adam_states_once():
    plan = make_plan("llama3-70b", gpus=64, dp=8, tp=8)
    params = plan.model.params_total
    assert 70e9 < params < 71e9  # Llama 3 70B
    # bf16 weights (2) + fp32 master weights and two moments (12): Megatron-LM's distributed
    # optimizer table; gradients are not saved
    assert checkpoint_bytes(plan) == pytest.approx(14 * params)
    r = reliability(failing(plan))
    # the example's file system, 2 TB/s, but at most 50 GB/s a node (8 here); and each rank's
    # states leave its GPU at 63 GB/s
    over_storage = 14 * params / min(2000e9, 8 * 50e9)
    assert r.write_s == pytest.approx(max(over_storage, rank_state_bytes(failing(plan)) / 63e9))
    assert r.write_s == pytest.approx(over_storage)  # 2.5 s here: the nodes' storage links bind
    assert r.restart_s == pytest.approx(600 + r.write_s)
    assert reliability(plan) is None  # dgx-h100 gives no failure rate: the steps alone


def test_an_asynchronous_save_stalls_for_each_ranks_own_states_over_its_host_link():
    zero0 = failing(make_plan("llama3-70b", gpus=64, dp=8, tp=8, zero=ZeroStage.NONE))
    zero1 = failing(make_plan("llama3-70b", gpus=64, dp=8, tp=8, zero=ZeroStage.OPTIMIZER))
    params = zero0.model.params_total
    # ZeRO-0: each rank holds 1/tp of everything; ZeRO-1 its 1/tp of the weights and 1/(tp dp)
    # of the optimizer: about 14/8 and (2 + 12/8)/8 bytes a parameter (the embedding's split aside)
    assert rank_state_bytes(zero0) == pytest.approx(14 * params / 8, rel=0.02)
    assert rank_state_bytes(zero1) == pytest.approx((2 + 12 / 8) * params / 8, rel=0.02)
    a0, a1 = reliability(zero0, asynchronous=True), reliability(zero1, asynchronous=True)
    assert a0.stall_s == pytest.approx(rank_state_bytes(zero0) / 63e9)
    assert a1.stall_s < a0.stall_s and a1.goodput > a0.goodput
    sync = reliability(zero1)
    assert sync.stall_s == sync.write_s >= a1.stall_s  # the copy is part of a synchronous write
    assert a1.interval_s >= a1.write_s  # the next save waits for the last write


def test_economics_counts_the_wall_clock_failures_and_checkpoints_add():
    from autoplan.cost.evaluate import evaluate

    plan = make_plan("llama3-8b", gpus=64, dp=64, global_batch=512, seq_len=8192)
    pred = evaluate(plan)
    steady = economics(plan, pred, 1e12, 2.0)
    fails = economics(failing(plan), pred, 1e12, 2.0)
    assert steady.reliability is None and fails.goodput is not None and fails.goodput < 1
    assert fails.train_days * fails.goodput == pytest.approx(steady.train_days)
    assert fails.cost_usd * fails.goodput == pytest.approx(steady.cost_usd)
    assert "reliability" in fails.to_dict() and "reliability" not in steady.to_dict()


@pytest.mark.parametrize(("section", "words"), [
    ({"reliability": {"failures_per_gpu_hour": 1e-5, "restart_minutes": 5}}, "storage: missing"),
    ({"storage": {"bandwidth_GBps": 100}}, "reliability: missing"),
    ({"reliability": {"failures_per_gpu_hour": 1e-5, "failures_per_node_day": 0.1, "restart_minutes": 5},
      "storage": {"bandwidth_GBps": 100}}, "not both"),
    ({"reliability": {"failures_per_gpu_hour": -1, "restart_minutes": 5},
      "storage": {"bandwidth_GBps": 100}}, "reliability.failures_per_gpu_hour"),
    ({"reliability": {"failures_per_gpu_hour": 1e-5}, "storage": {"bandwidth_GBps": 100}},
     "restart_minutes: missing"),
    ({"reliability": {"failures_per_gpu_hour": 1e-5, "restart_minutes": 5},
      "storage": {"bandwidth_GBps": 1e300}}, "storage.bandwidth_GBps"),
])
def test_a_clusters_reliability_and_storage_are_read_strictly(section, words):
    doc = resolve_cluster("dgx-h100").to_dict()
    doc.update(section)
    with pytest.raises(InputError, match=words.replace(".", r"\.")):
        resolve_cluster(doc, "c.yaml")


def test_failures_per_node_day_are_per_gpu_hour_over_the_nodes_gpus_and_round_trip():
    doc = resolve_cluster("dgx-h100").to_dict()
    doc.update(reliability={"failures_per_node_day": 0.192, "restart_minutes": 6},
               storage={"bandwidth_GBps": 500, "node_GBps": 25})
    c = resolve_cluster(doc, "c.yaml")
    assert c.failures_per_gpu_hour == pytest.approx(0.192 / (24 * 8))
    assert c.restart_s == 360 and c.storage_Bps == 500e9 and c.storage_node_Bps == 25e9
    assert resolve_cluster(c.to_dict(), "again") == c
    # two nodes write at 2 x 25 GB/s, under the file system's 500
    plan = dataclasses.replace(make_plan("llama3-8b", gpus=16, dp=16),
                               cluster=dataclasses.replace(c, nodes=2))
    assert reliability(plan).write_s == pytest.approx(checkpoint_bytes(plan) / 50e9)

