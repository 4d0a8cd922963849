"""Prefix caching (``Workload.prefix``): prefill skips a warm shared prefix in whole KV
blocks, the KV cache holds each group's prefix once, and plans, job files, the command
line and the exports carry it. Checked against hand calculations of the iteration model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.strict import parse_yaml
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Lengths,
    Prefix,
    Workload,
    prefix_hit,
)
from autoplan.serving.engine import Engine
from autoplan.serving.planfile import read_serving_plan
from autoplan.serving.simulate import run_requests, simulate
from tests.helpers import autoplan

L8 = resolve_model("llama3-8b")
H1 = with_gpus(resolve_cluster("dgx-h100"), 1)


def test_a_warm_prefix_is_served_in_whole_blocks_and_the_last_token_is_always_computed() -> None:
    assert prefix_hit(512, 1024, 16) == 512
    assert prefix_hit(500, 1024, 16) == 496  # whole blocks only
    assert prefix_hit(1024, 1024, 16) == 1008  # never the whole prompt: its last token's logits
    assert prefix_hit(1024, 1024, 1) == 1023
    assert prefix_hit(512, 10, 16) == 0
    assert Prefix(0.5).tokens(1000.0) == 500


def test_a_prefix_hit_prefills_only_the_rest_of_the_prompt_by_hand() -> None:
    """Closed loop of one: the first request computes its 1024-token prompt; the next two
    find the 512-token prefix computed and prefill 512 tokens attending to it. Their TTFT is
    the idle front end's time (the engine's ``request_s``) and one iteration each (no
    decode: one output token), by the iteration model: step_seconds(tokens, decodes 0,
    context 0, causal pairs, prior KV re-read, sampled 1)."""
    step = StepModel(L8, H1, Deployment(replicas=1, tp=1), Engine.VLLM)
    kv = step.kv_tokens(step.memory())
    w = Workload(Lengths(1024), Lengths(1), Arrival(ArrivalKind.CONCURRENCY, concurrency=1), 3, Prefix(0.5))
    ttft = simulate(step, w, 1, kv).ttft
    cold = step.request_s + step.step_seconds(1024, decodes=0, decode_context=0.0,
                                              prefill_pairs=1024 * 1025 / 2, prefill_context=0.0, sampled=1)
    warm = step.request_s + step.step_seconds(512, decodes=0, decode_context=0.0,
                                              prefill_pairs=512 * 512 + 512 * 513 / 2, prefill_context=512.0,
                                              sampled=1)
    assert ttft == pytest.approx([cold, warm, warm], rel=1e-12)
    without = simulate(step, Workload(Lengths(1024), Lengths(1), w.arrival, 3), 1, kv).ttft
    assert without == pytest.approx([cold, cold, cold], rel=1e-12)
    # two of the three prompts found 512 of their 1,024 tokens cached: 1,024 of 3,072
    assert simulate(step, w, 1, kv).prefix_hit_share == pytest.approx(1 / 3)


def test_the_kv_cache_holds_a_shared_prefix_once() -> None:
    """TensorRT-LLM admits a request only when its prompt and whole output fit beside what
    earlier admissions set aside. With 10,000 tokens of cache and 1,024 + 64 tokens a
    request, 9 run at once (9 x 1088 = 9,792). With half the prompt a shared prefix (512
    tokens, 16 blocks of 32), the prefix is held once (10,000 - 512 = 9,488 left) and each
    request sets aside its own 512 + 64: 16 run at once (16 x 576 = 9,216; 17 x 576 = 9,792)."""
    step = StepModel(L8, H1, Deployment(replicas=1, tp=1, max_num_seqs=256), Engine.TRTLLM)
    n = 40
    args = (np.zeros(n), np.full(n, 1024), np.full(n, 64), 10_000)
    assert run_requests(step, *args).max_running == 9
    assert run_requests(step, *args, prefix=(512, 1)).max_running == 16
    # two groups: both prefixes held (10,000 - 1,024 = 8,976 = 15 x 576 + 336)
    assert run_requests(step, *args, prefix=(512, 2)).max_running == 15


def test_prefix_caching_serves_a_shared_system_prompt_faster_and_no_faster_than_without() -> None:
    step = StepModel(L8, H1, Deployment(replicas=1, tp=1), Engine.VLLM)
    kv = step.kv_tokens(step.memory())
    arrival = Arrival(ArrivalKind.RATE, rate_rps=8.0)
    base = simulate(step, Workload(Lengths(3000), Lengths(100), arrival, 300), 1, kv, seed=3)
    shared = simulate(step, Workload(Lengths(3000), Lengths(100), arrival, 300, Prefix(0.8)), 1, kv, seed=3)
    none = simulate(step, Workload(Lengths(3000), Lengths(100), arrival, 300, Prefix(0.0)), 1, kv, seed=3)
    assert shared.ttft.mean() < 0.5 * base.ttft.mean()
    assert none.ttft == pytest.approx(base.ttft, rel=1e-12)  # a share of 0 changes nothing


PLAN = """\
autoplan: 1
kind: serving
model: llama3-8b
cluster: {name: dgx-h100, gpus: 1}
engine: ENGINE
deployment: {replicas: 1, tp: 1}
workload:
  input_len: 2000
  output_len: 100
  arrival: {rate_rps: 4}
  requests: 200
  prefix: {share: 0.75, groups: 3}
"""


def test_a_plan_file_carries_the_prefix_both_ways(tmp_path) -> None:
    from autoplan.serving.evaluate import evaluate_serving, serving_document

    plan = read_serving_plan(parse_yaml(PLAN.replace("ENGINE", "vllm"), "p.yaml"), "p.yaml")
    assert plan.workload.prefix == Prefix(0.75, 3) and plan.workload.prefix_tokens == 1500
    doc = serving_document(plan, evaluate_serving(plan))
    assert doc["workload"]["prefix"] == {"share": 0.75, "groups": 3}
    path = tmp_path / "p.yaml"
    path.write_text(PLAN.replace("ENGINE", "vllm"))
    got = autoplan("evaluate", path, "--format", "json")
    assert got.returncode == 0, got.stderr
    plain = tmp_path / "plain.yaml"
    plain.write_text(PLAN.replace("ENGINE", "vllm").replace("  prefix: {share: 0.75, groups: 3}\n", ""))
    base = autoplan("evaluate", plain, "--format", "json")
    ttft = [json.loads(r.stdout)["plans"][0]["prediction"]["ttft_ms"]["mean"] for r in (got, base)]
    assert ttft[0] < ttft[1]
    assert 0 < json.loads(got.stdout)["plans"][0]["prediction"]["prefix_cache_hit_share"] < 0.75
    assert "prefix_cache_hit_share" not in json.loads(base.stdout)["plans"][0]["prediction"]


@pytest.mark.parametrize(("bad", "field"), [
    ("prefix: {share: 1.5}", "workload.prefix.share"),
    ("prefix: {share: 0.5, groups: 0}", "workload.prefix.groups"),
    ("prefix: {share: 0.5, group: 2}", "workload.prefix.group"),
    ("prefix: 0.5", "workload.prefix"),
])
def test_a_bad_prefix_is_refused_naming_its_field(tmp_path, bad: str, field: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(PLAN.replace("ENGINE", "vllm").replace("prefix: {share: 0.75, groups: 3}", bad))
    got = autoplan("evaluate", path)
    assert got.returncode == 2 and field in got.stderr and "Traceback" not in got.stderr


SERVE = ("serve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "2", "--input-len", "2000",
         "--output-len", "64", "--rate", "4", "--requests", "100", "--format", "json")


def test_serve_takes_a_prefix_share_and_ranks_with_it() -> None:
    got = autoplan(*SERVE, "--prefix-share", "0.8", "--prefix-groups", "2")
    assert got.returncode == 0, got.stderr
    best = json.loads(got.stdout)["plans"][0]
    assert best["workload"]["prefix"] == {"share": 0.8, "groups": 2}
    base = json.loads(autoplan(*SERVE).stdout)["plans"][0]
    assert best["prediction"]["ttft_ms"]["mean"] < base["prediction"]["ttft_ms"]["mean"]


@pytest.mark.parametrize(("args", "flag"), [
    (("--prefix-share", "-0.1"), "--prefix-share"),
    (("--prefix-share", "2"), "--prefix-share"),
    (("--prefix-groups", "3"), "--prefix-groups"),  # groups of no prefix
    (("--prefix-share", "0.5", "--prefix-groups", "0"), "--prefix-groups"),
])
def test_serve_refuses_a_bad_prefix_option(args: tuple[str, ...], flag: str) -> None:
    got = autoplan(*SERVE, *args)
    assert got.returncode == 2 and flag in got.stderr and "Traceback" not in got.stderr


@pytest.mark.parametrize(("engine", "says"), [("vllm", "--enable-prefix-caching"),
                                              ("trtllm", "enable_block_reuse: true")])
def test_the_exports_turn_on_the_prefix_cache_the_prediction_counts_on(tmp_path, engine: str,
                                                                        says: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(PLAN.replace("ENGINE", engine))
    out = tmp_path / "out"
    got = autoplan("export", path, "--to", engine, "--out", out)
    assert got.returncode == 0, got.stderr
    text = "\n".join(p.read_text() for p in out.iterdir()) if out.is_dir() else out.read_text()
    assert says in text
