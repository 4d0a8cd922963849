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
two pools in turn (:func:`simulate_disaggregated`), or, in a closed loop, together
(:func:`simulate_closed_disaggregated`).
One scheduler is simulated; the deployment's rates count every scheduler's share over the
whole workload's span (:func:`autoplan.serving.evaluate.deployment_rate`).

A closed loop (a benchmark's ``concurrency`` clients, each sending its next request when
its last one finishes) is measured as a benchmark measures it (:class:`ClosedLoop`): the
burst of every client's first request at time 0 and the steady state after it, each in
the workload's proportion however few requests the simulation's budget holds, the loop
kept full until the last measured request has finished.

The scheduler's policy and state are :mod:`autoplan.serving.scheduler`'s
(:class:`~autoplan.serving.scheduler.SchedulerConfig`, the KV cache's
:class:`~autoplan.serving.scheduler.KVPool` and the
:class:`~autoplan.serving.scheduler.Scheduler`); the loop here (:class:`_EngineLoop`) runs
it against the clock and the arrivals. Per iteration the work is O(1) plus the requests
that start or finish in it: decoding sequences are kept as a count, a context sum and a
heap of finishing iterations, never walked one by one.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
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
# and where few sequences run at once (a small batch limit, or a closed loop's few clients on
# a scheduler) each token is an iteration of its own: about this many iterations (each costs
# microseconds) at most, a request's own output aside (simulated_per_scheduler)
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
    # a closed loop (ClosedLoop): the requests in flight on the simulated scheduler's share
    # of the deployment (the concurrency over the schedulers; its throughput is in_flight /
    # mean e2e, Little's law); 0: not a closed loop, or one of a single wave
    in_flight: float = 0.0

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
    budget = simulated_per_scheduler(step, workload, schedulers)
    share = math.ceil(workload.requests / schedulers)
    loop, in_flight = None, 0.0
    if workload.arrival.kind is ArrivalKind.CONCURRENCY:
        in_flight = min(float(budget), workload.arrival.concurrency / schedulers)
        loop = ClosedLoop.of(in_flight, share, budget)
    n = loop.slots if loop is not None else min(budget, share)
    arrival, inputs, outputs = _requests(workload, schedulers, n, np.random.default_rng(seed))
    return run_requests(step, arrival, inputs, outputs, kv_tokens, closed=loop,
                        open_loop=workload.arrival.kind in OPEN_LOOP, step_over_decodes=step_over_decodes,
                        prefix=_prefix(workload), in_flight=in_flight, encoder_s=_encoder(step, workload))


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """How a closed loop is simulated on one scheduler: ``in_flight`` clients, each sending
    its next request as its last one finishes, and which requests are measured.

    What a benchmark measures: its ``requests`` (the workload's) from the moment its
    clients all send their first request at once. AIPerf runs its warm-up requests first
    and "waits indefinitely for all warmup responses before starting profiling" (AIPerf
    docs, "Warmup Phase Configuration"), so its profiling phase starts with every client's
    request at once, as vLLM's ``bench serve --max-concurrency`` and SGLang's
    ``bench_serving`` start theirs; AIConfigurator's generated benchmark scripts run
    ``aiperf profile --concurrency C --num-requests 20C --warmup-request-count 2C``
    (ai-dynamo/aiconfigurator, tests/baseline/.../bench_run.sh), and the benchmark's TTFT
    and TPOT average over all of its requests. The first wave's requests queue behind each
    other's prompts (with fixed lengths the last waits for every prompt of the burst); the
    later ones arrive as others finish, spread over the iterations, and wait less: the
    loop's steady state. So the burst weighs ``in_flight / requests`` of a benchmark's
    mean, 1/20 in AIConfigurator's scripts, and all of it when ``requests <= in_flight``.

    The simulation keeps that proportion within a bounded number of requests (a search
    evaluates many deployments): it sends the burst of ``in_flight`` requests at time 0,
    then ``measured`` requests of the steady state (the workload's after the burst, at
    most what leaves room for the burst and a cool-down within ``budget``,
    :func:`simulated_per_scheduler`, at least a quarter of it), and keeps sending requests
    until the last measured one has finished (at most ``in_flight`` more, not measured), so
    that every steady request runs beside ``in_flight - 1`` others, none in a draining tail.
    Of the burst it measures ``burst`` requests, evenly over its queue, so that burst and
    steady requests are measured in the workload's proportion: all of the burst where the
    budget holds the whole workload. (Simulating the first requests from time 0 up to the
    budget weighed the burst by the budget, not the workload: 256 clients sending 20 x 256
    requests of 8,192 output tokens, a budget of 976 requests, weighed it 26%, not 5%.)
    ``in_flight`` is at most ``budget``: 2.25 ``budget`` requests simulated at the very
    most."""

    in_flight: int
    measured: int  # steady-state requests measured, sent after the burst
    burst: int  # requests of the burst measured

    @classmethod
    def of(cls, in_flight: float, requests: int, budget: int) -> ClosedLoop:
        """``in_flight`` (the concurrency's share, at least one) and ``requests`` (the
        workload's share) within ``budget`` simulated requests (class doc)."""
        c = max(1, min(budget, round(in_flight)))
        if requests <= c:  # one wave: every request at once
            return cls(requests, 0, requests)
        m = max(1, min(requests - c, max(budget - 2 * c, budget // 4)))
        return cls(c, m, min(c, round(c * m / (requests - c))))

    @property
    def slots(self) -> int:
        """Requests simulated at most: the burst, the steady ones, the cool-down."""
        return self.in_flight + self.measured + (self.in_flight if self.measured else 0)

    def measure(self) -> np.ndarray:
        """Which requests are measured, by the order they are sent in (sorted): ``burst`` of
        the first ``in_flight``, evenly spread, and the ``measured`` after them."""
        picks = np.arange(self.burst) * self.in_flight // max(1, self.burst)
        return np.concatenate([picks, np.arange(self.in_flight, self.in_flight + self.measured)])


def _prefix(workload: Workload) -> tuple[int, int]:
    """(shared prefix tokens, prefix groups) of the workload's prompts ((0, 1): none)."""
    return (workload.prefix_tokens, workload.prefix.groups) if workload.prefix is not None else (0, 1)


def _encoder(step: StepModel, workload: Workload) -> float:
    """The vision encoder's seconds for one request's images (0: none)."""
    return step.encoder_seconds(workload.images_per_request, workload.tokens_per_image)


def simulated_per_scheduler(step: StepModel, workload: Workload, schedulers: int = 1) -> int:
    """Requests one of ``schedulers`` schedulers' simulation takes at most (the bounds
    above): the token budget over the longest output, and the iteration budget times the
    sequences that run at once over it. At most ``max_num_seqs`` run at once; in a closed
    loop at most the scheduler's share of its concurrency (the ``schedulers`` share it), so
    a few clients with long outputs are simulated for fewer requests than the batch limit
    would allow (4 clients of 50,000-token outputs: 8 requests, 100,000 iterations, not 160
    and 2,000,000)."""
    longest = max(1.0, workload.output_len.ceiling)
    running = float(step.max_num_seqs)
    if workload.arrival.kind is ArrivalKind.CONCURRENCY:
        running = min(running, max(1.0, workload.arrival.concurrency / max(1, schedulers)))
    return max(1, min(MAX_SIMULATED_REQUESTS, int(MAX_SIMULATED_TOKENS // longest),
                      int(ITERATION_BUDGET * running // longest)))


def _requests(workload: Workload, schedulers: int, n: int, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival, prompt lengths, output lengths) of the ``n`` requests one of ``schedulers``
    schedulers sees (``schedulers`` 1: the whole deployment's stream). A closed loop's and
    an offline batch's all arrive at 0 (a closed loop's run sends them as it goes:
    :class:`ClosedLoop`)."""
    spec = workload.arrival
    if spec.kind is ArrivalKind.TRACE:
        # a router deals the recorded requests to the schedulers in turn: this one gets
        # every ``schedulers``-th of the workload's first ``requests``
        assert spec.trace is not None
        mine = slice(0, workload.requests, schedulers)
        arrival = np.asarray(spec.trace.arrival_s[mine], dtype=float)[:n]
        inputs = np.asarray(spec.trace.input_len[mine], dtype=np.int64)[:n] + workload.image_tokens
        outputs = np.asarray(spec.trace.output_len[mine], dtype=np.int64)[:n]
        return arrival, inputs, outputs
    # each image's language-model tokens are prompt tokens (Workload.image_tokens)
    inputs = sample_lengths(workload.input_len, n, rng) + workload.image_tokens
    outputs = sample_lengths(workload.output_len, n, rng)
    arrival = np.zeros(n)
    if spec.kind is ArrivalKind.RATE:
        arrival = np.cumsum(rng.exponential(schedulers / spec.rate_rps, n))
    return arrival, inputs, outputs


def run_requests(step: StepModel, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray,
                 kv_tokens: int, *, closed: ClosedLoop | None = None, open_loop: bool = False,
                 step_over_decodes: bool = True, prefilled: bool = False,
                 prefix: tuple[int, int] = (0, 1), in_flight: float = 0.0, encoder_s: float = 0.0
                 ) -> SimResult:
    """The scheduler over given requests (arrival times, sorted; prompt and output lengths).
    ``closed``: a closed loop (:class:`ClosedLoop`; ``arrival`` then holds its slots, whose
    times are set as requests are sent), measured in its steady window; ``in_flight``: the
    requests in flight on this scheduler's share of the deployment (its concurrency over
    the schedulers: ``closed.in_flight`` unrounded; the result's :attr:`SimResult.in_flight`).
    ``prefilled``: the requests arrive with their
    prompt's KV cache already computed (a decode instance of a disaggregated deployment):
    admitting one takes its prompt's cache and no prompt compute, and it decodes from the
    iteration it is admitted in; one preempted is recomputed like any other. ``prefix``:
    (tokens, groups) of shared prompt prefixes (``Workload.prefix``): request i is in group
    i mod groups; each group's prefix, in whole KV blocks, is cached once in the cache the
    requests share, for as long as it fits there beside them (``scheduler.KVPool``: unused
    prefixes are evicted least recently used first), and a request admitted while its
    group's prefix is cached skips it (:func:`autoplan.serving.deployment.prefix_hit`), in
    what the engine reuses (``StepModel.prefix_block``: whole KV blocks, or for a model with
    recurrent layers the positions where the engine keeps their state, or nothing).
    ``encoder_s``: a vision encoder's seconds for each request's images, in the iteration that
    starts its prefill."""
    loop = _engine_loop(step, arrival, inputs, outputs, kv_tokens, prefilled=prefilled, prefix=prefix,
                        encoder_s=encoder_s)
    if closed is not None:
        _Refill(loop, closed)
    loop.run(step_over_decodes)
    if closed is None:
        return loop.result(open_loop)
    # a loop of one wave (every request at once, none sent after) is rated as a batch
    steady = (in_flight or float(closed.in_flight)) if closed.measured else 0.0
    return loop.result(False, closed.measure(), steady)


def _engine_loop(step: StepModel, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray,
                 kv_tokens: int, *, prefilled: bool = False, prefix: tuple[int, int] = (0, 1),
                 encoder_s: float = 0.0) -> _EngineLoop:
    """One scheduler's loop over these requests (:func:`run_requests`), not yet run."""
    config = SchedulerConfig.of(step)
    block = step.prefix_block  # 0: the engine reuses no prefix of this model
    shared: list[int] = []
    tokens, groups = prefix
    if tokens and not prefilled and block:
        shared = [prefix_hit(tokens, int(p), block) for p in inputs.tolist()]
    else:
        groups = 0  # no prefix: requests carry none
    pool = KVPool(kv_tokens, reserves=bool(config.reserve_output),
                  prefix=tokens // block * block if groups else 0, per_seq=step.seq_units)
    scheduler = Scheduler(config, pool)

    def make(i: int, prompt: int, steps: int) -> Request:
        if groups:  # prefix caching
            return Request(i, prompt, steps, prefilled, shared[i], i % groups)
        return Request(i, prompt, steps, prefilled)

    # a prefilled request is handed over by a prefill instance: no front end, no encoder
    requests = _Requests(arrival, inputs, outputs, config.steps, 0.0 if prefilled else step.request_s, make)
    return _EngineLoop(step, scheduler, requests, 0.0 if prefilled else encoder_s)


class _Refill:
    """A closed loop on one scheduler (:class:`ClosedLoop`): its first ``in_flight``
    requests at time 0, and one more each time one finishes, while a measured one is
    unfinished (or still to be sent)."""

    __slots__ = ("requests", "mine", "pending")

    def __init__(self, loop: _EngineLoop, closed: ClosedLoop):
        self.requests = loop.requests
        self.mine = np.zeros(self.requests.n, dtype=bool)
        self.mine[closed.measure()] = True
        self.pending = closed.burst + closed.measured  # measured requests not yet finished
        self.requests.hold_back(closed.in_flight)  # the rest are sent as requests finish
        loop.on_finish = self.finished

    def finished(self, i: int, t: float) -> None:
        if self.mine[i]:
            self.pending -= 1
        if self.pending > 0 and self.requests.issued < self.requests.n:
            self.requests.issue(t)


class _Requests:
    """The requests one scheduler is given and how they reach it: each one's arrival
    (``arrival``, as its client sends it; ``times``, past the engine's front end) and
    lengths, and two cursors: ``issued`` requests have been given arrival times (all of them
    unless a closed loop sends them as it goes: :meth:`issue`), ``queued`` have reached the
    scheduler's queue. ``horizon``: no request not yet issued is sent before it (a
    disaggregated closed loop's other pool: :func:`simulate_closed_disaggregated`).

    A request reaches the scheduler through the engine's front end: ``request_s`` a
    request, one after another (HTTP, tokenizing, routing), which clients' requests pass
    and a prefilled request handed over by a prefill instance does not."""

    __slots__ = ("arrival", "inputs", "outputs", "times", "lengths", "n", "queued", "issued", "horizon",
                 "steps", "request_s", "frontend_free", "make")

    def __init__(self, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray,
                 steps: Callable[[int], int], request_s: float, make: Callable[[int, int, int], Request]):
        """``steps``: the iterations a request of so many output tokens decodes in (fewer
        with speculative decoding); ``make(i, prompt, steps)``: request i as the scheduler
        holds it."""
        self.arrival, self.inputs, self.outputs = arrival, inputs, outputs
        self.steps, self.make, self.request_s = steps, make, request_s
        self.frontend_free = -math.inf
        # per request, as Python floats and ints: the loop reads them one at a time
        self.times: list[float] = [self._through_frontend(t)
                                   for t in np.asarray(arrival, dtype=float).tolist()]
        self.lengths: list[tuple[int, int]] = list(zip(inputs.tolist(), map(steps, outputs.tolist()),
                                                       strict=True))
        self.n = len(arrival)
        self.queued, self.issued = 0, self.n
        self.horizon = math.inf

    def issue(self, t: float, prompt: int | None = None, out: int | None = None) -> int:
        """Send the next request at ``t`` (no earlier than any sent before it), with these
        lengths where given; its index."""
        i = self.issued
        self.arrival[i] = t
        self.times[i] = self._through_frontend(t)
        if prompt is not None and out is not None:
            self.inputs[i], self.outputs[i] = prompt, out
            self.lengths[i] = (prompt, self.steps(out))
        self.issued += 1
        return i

    def hold_back(self, sent: int) -> None:
        """Send only the first ``sent`` now (a closed loop's burst); the rest wait for
        :meth:`issue`. The front end has passed the burst alone, not the later slots'
        placeholder times."""
        self.arrival[sent:] = np.inf
        self.times[sent:] = [math.inf] * (self.n - sent)
        self.issued = min(self.n, sent)
        self.frontend_free = self.times[self.issued - 1] if self.issued else -math.inf

    def _through_frontend(self, t: float) -> float:
        """When a request a client sends at ``t`` reaches the scheduler: the front end
        takes requests one at a time, ``request_s`` each (an M/D/1-like queue in front of
        the engine: a burst of requests reaches the scheduler spread out, as it does from a
        real server; Little's law then holds for the whole path). inf (not sent) stays."""
        if self.request_s <= 0.0 or not math.isfinite(t):
            return t
        self.frontend_free = max(t, self.frontend_free) + self.request_s
        return self.frontend_free

    def next_time(self) -> float:
        """When the next request reaches the scheduler (inf: none is sent yet)."""
        return self.times[self.queued] if self.queued < self.issued else math.inf

    def arrive(self, t: float, waiting: deque[Request]) -> None:
        """Queue on ``waiting`` the requests that have reached the scheduler by ``t``."""
        times, issued = self.times, self.issued
        while self.queued < issued and times[self.queued] <= t:
            i = self.queued
            waiting.append(self.make(i, *self.lengths[i]))
            self.queued += 1


class _Tally:
    """What one scheduler's loop records: each request's first and last token (NaN: not
    yet), the seconds of iterations (the clock also jumps to arrivals, idle), the most
    sequences running at once, and a timeline sampled every ``sample_every`` decode
    iterations."""

    __slots__ = ("first", "finish", "busy", "max_running", "timeline", "sample_every")

    def __init__(self, n: int, sample_every: int):
        self.first = [math.nan] * n
        self.finish = [math.nan] * n
        self.busy = 0.0
        self.max_running = 0
        self.timeline: list[tuple[float, int, int]] = []
        self.sample_every = sample_every


class _EngineLoop:
    """The engine's busy loop over one scheduler (vLLM V1's ``EngineCore.step``: schedule,
    run the model, update the requests): the clock ``t``, the decodes' iteration count
    ``it``, the requests (:class:`_Requests`) and what is recorded (:class:`_Tally`). An
    iteration takes ``StepModel.step_seconds``; the clock jumps over idle time to the next
    arrival. ``on_finish(i, t)`` is told of each request's last token."""

    __slots__ = ("step", "sched", "requests", "tally", "t", "it", "prefill_alone", "width", "gain",
                 "encoder_s", "on_finish")

    def __init__(self, step: StepModel, sched: Scheduler, requests: _Requests, encoder_s: float):
        """``encoder_s``: a vision encoder's seconds per request starting its prefill."""
        self.step, self.sched, self.requests, self.encoder_s = step, sched, requests, encoder_s
        self.width, self.gain = sched.config.width, sched.config.gain  # speculative decoding's
        outputs = requests.outputs
        n = requests.n
        self.tally = _Tally(n, max(1, int(outputs.sum()) // max(1, min(n, 400)) // 4))
        self.t, self.it = 0.0, 0  # the clock and the decodes' iterations
        self.prefill_alone = 0  # iterations of a prefill batch alone (prefill_first)
        self.on_finish: Callable[[int, float], None] | None = None

    def ready(self) -> float:
        """When the loop's next step begins: now, where a request waits or runs; else the
        next request's arrival (inf: none sent yet)."""
        if not self.sched.idle():
            return self.t
        return max(self.t, self.requests.next_time())

    def run(self, step_over_decodes: bool) -> None:
        """Iterate until every request has finished or what waits can never be admitted."""
        while self.advance(step_over_decodes):
            pass

    def advance(self, step_over_decodes: bool) -> bool:
        """One step: queue what has arrived, then run an iteration (or a run of decode-only
        ones: :meth:`_step_over`), or move the clock to the next arrival. False where
        nothing can happen until a request is sent (none arrives, or what waits can never
        be admitted)."""
        sched, requests = self.sched, self.requests
        requests.arrive(self.t, sched.waiting)
        if sched.idle():
            if requests.queued >= requests.issued:
                return False
            self.t = requests.times[requests.queued]
            return True
        self.it += 1
        if self.it + self.prefill_alone > MAX_ITERATIONS:
            raise AutoplanError(f"the serving simulation passed {MAX_ITERATIONS:,} iterations: a batch "
                                "limit this small for outputs this long is more than it simulates")
        batch = sched.schedule(self.it)
        if not batch.chunks and not sched.decodes.count:
            if requests.queued >= requests.issued:
                return False  # what waits can never be admitted
            self.t = max(self.t, requests.times[requests.queued])
            return True
        if not batch.decoding:  # a prefill batch alone: the decodes' clock stands still
            self.it -= 1
            self.prefill_alone += 1
        decode_only = not batch.chunks and not batch.joined
        if not (decode_only and step_over_decodes and self._step_over(batch.running)):
            self._execute(batch)
        return True

    def _step_over(self, running: int) -> bool:
        """Decode-only iterations change nothing but the clock, the contexts and the cache
        until a sequence finishes, the cache fills or (with nothing queued) a request
        arrives: take all of them at once (their times are a closed-form sum). False where
        a run of one is all there is (the iteration is then executed as any other)."""
        sched, dec, tally = self.sched, self.sched.decodes, self.tally
        nxt = min(self.requests.next_time(), self.requests.horizon)
        # with a request queued, no arrival can change the batch
        until = None if sched.waiting or nxt == math.inf else nxt - self.t
        span = _decode_run(self.step, dec.count, dec.context, dec.to_finish(self.it),
                           sched.pool.room(dec.count * dec.gain), until)
        if span is None:
            return False
        k, elapsed = span
        self.t += elapsed
        tally.busy += elapsed
        tally.max_running = max(tally.max_running, running)
        self.it += k - 1
        if self.it // tally.sample_every > (self.it - k) // tally.sample_every:
            tally.timeline.append((self.t, running, dec.count))
        sched.pool.grow(dec.advance(k))
        for r in dec.retire(self.it):
            self._finished(r)
        return True

    def _execute(self, batch: Batch) -> None:
        """Run one iteration of ``batch``: time it, store its tokens' KV, and record the
        first tokens and the finishes it produced."""
        sched, it, tally = self.sched, self.it, self.tally
        n_dec = sched.decodes.count if batch.decoding else 0
        tokens = n_dec * self.width + batch.new_kv
        done = sched.computed(batch)
        elapsed = self.step.step_seconds(
            tokens, decodes=n_dec, decode_context=sched.decodes.context if n_dec else 0.0,
            prefill_pairs=batch.pairs, prefill_context=batch.prior, sampled=n_dec + len(done),
        ) + batch.started * self.encoder_s
        self.t += elapsed
        tally.busy += elapsed
        tally.max_running = max(tally.max_running, batch.running)
        if it % tally.sample_every == 0:
            tally.timeline.append((self.t, batch.running, tokens))
        sched.pool.grow(n_dec * self.gain + batch.stored if self.gain != 1.0 else n_dec + batch.stored)
        if batch.decoding:
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
        if math.isnan(self.tally.first[r.i]):
            self.tally.first[r.i] = self.t

    def _finished(self, r: Request) -> None:
        """``r``'s last token came now (``on_finish`` is told: a closed loop sends the next)."""
        self.tally.finish[r.i] = self.t
        if self.on_finish is not None:
            self.on_finish(r.i, self.t)

    def result(self, open_loop: bool, measure: np.ndarray | None = None, in_flight: float = 0.0) -> SimResult:
        """The served requests (those not refused; of a closed loop's, the ``measure``d ones,
        by index) and the scheduler's totals (over the whole run)."""
        requests, tally = self.requests, self.tally
        arrival, first, finish = requests.arrival, np.array(tally.first), np.array(tally.finish)
        served = ~np.isnan(finish)
        duration = float(finish[served].max() - arrival[served].min()) if served.any() else 0.0
        given = len(arrival)
        position = np.arange(len(arrival))  # among the requests given
        if measure is not None:
            mine = np.zeros(len(arrival), dtype=bool)
            mine[measure] = True
            position = np.cumsum(mine) - 1  # among the measured
            served &= mine
            given = len(measure)
        return SimResult(arrival[served], first[served], finish[served], requests.inputs[served],
                         requests.outputs[served], duration, min(tally.busy, duration),
                         self.it + self.prefill_alone,
                         self.sched.preemptions, tally.max_running, tuple(tally.timeline),
                         # a queue that grows is a rate the deployment cannot keep up with; an
                         # offline batch queues by design and a closed loop cannot outrun itself
                         _steady(arrival[served], first[served]) if open_loop else True,
                         position[served], given,
                         # of the prompts sent (a closed loop's unsent slots are none)
                         self.sched.cached_tokens / max(1, int(requests.inputs[:requests.issued].sum())),
                         in_flight)


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
    share, with the finish from the decode pool; the first token reaches the client with the
    cache (:func:`handoff`; a one-token request finishes with its first token, in the prefill
    pool). A closed loop runs both pools together (:func:`simulate_closed_disaggregated`)."""
    if workload.arrival.kind is ArrivalKind.CONCURRENCY:
        return simulate_closed_disaggregated(prefill, decode, workload, schedulers, kv_tokens, transfer, seed)
    p_sched, d_sched = schedulers
    n = min(workload.requests, simulated_per_scheduler(decode, workload) * d_sched)
    arrival, inputs, outputs = _requests(workload, 1, n, np.random.default_rng(seed))
    open_loop = workload.arrival.kind in OPEN_LOOP
    done_prefill = np.full(n, np.nan)
    steady, preemptions, hits = True, 0, 0.0
    for k in range(min(p_sched, n)):
        mine = np.arange(k, n, p_sched)
        run = run_requests(prefill, arrival[mine], inputs[mine], np.ones(len(mine), dtype=np.int64),
                           kv_tokens[0], open_loop=open_loop, prefix=_prefix(workload),
                           encoder_s=_encoder(prefill, workload))
        done_prefill[mine[run.index]] = run.first_token
        steady, preemptions = steady and run.steady, preemptions + run.preemptions
        hits += run.prefix_hit_share * float(inputs[mine].sum())
    prefilled = ~np.isnan(done_prefill)  # the rest were refused: a prompt larger than the cache
    moved = handoff(done_prefill, inputs, transfer)
    first = np.where(outputs > 1, moved, done_prefill)  # the first token reaches the client (handoff)
    dealt = np.flatnonzero(prefilled)[np.argsort(moved[prefilled], kind="stable")][::d_sched]
    one = dealt[outputs[dealt] <= 1]
    more = dealt[outputs[dealt] > 1]
    run = run_requests(decode, moved[more], inputs[more], outputs[more] - 1, kv_tokens[1],
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


def handoff(prefilled: np.ndarray, inputs: np.ndarray, transfer: tuple[float, float]) -> np.ndarray:
    """When requests whose prompts the prefill pool finished at ``prefilled`` reach the
    decode pool with their KV cache (``transfer``: seconds, and seconds per prompt token).
    Their first token, sampled by the prefill instance, reaches the client then: the decode
    instance streams it, as the engines' disaggregated routers return the decode
    instance's stream (SGLang's ``--pd-disaggregation`` router, vLLM's P/D proxy, Dynamo),
    so the time to first token counts the hand-off. A one-token request is answered by
    the prefill instance: its first token is its prefill's."""
    return prefilled + transfer[0] + transfer[1] * inputs


def simulate_closed_disaggregated(prefill: StepModel, decode: StepModel, workload: Workload,
                                  schedulers: tuple[int, int], kv_tokens: tuple[int, int],
                                  transfer: tuple[float, float], seed: int = 0) -> SimResult:
    """A closed loop over a disaggregated deployment (arguments as
    :func:`simulate_disaggregated`'s): ``concurrency`` requests in flight over the whole
    deployment; each goes to a prefill scheduler, queues there and is prefilled as the
    engine's limits batch it (to its first token); its KV cache moves to a decode
    scheduler (:func:`handoff`), which decodes the rest of its output (its share of the
    requests: those in flight spread over the decode pool's workers x attention-DP
    ranks); when its last token comes the next request enters the prefill queue. Time to
    first token: the prefill queue, the prefill and the hand-off; time per output token:
    the decode scheduler's iterations.

    One prefill scheduler and one decode scheduler are simulated, together, on one clock
    (each advanced in turn from the earlier of the two, so that neither runs past a request
    the other has still to send it): the one prefill scheduler stands for the P prefill
    schedulers (each sees 1/P of the requests, as a router spreads them) and the decode
    scheduler for the D decode schedulers. So each request the decode scheduler finishes
    stands for D finishing over the deployment, which send D new requests, D/P of them to
    the prefill scheduler; each prompt the prefill scheduler finishes stands for P, P/D of
    which reach the decode scheduler. Fractions are carried (exact counts, in whole
    requests as they add up); P and D count only schedulers the concurrency can fill (at
    most ``concurrency`` of each hold a request). A request the decode scheduler gets
    carries the lengths and times of the prefilled request it stands for.

    Measured as :class:`ClosedLoop` says, over the deployment: the burst of every client's
    first request at time 0 and the steady state after it, in the workload's proportion
    (within the budget of the decode scheduler's :func:`simulated_per_scheduler`, its
    share of the concurrency over the decode pool, for the smaller of the two pools'
    shares); requests are sent until every measured one has finished."""
    spec = workload.arrival
    assert spec.kind is ArrivalKind.CONCURRENCY
    conc = min(spec.concurrency, workload.requests)  # clients past the requests never send
    p_eff, d_eff = min(schedulers[0], conc), min(schedulers[1], conc)
    per = min(p_eff, d_eff)  # the pool with more requests a scheduler: its share sets the bounds
    budget = min(MAX_SIMULATED_REQUESTS, simulated_per_scheduler(decode, workload, d_eff))
    concurrency = min(conc, budget * per)  # at most the budget's in flight
    warm = concurrency // p_eff  # the prefill scheduler's share of the burst at time 0
    # the loop on the prefill scheduler's share: its burst, steady and cool-down requests
    mine = ClosedLoop(warm, 0, warm)  # one wave: every request at once
    if workload.requests > spec.concurrency:
        loop = ClosedLoop.of(conc / per, math.ceil(workload.requests / per), budget)
        mine = ClosedLoop(warm, math.ceil(loop.measured * per / p_eff),
                          min(warm, math.ceil(loop.burst * per / p_eff)))
    measured = np.zeros(mine.slots + 2, dtype=bool)
    measured[mine.measure()] = True
    n_p = mine.slots + (2 if mine.measured else 0)  # a request or two of rounding to spare
    n_d = math.ceil(n_p * p_eff / d_eff) + 2
    rng = np.random.default_rng(seed)
    inputs = sample_lengths(workload.input_len, n_p, rng) + workload.image_tokens
    outputs = sample_lengths(workload.output_len, n_p, rng)
    pre = _engine_loop(prefill, np.full(n_p, math.inf), inputs, np.ones(n_p, dtype=np.int64), kv_tokens[0],
                       prefix=_prefix(workload), encoder_s=_encoder(prefill, workload))
    dec = _engine_loop(decode, np.full(n_d, math.inf), np.ones(n_d, dtype=np.int64),
                       np.full(n_d, 2, dtype=np.int64), kv_tokens[1], prefilled=True)
    pre.requests.hold_back(0)
    dec.requests.hold_back(0)
    # the timeline's samples: as for the decode scheduler's expected output tokens
    dec.tally.sample_every = max(1, int(n_d * workload.output_len.mean) // min(n_d, 400) // 4)
    source = np.full(n_d, -1, dtype=np.int64)  # the prefill request each decode request stands for
    first = np.full(n_p, np.nan)  # the first token of each prefill request (its hand-off)
    pending: list[tuple[float, int]] = []  # hand-offs not yet sent to the decode scheduler
    state = _Credits(to_prefill=concurrency % p_eff, to_decode=0, pending=mine.burst + mine.measured)

    def send(t: float, count: int) -> None:
        for _ in range(count):
            if pre.requests.issued < n_p and state.pending > 0:
                pre.requests.issue(t)

    def done(i: int, t: float) -> None:
        """A prefill request is done: its first token at ``t``."""
        measured_one = int(measured[i])
        if outputs[i] <= 1:  # answered by the prefill instance: P finish, P new requests
            first[i] = t
            state.pending -= measured_one
            send(t, 1)
            return
        first[i] = t + transfer[0] + transfer[1] * float(inputs[i])  # handoff()
        state.to_decode += p_eff
        copies, state.to_decode = divmod(state.to_decode, d_eff)
        state.pending += measured_one * (copies - 1)
        for _ in range(copies):
            heapq.heappush(pending, (first[i], i))

    def finished(j: int, t: float) -> None:
        """A decode request finished: D over the deployment, D new requests."""
        state.pending -= int(measured[source[j]])
        state.to_prefill += d_eff
        count, state.to_prefill = divmod(state.to_prefill, p_eff)
        send(t, count)

    pre.on_finish, dec.on_finish = done, finished
    send(0.0, warm)
    while state.pending > 0:
        tp = pre.ready()
        # the hand-offs no later one can precede, in time order: a hand-off still to come
        # follows the prefill scheduler's next step, or, where it has none, the decode
        # scheduler's (whose next finish sends the prefill scheduler a request)
        bound = tp if tp < math.inf else dec.ready()
        while pending and pending[0][0] <= bound:
            h, i = heapq.heappop(pending)
            if dec.requests.issued < n_d:
                source[dec.requests.issue(h, int(inputs[i]), int(outputs[i]) - 1)] = i
            else:  # out of slots (cannot happen within the bound above): the request is dropped
                state.pending -= int(measured[i])
        td = dec.ready()
        if tp == math.inf and td == math.inf:
            break  # what waits can never be admitted
        if tp <= td:
            if not pre.advance(False):
                break
        else:
            dec.requests.horizon = min(tp, pending[0][0] if pending else math.inf)
            if not dec.advance(True):
                break
    return _closed_result(pre, dec, source, first, inputs, outputs, measured[:n_p],
                          concurrency / schedulers[1] if mine.measured else 0.0)


@dataclass(slots=True)
class _Credits:
    """A disaggregated closed loop's counts (:func:`simulate_closed_disaggregated`):
    requests owed to each scheduler, in units of 1/P (prefill) and 1/D (decode) of a
    request, and the measured requests not yet finished (or sent)."""

    to_prefill: int
    to_decode: int
    pending: int


def _closed_result(pre: _EngineLoop, dec: _EngineLoop, source: np.ndarray, first: np.ndarray,
                   inputs: np.ndarray, outputs: np.ndarray, measured: np.ndarray,
                   in_flight: float) -> SimResult:
    """The ``measured`` requests of a disaggregated closed loop (by the prefill scheduler's
    index): those the decode scheduler finished, each with the arrival and first token of
    the prefill request it stands for, and those of one token the prefill scheduler
    finished; the decode scheduler's totals."""
    d_finish = np.array(dec.tally.finish[:dec.requests.issued])
    src = source[:dec.requests.issued]
    mine = ~np.isnan(d_finish) & measured[src]
    p_finish = np.array(pre.tally.finish)
    served = ~np.isnan(p_finish)  # prefilled (the rest never sent, or refused)
    one = np.flatnonzero(measured & (outputs <= 1) & served)
    req = np.concatenate([src[mine], one])
    finish = np.concatenate([d_finish[mine], first[one]])
    arrival = pre.requests.arrival[req]
    order = np.argsort(arrival, kind="stable")
    req, finish, arrival = req[order], finish[order], arrival[order]
    start = float(pre.requests.arrival[served].min()) if served.any() else 0.0
    ends = np.concatenate([d_finish[~np.isnan(d_finish)], p_finish[served], [start]])
    duration = float(ends.max()) - start
    return SimResult(arrival, first[req], finish, inputs[req], outputs[req], duration,
                     min(dec.tally.busy, duration), dec.it, pre.sched.preemptions + dec.sched.preemptions,
                     dec.tally.max_running, tuple(dec.tally.timeline), True, np.arange(len(req)),
                     max(1, len(req)),
                     pre.sched.cached_tokens / max(1, int(inputs[:pre.requests.issued].sum())),
                     in_flight)


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
