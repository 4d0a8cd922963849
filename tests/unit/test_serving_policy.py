"""Two serving behaviours checked against hand calculations of the iteration model
(``StepModel.step_seconds``):

- SGLang's scheduler runs a new prefill batch alone, the running decodes waiting
  (``SchedulerConfig.prefill_first``; ``EngineVersion.prefill_first`` on SGLang's lines),
  where vLLM's mixes the prompt chunks into the decodes' iteration;
- an engine's front end takes a client's requests one at a time, ``request_s`` each
  (``Fitted.request_s``), before they reach the scheduler; a prefilled request handed to a
  decode pool does not pass it, and TTFT counts from the client's send time."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import numpy as np
import pytest

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.serving.cost import StepModel, kv_transfer
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Lengths,
    Pool,
    Precision,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.engine import Engine, fitted_as
from autoplan.serving.evaluate import evaluate_serving
from autoplan.serving.simulate import run_requests, simulate
from tests.helpers import engine_constants

L8 = resolve_model("llama3-8b")
H100 = resolve_cluster("dgx-h100")
H1 = with_gpus(H100, 1)
ONE = Deployment(replicas=1, tp=1)


@pytest.fixture(autouse=True)
def own_constants() -> Iterator[None]:
    """Every engine's default line with the module's own constants, whatever the engine
    files' shipped FITTED holds (a fit changes them; the hand calculations here hold for
    any): 2 ms of host time an iteration, shown in series with the GPU's work, no front end
    (``front_end`` sets one)."""
    with contextlib.ExitStack() as stack:
        for engine in (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM):
            stack.enter_context(engine_constants(engine, host_step_s=2e-3, serial=True))
        yield


def _step(engine: Engine, prefill_first: bool | None = None) -> StepModel:
    """llama3-8b on one H100 under ``engine``'s default line; ``prefill_first`` overrides the
    line's policy alone (the same iteration times: only the scheduling differs)."""
    step = StepModel(L8, H1, ONE, engine)
    if prefill_first is not None:
        step.line = dataclasses.replace(step.line, prefill_first=prefill_first)
    return step


def _prefill(step: StepModel, prompt: int, n: int = 1) -> float:
    """One iteration prefilling ``n`` whole prompts of ``prompt`` tokens, no decodes."""
    return step.step_seconds(n * prompt, decodes=0, decode_context=0.0,
                             prefill_pairs=n * prompt * (prompt + 1) / 2, prefill_context=0.0, sampled=n)


def _decode(step: StepModel, context: float) -> float:
    """One iteration decoding one sequence over ``context`` tokens."""
    return step.step_seconds(1, decodes=1, decode_context=context, prefill_pairs=0.0, prefill_context=0.0,
                             sampled=1)


def _closed(inp: int, out: int, concurrency: int, requests: int) -> Workload:
    return Workload(Lengths(float(inp)), Lengths(float(out)),
                    Arrival(ArrivalKind.CONCURRENCY, concurrency=concurrency), requests)


# --------------------------------------------------------------------------- prefill first

def test_sglangs_lines_schedule_a_new_prompt_alone_and_vllms_mix_it() -> None:
    assert all(v.prefill_first for v in Engine.SGLANG.spec.versions)
    assert not any(v.prefill_first for v in Engine.VLLM.spec.versions)
    assert _step(Engine.SGLANG).line.prefill_first and not _step(Engine.VLLM).line.prefill_first


@pytest.mark.parametrize("step_over_decodes", [False, True])
def test_a_new_prompt_runs_alone_and_delays_the_decoding_sequence_by_exactly_its_prefill(
        step_over_decodes: bool) -> None:
    """A (512-token prompt, 8 tokens out) is sent at 0 and decodes from its prefill on, one
    iteration a token, its context growing by one each; B (256 tokens, 1 out) arrives during
    A's second decode. Prefill first: the iteration after it is B's prefill alone (no decode
    in it: step_seconds(256, 0 decodes, ...)), A's decodes wait and A finishes exactly that
    iteration later than alone, after 9 iterations instead of 8. Mixed: B's prompt runs in
    A's third decode iteration (257 tokens, 1 decode, 2 sampled), which takes that
    iteration's place."""
    arrival_a = np.zeros(1)
    one = (np.array([512]), np.array([8]))
    first = _step(Engine.SGLANG)
    p_a = _prefill(first, 512)
    d = [_decode(first, 512.0 + j) for j in range(7)]  # A's 7 decode iterations
    t_b = p_a + d[0] + 0.5 * d[1]  # B arrives during A's second decode
    start = p_a + d[0] + d[1]  # the iteration B is scheduled in starts
    args = (np.array([0.0, t_b]), np.array([512, 256]), np.array([8, 1]), 100_000)

    alone = run_requests(first, arrival_a, *one, 100_000, step_over_decodes=step_over_decodes)
    assert alone.finish[0] == pytest.approx(p_a + sum(d), rel=1e-12)
    assert alone.iterations == 8

    res = run_requests(first, *args, step_over_decodes=step_over_decodes)
    q = _prefill(first, 256)
    assert res.first_token[1] == pytest.approx(start + q, rel=1e-12)
    assert res.finish[0] == pytest.approx(p_a + sum(d) + q, rel=1e-12)
    assert res.finish[0] - alone.finish[0] == pytest.approx(q, rel=1e-9)
    assert res.first_token[0] == pytest.approx(p_a, rel=1e-12)  # A's first token untouched
    assert res.iterations == 9  # the prefill alone is an iteration of its own

    mixed_step = _step(Engine.SGLANG, prefill_first=False)
    mixed = run_requests(mixed_step, *args, step_over_decodes=step_over_decodes)
    m = mixed_step.step_seconds(1 + 256, decodes=1, decode_context=512.0 + 2, prefill_pairs=256 * 257 / 2,
                                prefill_context=0.0, sampled=2)
    assert mixed.first_token[1] == pytest.approx(start + m, rel=1e-12)
    assert mixed.finish[0] == pytest.approx(p_a + sum(d) - d[2] + m, rel=1e-12)
    assert mixed.iterations == 8
    # B's prompt alone is faster than beside A's decode; A waits the whole of it
    assert res.first_token[1] < mixed.first_token[1] and res.finish[0] > mixed.finish[0]


def test_a_prefill_batch_alone_takes_every_waiting_prompt_the_budget_holds() -> None:
    """Three prompts arrive together while A decodes: prefill first runs them in one
    iteration alone (768 tokens, 3 sampled), A's finish later by exactly that iteration."""
    step = _step(Engine.SGLANG)
    p_a = _prefill(step, 512)
    d = [_decode(step, 512.0 + j) for j in range(7)]
    t_b = p_a + 0.5 * d[0]
    res = run_requests(step, np.array([0.0, t_b, t_b, t_b]), np.array([512, 256, 256, 256]),
                       np.array([8, 1, 1, 1]), 100_000, step_over_decodes=False)
    q3 = _prefill(step, 256, 3)
    assert res.first_token[1:] == pytest.approx([p_a + d[0] + q3] * 3, rel=1e-12)
    assert res.finish[0] == pytest.approx(p_a + sum(d) + q3, rel=1e-12)


def _lockstep(step: StepModel, inp: int, n: int) -> float:
    """Mean TTFT of ``n`` clients in lockstep: all send at once, their prompts are prefilled
    ``max_batched_tokens`` at a time in iterations alone, the j-th batch's first tokens j
    iterations after the send."""
    per = step.max_batched_tokens // inp
    k = n // per
    assert per * inp == step.max_batched_tokens and k * per == n  # whole batches (the test's lengths)
    return _prefill(step, inp, per) * (k + 1) / 2


def test_a_closed_loop_over_sglang_stays_in_lockstep_and_over_vllm_spreads_out() -> None:
    """N clients of 1,024-token prompts and 128 output tokens, each sending its next request
    as its last finishes. SGLang: every wave's prompts are prefilled in batches alone (8
    prompts to its 8,192-token budget), the decodes of the first batches waiting for the
    last, so the N requests finish together and are sent again together: each wave's mean
    TTFT is (k + 1) / 2 prefill iterations of k = N / 8, linear in N. vLLM mixes the later
    prompts' chunks into the first ones' decodes: their finishes, and so the next wave's
    sends, spread over the iterations and a request waits for a few chunks, not the whole
    wave's prompts."""
    sglang, vllm = _step(Engine.SGLANG), _step(Engine.VLLM)
    assert sglang.max_batched_tokens == vllm.max_batched_tokens == 8192
    kv = sglang.kv_tokens(sglang.memory())
    ttft: dict[str, dict[int, float]] = {"sglang": {}, "vllm": {}, "sglang-mixed": {}}
    for n in (16, 32, 64):
        w = _closed(1024, 128, n, 20 * n)
        ttft["sglang"][n] = float(simulate(sglang, w, 1, kv).ttft.mean())
        ttft["vllm"][n] = float(simulate(vllm, w, 1, vllm.kv_tokens(vllm.memory())).ttft.mean())
        mixed = _step(Engine.SGLANG, prefill_first=False)
        ttft["sglang-mixed"][n] = float(simulate(mixed, w, 1, kv).ttft.mean())
        assert ttft["sglang"][n] == pytest.approx(_lockstep(sglang, 1024, n), rel=1e-9)
    s, v, sm = ttft["sglang"], ttft["vllm"], ttft["sglang-mixed"]
    assert s[64] / s[16] == pytest.approx(3.0, rel=1e-6)  # 4.5 / 1.5 prefill iterations
    assert v[64] / v[16] < 2.5  # four times the clients: well under four times the wait
    for n in (32, 64):
        assert v[n] < 0.6 * s[n] and sm[n] < 0.6 * s[n]
    assert s[64] > 2.0 * v[64]
    # eight prompts fill one batch: one prefill iteration a wave, in lockstep under either
    # policy (the policy only matters where a wave's prompts take more than one iteration)
    for step in (sglang, vllm):
        r = simulate(step, _closed(1024, 128, 8, 80), 1, step.kv_tokens(step.memory()))
        assert r.ttft == pytest.approx(np.full(len(r.ttft), _prefill(step, 1024, 8)), rel=1e-9)


# --------------------------------------------------------------------------- the front end

FrontEnd = Callable[[Engine, float], None]


@pytest.fixture
def front_end(own_constants: None) -> Iterator[FrontEnd]:
    """``set(engine, request_s)``: the engine's default line's constants (the module's:
    ``own_constants``) with the front end's ``request_s`` (serving.engine.fitted_as); the
    registered specs are restored after, last set first."""
    with ExitStack() as stack:

        def set_request_s(engine: Engine, request_s: float) -> None:
            line = engine.spec.default_line
            assert line.fitted is not None
            stack.enter_context(fitted_as(engine, {line.fitted_line or line.version:
                                                   dataclasses.replace(line.fitted, request_s=request_s)}))

        yield set_request_s


def test_a_burst_reaches_the_scheduler_one_request_every_request_s(front_end: FrontEnd) -> None:
    """Four 128-token prompts (1 token out) sent at 0 to an idle engine whose front end takes
    10 ms a request: they reach the scheduler at 10, 20, 30 and 40 ms, each prefilled alone
    (one prefill is under 10 ms), so request i's TTFT, from its send at 0, is 10 (i + 1) ms
    and its prefill. With no front end time (request_s 0) they are one iteration of four
    prompts, to the bit as before the front end existed."""
    burst = (np.zeros(4), np.full(4, 128), np.full(4, 1), 100_000)
    assert StepModel(L8, H1, ONE, Engine.VLLM).request_s == 0.0  # the module's constants
    before = run_requests(StepModel(L8, H1, ONE, Engine.VLLM), *burst)
    assert before.ttft.tolist() == [_prefill(StepModel(L8, H1, ONE, Engine.VLLM), 128, 4)] * 4

    front_end(Engine.VLLM, 0.01)
    step = StepModel(L8, H1, ONE, Engine.VLLM)
    assert step.request_s == 0.01
    q = _prefill(step, 128)
    assert q < 0.01  # each is done before the next reaches the scheduler
    res = run_requests(step, *burst)
    assert res.arrival.tolist() == [0.0] * 4  # the client's send times
    assert res.ttft == pytest.approx([0.01 + q, 0.02 + q, 0.03 + q, 0.04 + q], rel=1e-12)
    assert res.iterations == 4

    front_end(Engine.VLLM, 0.0)
    again = run_requests(StepModel(L8, H1, ONE, Engine.VLLM), *burst)
    for a, b in ((again.first_token, before.first_token), (again.finish, before.finish)):
        assert a.tolist() == b.tolist()  # to the bit
    assert again.iterations == before.iterations == 1


def test_the_first_request_of_a_burst_waits_for_the_front_end_and_its_prefill(front_end: FrontEnd) -> None:
    """Four 2,048-token prompts at 0, 10 ms a request: the first reaches the scheduler at 10
    ms and is prefilled alone (TTFT 10 ms + its prefill); the other three reach it during
    that prefill and are prefilled together in the next iteration (6,144 tokens, within the
    8,192-token budget)."""
    front_end(Engine.VLLM, 0.01)
    step = StepModel(L8, H1, ONE, Engine.VLLM)
    q1, q3 = _prefill(step, 2048), _prefill(step, 2048, 3)
    assert q1 > 0.03  # the others are in the queue when it finishes
    res = run_requests(step, np.zeros(4), np.full(4, 2048), np.full(4, 1), 100_000)
    assert res.ttft[0] == pytest.approx(0.01 + q1, rel=1e-12)
    assert res.ttft[1:] == pytest.approx([0.01 + q1 + q3] * 3, rel=1e-12)


def test_a_front_end_queue_spreads_a_burst_on_sglang_too(front_end: FrontEnd) -> None:
    front_end(Engine.SGLANG, 0.01)
    step = StepModel(L8, H1, ONE, Engine.SGLANG)
    q = _prefill(step, 128)
    res = run_requests(step, np.zeros(4), np.full(4, 128), np.full(4, 1), 100_000)
    assert res.ttft == pytest.approx([0.01 + q, 0.02 + q, 0.03 + q, 0.04 + q], rel=1e-12)


def test_prefilled_requests_handed_to_a_decode_pool_skip_the_front_end(front_end: FrontEnd) -> None:
    """The same requests arriving with their prompt's KV computed (a decode instance) run as
    with no front end time, to the bit; sent by clients they are spread out by it."""
    args = (np.zeros(4), np.full(4, 512), np.full(4, 16), 100_000)
    step = StepModel(L8, H1, ONE, Engine.VLLM)
    before, before_cold = run_requests(step, *args, prefilled=True), run_requests(step, *args)
    front_end(Engine.VLLM, 0.01)
    step = StepModel(L8, H1, ONE, Engine.VLLM)
    after, after_cold = run_requests(step, *args, prefilled=True), run_requests(step, *args)
    assert after.first_token.tolist() == before.first_token.tolist()
    assert after.finish.tolist() == before.finish.tolist()
    # sent by clients: one iteration of the four prompts at 0 without a front end; with it
    # the first reaches the scheduler 10 ms after the send, alone
    assert before_cold.first_token.tolist() == [before_cold.first_token[0]] * 4
    assert after_cold.first_token[0] == pytest.approx(0.01 + _prefill(step, 512), rel=1e-12)
    assert after_cold.first_token[3] > after_cold.first_token[0]


def test_a_closed_loops_ttft_counts_the_front_end_from_the_clients_send(front_end: FrontEnd) -> None:
    """One client, 128-token prompts, 4 tokens out: each request is sent as the last one
    finishes and reaches the scheduler 10 ms later, so every TTFT is 10 ms and one prefill;
    the tokens after the first are not delayed."""
    front_end(Engine.VLLM, 0.01)
    step = StepModel(L8, H1, ONE, Engine.VLLM)
    res = simulate(step, _closed(128, 4, 1, 5), 1, step.kv_tokens(step.memory()))
    q = _prefill(step, 128)
    assert len(res.ttft) == 5
    assert res.ttft == pytest.approx(np.full(5, 0.01 + q), rel=1e-9)
    tpot = sum(_decode(step, 128.0 + j) for j in range(3)) / 3
    assert res.tpot == pytest.approx(np.full(5, tpot), rel=1e-9)
    # each send waits for the last finish: a request's whole time is the front end's and its own
    assert np.diff(res.arrival) == pytest.approx(np.full(4, 0.01 + q + 3 * tpot), rel=1e-9)


def test_a_disaggregated_closed_loop_passes_the_front_end_once_at_the_prefill_pool(
        front_end: FrontEnd) -> None:
    """Concurrency 1 on one prefill and one decode worker (test_serving_disagg's hand
    calculation): the client's request passes the prefill instance's front end (10 ms) and
    then the prefill and the hand-off; the decode instance takes it with no front end, so
    TPOT is unchanged."""
    d = Deployment.split(Pool(1, 1), Pool(1, 1))
    h2 = with_gpus(H100, 2)
    front_end(Engine.VLLM, 0.01)
    pred = evaluate_serving(ServingPlan(L8, h2, Engine.VLLM, d, _closed(512, 64, 1, 20), Slo()))
    pre = StepModel(L8, h2, d.pool("prefill"), Engine.VLLM)
    dec = StepModel(L8, h2, d.pool("decode"), Engine.VLLM)
    assert pre.request_s == dec.request_s == 0.01
    latency, per_token = kv_transfer(L8, h2, d)
    ttft = 0.01 + _prefill(pre, 512) + latency + per_token * 512
    tpot = sum(dec.step_seconds(1, decodes=1, decode_context=512.0 + j, prefill_pairs=0.0,
                                prefill_context=0.0, sampled=1) for j in range(63)) / 63
    assert pred.ttft_ms.mean == pytest.approx(1e3 * ttft, rel=1e-9)
    assert pred.tpot_ms.mean == pytest.approx(1e3 * tpot, rel=1e-9)


def test_a_deployment_whose_weights_fill_the_default_budget_launches_with_the_raised_fraction() -> None:
    # DeepSeek-R1 in fp8 on 4 B200 under SGLang (NVIDIA's measured runs): its weights fill
    # the default 0.88 of the GPU; the launch raises --mem-fraction-static to 0.95 and the
    # KV cache gets what that leaves; on 8 GPUs the default stands
    from autoplan.export.engines import sglang as sglang_engine

    model, b200 = resolve_model("deepseek-r1"), resolve_cluster("dgx-b200")
    dep = Deployment(replicas=1, tp=4, weights=Precision.FP8, kv_cache=Precision.FP8)
    step = StepModel(model, b200, dep, Engine.SGLANG)
    assert step.defaults.memory_fraction < step.memory_fraction == step.defaults.raised_fraction
    mem = step.memory()
    assert mem.kv_cache == pytest.approx(step.memory_fraction * b200.device.mem_bytes - mem.weights
                                         - mem.activations - mem.other)
    assert step.kv_tokens(mem) > 0
    loop = Workload(Lengths(1024), Lengths(1024), Arrival(ArrivalKind.CONCURRENCY, concurrency=8))
    args = dict((a[0], a[1:]) for a in sglang_engine.args(
        ServingPlan(model, b200, Engine.SGLANG, dep, loop, Slo()), step))
    assert args["--mem-fraction-static"] == ("0.95",)
    wide = StepModel(model, b200, dataclasses.replace(dep, tp=8), Engine.SGLANG)
    assert wide.memory_fraction == wide.defaults.memory_fraction
