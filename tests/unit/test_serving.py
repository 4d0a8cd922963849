"""Serving plans: the step cost against hand calculations, the simulator's invariants,
and the search and command line."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.library import builtin_names, resolve_cluster, resolve_model, with_gpus
from autoplan.errors import InputError
from autoplan.kernels.layer import distinct_experts, kv_bytes_per_token_layer
from autoplan.serving.cost import StepModel, vision_params_per_rank
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Dist,
    Lengths,
    Precision,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.engine import Engine
from autoplan.serving.evaluate import evaluate_serving, per_million, serving_document
from autoplan.serving.search import pareto, serve_search
from autoplan.serving.simulate import sample_lengths, simulate
from autoplan.vocab import ZeroStage
from tests.helpers import autoplan, make_plan, run_launch_script

L70 = resolve_model("llama3-70b")
H8 = with_gpus(resolve_cluster("dgx-h100"), 8)


def _plan(arrival: Arrival, tp: int = 8, replicas: int = 1, inp: int = 1024, out: int = 128,
          requests: int = 300, **dep: object) -> ServingPlan:
    w = Workload(Lengths(float(inp)), Lengths(float(out)), arrival, requests)
    return ServingPlan(L70, H8, Engine.VLLM, Deployment(replicas=replicas, tp=tp, **dep), w, Slo(2000, 50))


def test_kv_cache_bytes_per_token_match_the_published_figure() -> None:
    # Llama 3 70B: 80 layers x 8 KV heads x 128 channels x (K, V) x 2 bytes = 320 KiB a token
    per_layer = kv_bytes_per_token_layer(L70, 1, Precision.BF16.bytes)
    assert per_layer * L70.layers == 80 * 8 * 128 * 2 * 2 == 320 * 1024
    # TP 8 keeps one KV head per GPU; TP 16 still one (replicated), fp8 halves it
    assert kv_bytes_per_token_layer(L70, 8, Precision.BF16.bytes) == per_layer / 8
    assert kv_bytes_per_token_layer(L70, 16, Precision.BF16.bytes) == per_layer / 8
    assert kv_bytes_per_token_layer(L70, 8, Precision.FP8.bytes) == per_layer / 16
    # DeepSeek-V3's MLA caches the 512-wide latent and the 64-wide RoPE key: 576 values
    ds = resolve_model("deepseek-v3")
    assert kv_bytes_per_token_layer(ds, 8, Precision.BF16.bytes) == (512 + 64) * 2


def test_distinct_experts_is_the_expected_coverage() -> None:
    assert distinct_experts(8, 2, 1) == pytest.approx(2.0)  # one token: its top-2
    assert distinct_experts(256, 8, 10_000) == pytest.approx(256.0)
    # two tokens: 2k - k^2/E expected distinct (inclusion-exclusion)
    assert distinct_experts(64, 4, 2) == pytest.approx(8 - 16 / 64)


def test_a_one_token_decode_reads_every_weight_once() -> None:
    # batch 1 at TP 8: the GEMMs are bound by reading this GPU's share of the layer weights
    step = StepModel(L70, H8, Deployment(replicas=1, tp=8), Engine.VLLM)
    b = step.iteration(1, decodes=1, decode_context=0, prefill_pairs=0.0, prefill_context=0.0, sampled=1)
    dev = H8.device
    layer_weights = (L70.params_attention + L70.params_mlp) * 2 / 8  # bytes per GPU
    floor = L70.layers * layer_weights / (dev.hbm_Bps * dev.hbm_efficiency)
    # the engine's fitted kernel scale multiplies the roofline's time
    assert floor <= b.gemm / step._kscale <= 1.1 * floor
    assert b.attention == 0 and b.kv_read == 0 and b.moe == 0


def test_decode_attention_reads_each_sequences_kv_cache() -> None:
    step = StepModel(L70, H8, Deployment(replicas=1, tp=8), Engine.VLLM)
    ctx = 64 * 4096  # 64 sequences of 4096 tokens
    b = step.iteration(64, decodes=64, decode_context=ctx, prefill_pairs=0.0, prefill_context=0.0, sampled=64)
    kv_bytes = ctx * 80 * 8 * 128 * 2 * 2 / 8
    dev = H8.device
    assert b.kv_read == pytest.approx(step._kscale * kv_bytes / (dev.hbm_Bps * dev.hbm_efficiency), rel=1e-9)


def test_the_simulations_fast_step_is_the_breakdowns_total() -> None:
    rng = np.random.default_rng(0)
    for name, dep in (("llama3-70b", Deployment(replicas=1, tp=4, pp=2)),
                      ("mixtral-8x7b", Deployment(replicas=1, tp=2, attention_dp=4, ep=8)),
                      ("deepseek-v3", Deployment(replicas=1, tp=8))):
        step = StepModel(resolve_model(name), H8, dep, Engine.SGLANG)
        for _ in range(50):
            tokens, decodes = int(rng.integers(1, 8192)), int(rng.integers(0, 256))
            args = dict(tokens=tokens, decodes=decodes, decode_context=float(rng.uniform(0, 1e6)),
                        prefill_pairs=float(rng.uniform(0, 1e7)), prefill_context=float(rng.uniform(0, 1e5)),
                        sampled=int(rng.integers(0, 300)))
            assert step.step_seconds(**args) == pytest.approx(step.iteration(**args).total, rel=1e-12)


def test_the_engine_loop_keeps_requests_and_records_apart() -> None:
    """Issue 53: the loop carried 23 fields (clock, requests, front end, records); the
    requests and their front end are :class:`_Requests`, what is recorded :class:`_Tally`,
    and no one of them holds more than 13."""
    from autoplan.serving import simulate

    parts = (simulate._EngineLoop, simulate._Requests, simulate._Tally)
    assert all(len(cls.__slots__) <= 13 for cls in parts), {c.__name__: len(c.__slots__) for c in parts}
    assert {"requests", "tally"} <= set(simulate._EngineLoop.__slots__)


def test_an_iterations_counts_are_named_never_six_in_a_row() -> None:
    """Issue 53: six positional numbers were easily swapped (decodes for sampled, pairs
    for context); all but ``tokens`` are keyword-only."""
    step = StepModel(resolve_model("llama3-8b"), H8, Deployment(replicas=1, tp=1), Engine.VLLM)
    for method in (step.step_seconds, step.device_seconds, step.iteration):
        with pytest.raises(TypeError):
            method(8, 8, 800.0, 0.0, 0.0, 8)  # type: ignore[misc]
    assert step.step_seconds(8, decodes=8, decode_context=800.0, prefill_pairs=0.0, prefill_context=0.0,
                             sampled=8) > 0


def test_memory_leaves_the_kv_cache_what_vllm_budgets() -> None:
    step = StepModel(L70, H8, Deployment(replicas=1, tp=8), Engine.VLLM)
    mem = step.memory()
    # vLLM: gpu_memory_utilization 0.92 (vLLM 0.33) of the GPU holds weights, activations and the cache
    assert mem.peak == pytest.approx(0.92 * H8.device.mem_bytes)
    assert mem.weights == pytest.approx(L70.params_total * 2 / 8, rel=0.01)
    assert step.kv_tokens(mem) == int(mem.kv_cache // (80 * 2 * 128 * 2))
    # 70B in bf16 does not fit one 80 GiB GPU: no room for a cache
    one = StepModel(L70, with_gpus(resolve_cluster("dgx-h100"), 1), Deployment(replicas=1, tp=1),
                    Engine.VLLM)
    assert one.memory().kv_cache == 0


def test_lengths_are_drawn_with_their_mean() -> None:
    rng = np.random.default_rng(0)
    for spec in (Lengths(300.0, Dist.LOGNORMAL, sigma=0.8), Lengths(300.0, Dist.EXPONENTIAL),
                 Lengths(300.0, Dist.UNIFORM, low=100, high=500)):
        drawn = sample_lengths(spec, 20_000, rng)
        assert drawn.min() >= 1 and drawn.mean() == pytest.approx(300, rel=0.03), spec.dist
    assert set(sample_lengths(Lengths(7.0), 5, rng)) == {7}


def test_every_request_is_served_once_with_causal_times() -> None:
    plan = _plan(Arrival(ArrivalKind.RATE, rate_rps=4.0))
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine)
    sim = simulate(step, plan.workload, 1, step.kv_tokens(step.memory()), seed=3)
    assert len(sim.arrival) == 300
    assert np.all(sim.first_token > sim.arrival) and np.all(sim.finish >= sim.first_token)
    # a token per iteration at most: the last token comes at least (out - 1) steps later
    fastest = step.step_seconds(1, decodes=1, decode_context=0, prefill_pairs=0, prefill_context=0, sampled=1)
    assert np.all(sim.finish - sim.first_token >= 127 * fastest * 0.999)


def test_a_closed_loop_keeps_its_concurrency_and_obeys_littles_law() -> None:
    plan = _plan(Arrival(ArrivalKind.CONCURRENCY, concurrency=16), requests=400)
    pred = evaluate_serving(plan)
    assert pred.max_concurrency <= 16
    # Little's law: in flight = throughput x time in system
    in_flight = pred.requests_per_s * pred.e2e_ms.mean / 1e3
    assert in_flight == pytest.approx(16, rel=0.08)


def test_the_batch_limit_caps_concurrency_and_a_tight_cache_preempts() -> None:
    capped = evaluate_serving(_plan(Arrival(ArrivalKind.OFFLINE), max_num_seqs=8))
    assert capped.max_concurrency <= 8
    plan = _plan(Arrival(ArrivalKind.OFFLINE), inp=512, out=512, requests=64)
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine)
    sim = simulate(step, plan.workload, 1, kv_tokens=8 * 1024)  # room for ~8 sequences
    assert sim.preemptions > 0 and len(sim.finish) == 64
    assert sim.max_running <= 16


def test_tensorrt_llm_admits_only_what_it_can_finish_and_never_preempts() -> None:
    # GUARANTEED_NO_EVICT: a request waits until its prompt and whole output fit
    base = _plan(Arrival(ArrivalKind.OFFLINE), inp=512, out=512, requests=64)
    plan = ServingPlan(base.model, base.cluster, Engine.TRTLLM, base.deployment, base.workload, base.slo)
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine)
    sim = simulate(step, plan.workload, 1, kv_tokens=8 * 1024)
    assert sim.preemptions == 0 and len(sim.finish) == 64
    assert sim.max_running == 8  # 8 x (512 + 512) tokens fill the cache exactly


def test_the_simulation_is_deterministic() -> None:
    plan = _plan(Arrival(ArrivalKind.RATE, rate_rps=3.0))
    assert evaluate_serving(plan, seed=1) == evaluate_serving(plan, seed=1)


def test_an_overloaded_deployment_is_flagged_and_misses_its_slo() -> None:
    pred = evaluate_serving(_plan(Arrival(ArrivalKind.RATE, rate_rps=200.0), requests=1500))
    assert not pred.steady and not pred.meets_slo
    fine = evaluate_serving(_plan(Arrival(ArrivalKind.RATE, rate_rps=1.0)))
    assert fine.steady and fine.meets_slo
    # an open loop that keeps up serves what arrives
    assert fine.requests_per_s == pytest.approx(1.0, rel=0.15)


def test_the_front_is_non_dominated() -> None:
    w = Workload(Lengths(1024.0), Lengths(128.0), Arrival(ArrivalKind.RATE, rate_rps=4.0), 300)
    result = serve_search(L70, H8, Engine.VLLM, w, Slo(2000, 50))
    assert result.plans and result.plans[0].prediction.meets_slo
    assert all(r.plan.deployment.gpus == 8 for r in result.plans)
    front = pareto(result.plans)
    for a in front:
        for b in result.plans:
            assert not (b.per_gpu > a.per_gpu and b.user_tokens_per_s > a.user_tokens_per_s)
    doc = serving_document(result.plans[0].plan, result.plans[0].prediction)
    assert doc["kind"] == "serving" and doc["model"] == "llama3-70b"
    assert set(doc["prediction"]) >= {"ttft_ms", "tpot_ms", "e2e_ms", "goodput_rps", "meets_slo",  # type: ignore[operator]
                                      "memory_gib_per_gpu", "kv_cache_tokens", "max_concurrency"}


def test_serve_answers_the_issues_question(tmp_path) -> None:
    out = tmp_path / "serve.yaml"
    result = autoplan("serve", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8",
                      "--input-len", "2048", "--output-len", "256", "--rate", "6", "--ttft-slo", "2000",
                      "--tpot-slo", "50", "--format", "json", "--out", out)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    best = doc["plans"][0]
    assert best["prediction"]["meets_slo"] and best["deployment"]["tp"] * best["deployment"]["replicas"] \
        * best["deployment"]["pp"] == 8
    assert doc["pareto"] and out.read_text().startswith("autoplan: 1\nkind: serving\n")
    mem = best["prediction"]["memory_gib_per_gpu"]
    assert mem["peak"] <= 80 and math.isclose(mem["peak"], sum(v for k, v in mem.items() if k != "peak"))


def test_a_million_output_tokens_cost_gpu_hours_dollars_and_energy_by_hand() -> None:
    plan = _plan(Arrival(ArrivalKind.RATE, rate_rps=1.0))
    dev = H8.device
    assert dev.price_per_gpu_hour and dev.power_load_W and dev.power_idle_W is not None
    m = per_million(plan, 1000.0, 0.25)
    assert m is not None
    # 8 GPUs for 1000 s (a million tokens at 1000/s)
    assert m.gpu_hours == pytest.approx(8 * 1000 / 3600)
    assert m.cost_usd == pytest.approx(8 * 1000 / 3600 * dev.price_per_gpu_hour)
    power = 0.25 * dev.power_load_W + 0.75 * dev.power_idle_W
    assert m.mean_power_W == pytest.approx(power)
    assert m.energy_kwh == pytest.approx(8 * power * H8.pue * 1000 / 3.6e6)
    assert per_million(plan, 0.0, 1.0) is None


def test_an_idle_deployment_draws_idle_power_between_requests() -> None:
    # one request a second that takes well under a second: the GPUs wait most of the run
    sparse = evaluate_serving(_plan(Arrival(ArrivalKind.RATE, rate_rps=0.2), inp=128, out=16, requests=40))
    busy = evaluate_serving(_plan(Arrival(ArrivalKind.OFFLINE), inp=128, out=16, requests=200))
    assert sparse.per_million is not None and busy.per_million is not None
    assert sparse.per_million.busy_share < 0.5 < 0.95 < busy.per_million.busy_share <= 1.0
    assert sparse.per_million.mean_power_W < busy.per_million.mean_power_W


def test_serve_prices_a_million_tokens_at_the_given_price() -> None:
    result = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "2",
                      "--input-len", "512", "--output-len", "64", "--rate", "4", "--requests", "200",
                      "--price", "2", "--format", "json")
    assert result.returncode == 0, result.stderr
    for plan in json.loads(result.stdout)["plans"]:
        pm = plan["prediction"]["per_million_output_tokens"]
        gpus = plan["deployment"]["replicas"] * plan["deployment"]["tp"] * plan["deployment"]["pp"]
        assert pm["gpu_hours"] == pytest.approx(gpus * 1e6 / plan["prediction"]["output_tokens_per_s"] / 3600)
        assert pm["cost_usd"] == pytest.approx(2 * pm["gpu_hours"]) and pm["energy_kwh"] > 0


def test_serve_exits_1_with_the_closest_when_nothing_meets_the_slo() -> None:
    result = autoplan("serve", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8",
                      "--input-len", "2048", "--output-len", "256", "--rate", "6", "--tpot-slo", "1")
    assert result.returncode == 1
    assert "no deployment meets the SLO; the closest" in result.stderr and "TPOT p99" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--rate", "0"), "--rate: expected requests/s from 0.0001 to 1e+06"),
    (("--rate", "1", "--offline"), "give exactly one of --rate, --concurrency, --offline"),
    (("--rate", "1", "--input-len", "0"), "--input-len: expected 1 to"),
    (("--rate", "1", "--weights", "fp7"), "--weights: expected bf16"),
    (("--rate", "1", "--kv-cache", "int4"), "--kv-cache: expected bf16, fp16, fp8"),
    (("--rate", "1", "--requests", "100000000000"), "--requests: expected 1 to"),
    (("--rate", "1", "--ttft-slo", "-3"), "--ttft-slo: expected milliseconds from 0.001 to 1e+09, got -3"),
    (("--rate", "1", "--price", "nan"), "--price: expected USD per GPU-hour > 0"),
    (("--rate", "1", "--price", "0"), "--price: expected USD per GPU-hour > 0"),
])
def test_serve_refuses_bad_input_naming_the_flag(args: tuple[str, ...], message: str) -> None:
    base = ["serve", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8",
            "--input-len", "128", "--output-len", "16"]
    result = autoplan(*base, *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_model_too_big_for_the_gpus_exits_1_saying_so() -> None:
    result = autoplan("serve", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "2",
                      "--input-len", "128", "--output-len", "16", "--offline")
    assert result.returncode == 1 and "no deployment fits" in result.stderr


# --------------------------------------------------------------------------- plan files

SERVING_PLAN = """\
autoplan: 1
kind: serving
model: llama3-70b
cluster: {name: dgx-h100, nodes: 1}
engine: vllm
deployment: {replicas: 2, tp: 4, pp: 1, weights: bf16, kv_cache: fp8, max_num_seqs: 64}
workload:
  input_len: {mean: 1000, dist: lognormal, sigma: 0.6}
  output_len: 128
  arrival: {rate_rps: 3.0}
  requests: 300
slo: {ttft_ms: 2000, tpot_ms: 60, percentile: 90}
"""


def test_a_serving_plan_file_is_read_and_evaluated(tmp_path) -> None:
    from autoplan.descriptors.strict import parse_yaml
    from autoplan.serving.planfile import read_serving_plan

    plan = read_serving_plan(parse_yaml(SERVING_PLAN, "p.yaml"), "p.yaml")
    d, w = plan.deployment, plan.workload
    assert (d.replicas, d.tp, d.kv_cache, d.max_num_seqs) == (2, 4, Precision.FP8, 64)
    assert w.input_len == Lengths(1000.0, Dist.LOGNORMAL, 0.6) and w.arrival.rate_rps == 3.0
    assert plan.slo == Slo(2000.0, 60.0, 90.0)
    path = tmp_path / "p.yaml"
    path.write_text(SERVING_PLAN)
    result = autoplan("evaluate", path, "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["plans"][0]
    assert doc["kind"] == "serving" and doc["deployment"]["kv_cache"] == "fp8"
    assert doc["workload"]["input_len"] == {"mean": 1000.0, "dist": "lognormal", "sigma": 0.6}
    table = autoplan("evaluate", path)
    assert table.returncode == 0 and "where an iteration goes" in table.stdout and "TPOT" in table.stdout


def test_what_serve_writes_evaluate_reads_back(tmp_path) -> None:
    out = tmp_path / "best.yaml"
    result = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "2",
                      "--input-len", "512", "--output-len", "64", "--concurrency", "8", "--out", out)
    assert result.returncode == 0, result.stderr
    again = autoplan("evaluate", out, "--format", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["plans"][0]["deployment"]["replicas"] >= 1


@pytest.mark.parametrize(("edit", "message"), [
    (("tp: 4", "tp: 3"), "deployment.tp: must divide llama3-70b's 64 attention heads, got 3"),
    (("replicas: 2", "replicas: 3"), "deployment: replicas x tp x pp x attention_dp = 12 GPUs, but the "
                                     "cluster has 8"),
    (("kv_cache: fp8", "kv_cache: int4"), "deployment.kv_cache: expected one of bf16, fp16, fp8, got int4"),
    (("rate_rps: 3.0", "trace: t.csv"), "workload.arrival.trace: t.csv: file not found"),
    (("rate_rps: 3.0", "rate_rps: 3.0, trace: t.csv"),
     "workload.arrival: expected one of rate_rps, concurrency, trace"),
    (("dist: lognormal", "dist: zipf"), "workload.input_len.dist: expected one of"),
    (("engine: vllm", "engine: tgi"), "engine: expected one of vllm | sglang | trtllm"),
    (("requests: 300", "requests: 100000000"), "workload.requests: expected a value <= 1,000,000"),
    (("percentile: 90", "percentil: 90"), "slo.percentil: unknown field (did you mean 'percentile'?)"),
    (("max_num_seqs: 64", "max_num_seqs: 64, disaggregated: {}"), "deployment.tp: with disaggregated"),
    (("max_num_seqs: 64", "max_num_seqs: 64, max_batched_tokens: 32"),
     "deployment.max_batched_tokens: must be at least max_num_seqs (64), got 32"),
])
def test_bad_serving_plans_name_the_file_and_field(tmp_path, edit: tuple[str, str], message: str) -> None:
    path = tmp_path / "bad.yaml"
    assert edit[0] in SERVING_PLAN
    path.write_text(SERVING_PLAN.replace(*edit))
    result = autoplan("evaluate", path)
    assert result.returncode == 2 and f"{path}: {message}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_diff_compares_two_serving_plans_and_refuses_one_of_each(tmp_path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(SERVING_PLAN)
    b.write_text(SERVING_PLAN.replace("replicas: 2, tp: 4", "replicas: 1, tp: 8"))
    result = autoplan("diff", a, b, "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    changed = {c["field"]: (c["a"], c["b"]) for c in doc["changes"]}
    assert changed["deployment.replicas"] == (2, 1) and changed["deployment.tp"] == (4, 8)
    metrics = {d["metric"] for d in doc["deltas"]}
    assert {"ttft_ms.p99", "tpot_ms.mean", "output_tokens_per_s", "memory_gib_per_gpu.kv_cache"} <= metrics
    table = autoplan("diff", a, b)
    assert table.returncode == 0 and "what changed" in table.stdout and "deployment.tp" in table.stdout
    example = Path(__file__).resolve().parents[2] / "examples/plans/llama3-8b-32xh100-1f1b.yaml"
    mixed = autoplan("diff", a, example)
    assert mixed.returncode == 2 and "diff compares two of a kind" in mixed.stderr


def test_training_plans_may_say_kind_training(tmp_path) -> None:
    from autoplan.descriptors.strict import read_yaml
    from autoplan.plans.file import read_plan

    example = read_yaml(Path(__file__).resolve().parents[2] / "examples/plans/llama3-8b-32xh100-1f1b.yaml")
    plan = read_plan({**example, "kind": "training"}, "t.yaml")
    assert plan.layout.gpus == 32
    with pytest.raises(InputError, match="kind: expected training or serving, got 'inference'"):
        read_plan({**example, "kind": "inference"}, "t.yaml")


# --------------------------------------------------------------------------- exports

def _export_plan(tmp_path: Path, engine: str, deployment: str, model: str = "llama3-70b") -> Path:
    text = (SERVING_PLAN.replace("engine: vllm", f"engine: {engine}")
            .replace("model: llama3-70b", f"model: {model}")
            .replace(SERVING_PLAN.splitlines()[5], f"deployment: {deployment}"))
    path = tmp_path / f"{engine}.yaml"
    path.write_text(text)
    return path


def _bash_syntax_ok(script: str, tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "s.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize(("engine", "flags"), [
    ("vllm", ["vllm serve \"$MODEL\"", "--tensor-parallel-size 4", "--pipeline-parallel-size 1",
              "--max-num-seqs 64", "--max-num-batched-tokens 8192", "--enable-chunked-prefill",
              "--gpu-memory-utilization 0.92", "--kv-cache-dtype fp8"]),
    ("sglang", ["python -m sglang.launch_server --model-path \"$MODEL\"", "--tp-size 4", "--pp-size 1",
                "--max-running-requests 64", "--chunked-prefill-size 8192", "--mem-fraction-static 0.88",
                "--kv-cache-dtype fp8_e4m3"]),
    ("trtllm", ["trtllm-serve \"$MODEL\"", "--backend pytorch", "--tp_size 4", "--pp_size 1",
                "--max_batch_size 64", "--max_num_tokens 8192", "--kv_cache_free_gpu_memory_fraction 0.9",
                "--extra_llm_api_options"]),
])
def test_each_engine_gets_the_flags_the_prediction_used(tmp_path, engine: str, flags: list[str]) -> None:
    from autoplan.descriptors.strict import read_yaml
    from autoplan.export.serving import export_serving
    from autoplan.serving.planfile import read_serving_plan

    dep = "{replicas: 2, tp: 4, weights: bf16, kv_cache: fp8, max_num_seqs: 64}"
    path = _export_plan(tmp_path, engine, dep)
    written = export_serving(read_serving_plan(read_yaml(path), str(path)), Engine(engine), str(path))
    script = written[f"serve-{engine}.sh"]
    for flag in flags:
        assert flag in script, flag
    assert 'REPLICA="${REPLICA:-0}"' in script and "REPLICA must be 0..1" in script
    assert 'PORT=$(( 8000 + REPLICA ))' in script and "FIRST=$(( (REPLICA * 4) % PER_NODE ))" in script
    _bash_syntax_ok(script, tmp_path)
    if engine == "trtllm":
        import yaml

        extra = yaml.safe_load(written["extra-llm-api-options.yaml"])
        assert extra == {"enable_chunked_prefill": True, "kv_cache_config": {"dtype": "fp8"}}


def test_moe_attention_data_parallel_and_expert_parallel_flags(tmp_path) -> None:
    from autoplan.descriptors.strict import read_yaml
    from autoplan.export.serving import export_serving
    from autoplan.serving.planfile import read_serving_plan

    for engine, expect in (("vllm", ["--tensor-parallel-size 1", "--data-parallel-size 8",
                                     "--enable-expert-parallel"]),
                           ("sglang", ["--tp-size 8", "--attn-dp-size 8", "--ep-size 8"]),
                           ("trtllm", ["--tp_size 8", "--ep_size 8"])):
        path = _export_plan(tmp_path, engine, "{replicas: 1, tp: 1, attention_dp: 8, ep: 8}", "mixtral-8x7b")
        plan = read_serving_plan(read_yaml(path), str(path))
        written = export_serving(plan, Engine(engine), str(path))
        script = written[f"serve-{engine}.sh"]
        for flag in expect:
            assert flag in script, (engine, flag)
        if engine == "trtllm":
            assert "enable_attention_dp: true" in written["extra-llm-api-options.yaml"]


def test_exports_refuse_what_the_engine_cannot_run_naming_the_field(tmp_path) -> None:
    path = _export_plan(tmp_path, "vllm", "{replicas: 2, tp: 4}")
    wrong = autoplan("export", path, "--to", "sglang")
    assert wrong.returncode == 2 and "engine: --to sglang: the plan was predicted for vllm" in wrong.stderr
    training = autoplan("export", path, "--to", "megatron")
    assert training.returncode == 2
    assert "a serving plan exports to dynamo, k8s, llm-d, sglang, trtllm, vllm" in training.stderr
    # a replica across nodes: whole nodes for vLLM and SGLang, none for TensorRT-LLM
    spans = _export_plan(tmp_path, "trtllm", "{replicas: 1, tp: 8, pp: 2}").read_text().replace(
        "nodes: 1", "nodes: 2")
    (tmp_path / "spans.yaml").write_text(spans)
    multi = autoplan("export", tmp_path / "spans.yaml", "--to", "trtllm")
    assert multi.returncode == 2
    assert "deployment: --to trtllm: a replica of 16 GPUs spans nodes of 8: TensorRT-LLM's" in multi.stderr
    part = _export_plan(tmp_path, "vllm", "{replicas: 2, tp: 4, pp: 3}").read_text().replace(
        "nodes: 1", "nodes: 3")
    (tmp_path / "part.yaml").write_text(part)
    partial = autoplan("export", tmp_path / "part.yaml", "--to", "vllm")
    assert partial.returncode == 2 and "spans nodes of 8 without filling them" in partial.stderr
    trt = _export_plan(tmp_path, "trtllm", "{replicas: 1, tp: 2, attention_dp: 4, ep: 8}", "mixtral-8x7b")
    refused = autoplan("export", trt, "--to", "trtllm")
    assert refused.returncode == 2 and "deployment.attention_dp: --to trtllm" in refused.stderr
    example = Path(__file__).resolve().parents[2] / "examples/plans/llama3-8b-32xh100-1f1b.yaml"
    vllm_for_training = autoplan("export", example, "--to", "vllm")
    assert vllm_for_training.returncode == 2
    assert "vllm serves models: give a serving plan" in vllm_for_training.stderr


def test_an_export_is_written_where_out_says(tmp_path) -> None:
    path = _export_plan(tmp_path, "trtllm", "{replicas: 2, tp: 4}")
    out = tmp_path / "launch"
    out.mkdir()
    result = autoplan("export", path, "--to", "trtllm", "--out", out)
    assert result.returncode == 0, result.stderr
    assert (out / "serve-trtllm.sh").stat().st_mode & 0o100
    assert (out / "extra-llm-api-options.yaml").read_text().startswith("# LLM API options")


def test_serve_reads_a_job_file_and_flags_override_it(tmp_path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: {name: dgx-h100, nodes: 1}\ngpus: 2\nengine: sglang\n"
                   "workload:\n  input_len: {mean: 600, dist: lognormal, sigma: 0.7}\n  output_len: 100\n"
                   "  arrival: {rate_rps: 2}\n  requests: 200\nslo: {ttft_ms: 3000, tpot_ms: 80}\n")
    result = autoplan("serve", job, "--format", "json", "--top", "1")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["plans"][0]
    assert best["engine"] == "sglang" and best["workload"]["input_len"]["dist"] == "lognormal"
    assert best["workload"]["requests"] == 200 and best["slo"]["tpot_ms"] == 80
    over = autoplan("serve", job, "--engine", "vllm", "--format", "json", "--top", "1")
    assert over.returncode == 0 and f"--engine overrides {job}" in over.stderr
    assert json.loads(over.stdout)["plans"][0]["engine"] == "vllm"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ndeployment: {tp: 1}\n")
    bad = autoplan("serve", job)
    assert bad.returncode == 2 and f"{job}: deployment: a job file leaves the deployment" in bad.stderr
    job.write_text("model: llama3-8b\ncluster: dgx-h100\n")
    missing = autoplan("serve", job)
    assert missing.returncode == 2 and f"--input-len: missing required option (or in {job})" in missing.stderr


def test_explain_shows_where_a_serving_plans_iterations_go(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SERVING_PLAN)
    result = autoplan("explain", path)
    assert result.returncode == 0, result.stderr
    assert "where an iteration goes" in result.stdout and "kv_read" in result.stdout
    assert "the batch over the run" in result.stdout
    refused = autoplan("explain", path, "--timeline", tmp_path / "t.svg")
    assert refused.returncode == 2 and "--timeline: draws a training pipeline's schedule" in refused.stderr


def test_check_gates_a_serving_plan_on_memory_slo_and_regression(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SERVING_PLAN)
    result = autoplan("check", path, "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert [r["rule"] for r in doc["rules"]] == ["valid", "fits-memory", "meets-slo"]
    assert doc["kind"] == "serving" and "ttft_ms" in doc["serving_prediction"]
    tight = tmp_path / "tight.yaml"
    tight.write_text(SERVING_PLAN.replace("tpot_ms: 60", "tpot_ms: 1"))
    failed = autoplan("check", tight)
    assert failed.returncode == 1 and "FAIL  meets-slo" in failed.stdout and "(SLO 1)" in failed.stdout
    # regression against the deployments serve finds for the same workload: a 1-replica
    # plan capped at 16 sequences is far behind
    slow = tmp_path / "slow.yaml"
    no_slo = SERVING_PLAN.replace("slo: {ttft_ms: 2000, tpot_ms: 60, percentile: 90}\n", "")
    slow.write_text(no_slo.replace("max_num_seqs: 64", "max_num_seqs: 16").replace(
        "rate_rps: 3.0", "concurrency: 64"))
    reg = autoplan("check", slow, "--max-regression", "0.05", "--format", "junit")
    assert reg.returncode == 1 and '<failure message="output tokens/s per GPU' in reg.stdout
    spaced = autoplan("check", path, "--space", "megatron")
    assert spaced.returncode == 2 and "--space: searches training plans" in spaced.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(SERVING_PLAN.replace("tp: 4", "tp: 3"))
    bad = autoplan("check", broken, "--format", "json", "--max-regression", "0.1")
    assert bad.returncode == 2
    rules = {r["rule"]: r["status"] for r in json.loads(bad.stdout)["rules"]}
    assert rules == {"valid": "error", "fits-memory": "skipped", "meets-slo": "skipped",
                     "regression": "skipped"}


@pytest.mark.parametrize(("args", "code", "message"), [
    (("--input-len", "128", "--output-len", "16777216", "--rate", "1"), 2,
     "--output-len: expected 1 to 131,072, got 16,777,216"),
    (("--input-len", "16777216", "--output-len", "16", "--rate", "1"), 2,
     "--output-len: input + output length 16,777,232 tokens exceeds llama3-8b's max_seq_len 8,192"),
    (("--input-len", "128", "--output-len", "16", "--concurrency", "1000000"), 0, ""),
])
def test_absurd_workloads_end_quickly_with_a_reason(args: tuple[str, ...], code: int, message: str) -> None:
    result = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", *args,
                      "--top", "1")
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_long_outputs_simulate_fewer_requests_within_the_token_budget() -> None:
    from autoplan.serving.simulate import ITERATION_BUDGET, MAX_SIMULATED_TOKENS, simulated_per_scheduler

    # 100 clients: the iteration budget would allow 1,250 requests of 8,000 tokens, the
    # token budget 1,000 (fewer than MAX_SIMULATED_REQUESTS)
    plan = _plan(Arrival(ArrivalKind.CONCURRENCY, concurrency=100), inp=64, out=8000, requests=2000)
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine)
    budget = simulated_per_scheduler(step, plan.workload, 1)
    assert budget == MAX_SIMULATED_TOKENS // 8000 == 1000 < ITERATION_BUDGET * 100 // 8000
    sim = simulate(step, plan.workload, 1, step.kv_tokens(step.memory()))
    # 1,000 requests within the budget: the closed loop's burst of 100, 800 of its steady
    # state and a cool-down of 100; measured, the 800 and 42 of the burst (100 in 2,000:
    # ClosedLoop)
    assert len(sim.finish) == budget - 2 * 100 + round(100 * 800 / 1900) == 842


def test_a_few_clients_with_long_outputs_simulate_within_the_iteration_budget() -> None:
    """4 clients of 50,000-token outputs run at most 4 sequences at once, however large the
    batch limit: 8 requests fill the iteration budget (160 within the token budget took 2
    million iterations, the hard stop); the clients' share of a scheduler counts, and so
    does a batch limit below it."""
    from autoplan.serving.simulate import ITERATION_BUDGET, simulated_per_scheduler

    def closed(concurrency: int, **dep: object) -> ServingPlan:
        return _plan(Arrival(ArrivalKind.CONCURRENCY, concurrency=concurrency), inp=64, out=50_000,
                     requests=1000, **dep)

    plan = closed(4)
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine)
    assert step.max_num_seqs >= 1024
    assert simulated_per_scheduler(step, plan.workload, 1) == ITERATION_BUDGET * 4 // 50_000 == 8
    assert simulated_per_scheduler(step, closed(8).workload, 2) == 8  # 4 clients a scheduler
    small = closed(4, max_num_seqs=2)
    small_step = StepModel(small.model, small.cluster, small.deployment, small.engine)
    assert simulated_per_scheduler(small_step, small.workload, 1) == 4  # 2 sequences at once
    sim = simulate(step, plan.workload, 1, step.kv_tokens(step.memory()))
    # the burst, the steady requests and the cool-down: three outputs one after another
    assert len(sim.finish) >= 1 and sim.iterations <= 2 * ITERATION_BUDGET


@pytest.mark.parametrize("case", ["rate", "concurrency", "offline-tight-cache", "trtllm-lognormal"])
def test_stepping_over_decode_runs_changes_nothing(case: str) -> None:
    engine = Engine.TRTLLM if case.startswith("trtllm") else Engine.VLLM
    arrival = {"rate": Arrival(ArrivalKind.RATE, rate_rps=3.0),
               "concurrency": Arrival(ArrivalKind.CONCURRENCY, concurrency=12)}.get(
        case, Arrival(ArrivalKind.OFFLINE))
    inp = Lengths(400.0, Dist.LOGNORMAL, sigma=0.8) if case.endswith("lognormal") else Lengths(400.0)
    w = Workload(inp, Lengths(300.0, Dist.EXPONENTIAL), arrival, 150)
    step = StepModel(L70, H8, Deployment(replicas=1, tp=8, max_num_seqs=32), engine)
    kv = 12_000 if case.startswith("offline") else step.kv_tokens(step.memory())
    fast, slow = (simulate(step, w, 1, kv, seed=2, step_over_decodes=flag) for flag in (True, False))
    assert np.allclose(fast.arrival, slow.arrival, rtol=1e-9)  # closed loop: arrivals are finishes
    assert np.allclose(fast.first_token, slow.first_token, rtol=1e-9)
    assert np.allclose(fast.finish, slow.finish, rtol=1e-9)
    assert (fast.preemptions, fast.max_running) == (slow.preemptions, slow.max_running)
    assert fast.iterations == slow.iterations


# --------------------------------------------------------------------------- the engines' own parsers
# vLLM and SGLang pin their own torch, so they cannot share autoplan's environment: the
# checks run where AUTOPLAN_VLLM_PYTHON / AUTOPLAN_SGLANG_PYTHON name a Python with the
# engine installed (tests/engines/*.py parse there), e.g.
# `python3 -m venv /opt/vllm && /opt/vllm/bin/pip install vllm==0.33.0`.
ENGINE_PYTHON = {"vllm": os.environ.get("AUTOPLAN_VLLM_PYTHON"),
                 "sglang": os.environ.get("AUTOPLAN_SGLANG_PYTHON")}
ENGINE_HELPER = {"vllm": "vllm_serve_args.py", "sglang": "sglang_server_args.py"}
ENGINE_EXPORTS = (  # (model, nodes, deployment): every flag the exports write, between them
    ("llama3-70b", 1, "{replicas: 2, tp: 4, kv_cache: fp8, max_num_seqs: 64}"),
    ("llama3-70b", 1, "{replicas: 1, tp: 4, pp: 2, weights: fp8, chunked_prefill: false}"),
    ("mixtral-8x7b", 1, "{replicas: 1, tp: 1, attention_dp: 8, ep: 8}"),
    ("llama3-405b", 4, "{replicas: 2, tp: 8, pp: 2}"),  # each replica on two nodes
)
LAUNCH = {"vllm": ["vllm", "serve"], "sglang": ["python", "-m", "sglang.launch_server"]}


def _run_script(script: str, engine: str, tmp_path: Path, **env: str) -> list[str]:
    """What the script hands its engine (``tests.helpers.run_launch_script``)."""
    return run_launch_script(script, tmp_path, LAUNCH[engine], **env)


def _engine_exports(tmp_path: Path, engine: str) -> list[tuple[ServingPlan, list[str]]]:
    """Each export's command line on each node of its last replica (MODEL=m)."""
    from autoplan.descriptors.strict import read_yaml
    from autoplan.export.serving import export_serving, nodes_per_replica
    from autoplan.serving.planfile import read_serving_plan

    out = []
    for i, (model, nodes, dep) in enumerate(ENGINE_EXPORTS):
        sub = tmp_path / f"{engine}{i}"
        sub.mkdir()
        path = _export_plan(sub, engine, dep, model)
        path.write_text(path.read_text().replace("nodes: 1}", f"nodes: {nodes}}}"))
        plan = read_serving_plan(read_yaml(path), str(path))
        script = export_serving(plan, Engine(engine), str(path))[f"serve-{engine}.sh"]
        for node in range(nodes_per_replica(plan)):
            env = {"REPLICA": str(plan.deployment.replicas - 1)}  # the last replica
            if nodes_per_replica(plan) > 1:
                env.update(NODE=str(node), MASTER_ADDR="10.0.0.1")
            out.append((plan, _run_script(script, engine, sub, **env)))
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_engine_export_is_one_server_command_line(tmp_path, engine: str) -> None:
    flag = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size"}[engine]
    for plan, argv in _engine_exports(tmp_path, engine):
        flags = [a for a in argv if a.startswith("--")]
        assert len(flags) == len(set(flags)), argv  # each flag once
        d = plan.deployment
        assert argv[argv.index(flag) + 1] == str(d.tp if engine == "vllm" else d.tp * d.attention_dp)


def _parsed_by_the_engine(tmp_path: Path, engine: str) -> list[tuple[ServingPlan, list[str], dict]]:
    import subprocess

    python = ENGINE_PYTHON[engine]
    if not python:
        pytest.skip(f"AUTOPLAN_{engine.upper()}_PYTHON (a Python with {engine}) not set")
    exports = _engine_exports(tmp_path, engine)
    helper = Path(__file__).resolve().parents[1] / "engines" / ENGINE_HELPER[engine]
    done = subprocess.run([python, str(helper)], input=json.dumps([argv for _, argv in exports]),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})  # no GPU needed to parse
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout)
    for (_, argv), values in zip(exports, parsed, strict=True):
        assert "error" not in values, (argv, values, done.stderr[-2000:])
    return [(plan, argv, values) for (plan, argv), values in zip(exports, parsed, strict=True)]


def test_vllms_own_parser_reads_every_export_as_the_prediction_ran(tmp_path) -> None:
    from autoplan.serving.cost import StepModel

    for plan, argv, parsed in _parsed_by_the_engine(tmp_path, "vllm"):
        d = plan.deployment
        step = StepModel(plan.model, plan.cluster, d, plan.engine)
        assert (parsed["tensor_parallel_size"], parsed["pipeline_parallel_size"],
                parsed["data_parallel_size"]) == (d.tp, d.pp, d.attention_dp)
        assert parsed["enable_expert_parallel"] is (d.ep > 1)
        assert (parsed["max_num_seqs"], parsed["max_num_batched_tokens"], parsed["enable_chunked_prefill"]) \
            == (step.max_num_seqs, step.max_batched_tokens, step.chunked_prefill)
        assert parsed["gpu_memory_utilization"] == step.defaults.memory_fraction
        assert parsed["kv_cache_dtype"] == ("fp8" if d.kv_cache is Precision.FP8 else "auto")
        assert parsed["quantization"] == ("fp8" if d.weights is Precision.FP8 else None)
        assert parsed["max_model_len"] == int(argv[argv.index("--max-model-len") + 1])
        _assert_nodes(plan, parsed, argv)
        if parsed["nnodes"] > 1:  # the multiprocessing backend's rendezvous; no API past node 0
            assert (parsed["master_addr"], parsed["master_port"]) == ("10.0.0.1", 29501)
            assert parsed["headless"] is (parsed["node_rank"] > 0)


def test_sglangs_own_parser_reads_every_export_as_the_prediction_ran(tmp_path) -> None:
    from autoplan.serving.cost import StepModel

    for plan, argv, parsed in _parsed_by_the_engine(tmp_path, "sglang"):
        d = plan.deployment
        step = StepModel(plan.model, plan.cluster, d, plan.engine)
        # one replica: tp x attention-DP GPUs, the attention-DP ranks splitting the TP group
        assert (parsed["tp_size"], parsed["pp_size"], parsed["attn_dp_size"], parsed["dp_size"]) \
            == (d.tp * d.attention_dp, d.pp, d.attention_dp, 1)
        assert parsed["ep_size"] == d.ep
        assert parsed["max_running_requests"] == step.max_num_seqs
        assert parsed["chunked_prefill_size"] == (step.max_batched_tokens if step.chunked_prefill else -1)
        assert parsed["mem_fraction_static"] == step.defaults.memory_fraction
        assert parsed["kv_cache_dtype"] == ("fp8_e4m3" if d.kv_cache is Precision.FP8 else "auto")
        assert parsed["quantization"] == ("fp8" if d.weights is Precision.FP8 else None)
        assert parsed["context_length"] == int(argv[argv.index("--context-length") + 1])
        _assert_nodes(plan, parsed, argv)
        if parsed["nnodes"] > 1:
            assert parsed["dist_init_addr"] == "10.0.0.1:29501"


def _assert_nodes(plan: ServingPlan, parsed: dict, argv: list[str]) -> None:
    """A replica on several nodes: each node's launch names the node count and its rank."""
    from autoplan.export.serving import nodes_per_replica

    nodes = nodes_per_replica(plan)
    assert parsed["nnodes"] == nodes and 0 <= parsed["node_rank"] < nodes, argv
    assert (nodes > 1) == ("--nnodes" in argv)


# --------------------------------------------------------------------------- arrival traces

def _trace_file(path: Path, rows: list[tuple[object, ...]],
                header: str = "request_id,arrival_s,input_len,output_len") -> Path:
    path.write_text("\ufeff" + header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def test_a_trace_is_read_sorted_from_its_first_arrival_other_columns_ignored(tmp_path) -> None:
    from autoplan.serving.planfile import read_trace

    path = _trace_file(tmp_path / "t.csv", [("b", 1700000002.5, 300, 20), ("a", 1700000001.0, 100, 10),
                                            ("c", 1700000001.0, 200, 30)])
    trace = read_trace("t.csv", str(tmp_path / "plan.yaml"), "workload.arrival.trace")  # beside the plan
    assert trace.arrival_s == (0.0, 0.0, 1.5) and trace.input_len == (100, 200, 300)
    assert trace.output_len == (10, 30, 20) and trace.path == str(path)
    w = Workload.of_trace(trace, 2)
    assert (w.requests, w.input_len.mean, w.input_len.ceiling, w.output_len.ceiling) == (2, 150, 200, 30)


@pytest.mark.parametrize(("text", "message"), [
    ("arrival_s,input_len\n1,2\n",
     "header: expected columns arrival_s, input_len, output_len; missing output_len"),
    ("arrival_s,input_len,output_len\n", ": no requests"),
    ("arrival_s,input_len,output_len\nx,2,3\n", "row 2, arrival_s: expected a number, got 'x'"),
    ("arrival_s,input_len,output_len\n1,0,3\n", "row 2, input_len: expected whole tokens from 1 to"),
    ("arrival_s,input_len,output_len\n1,2,2.5\n", "row 2, output_len: expected whole tokens from 1 to"),
    ("arrival_s,input_len,output_len\ninf,2,3\n", "row 2, arrival_s: expected a finite number"),
    ("arrival_s,input_len,output_len\n1,2\n", "row 2, output_len: expected a number, got ''"),
])
def test_a_bad_trace_is_refused_naming_file_row_and_column(tmp_path, text: str, message: str) -> None:
    from autoplan.serving.planfile import read_trace

    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(InputError) as err:
        read_trace(str(tmp_path / "t.csv"), "--trace", "")
    assert f"{tmp_path / 't.csv'}{message}" in str(err.value) or message in str(err.value)
    assert str(tmp_path / "t.csv") in str(err.value)


def test_hostile_traces_end_at_once(tmp_path, monkeypatch) -> None:
    import autoplan.serving.planfile as pf

    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)  # opening it would block until a writer came
    for ref, message in ((str(fifo), "not a regular file"), ("/dev/zero", "not a regular file"),
                         (str(tmp_path / "none.csv"), "file not found"), ("", "expected the path")):
        with pytest.raises(InputError, match=message):
            pf.read_trace(ref, "--trace", "")
    huge = tmp_path / "huge.csv"  # one field past csv's own limit
    huge.write_text("arrival_s,input_len,output_len\n" + "x" * 200_000 + ",1,1\n")
    with pytest.raises(InputError, match="row 2: not CSV: field larger than field limit"):
        pf.read_trace(str(huge), "--trace", "")
    monkeypatch.setattr(pf, "MAX_TRACE_BYTES", 64)
    big = _trace_file(tmp_path / "big.csv", [(i, i, 1, 1) for i in range(20)])
    with pytest.raises(InputError, match="larger than"):
        pf.read_trace(str(big), "--trace", "")
    monkeypatch.setattr(pf, "MAX_TRACE_BYTES", 1 << 20)
    monkeypatch.setattr(pf, "MAX_REQUESTS", 5)
    with pytest.raises(InputError, match="row 7: more than 5 requests"):
        pf.read_trace(str(big), "--trace", "")
    # many bad rows: the first few are reported, then reading stops
    bad = _trace_file(tmp_path / "bad.csv", [("r", "x", 1, 1)] * 1000)
    with pytest.raises(InputError) as err:
        pf.read_trace(str(bad), "--trace", "")
    assert len(err.value.problems) == pf.MAX_TRACE_PROBLEMS


def test_a_trace_arriving_at_once_runs_as_the_offline_workload(tmp_path) -> None:
    from autoplan.serving.planfile import read_trace

    rows = [(f"r{i}", 0.0, 512, 64) for i in range(96)]
    trace = read_trace(str(_trace_file(tmp_path / "t.csv", rows)), "--trace", "")
    for replicas, tp in ((1, 8), (4, 2)):
        traced = evaluate_serving(dataclasses.replace(
            _plan(Arrival(ArrivalKind.OFFLINE), tp=tp, replicas=replicas), workload=Workload.of_trace(trace)))
        offline = evaluate_serving(_plan(Arrival(ArrivalKind.OFFLINE), tp=tp, replicas=replicas, inp=512,
                                         out=64, requests=96))
        assert traced.simulated_requests == offline.simulated_requests == 96 // replicas
        assert traced.ttft_ms == offline.ttft_ms and traced.tpot_ms == offline.tpot_ms
        assert traced.output_tokens_per_s == pytest.approx(offline.output_tokens_per_s)


def test_a_trace_plan_reads_back_from_anywhere_and_refuses_lengths_beside_it(tmp_path, monkeypatch) -> None:
    from autoplan.descriptors.strict import read_yaml
    from autoplan.serving.planfile import read_serving_plan

    (tmp_path / "plans").mkdir()
    _trace_file(tmp_path / "plans" / "t.csv", [(f"r{i}", i * 0.5, 256, 32) for i in range(40)])
    out = tmp_path / "plans" / "best.yaml"
    result = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "2", "--trace",
                      "t.csv", "--requests", "30", "--format", "json", "--out", out, cwd=tmp_path / "plans")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["plans"][0]["workload"] == {"arrival": {"trace": str(tmp_path / "plans" / "t.csv")},
                                           "requests": 30}
    assert "arrival: {trace: t.csv}" in out.read_text()  # relative to the plan file
    monkeypatch.chdir(tmp_path)  # read from elsewhere: the trace is found beside the plan
    plan = read_serving_plan(read_yaml(out), str(out))
    assert plan.workload.requests == 30 and plan.workload.arrival.trace is not None
    assert autoplan("evaluate", out, cwd=tmp_path).returncode == 0
    text = out.read_text().replace("  requests: 30", "  requests: 30\n  input_len: 100")
    out.write_text(text)
    result = autoplan("evaluate", out)
    assert result.returncode == 2 and "workload.input_len: the arrival trace gives" in result.stderr


# --------------------------------------------------------------------------- P/D disaggregation

def _split(prefill: tuple[int, int], decode: tuple[int, int]) -> Deployment:
    from autoplan.serving.deployment import Disaggregated, Pool

    return Deployment(replicas=decode[0], tp=decode[1],
                      disaggregated=Disaggregated(Pool(*prefill), Pool(*decode)))


def test_a_prefilled_request_decodes_without_computing_its_prompt() -> None:
    from autoplan.serving.simulate import run_requests

    step = StepModel(L70, H8, Deployment(replicas=1, tp=8), Engine.VLLM)
    one = (np.zeros(1), np.array([4096]), np.array([65]))
    cold = run_requests(step, *one, 100_000)
    warm = run_requests(step, *one, 100_000, prefilled=True)
    decode = step.step_seconds(1, decodes=1, decode_context=4096.0, prefill_pairs=0.0, prefill_context=0.0,
                               sampled=1)  # one sequence's decode iteration
    # 65 tokens: the cold run's first comes with its prefill, the warm run decodes all 65
    assert warm.finish[0] == pytest.approx(65 * decode, rel=0.02)
    assert cold.finish[0] - cold.first_token[0] == pytest.approx(64 * decode, rel=0.02)
    assert cold.first_token[0] > 5 * decode  # a 4096-token prefill is no decode step


def test_the_kv_hand_off_moves_every_layers_cache_over_the_pools_link() -> None:
    from autoplan.serving.cost import kv_transfer

    d = _split((1, 4), (1, 4))
    latency, per_token = kv_transfer(L70, H8, d)
    link = H8.intra_node  # both pools on one NVLink domain
    # llama3-70b: 80 layers x K and V x 8 KV heads x 128 channels x 2 bytes
    assert per_token == pytest.approx(80 * 2 * 8 * 128 * 2 / (4 * link.effective_Bps))
    assert latency == link.latency_s
    two_nodes = with_gpus(resolve_cluster("dgx-h100"), 16)
    wide = _split((1, 8), (1, 8))
    assert kv_transfer(L70, two_nodes, wide)[1] == pytest.approx(
        80 * 2 * 8 * 128 * 2 / (8 * two_nodes.inter_node.effective_Bps))


def test_disaggregation_keeps_prefills_out_of_the_decode_iterations() -> None:
    w = Workload(Lengths(4096.0), Lengths(256.0), Arrival(ArrivalKind.RATE, rate_rps=3.0), 400)
    mixed = evaluate_serving(ServingPlan(L70, H8, Engine.VLLM, Deployment(replicas=2, tp=4), w, Slo()))
    split = evaluate_serving(ServingPlan(L70, H8, Engine.VLLM, _split((1, 4), (1, 4)), w, Slo()))
    assert split.fits and split.prefill_pool is not None and split.simulated_requests > 300
    assert split.tpot_ms.p50 < 0.9 * mixed.tpot_ms.p50  # no prompt chunk shares a decode step
    assert split.ttft_ms.p50 > mixed.ttft_ms.p50  # one prefill instance instead of two
    assert split.steady and split.output_tokens_per_s == pytest.approx(mixed.output_tokens_per_s, rel=0.05)


def test_one_token_requests_finish_in_the_prefill_pool() -> None:
    w = Workload(Lengths(512.0), Lengths(1.0), Arrival(ArrivalKind.OFFLINE), 64)
    pred = evaluate_serving(ServingPlan(L70, H8, Engine.VLLM, _split((1, 4), (1, 4)), w, Slo()))
    assert pred.simulated_requests == 64 and pred.e2e_ms.mean == pytest.approx(pred.ttft_ms.mean)


def test_a_disaggregated_plan_is_read_written_and_refused_where_it_cannot_run(tmp_path) -> None:
    dep = "{disaggregated: {prefill: {replicas: 2, tp: 2}, decode: {replicas: 1, tp: 4}}}"
    path = _export_plan(tmp_path, "vllm", dep)
    good = path.read_text()
    result = autoplan("evaluate", path, "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["plans"][0]
    assert doc["deployment"]["disaggregated"] == {"prefill": {"replicas": 2, "tp": 2},
                                                  "decode": {"replicas": 1, "tp": 4}}
    assert "kv_transfer_ms_mean" in doc["prediction"]["prefill_pool"]
    text = autoplan("evaluate", path)
    assert "disaggregated: prefill pool 2x tp2" in text.stdout.replace("\n", " ")
    export = autoplan("export", path, "--to", "vllm")  # a script per pool and a router
    assert export.returncode == 0, export.stderr
    assert "exec vllm-router" in export.stdout and "--vllm-pd-disaggregation" in export.stdout
    trt = _export_plan(tmp_path, "trtllm", dep)
    refused = autoplan("export", trt, "--to", "trtllm")
    assert refused.returncode == 2 and "deployment.disaggregated: --to trtllm" in refused.stderr
    for bad, message in (
            ("{tp: 4, disaggregated: {prefill: {tp: 4}, decode: {tp: 4}}}",
             "deployment.tp: with disaggregated, each pool gives its own"),
            ("{disaggregated: {prefill: {tp: 3}, decode: {tp: 4}, }}", "must divide llama3-70b's 64"),
            ("{disaggregated: {prefill: {tp: 4}}}", "deployment.disaggregated.decode: missing"),
    ):
        wrong = _export_plan(tmp_path, "vllm", bad)
        refused = autoplan("evaluate", wrong)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    closed = good.replace("arrival: {rate_rps: 3.0}", "arrival: {concurrency: 8}")
    (tmp_path / "closed.yaml").write_text(closed)
    loop = autoplan("evaluate", tmp_path / "closed.yaml", "--format", "json")  # a closed loop runs too
    assert loop.returncode == 0, loop.stderr
    assert json.loads(loop.stdout)["plans"][0]["prediction"]["prefill_pool"]["kv_transfer_ms_mean"] > 0


def test_serve_tries_disaggregated_deployments_when_asked(tmp_path) -> None:
    out = tmp_path / "best.yaml"
    base = ("serve", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "8", "--input-len", "2048",
            "--output-len", "256", "--rate", "6", "--ttft-slo", "2000", "--tpot-slo", "30")
    plain = json.loads(autoplan(*base, "--format", "json").stdout)["plans"]
    result = autoplan(*base, "--disaggregated", "--format", "json", "--out", out)
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert not any("disaggregated" in p["deployment"] for p in plain)
    assert "disaggregated" in plans[0]["deployment"] and plans[0]["prediction"]["meets_slo"]
    assert autoplan("evaluate", out).returncode == 0
    loop = autoplan(*base[:-6], "--concurrency", "8", "--disaggregated", "--format", "json")
    assert loop.returncode == 0, loop.stderr  # a closed loop over the splits too
    assert any("disaggregated" in p["deployment"] for p in json.loads(loop.stdout)["plans"])


def test_the_disaggregated_splits_cover_small_clusters_and_stay_bounded_on_large_ones() -> None:
    from autoplan.serving.search import SPLIT_STEPS, disaggregated_deployments

    l8 = resolve_model("llama3-8b")
    for gpus in (8, 64, 1024):
        c = with_gpus(resolve_cluster("dgx-h100"), gpus)
        splits = list(disaggregated_deployments(l8, c, gpus, [Precision.BF16], [Precision.BF16]))
        assert all(d.gpus == gpus and d.disaggregated is not None for d in splits)
        assert len(splits) == len({d.label() for d in splits})  # each split once
        prefill = {d.disaggregated.prefill.gpus for d in splits if d.disaggregated is not None}
        if gpus == 8:  # every split: 1..7 GPUs for prefill
            assert prefill == set(range(1, 8))
        assert len(prefill) < SPLIT_STEPS and len(splits) <= SPLIT_STEPS * 4 * 4


def test_any_trace_text_reads_or_is_refused_as_input() -> None:
    # whatever a file holds, the reader returns a trace or an input error (no other exception)
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from autoplan.serving.planfile import _parse_trace

    cell = st.one_of(st.text(max_size=8), st.integers(-5, 10**7).map(str),
                     st.floats(allow_nan=True, allow_infinity=True).map(str))
    rows = st.lists(st.lists(cell, max_size=5).map(",".join), max_size=8)
    header = st.sampled_from(["arrival_s,input_len,output_len", "input_len,arrival_s,output_len,x",
                              "arrival_s,input_len", ""])

    csv_like = st.tuples(header, rows).map(lambda hr: "\n".join([hr[0], *hr[1]]))

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.text(max_size=200), csv_like))
    def check(text: str) -> None:
        try:
            trace = _parse_trace(text, "t.csv")
        except InputError as err:
            assert all(p.source == "t.csv" for p in err.problems)
            return
        assert len(trace) >= 1 and trace.arrival_s[0] == 0.0
        assert list(trace.arrival_s) == sorted(trace.arrival_s)
        assert min(trace.input_len) >= 1 and min(trace.output_len) >= 1

    check()


# ---- one layer model: training and serving hold the same weights

def _tps(model) -> list[int]:
    """TP degrees both halves take for the model: dividing heads and the dense width, and
    dividing kv_heads or a multiple of them."""
    return [t for t in (1, 2, 4, 8) if model.heads % t == 0 and model.ffn_hidden % t == 0
            and (model.kv_heads % t == 0 or t % model.kv_heads == 0)]


@pytest.mark.parametrize("name", builtin_names("model"))
def test_training_and_serving_hold_the_same_weights_per_gpu_at_every_tp(name: str) -> None:
    """kernels.layer is the one place a layer's weights per rank are worked out: training's
    stage (evaluate's memory, no MTP module, no ZeRO) and serving's replica (StepModel's
    memory) at the same tp and precision (bf16) hold the same bytes per GPU."""
    model = dataclasses.replace(resolve_model(name), mtp_layers=0)
    tps = _tps(model)
    assert tps, name
    for tp in tps:
        plan = make_plan(model, gpus=tp, global_batch=1, seq_len=1024, dp=1, tp=tp,
                         zero=ZeroStage.NONE)
        training = evaluate(plan).memory.weights
        serving = StepModel(model, plan.cluster, Deployment(replicas=1, tp=tp), Engine.VLLM)
        # a plan trains the language model; the engine also loads the vision tower
        vision = 2 * vision_params_per_rank(model, tp)
        assert serving.memory().weights - vision == pytest.approx(training, rel=1e-12), (name, tp)


def test_mla_down_projections_are_replicated_in_serving_as_in_training() -> None:
    """DeepSeek-V3's down projections (hidden x (q_lora + kv_lora + rope)) and latent norms
    sit whole on every TP rank: at tp 8 in bf16 serving holds them once per GPU, not 1/8."""
    ds = dataclasses.replace(resolve_model("deepseek-v3"), mtp_layers=0)
    down = ds.hidden * (ds.q_lora_rank + ds.kv_lora_rank + ds.qk_rope_head_dim)
    split = StepModel(ds, H8, Deployment(replicas=1, tp=8), Engine.VLLM).memory().weights
    one = StepModel(ds, with_gpus(resolve_cluster("dgx-h100"), 1), Deployment(replicas=1, tp=1),
                    Engine.VLLM).memory().weights
    # what does not split: every layer's down projections and norms (latent, layer), the
    # MoE layers' routers and the final norm; 2 bytes each
    whole = 2 * (ds.layers * (down + ds.q_lora_rank + ds.kv_lora_rank + 2 * ds.params_norm)
                 + ds.moe_layers * ds.params_router + ds.params_norm)
    assert split == pytest.approx((one - whole) / 8 + whole, rel=1e-9)
    assert whole * 7 / 8 > 1.4 * 2**30  # what splitting them wrongly freed: about 1.5 GiB


# ---- conservation: rates over the whole workload's span, every scheduler's share counted

def _served(gpus: int, rate: float, requests: int, inp: int = 512, out: int = 64):
    cluster = with_gpus(resolve_cluster("dgx-h100"), gpus)
    w = Workload(Lengths(float(inp)), Lengths(float(out)), Arrival(ArrivalKind.RATE, rate_rps=rate),
                 requests)
    return serve_search(resolve_model("llama3-8b"), cluster, Engine.VLLM, w, Slo(2000, 100))


@settings(max_examples=30, deadline=None)
@given(gpus=st.sampled_from([8, 16, 64]), rate=st.floats(0.05, 40.0), requests=st.integers(1, 300))
def test_no_deployment_serves_more_requests_per_second_than_arrive(gpus, rate, requests):
    """Whatever the deployment, the rate and the workload's size (few requests per
    scheduler included): requests per second served <= offered, goodput <= served."""
    for r in _served(gpus, rate, requests).plans:
        p = r.prediction
        assert p.requests_per_s <= rate * (1 + 1e-9), (r.plan.deployment.label(), p.requests_per_s)
        assert p.goodput_rps <= p.requests_per_s * (1 + 1e-12)
        assert p.output_tokens_per_s <= rate * 64 * (1 + 1e-9)


def test_few_requests_on_many_schedulers_are_served_at_the_rate_they_arrive():
    """The issue's case: 50 requests at 1 request/s on 64 H100s (64 schedulers of one GPU
    each: most see no request, one sees one). Every deployment serves about 1 request/s
    (50 over their 50 s of arrivals and the last one's drain), not 64x one request's time."""
    few, many = _served(64, 1.0, 50), _served(64, 1.0, 1000)
    for result in (few, many):
        assert all(0.9 < r.prediction.goodput_rps <= 1.0 for r in result.plans)
    # the ranking stands on the same deployment whatever the workload's size
    assert few.plans[0].plan.deployment == many.plans[0].plan.deployment


def test_a_trace_of_two_requests_1000_s_apart_is_two_requests_in_1000_s(tmp_path):
    trace = tmp_path / "two.csv"
    trace.write_text("arrival_s,input_len,output_len\n0,512,64\n1000,512,64\n")
    r = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--trace", trace, "--format", "json")
    assert r.returncode == 0, r.stderr
    for plan in json.loads(r.stdout)["plans"]:
        rps = plan["prediction"]["requests_per_s"]
        assert 2 / 1001 < rps <= 2 / 1000, (plan["deployment"], rps)


def test_a_closed_loop_with_fewer_requests_than_schedulers_counts_only_those():
    """4 requests offline on 8 one-GPU replicas: 4 schedulers work, 4 idle; the deployment
    serves 4 requests over one request's time, not 8."""
    cluster = with_gpus(resolve_cluster("dgx-h100"), 8)
    w = Workload(Lengths(512.0), Lengths(64.0), Arrival(ArrivalKind.OFFLINE), 4)
    plan = ServingPlan(resolve_model("llama3-8b"), cluster, Engine.VLLM,
                       Deployment(replicas=8, tp=1), w, Slo())
    p = evaluate_serving(plan)
    assert p.requests_per_s == pytest.approx(4 / (p.e2e_ms.mean / 1e3), rel=1e-9)


# ---- part of a node, named by a built-in cluster and a GPU count

def test_a_serving_plan_on_part_of_a_node_names_the_builtin_and_its_gpus(tmp_path):
    """`serve --gpus 4` on dgx-h100 writes `cluster: {name: dgx-h100, gpus: 4}` (not the whole
    cluster written out), and the plan reads back to the same prediction."""
    out = tmp_path / "half.yaml"
    served = autoplan("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "4",
                      "--input-len", "512", "--output-len", "64", "--rate", "2", "--requests", "50",
                      "--out", out, "--format", "json")
    assert served.returncode == 0, served.stderr
    from autoplan.descriptors.strict import read_yaml

    doc = read_yaml(out)
    assert doc["cluster"] == {"name": "dgx-h100", "gpus": 4}
    again = autoplan("evaluate", out, "--format", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["plans"][0]["prediction"] == \
        json.loads(served.stdout)["plans"][0]["prediction"]
