"""A discrete-event simulation of one engine scheduler under continuous batching.

Iteration by iteration, as vLLM V1, SGLang and TensorRT-LLM's in-flight batching run
(Yu et al. 2022 "Orca"; Kwon et al. 2023 "vLLM"; Agrawal et al. 2024 "Sarathi-Serve" for
chunked prefill): every running sequence decodes one token per iteration; the remaining
``max_batched_tokens`` budget goes to prompt chunks in arrival order (the last admitted
prompt may be cut where chunked prefill is on); a request is admitted while fewer than
``max_num_seqs`` run and its prompt fits the free KV cache; when decoding would overflow
the cache, the most recently admitted sequence is preempted and recomputed later (vLLM's
default policy). An iteration's time is :class:`autoplan.serving.cost.StepModel`'s.

A replica runs ``pp`` such schedulers (one per batch in flight: vLLM's virtual engines)
for each of its ``attention_dp`` ranks, and the deployment ``replicas`` of them; requests
are spread at random, so each scheduler sees a Poisson stream at its share of the rate
(Poisson splitting), or its share of a closed loop's concurrency, or of an offline batch;
a recorded trace is dealt to the schedulers in turn (round robin), and this one replays
every ``schedulers``-th request at its recorded time. A disaggregated deployment runs its
two pools in turn (:func:`simulate_disaggregated`).
One scheduler is simulated; the deployment's rates count every scheduler's share over the
whole workload's span (:func:`autoplan.serving.evaluate.deployment_rate`).

The scheduler's policy and state are :mod:`autoplan.serving.scheduler`'s
(:class:`~autoplan.serving.scheduler.SchedulerConfig`, the KV cache's
:class:`~autoplan.serving.scheduler.KVPool` and the
:class:`~autoplan.serving.scheduler.Scheduler`); the loop here (:class:`_EngineLoop`) runs
it against the clock and the arrivals. Per iteration the work is O(1) plus the requests
that start or finish in it: decoding sequences are kept as a count, a context sum and a
heap of finishing iterations, never walked one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoplan.errors import AutoplanError
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import ArrivalKind, Dist, Lengths, Workload, prefix_hit
from autoplan.serving.scheduler import Batch, KVPool, Request, Scheduler, SchedulerConfig

MAX_SIMULATED_REQUESTS = 4000  # per simulation: percentiles to a few % and a search in seconds
# output tokens one simulation generates at most (each is an iteration's work for a sequence;
# enough for offline runs to reach their steady batch: TensorRT-LLM's 128/4096 rows at 1M
# simulated one wave and read 1-2 points of MAPE worse):
# fewer requests are simulated where each is long
MAX_SIMULATED_TOKENS = 8_000_000
# and where a small batch limit makes each token an iteration of its own: about this many
# iterations (each costs microseconds) at most, a request's own output aside
ITERATION_BUDGET = 100_000
MAX_ITERATIONS = 2_000_000  # a hard stop whatever the input (the limits above keep below it)


# arrivals that do not wait for the deployment: a queue that grows means it cannot keep up
OPEN_LOOP = (ArrivalKind.RATE, ArrivalKind.TRACE)


def sample_lengths(spec: Lengths, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` token counts, each >= 1 (and <= ``high`` where set)."""
    if spec.dist is Dist.FIXED:
        out = np.full(n, spec.mean)
    elif spec.dist is Dist.LOGNORMAL:  # underlying normal whose exp has mean ``mean``
        out = rng.lognormal(math.log(spec.mean) - spec.sigma**2 / 2, spec.sigma, n)
    elif spec.dist is Dist.EXPONENTIAL:
        out = rng.exponential(spec.mean, n)
    else:
        out = rng.uniform(spec.low, spec.high, n)
    out = np.maximum(1, np.rint(out))
    if spec.high:
        out = np.minimum(out, spec.high)
    return out.astype(np.int64)


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per simulated request (seconds), and the scheduler's totals."""

    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    duration_s: float  # first arrival to last finish
    busy_s: float  # of that, iterations running (the rest: waiting for arrivals)
    iterations: int
    preemptions: int
    max_running: int
    timeline: tuple[tuple[float, int, int], ...]  # (time, running sequences, tokens) samples
    steady: bool  # the queue did not grow through the run
    index: np.ndarray  # each served request's position among the requests given (run_requests)
    requested: int  # requests this scheduler was given (served or refused)
    # of the prompt tokens given, the share admissions found in the prefix cache
    prefix_hit_share: float = 0.0

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        """Time per output token after the first; requests of one token are left out."""
        many = self.output_len > 1
        return (self.finish[many] - self.first_token[many]) / (self.output_len[many] - 1)

    @property
    def e2e(self) -> np.ndarray:
        return self.finish - self.arrival


def simulate(step: StepModel, workload: Workload, schedulers: int, kv_tokens: int,
             seed: int = 0, step_over_decodes: bool = True) -> SimResult:
    """Run one of ``schedulers`` identical schedulers holding ``kv_tokens`` of KV cache.
    Requests that can never be admitted (a prompt, or what the engine's admission sets
    aside, larger than the cache) are refused, as engines refuse them, and left out.
    ``step_over_decodes``: take runs of decode-only iterations at once (the same result,
    to rounding; False steps through each, for tests)."""
    n = min(simulated_per_scheduler(step, workload), math.ceil(workload.requests / schedulers))
    arrival, inputs, outputs, closed = _requests(workload, schedulers, n, np.random.default_rng(seed))
    return run_requests(step, arrival, inputs, outputs, kv_tokens, closed=closed,
                        open_loop=workload.arrival.kind in OPEN_LOOP, step_over_decodes=step_over_decodes,
                        prefix=_prefix(workload))


def _prefix(workload: Workload) -> tuple[int, int]:
    """(shared prefix tokens, prefix groups) of the workload's prompts ((0, 1): none)."""
    return (workload.prefix_tokens, workload.prefix.groups) if workload.prefix is not None else (0, 1)


def simulated_per_scheduler(step: StepModel, workload: Workload) -> int:
    """Requests one scheduler's simulation takes at most (the bounds above)."""
    longest = max(1.0, workload.output_len.ceiling)
    return max(1, min(MAX_SIMULATED_REQUESTS, int(MAX_SIMULATED_TOKENS // longest),
                      int(ITERATION_BUDGET * step.max_num_seqs // longest)))


def _requests(workload: Workload, schedulers: int, n: int, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(arrival, prompt lengths, output lengths, closed loop) of the ``n`` requests one of
    ``schedulers`` schedulers sees (``schedulers`` 1: the whole deployment's stream)."""
    spec = workload.arrival
    if spec.kind is ArrivalKind.TRACE:
        # a router deals the recorded requests to the schedulers in turn: this one gets
        # every ``schedulers``-th of the workload's first ``requests``
        assert spec.trace is not None
        mine = slice(0, workload.requests, schedulers)
        arrival = np.asarray(spec.trace.arrival_s[mine], dtype=float)[:n]
        inputs = np.asarray(spec.trace.input_len[mine], dtype=np.int64)[:n]
        outputs = np.asarray(spec.trace.output_len[mine], dtype=np.int64)[:n]
        return arrival, inputs, outputs, 0
    inputs = sample_lengths(workload.input_len, n, rng)
    outputs = sample_lengths(workload.output_len, n, rng)
    arrival = np.zeros(n)
    closed = 0
    if spec.kind is ArrivalKind.RATE:
        arrival = np.cumsum(rng.exponential(schedulers / spec.rate_rps, n))
    elif spec.kind is ArrivalKind.CONCURRENCY:
        closed = min(n, max(1, round(spec.concurrency / schedulers)))
        arrival = np.full(n, np.inf)
        arrival[:closed] = 0.0
    return arrival, inputs, outputs, closed


def run_requests(step: StepModel, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray,
                 kv_tokens: int, *, closed: int = 0, open_loop: bool = False,
                 step_over_decodes: bool = True, prefilled: bool = False,
                 prefix: tuple[int, int] = (0, 1)) -> SimResult:
    """The scheduler over given requests (arrival times, sorted; prompt and output lengths).
    ``closed``: a closed loop of that many requests in flight (the rest of ``arrival``
    unset, filled in as requests finish). ``prefilled``: the requests arrive with their
    prompt's KV cache already computed (a decode instance of a disaggregated deployment):
    admitting one takes its prompt's cache and no prompt compute, and it decodes from the
    iteration it is admitted in; one preempted is recomputed like any other. ``prefix``:
    (tokens, groups) of shared prompt prefixes (``Workload.prefix``): request i is in group
    i mod groups; each group's prefix, in whole KV blocks, is cached once in the cache the
    requests share, for as long as it fits there beside them (``scheduler.KVPool``: unused
    prefixes are evicted least recently used first), and a request admitted while its
    group's prefix is cached skips it (:func:`autoplan.serving.deployment.prefix_hit`)."""
    config = SchedulerConfig.of(step)
    block = step.engine.spec.kv_block_tokens
    shared: list[int] = []
    tokens, groups = prefix
    if tokens and not prefilled:
        shared = [prefix_hit(tokens, int(p), block) for p in inputs.tolist()]
    else:
        groups = 0  # no prefix: requests carry none
    pool = KVPool(kv_tokens, reserves=bool(config.reserve_output),
                  prefix=tokens // block * block if groups else 0)
    scheduler = Scheduler(config, pool)
    loop = _EngineLoop(step, scheduler, arrival, inputs, outputs, closed, prefilled, shared, groups)
    loop.run(step_over_decodes)
    return loop.result(open_loop)


class _EngineLoop:
    """The engine's busy loop over one scheduler (vLLM V1's ``EngineCore.step``: schedule,
    run the model, update the requests): the clock, the arrivals, and each request's first
    and last token. An iteration takes ``StepModel.step_seconds``; the clock jumps over
    idle time to the next arrival."""

    __slots__ = ("step", "sched", "arrival", "inputs", "outputs", "times", "lengths", "closed", "prefilled",
                 "n", "first", "finish", "next_arrival", "issued", "t", "it", "busy", "max_running",
                 "timeline", "sample_every", "shared", "groups", "width", "gain")

    def __init__(self, step: StepModel, sched: Scheduler, arrival: np.ndarray, inputs: np.ndarray,
                 outputs: np.ndarray, closed: int, prefilled: bool, shared: list[int], groups: int):
        """``shared``, ``groups``: each request's cached prefix and the prefix groups (0: no
        prefix caching)."""
        self.step, self.sched, self.closed, self.prefilled = step, sched, closed, prefilled
        self.shared, self.groups = shared, groups
        self.width, self.gain = sched.config.width, sched.config.gain  # speculative decoding's
        self.arrival, self.inputs, self.outputs = arrival, inputs, outputs
        # per request, as Python floats and ints: the loop reads them one at a time
        self.times: list[float] = np.asarray(arrival, dtype=float).tolist()
        # each request's prompt and the iterations it decodes in (its output tokens, fewer
        # with speculative decoding)
        steps = [sched.config.steps(o) for o in outputs.tolist()]
        self.lengths: list[tuple[int, int]] = list(zip(inputs.tolist(), steps, strict=True))
        self.n = n = len(arrival)
        self.first = [math.nan] * n
        self.finish = [math.nan] * n
        self.next_arrival, self.issued = 0, (closed or n)  # requests queued; given arrival times
        self.t, self.it = 0.0, 0
        self.busy = 0.0  # seconds of iterations (the clock also jumps to arrivals, idle)
        self.max_running = 0
        self.timeline: list[tuple[float, int, int]] = []
        self.sample_every = max(1, int(outputs.sum()) // max(1, min(n, 400)) // 4)

    def run(self, step_over_decodes: bool) -> None:
        """Iterate until every request has finished or what waits can never be admitted."""
        sched = self.sched
        while True:
            self._arrive()
            if sched.idle():
                if self.next_arrival >= self.issued:
                    return
                self.t = self.times[self.next_arrival]
                continue
            self.it += 1
            if self.it > MAX_ITERATIONS:
                raise AutoplanError(f"the serving simulation passed {MAX_ITERATIONS:,} iterations: a batch "
                                    "limit this small for outputs this long is more than it simulates")
            batch = sched.schedule(self.it)
            if not batch.chunks and not sched.decodes.count:
                if self.next_arrival >= self.issued:
                    return  # what waits can never be admitted
                self.t = max(self.t, self.times[self.next_arrival])
                continue
            decode_only = not batch.chunks and not batch.joined
            if not (decode_only and step_over_decodes and self._step_over(batch.running)):
                self._execute(batch)

    def _arrive(self) -> None:
        """Queue the requests that have arrived by now."""
        while self.next_arrival < self.issued and self.times[self.next_arrival] <= self.t:
            i = self.next_arrival
            if self.groups:  # prefix caching
                r = Request(i, *self.lengths[i], self.prefilled, self.shared[i], i % self.groups)
            else:
                r = Request(i, *self.lengths[i], self.prefilled)
            self.sched.waiting.append(r)
            self.next_arrival += 1

    def _step_over(self, running: int) -> bool:
        """Decode-only iterations change nothing but the clock, the contexts and the cache
        until a sequence finishes, the cache fills or (with nothing queued) a request
        arrives: take all of them at once (their times are a closed-form sum). False where
        a run of one is all there is (the iteration is then executed as any other)."""
        sched, dec = self.sched, self.sched.decodes
        quiet = bool(sched.waiting) or self.next_arrival >= self.issued  # no arrival can change the batch
        until = None if quiet else self.times[self.next_arrival] - self.t
        span = _decode_run(self.step, dec.count, dec.context, dec.to_finish(self.it),
                           sched.pool.room(dec.count * dec.gain), until)
        if span is None:
            return False
        k, elapsed = span
        self.t += elapsed
        self.busy += elapsed
        self.max_running = max(self.max_running, running)
        self.it += k - 1
        if self.it // self.sample_every > (self.it - k) // self.sample_every:
            self.timeline.append((self.t, running, dec.count))
        sched.pool.grow(dec.advance(k))
        for r in dec.retire(self.it):
            self._finished(r)
        return True

    def _execute(self, batch: Batch) -> None:
        """Run one iteration of ``batch``: time it, store its tokens' KV, and record the
        first tokens and the finishes it produced."""
        sched, it = self.sched, self.it
        n_dec = sched.decodes.count
        tokens = n_dec * self.width + batch.new_kv
        done = sched.computed(batch)
        elapsed = self.step.step_seconds(tokens, n_dec, sched.decodes.context, batch.pairs, batch.prior,
                                         n_dec + len(done))
        self.t += elapsed
        self.busy += elapsed
        self.max_running = max(self.max_running, batch.running)
        if it % self.sample_every == 0:
            self.timeline.append((self.t, batch.running, tokens))
        sched.pool.grow(n_dec * self.gain + batch.stored if self.gain != 1.0 else n_dec + batch.stored)
        sched.decodes.advance(1)
        for r in batch.joined:  # its first token here (the prefill instance made the one before)
            self._first_token(r)
        for r in sched.decodes.retire(it):
            self._finished(r)
        for r in done:
            self._first_token(r)
            if sched.prompt_done(r, it):
                self._finished(r)

    def _first_token(self, r: Request) -> None:
        """``r``'s first token came now (not again after a preemption)."""
        if math.isnan(self.first[r.i]):
            self.first[r.i] = self.t

    def _finished(self, r: Request) -> None:
        """``r``'s last token came now; in a closed loop the next request arrives."""
        self.finish[r.i] = self.t
        if self.closed and self.issued < self.n:
            self.arrival[self.issued] = self.times[self.issued] = self.t
            self.issued += 1

    def result(self, open_loop: bool) -> SimResult:
        """The served requests (those not refused) and the scheduler's totals."""
        arrival, first, finish = self.arrival, np.array(self.first), np.array(self.finish)
        served = ~np.isnan(finish)
        duration = float(finish[served].max() - arrival[served].min()) if served.any() else 0.0
        return SimResult(arrival[served], first[served], finish[served], self.inputs[served],
                         self.outputs[served], duration, min(self.busy, duration), self.it,
                         self.sched.preemptions, self.max_running, tuple(self.timeline),
                         # a queue that grows is a rate the deployment cannot keep up with; an
                         # offline batch queues by design and a closed loop cannot outrun itself
                         _steady(arrival[served], first[served]) if open_loop else True,
                         np.flatnonzero(served), len(arrival),
                         self.sched.cached_tokens / max(1, int(self.inputs.sum())))


def simulate_disaggregated(prefill: StepModel, decode: StepModel, workload: Workload,
                           schedulers: tuple[int, int], kv_tokens: tuple[int, int],
                           transfer: tuple[float, float], seed: int = 0) -> SimResult:
    """A disaggregated deployment (``Deployment.disaggregated``): ``schedulers`` and
    ``kv_tokens`` are the (prefill, decode) pools' per scheduler, ``transfer`` the KV hand-off
    as (seconds, seconds per prompt token).

    The deployment's requests (at most what ``schedulers[1]`` schedulers simulate each) are
    dealt in arrival order to every prefill scheduler in turn, each run to its first token
    (:func:`run_requests`, one output token). A request's cache reaches the decode pool its
    transfer later; the decode schedulers are dealt the requests in that order, and one of
    them is run on its share with the caches arriving computed (``prefilled``). Returned: that
    share, with the first token from the prefill pool and the finish from the decode pool
    (a one-token request finishes with its first token)."""
    assert workload.arrival.kind is not ArrivalKind.CONCURRENCY, "the plan reader refuses closed loops"
    p_sched, d_sched = schedulers
    n = min(workload.requests, simulated_per_scheduler(decode, workload) * d_sched)
    arrival, inputs, outputs, _ = _requests(workload, 1, n, np.random.default_rng(seed))
    open_loop = workload.arrival.kind in OPEN_LOOP
    first = np.full(n, np.nan)
    steady, preemptions, hits = True, 0, 0.0
    for k in range(min(p_sched, n)):
        mine = np.arange(k, n, p_sched)
        run = run_requests(prefill, arrival[mine], inputs[mine], np.ones(len(mine), dtype=np.int64),
                           kv_tokens[0], open_loop=open_loop, prefix=_prefix(workload))
        first[mine[run.index]] = run.first_token
        steady, preemptions = steady and run.steady, preemptions + run.preemptions
        hits += run.prefix_hit_share * float(inputs[mine].sum())
    prefilled = ~np.isnan(first)  # the rest were refused: a prompt larger than the cache
    handoff = first + transfer[0] + transfer[1] * inputs
    dealt = np.flatnonzero(prefilled)[np.argsort(handoff[prefilled], kind="stable")][::d_sched]
    one = dealt[outputs[dealt] <= 1]
    more = dealt[outputs[dealt] > 1]
    run = run_requests(decode, handoff[more], inputs[more], outputs[more] - 1, kv_tokens[1],
                       open_loop=open_loop, prefilled=True)
    done = np.concatenate([one, more[run.index]])
    finish = np.concatenate([first[one], run.finish])
    order = np.argsort(arrival[done], kind="stable")
    done, finish = done[order], finish[order]
    duration = float(finish.max() - arrival[done].min()) if len(done) else 0.0
    return SimResult(arrival[done], first[done], finish, inputs[done], outputs[done], duration,
                     min(run.busy_s, duration), run.iterations, preemptions + run.preemptions,
                     run.max_running, run.timeline, steady and run.steady, done,
                     -(-n // d_sched),  # one decode scheduler's share of the requests simulated
                     hits / max(1.0, float(inputs.sum())))  # the prefill pool's prefix cache


def _decode_run(step: StepModel, n_dec: int, ctx: float, to_finish: int, to_full: int,
                until: float | None) -> tuple[int, float] | None:
    """How many decode-only iterations to take at once, and their total time, or None for
    one. Iteration i (from 0) costs A + c (ctx + i g n_dec) (``StepModel.decode_coefficients``;
    g the tokens a sequence adds an iteration, ``StepModel.gain``), so the first j cost
    j A + c (j ctx + g n_dec j (j - 1) / 2), or with the engine's overlap scheduler the sum
    ``StepModel.decode_run`` gives. The run ends with the
    iteration in which a sequence finishes (``to_finish``), before the cache would overflow
    (``to_full`` iterations fit), and, where ``until`` is given, with the last iteration
    that starts before a request arrives ``until`` seconds from now."""
    k = min(to_finish, to_full)
    if k <= 1:
        return None
    elapsed = step.decode_run(n_dec, ctx)

    if until is not None:
        # the most iterations whose starts (after 0, 1, .. j-1 iterations) precede the arrival
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if elapsed(mid - 1) < until:
                lo = mid
            else:
                hi = mid - 1
        k = lo
        if k <= 1:
            return None
    return k, elapsed(k)


def _steady(arrival: np.ndarray, first: np.ndarray) -> bool:
    """Whether waiting did not grow through the run: the median time to first token of the
    last fifth of the requests (by arrival) within 2x (+50 ms) of the second fifth's."""
    n = len(arrival)
    if n < 50:
        return True
    order = np.argsort(arrival, kind="stable")
    ttft = (first - arrival)[order]
    fifth = n // 5
    early = float(np.median(ttft[fifth:2 * fifth]))
    late = float(np.median(ttft[-fifth:]))
    return late <= 2 * early + 0.05
