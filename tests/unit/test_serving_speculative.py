"""Speculative decoding (``Deployment.speculative``): a decode verifies k + 1 positions per
sequence and yields the mean accepted length; the proposer (a draft model, an EAGLE or MTP
head, n-gram lookup) costs what its own passes cost. Checked against hand calculations."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.strict import parse_yaml
from autoplan.errors import InputError
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Lengths,
    SpecMethod,
    Speculative,
    Workload,
)
from autoplan.serving.engine import Engine
from autoplan.serving.planfile import read_serving_plan
from autoplan.serving.simulate import run_requests
from tests.helpers import autoplan

L70, L8 = resolve_model("llama3-70b"), resolve_model("llama3-8b")
H4 = with_gpus(resolve_cluster("dgx-h100"), 4)


def test_the_mean_tokens_of_a_verify_step_follow_leviathan_et_al() -> None:
    """E[tokens] = (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, Eq. 1): with
    alpha 0.7 and k 4, (1 - 0.16807) / 0.3 = 2.77310; alpha 0 yields the target's own token
    only; alpha 1 every proposal and one more."""
    assert Speculative(SpecMethod.EAGLE, 4, acceptance_rate=0.7).mean_tokens == pytest.approx(2.77310)
    assert Speculative(SpecMethod.EAGLE, 4, acceptance_rate=0.0).mean_tokens == 1.0
    assert Speculative(SpecMethod.EAGLE, 4, acceptance_rate=1.0).mean_tokens == 5.0
    assert Speculative(SpecMethod.NGRAM, 3, acceptance_length=2.2).mean_tokens == 2.2


@pytest.mark.parametrize("step_over", [True, False])
def test_one_request_decodes_in_fewer_wider_steps_by_hand(step_over: bool) -> None:
    """One request of 1,000 prompt tokens and 201 output tokens, n-gram proposals (no GPU
    work of their own), k 3, 2 tokens a step: the first token comes with the prefill, the
    other 200 in 100 verify steps of 4 positions; step i reads 1,000 + 2i tokens of
    context. So its decode time is the sum of step_seconds(4 tokens, 1 decode, context
    1,000 + 2i, no prefill, 1 sampled) over i = 0..99, and its TPOT that over 200."""
    spec = Speculative(SpecMethod.NGRAM, 3, acceptance_length=2.0)
    step = StepModel(L70, H4, Deployment(replicas=1, tp=4, speculative=spec), Engine.VLLM)
    got = run_requests(step, np.zeros(1), np.array([1000]), np.array([201]), 100_000,
                       step_over_decodes=step_over)
    decode = sum(step.step_seconds(4, decodes=1, decode_context=1000.0 + 2 * i, prefill_pairs=0.0,
                                   prefill_context=0.0, sampled=1) for i in range(100))
    assert got.finish[0] - got.first_token[0] == pytest.approx(decode, rel=1e-9)
    assert got.tpot[0] == pytest.approx(decode / 200, rel=1e-9)


def test_a_verify_step_schedules_k_plus_one_positions_and_the_proposer_costs_its_passes() -> None:
    """For 16 decodes with EAGLE k 3: the target's GEMMs run 64 rows; the head runs 3 times
    over 16 rows (its layer, its KV read, the output head), and once over prompt rows."""
    eagle = Speculative(SpecMethod.EAGLE, 3, acceptance_length=2.5)
    spec_step = StepModel(L70, H4, Deployment(replicas=1, tp=4, speculative=eagle), Engine.VLLM)
    plain = StepModel(L70, H4, Deployment(replicas=1, tp=4), Engine.VLLM)
    b = spec_step.iteration(64, decodes=16, decode_context=16 * 2000.0, prefill_pairs=0.0,
                            prefill_context=0.0, sampled=16)
    p64 = plain.iteration(64, decodes=64, decode_context=64 * 2000.0, prefill_pairs=0.0, prefill_context=0.0,
                          sampled=64)
    assert b.gemm == pytest.approx(p64.gemm, rel=1e-12)  # 64 rows either way
    assert b.logits == pytest.approx(p64.logits, rel=1e-12)  # 64 positions sampled
    kv = 2000.0 * 16 * spec_step.kv_token_layer / spec_step.mem_eff_Bps
    read = max(kv, spec_step._decode_s_per_token * 16 * 2000.0)
    head = spec_step._head_layer(16) + spec_step._kscale * read
    assert b.draft == pytest.approx(3 * (head + spec_step._logits(16)), rel=1e-12)
    ngram = StepModel(L70, H4, Deployment(replicas=1, tp=4, speculative=Speculative(
        SpecMethod.NGRAM, 3, acceptance_length=2.5)), Engine.VLLM)
    assert ngram.iteration(64, decodes=16, decode_context=16 * 2000.0, prefill_pairs=0.0,
                           prefill_context=0.0, sampled=16).draft == 0.0


def test_a_draft_model_costs_k_of_its_own_decode_iterations_and_holds_its_weights_and_kv() -> None:
    draft = Speculative(SpecMethod.DRAFT, 4, acceptance_rate=0.7, draft=L8)
    step = StepModel(L70, H4, Deployment(replicas=1, tp=4, speculative=draft), Engine.VLLM)
    small = StepModel(L8, H4, Deployment(replicas=1, tp=4), Engine.VLLM)
    host = Engine.VLLM.spec.at(None)  # the default line
    b = step.iteration(5 * 8, decodes=8, decode_context=8 * 1500.0, prefill_pairs=0.0, prefill_context=0.0,
                       sampled=8)
    one = small.step_seconds(8, decodes=8, decode_context=8 * 1500.0, prefill_pairs=0.0, prefill_context=0.0,
                             sampled=8) - host.host_step_s - host.host_seq_s * 8
    assert b.draft == pytest.approx(4 * one, rel=1e-12)
    plain = StepModel(L70, H4, Deployment(replicas=1, tp=4), Engine.VLLM)
    assert step.memory().weights == pytest.approx(plain.memory().weights + small.memory_weights())
    per_token = plain.kv_token_layer * plain.layers_stage + small.kv_token_layer * small.layers_stage
    assert step.kv_tokens(step.memory()) == int(step.memory().kv_cache // per_token)


def test_the_closed_form_of_decode_runs_agrees_with_stepping_under_load() -> None:
    eagle = Speculative(SpecMethod.EAGLE, 3, acceptance_rate=0.75)
    step = StepModel(L70, H4, Deployment(replicas=1, tp=4, max_num_seqs=48, speculative=eagle), Engine.VLLM)
    rng = np.random.default_rng(1)
    arrival = np.cumsum(rng.exponential(0.2, 120))
    inputs, outputs = rng.integers(200, 2000, 120), rng.integers(2, 600, 120)
    fast, slow = (run_requests(step, arrival, inputs, outputs, 60_000, step_over_decodes=flag)
                  for flag in (True, False))
    assert np.allclose(fast.finish, slow.finish, rtol=1e-9)
    assert fast.iterations == slow.iterations and fast.preemptions == slow.preemptions


def test_at_low_load_speculation_cuts_tpot_and_every_token_is_still_served() -> None:
    w = Workload(Lengths(1000), Lengths(300), Arrival(ArrivalKind.RATE, rate_rps=0.5), 100)
    from autoplan.serving.deployment import ServingPlan, Slo
    from autoplan.serving.evaluate import evaluate_serving

    eagle = Speculative(SpecMethod.EAGLE, 3, acceptance_length=2.5)
    plain = evaluate_serving(ServingPlan(L70, H4, Engine.VLLM, Deployment(replicas=1, tp=4), w, Slo()))
    fast = evaluate_serving(ServingPlan(L70, H4, Engine.VLLM, Deployment(replicas=1, tp=4, speculative=eagle),
                                        w, Slo()))
    assert fast.tpot_ms.mean < 0.6 * plain.tpot_ms.mean
    assert fast.output_tokens_per_s == pytest.approx(plain.output_tokens_per_s, rel=0.05)  # what arrives


PLAN = """\
autoplan: 1
kind: serving
model: MODEL
cluster: {name: dgx-h100, gpus: 4}
engine: vllm
deployment: {replicas: 1, tp: 4, speculative: SPEC}
workload: {input_len: 1000, output_len: 200, arrival: {rate_rps: 1}, requests: 100}
"""


def _plan(spec: str, model: str = "llama3-70b") -> str:
    return PLAN.replace("SPEC", spec).replace("MODEL", model)


def test_a_plan_file_carries_speculative_decoding_both_ways(tmp_path) -> None:
    from autoplan.serving.evaluate import evaluate_serving, serving_document

    text = _plan("{method: draft, draft_model: llama3-8b, tokens: 4, acceptance_rate: 0.7}")
    plan = read_serving_plan(parse_yaml(text, "p.yaml"), "p.yaml")
    spec = plan.deployment.speculative
    assert spec is not None and spec.draft is not None and spec.draft.name == "llama3-8b"
    doc = serving_document(plan, evaluate_serving(plan))
    assert doc["deployment"]["speculative"] == {"method": "draft", "tokens": 4, "acceptance_rate": 0.7,
                                                "draft_model": "llama3-8b"}
    path = tmp_path / "p.yaml"
    path.write_text(text)
    got = autoplan("evaluate", path, "--format", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["plans"][0]["deployment"]["speculative"]["method"] == "draft"


@pytest.mark.parametrize(("spec", "model", "field"), [
    ("{method: eagle, tokens: 3}", "llama3-70b", "deployment.speculative"),  # no acceptance
    ("{method: eagle, tokens: 3, acceptance_rate: 0.5, acceptance_length: 2}", "llama3-70b",
     "deployment.speculative"),
    ("{method: eagle, tokens: 3, acceptance_length: 5}", "llama3-70b",
     "deployment.speculative.acceptance_length"),
    ("{method: eagle, tokens: 0, acceptance_length: 1}", "llama3-70b", "deployment.speculative.tokens"),
    ("{method: magic, tokens: 3, acceptance_length: 2}", "llama3-70b", "deployment.speculative.method"),
    ("{method: draft, tokens: 3, acceptance_length: 2}", "llama3-70b", "deployment.speculative.draft_model"),
    ("{method: eagle, draft_model: llama3-8b, tokens: 3, acceptance_length: 2}", "llama3-70b",
     "deployment.speculative.draft_model"),
    ("{method: draft, draft_model: llama2-7b, tokens: 3, acceptance_length: 2}", "llama3-70b",
     "deployment.speculative.draft_model"),  # another vocabulary
    ("{method: mtp, tokens: 1, acceptance_length: 1.8}", "llama3-70b", "deployment.speculative.method"),
])
def test_a_bad_speculative_field_is_refused_naming_it(tmp_path, spec: str, model: str, field: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(_plan(spec, model))
    with pytest.raises(InputError) as info:
        from autoplan.descriptors.strict import read_yaml

        read_serving_plan(read_yaml(path), str(path))
    assert any(p.field.startswith(field) for p in info.value.problems), info.value.problems
    got = autoplan("evaluate", path)
    assert got.returncode == 2 and "Traceback" not in got.stderr


def test_mtp_runs_on_a_model_with_its_module() -> None:
    text = _plan("{method: mtp, tokens: 1, acceptance_length: 1.8}", "deepseek-v3").replace(
        "{name: dgx-h100, gpus: 4}", "{name: dgx-h100, nodes: 1}").replace("tp: 4", "tp: 8")
    plan = read_serving_plan(parse_yaml(text, "p.yaml"), "p.yaml")
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine)
    plain = StepModel(plan.model, plan.cluster, Deployment(replicas=1, tp=8), plan.engine)
    assert step.memory().weights > plain.memory().weights  # one MoE layer more
    assert step.iteration(16, decodes=8, decode_context=8 * 1000.0, prefill_pairs=0.0, prefill_context=0.0,
                          sampled=8).draft > 0


SERVE = ("serve", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "4", "--input-len", "1000",
         "--output-len", "200", "--rate", "0.5", "--requests", "60", "--format", "json")


def test_serve_tries_every_deployment_with_and_without_speculation() -> None:
    got = autoplan(*SERVE, "--speculative", "eagle", "--spec-tokens", "3", "--acceptance-length", "2.6")
    assert got.returncode == 0, got.stderr
    plans = json.loads(got.stdout)["plans"]
    with_spec = [p for p in plans if "speculative" in p["deployment"]]
    assert with_spec and len(with_spec) < len(plans)
    assert "speculative" in plans[0]["deployment"]  # at 0.5 req/s, the fastest tokens win


@pytest.mark.parametrize(("args", "flag"), [
    (("--spec-tokens", "3"), "--spec-tokens"),  # no method
    (("--speculative", "eagle", "--acceptance-length", "2"), "--spec-tokens"),
    (("--speculative", "eagle", "--spec-tokens", "3"), "--acceptance-length"),
    (("--speculative", "eagle", "--spec-tokens", "3", "--acceptance-rate", "1.5"), "--acceptance-rate"),
    (("--speculative", "eagle", "--spec-tokens", "3", "--acceptance-length", "9"), "--acceptance-length"),
    (("--speculative", "draft", "--spec-tokens", "3", "--acceptance-length", "2"), "--draft-model"),
    (("--speculative", "foo", "--spec-tokens", "3", "--acceptance-length", "2"), "--speculative"),
    (("--speculative", "mtp", "--spec-tokens", "1", "--acceptance-length", "1.5"), "--speculative"),
    (("--speculative", "draft", "--draft-model", "llama2-7b", "--spec-tokens", "3",
      "--acceptance-length", "2"), "--draft-model"),
])
def test_serve_refuses_bad_speculative_options(args: tuple[str, ...], flag: str) -> None:
    got = autoplan(*SERVE, *args)
    assert got.returncode == 2 and flag in got.stderr and "Traceback" not in got.stderr


def test_a_draft_model_is_tried_only_where_the_target_tp_splits_its_heads() -> None:
    """Qwen2.5 7B drafting for 72B (one vocabulary): its 28 heads split over TP 4 but not
    TP 8, so on one DGX H100 the TP-8 deployments are tried without the draft only."""
    from autoplan.serving.deployment import Slo
    from autoplan.serving.search import serve_search

    w = Workload(Lengths(500), Lengths(50), Arrival(ArrivalKind.RATE, rate_rps=1.0), 20)
    draft = Speculative(SpecMethod.DRAFT, 3, acceptance_rate=0.6, draft=resolve_model("qwen2.5-7b"))
    result = serve_search(resolve_model("qwen2.5-72b"), with_gpus(resolve_cluster("dgx-h100"), 8),
                          Engine.VLLM, w, Slo(), speculative=draft)
    tried = {(r.plan.deployment.tp, r.plan.deployment.speculative is not None) for r in result.plans}
    assert (8, False) in tried and (8, True) not in tried
    assert (4, True) in tried
