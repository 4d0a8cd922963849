"""Closed loops and prefill/decode disaggregation as NVIDIA's measured serving runs give
them: pools of workers with tensor, pipeline, attention-data and expert parallel widths,
closed loops over aggregated and disaggregated deployments, measured in their steady
state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.strict import read_yaml
from autoplan.serving.cost import StepModel, kv_transfer
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Lengths,
    Pool,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.engine import Engine
from autoplan.serving.evaluate import evaluate_serving
from autoplan.serving.planfile import read_serving_plan
from autoplan.serving.simulate import ClosedLoop, simulate, simulated_per_scheduler
from tests.helpers import autoplan, engine_constants

L8 = resolve_model("llama3-8b")
QWEN_MOE = resolve_model("qwen3-30b-a3b")  # 128 experts, 32 heads: a small wide-EP model
H100 = resolve_cluster("dgx-h100")


def _closed(inp: int, out: int, concurrency: int, requests: int) -> Workload:
    return Workload(Lengths(float(inp)), Lengths(float(out)),
                    Arrival(ArrivalKind.CONCURRENCY, concurrency=concurrency), requests)


@pytest.fixture
def vllm_constants() -> Iterator[None]:
    """vLLM's default line with the tests' own constants, whatever its shipped fit: 2 ms of
    host time an iteration shown in series, and a front end of 5 ms a request."""
    with engine_constants(Engine.VLLM, host_step_s=2e-3, request_s=5e-3, serial=True):
        yield


def test_one_request_in_a_closed_loop_over_one_prefill_and_one_decode_worker_by_hand(vllm_constants) -> None:
    """Concurrency 1 on P 1x tp1 + D 1x tp1: every request passes the idle front end
    (request_s) and is prefilled alone (one iteration of its 512-token prompt, which samples
    its first token), its cache moves (kv_transfer) and the first token reaches the client
    with it; the decode worker then runs 63 iterations of one sequence, its context growing
    a token each (its requests arrive prefilled, past the front end)."""
    d = Deployment.split(Pool(1, 1), Pool(1, 1))
    h2 = with_gpus(H100, 2)
    pred = evaluate_serving(ServingPlan(L8, h2, Engine.VLLM, d, _closed(512, 64, 1, 20), Slo()))
    pre = StepModel(L8, h2, d.pool("prefill"), Engine.VLLM)
    dec = StepModel(L8, h2, d.pool("decode"), Engine.VLLM)
    latency, per_token = kv_transfer(L8, h2, d)
    assert pre.request_s == 5e-3
    ttft = pre.request_s + pre.step_seconds(512, decodes=0, decode_context=0.0, prefill_pairs=512 * 513 / 2,
                                            prefill_context=0.0, sampled=1) + latency + per_token * 512
    tpot = sum(dec.step_seconds(1, decodes=1, decode_context=512.0 + j, prefill_pairs=0.0,
                                prefill_context=0.0, sampled=1) for j in range(63)) / 63
    assert pred.simulated_requests == 20
    assert pred.ttft_ms.mean == pytest.approx(1e3 * ttft, rel=1e-9)
    assert pred.ttft_ms.p99 == pytest.approx(1e3 * ttft, rel=1e-9)
    assert pred.tpot_ms.mean == pytest.approx(1e3 * tpot, rel=1e-9)
    # one request at a time: one request per its time in the system
    assert pred.requests_per_s == pytest.approx(1 / (ttft + 63 * tpot), rel=1e-9)
    assert pred.prefill_pool is not None and pred.prefill_pool.transfer_ms_mean > 0


def test_an_open_loops_first_token_reaches_the_client_with_the_kv_cache(vllm_constants) -> None:
    """At a rate low enough that requests never meet, a disaggregated request's TTFT is the
    front end's time, its prefill and the hand-off (the decode instance streams the first
    token, as the engines' P/D routers return its stream), open loop or closed; a
    one-token request is answered by the prefill instance."""
    d = Deployment.split(Pool(1, 1), Pool(1, 1))
    h2 = with_gpus(H100, 2)
    w = Workload(Lengths(512.0), Lengths(64.0), Arrival(ArrivalKind.RATE, rate_rps=0.01), 20)
    pred = evaluate_serving(ServingPlan(L8, h2, Engine.VLLM, d, w, Slo()))
    pre = StepModel(L8, h2, d.pool("prefill"), Engine.VLLM)
    latency, per_token = kv_transfer(L8, h2, d)
    assert pre.request_s == 5e-3
    prefill = pre.request_s + pre.step_seconds(512, decodes=0, decode_context=0.0,
                                               prefill_pairs=512 * 513 / 2, prefill_context=0.0, sampled=1)
    assert pred.ttft_ms.p99 == pytest.approx(1e3 * (prefill + latency + per_token * 512), rel=1e-9)
    one = Workload(Lengths(512.0), Lengths(1.0), w.arrival, 20)
    assert evaluate_serving(ServingPlan(L8, h2, Engine.VLLM, d, one, Slo())).ttft_ms.p99 == \
        pytest.approx(1e3 * prefill, rel=1e-9)


def test_doubling_the_concurrency_on_decode_bound_pools_raises_the_time_per_token() -> None:
    """Short prompts, long outputs: the decode worker holds the loop's requests, so twice
    the concurrency runs twice the batch in each of its iterations."""
    d = Deployment.split(Pool(1, 1), Pool(1, 1))
    h2 = with_gpus(H100, 2)
    preds = [evaluate_serving(ServingPlan(L8, h2, Engine.VLLM, d, _closed(128, 512, c, 200), Slo()))
             for c in (16, 32, 64)]
    tpots = [p.tpot_ms.mean for p in preds]
    assert tpots[0] < tpots[1] < tpots[2]
    assert [p.max_concurrency for p in preds] == [16, 32, 64]  # every request decoding at once
    for c, p in zip((16, 32, 64), preds, strict=True):  # Little's law over the deployment
        assert p.requests_per_s * p.e2e_ms.mean / 1e3 == pytest.approx(c, rel=1e-9)


def test_a_closed_loop_over_wide_ep_decode_spreads_its_requests_over_the_attention_dp_ranks() -> None:
    """P 1x tp4 + D 1x tp1 adp4 ep4 (a MoE model): the decode worker runs four attention-DP
    schedulers, each with its share of the requests in flight (32 / 4), whose experts
    meet over ep 4; it decodes faster per token than four tp1 workers holding every
    expert each, and than one tp4 worker. (SGLang's constants a test's own, in series: an
    iteration's time is then linear in its context, so the mean context's is the mean's.)"""
    with engine_constants(Engine.SGLANG, host_step_s=3e-3, serial=True):
        _wide_ep_decode_spreads()


def _wide_ep_decode_spreads() -> None:
    h8 = with_gpus(H100, 8)
    w = _closed(1024, 256, 32, 400)
    split = Deployment.split(Pool(1, 4), Pool(1, 1, attention_dp=4, ep=4))
    wide = evaluate_serving(ServingPlan(QWEN_MOE, h8, Engine.SGLANG, split, w, Slo()))
    assert wide.fits and wide.schedulers == 4 and wide.max_concurrency == 8
    decode = split.pool("decode")
    assert (decode.tp, decode.attention_dp, decode.ep) == (1, 4, 4)
    step = StepModel(QWEN_MOE, h8, decode, Engine.SGLANG)
    # a decode iteration of 8 sequences at about the mean context
    mid = 8 * (1024 + 128.0)
    assert wide.tpot_ms.mean == pytest.approx(1e3 * step.step_seconds(8, decodes=8, decode_context=mid,
                                                                      prefill_pairs=0.0, prefill_context=0.0,
                                                                      sampled=8), rel=0.02)
    replicas = evaluate_serving(ServingPlan(QWEN_MOE, h8, Engine.SGLANG,
                                            Deployment.split(Pool(1, 4), Pool(4, 1)), w, Slo()))
    assert wide.tpot_ms.mean < replicas.tpot_ms.mean


def test_a_closed_loop_measures_its_burst_in_the_workloads_proportion_and_no_drain() -> None:
    """A benchmark's clients all send their first request at once, and it averages over all
    of its requests: 32 clients and 200 requests measure the burst of 32 and 168 requests
    of the steady state, in which each request arrives as another finishes and waits for
    far fewer prompts than the burst's last; requests keep coming until the last measured
    one finishes, so every steady request sees the same batch (fixed lengths: alike TPOTs;
    no front end, whose queue would spread the burst's requests apart)."""
    with engine_constants(Engine.VLLM, host_step_s=2e-3, serial=True):
        step = StepModel(L8, with_gpus(H100, 1), Deployment(replicas=1, tp=1), Engine.VLLM)
        sim = simulate(step, _closed(2048, 128, 32, 200), 1, step.kv_tokens(step.memory()))
    burst = sim.arrival == 0
    assert len(sim.arrival) == 200 and burst.sum() == 32 and sim.in_flight == 32
    assert float(sim.ttft[burst].max()) > 3 * float(np.median(sim.ttft[~burst]))
    assert float(np.ptp(sim.tpot[~burst])) < 0.1 * float(sim.tpot[~burst].mean())


def test_a_closed_loop_cut_short_by_its_budget_keeps_the_burst_in_proportion() -> None:
    """Long outputs leave room for 320 requests of 1,000 at concurrency 64 (the iteration
    budget's 100,000 iterations of 64 sequences of 20,000 tokens): the burst is still about
    64 in 1,000 of the requests measured, not 64 in 320 (its weight in the mean TTFT is the
    workload's, not the budget's)."""
    step = StepModel(L8, with_gpus(H100, 1), Deployment(replicas=1, tp=1), Engine.VLLM)
    w = _closed(512, 20_000, 64, 1000)
    assert simulated_per_scheduler(step, w, 1) == 320
    sim = simulate(step, w, 1, step.kv_tokens(step.memory()))
    assert float(np.mean(sim.arrival == 0)) == pytest.approx(64 / 1000, abs=0.005)


def test_the_closed_loop_simulation_stays_within_its_budget() -> None:
    """Burst, steady and cool-down requests within the budget (a quarter of it steady at
    least), the in-flight count at most the budget; the burst measured in the workload's
    proportion to the steady requests, all of it where the budget holds the workload."""
    assert ClosedLoop.of(32, 1000, 4000) == ClosedLoop(32, 968, 32)
    assert ClosedLoop.of(1500, 10_000, 4000).slots == 4000
    assert ClosedLoop.of(3000, 10_000, 4000) == ClosedLoop(3000, 1000, 429)
    assert ClosedLoop.of(9000, 10_000, 4000).slots == 9000
    assert ClosedLoop.of(0.2, 5, 4000) == ClosedLoop(1, 4, 1)
    assert ClosedLoop.of(64, 40, 4000) == ClosedLoop(40, 0, 40)  # one wave: all at once
    loop = ClosedLoop(4, 10, 2)
    assert loop.measure().tolist() == [0, 2, *range(4, 14)] and loop.slots == 18


def test_a_closed_loop_of_fewer_clients_than_schedulers_serves_only_those_clients() -> None:
    """Two clients on eight one-GPU replicas: six replicas idle; the deployment serves two
    requests per request time, not eight (each scheduler's share of the concurrency is 1/4,
    not rounded up to one)."""
    w = _closed(512, 64, 2, 100)
    pred = evaluate_serving(ServingPlan(L8, with_gpus(H100, 8), Engine.VLLM, Deployment(replicas=8, tp=1),
                                        w, Slo()))
    assert pred.requests_per_s == pytest.approx(2 / (pred.e2e_ms.mean / 1e3), rel=1e-9)


PLAN = """\
autoplan: 1
kind: serving
model: qwen3-30b-a3b
cluster: {name: dgx-h100, nodes: 1}
engine: sglang
deployment:
  disaggregated:
    prefill: {replicas: 1, tp: 4}
    decode: {replicas: 1, tp: 1, attention_dp: 4, ep: 4}
  weights: bf16
  kv_cache: fp8
workload:
  input_len: 1024
  output_len: 256
  arrival: {concurrency: 32}
  requests: 200
"""


def test_pool_widths_round_trip_through_plan_files_and_show_in_labels(tmp_path: Path) -> None:
    path = tmp_path / "wide.yaml"
    path.write_text(PLAN)
    plan = read_serving_plan(read_yaml(path), str(path))
    assert plan.deployment.disaggregated is not None
    assert plan.deployment.disaggregated.decode == Pool(1, 1, attention_dp=4, ep=4)
    assert plan.deployment.label() == "P 1x tp4 + D 1x tp1 adp4 ep4"
    # the deployment's own widths are the decode pool's
    assert (plan.deployment.tp, plan.deployment.attention_dp, plan.deployment.ep) == (1, 4, 4)
    first = autoplan("evaluate", path, "--format", "json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)["plans"][0]  # the plan document, written back
    assert doc["deployment"]["disaggregated"] == {
        "prefill": {"replicas": 1, "tp": 4}, "decode": {"replicas": 1, "tp": 1, "attention_dp": 4, "ep": 4}}
    out = tmp_path / "out.yaml"
    out.write_text(json.dumps(doc))  # JSON is YAML
    again = autoplan("evaluate", out, "--format", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["plans"][0]["prediction"] == doc["prediction"]
    text = autoplan("evaluate", path)
    assert "P 1x tp4 + D 1x tp1 adp4 ep4" in text.stdout.replace("\n", " ")
    launch = autoplan("export", path, "--to", "sglang", "--out", tmp_path / "launch")
    assert launch.returncode == 0, launch.stderr
    decode = (tmp_path / "launch" / "serve-sglang-decode.sh").read_text()
    assert "--attn-dp-size" in decode and "--ep-size" in decode


@pytest.mark.parametrize(("deployment", "message"), [
    ("{disaggregated: {prefill: {tp: 4}, decode: {tp: 1, attention_dp: 4, ep: 3}}}",
     "deployment.disaggregated.decode.ep: must divide tp x attention_dp (4)"),
    ("{disaggregated: {prefill: {tp: 4, pp: 0}, decode: {tp: 4}}}", "deployment.disaggregated.prefill.pp: "),
    ("{disaggregated: {prefill: {tp: 4, pp: 64}, decode: {tp: 1, pp: 4}}}",
     "deployment.disaggregated.prefill.pp: at most qwen3-30b-a3b's 48 layers"),
    ("{disaggregated: {prefill: {tp: 4}, decode: {tp: 2, attention_dp: 4}}}",
     "deployment: the prefill and decode pools' replicas x tp x pp x attention_dp = 12 GPUs"),
    ("{ep: 4, disaggregated: {prefill: {tp: 4}, decode: {tp: 4}}}",
     "deployment.ep: with disaggregated, each pool gives its own"),
    ("{disaggregated: {prefill: {tp: 4}, decode: {tp: 4, attention_dp: two}}}",
     "deployment.disaggregated.decode.attention_dp: expected an integer"),
])
def test_bad_pool_widths_exit_2_naming_the_field(tmp_path: Path, deployment: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(PLAN.replace(PLAN[PLAN.index("deployment:"):PLAN.index("workload:")],
                                 f"deployment: {deployment}\n"))
    result = autoplan("evaluate", path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_dense_models_pools_take_no_attention_dp_or_ep(tmp_path: Path) -> None:
    path = tmp_path / "dense.yaml"
    path.write_text(PLAN.replace("qwen3-30b-a3b", "llama3-8b"))
    result = autoplan("evaluate", path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert ("deployment.disaggregated.decode: ep and attention_dp are for mixture-of-experts models; "
            "llama3-8b is dense") in result.stderr


def test_the_disaggregated_search_tries_wide_ep_workers_for_moe_models_only() -> None:
    from autoplan.serving.deployment import Precision
    from autoplan.serving.search import disaggregated_deployments, pool_workers

    assert Pool(1, 1, attention_dp=8, ep=8) in pool_workers(QWEN_MOE, 8)
    assert all(p.attention_dp == p.ep == 1 for p in pool_workers(L8, 8))
    h8 = with_gpus(H100, 8)
    splits = list(disaggregated_deployments(QWEN_MOE, h8, 8, [Precision.BF16], [Precision.BF16]))
    assert all(d.gpus == 8 for d in splits) and len(splits) == len({d.label() for d in splits})
    assert "P 1x tp4 + D 1x tp1 adp4 ep4" in {d.label() for d in splits}
