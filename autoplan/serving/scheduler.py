"""One engine scheduler's policy and state, split as vLLM V1 splits its own
(``vllm/v1/core/sched/scheduler.py``, ``vllm/v1/core/kv_cache_manager.py``,
``vllm.config.SchedulerConfig``):

- :class:`SchedulerConfig`: the batch limits and the admission policy;
- :class:`KVPool`: the KV cache, counted in tokens;
- :class:`Scheduler`: the waiting queue, the prompts being prefilled and the decoding
  sequences; it builds each iteration's :class:`Batch` and takes back what it computed.

The iteration loop that runs them and times each iteration is
:func:`autoplan.serving.simulate.run_requests`. Decoding sequences are kept as a count, a
context sum and a heap of finishing iterations (:class:`Decodes`), never walked one by one.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from autoplan.serving.cost import StepModel


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The engine's batching limits and admission policy (vLLM's ``SchedulerConfig``).

    Every running sequence decodes one token per iteration; the rest of
    ``max_batched_tokens`` goes to prompt chunks in admission order (Yu et al. 2022 "Orca";
    Kwon et al. 2023 "vLLM"); with ``chunked_prefill`` the last prompt may be cut to the
    budget left (Agrawal et al. 2024 "Sarathi-Serve"), without it a prompt goes whole or
    waits. A request is admitted while fewer than ``max_num_seqs`` run and its prompt fits
    the free cache; engines that reserve output (``reserve_output`` > 0: SGLang's
    ``new_token_ratio``, TensorRT-LLM's GUARANTEED_NO_EVICT) also need that share of its
    output tokens free beside what earlier admissions set aside. When the decodes' next
    tokens do not fit, the most recently admitted sequence is preempted and recomputed later
    (:meth:`Scheduler.schedule`: vLLM's default)."""

    max_num_seqs: int
    max_batched_tokens: int
    chunked_prefill: bool
    reserve_output: float  # share of a request's output tokens admission sets aside
    # speculative decoding: positions a decode schedules (proposals + 1) and the tokens it
    # yields on average (``StepModel.width``, ``StepModel.gain``); 1 and 1 without
    width: int = 1
    gain: float = 1.0
    # a new prefill batch runs alone, the decodes waiting, whenever a prompt can be
    # scheduled (SGLang's ``Scheduler.get_next_batch_to_run``: ``get_new_batch_prefill``
    # first, the running batch's decode only where it returns none; mixing the two is
    # ``--enable-mixed-chunk``, off by default); False: every iteration decodes every
    # running sequence and fills the rest of the budget with prompt chunks (vLLM V1,
    # TensorRT-LLM's in-flight batching)
    prefill_first: bool = False

    @classmethod
    def of(cls, step: StepModel) -> SchedulerConfig:
        """The limits the deployment runs (its own, else the engine's defaults)."""
        return cls(step.max_num_seqs, step.max_batched_tokens, step.chunked_prefill,
                   step.defaults.reserve_output, step.width, step.gain, step.line.prefill_first)

    def steps(self, out: int) -> int:
        """Iterations a request of ``out`` output tokens decodes in, its first token from
        the prefill: one per token, or with speculative decoding ``gain`` tokens per verify
        step on average."""
        return out if self.gain == 1.0 else 1 + math.ceil((out - 1) / self.gain)

    def held(self, prompt: int, left: int) -> int:
        """KV tokens admitting a request sets aside: its prompt and the reserved share of the
        ``left`` output tokens it has still to generate."""
        return prompt + math.ceil(self.reserve_output * left)

    def schedulable(self, chunk: int, remaining: int) -> bool:
        """Whether a chunk of ``chunk`` of a prompt's ``remaining`` tokens may run: any cut
        with chunked prefill on, else only the whole rest."""
        return self.chunked_prefill or chunk >= remaining


class KVPool:
    """The scheduler's KV cache in tokens (vLLM's ``KVCacheManager`` over its block pool,
    counted per token rather than per block). ``used``: tokens whose KV is stored;
    ``committed``: what the live requests' admissions set aside (prompt and reserved
    output), checked against the capacity only where the engine reserves output.

    Shared prompt prefixes (prefix caching) are cached in the same pool, ``prefix`` tokens
    (whole blocks) a group: a group's prefix that live requests reference is stored and set
    aside like theirs (``pin``); one no request references stays cached in what is free and
    is evicted, least recently released first, as soon as the cache needs its room
    (``evictable``). That is what the engines do: vLLM's automatic prefix caching keeps a
    freed block's KV, hashed, in its free queue and hands out the queue's front when it
    needs a block, "the least recent used block is at the front (LRU)"
    (vllm/v1/core/kv_cache_utils.py, ``FreeKVCacheBlockQueue``); SGLang's RadixAttention
    evicts radix-tree leaves no running request locks (``lock_ref`` 0), least recently
    accessed first, when an allocation needs room (sglang/srt/mem_cache/radix_cache.py,
    ``RadixCache.evict``); TensorRT-LLM keeps a finished request's blocks for reuse and
    evicts them "by default ... least recently used (LRU)" (NVIDIA, "Introducing New KV
    Cache Reuse Optimizations in TensorRT-LLM", 2025: priority-based eviction). So prefix
    caching takes no room from the requests: where every group's prefix does not fit
    beside them, fewer requests find theirs cached."""

    __slots__ = ("capacity", "used", "committed", "reserves", "prefix", "refs", "ready",
                 "lru", "evictable", "per_seq")

    def __init__(self, capacity: int, reserves: bool, prefix: int = 0, per_seq: int = 0):
        self.capacity = capacity
        self.reserves = reserves
        # units every admitted sequence holds beside its tokens (a model's recurrent states
        # and sliding windows: serving.kinds), taken at admission and given back at release
        self.per_seq = per_seq
        self.used = 0.0  # fractional with speculative decoding (a verify step's mean yield)
        self.committed = 0
        self.prefix = prefix  # a group's shared prefix, whole blocks (0: no prefix caching)
        self.refs: dict[int, int] = {}  # live requests referencing a group's cached prefix
        self.ready: set[int] = set()  # groups whose prefix is cached (computed, not evicted)
        self.lru: dict[int, None] = {}  # cached groups no request references, oldest first
        self.evictable = 0  # their tokens: stored, in the room free to admissions

    def refuses(self, prompt: int, held: int) -> bool:
        """Whether a request can never be admitted (its prompt, or what its admission sets
        aside, larger than the cache): engines refuse it."""
        s = self.per_seq
        return prompt + s > self.capacity or held + s > self.capacity

    def can_admit(self, stored: float, held: int) -> bool:
        """Whether ``stored`` more tokens fit the cache this iteration and, where the engine
        reserves output, ``held`` more fit beside what admissions already set aside (and the
        sequence's own ``per_seq`` units with each)."""
        s = self.per_seq
        return self.used + stored + s <= self.capacity and not (
            self.reserves and self.committed + held + s > self.capacity)

    def allocate(self, held: int, stored: int = 0) -> None:
        """Admit a request: set ``held`` aside and store ``stored`` tokens now (and its
        ``per_seq`` units)."""
        self.committed += held + self.per_seq
        self.used += stored + self.per_seq
        if self.evictable:
            self._evict()

    def grow(self, tokens: float) -> None:
        """Store the KV of ``tokens`` computed tokens (prompt chunks and decodes)."""
        self.used += tokens
        if self.evictable:
            self._evict()

    def fits(self, tokens: float) -> bool:
        """Whether ``tokens`` more fit the cache."""
        return self.used + tokens <= self.capacity

    def room(self, per_iteration: float) -> int:
        """Iterations that adding ``per_iteration`` tokens each fit before the cache is full."""
        return int((self.capacity - self.used) // per_iteration)

    def free(self, stored: float, held: int) -> None:
        """Release a finished or preempted request's ``stored`` tokens and what its admission
        set aside (and its ``per_seq`` units)."""
        self.used -= stored + self.per_seq
        self.committed -= held + self.per_seq

    # -- prefix caching (class doc) ----------------------------------------------
    def pin_cost(self, group: int) -> int:
        """Tokens referencing ``group``'s cached prefix adds to ``used`` and ``committed``:
        its prefix where no live request references it yet (it leaves the evictable room)."""
        return 0 if group in self.refs else self.prefix

    def pin(self, group: int) -> None:
        """One more live request references ``group``'s cached prefix (a hit)."""
        if group in self.refs:
            self.refs[group] += 1
            return
        del self.lru[group]
        self.evictable -= self.prefix
        self.refs[group] = 1
        self.used += self.prefix
        self.committed += self.prefix

    def cache(self, group: int) -> None:
        """``group``'s prefix, just computed by a request that stored it as its own (and set
        it aside), is the group's from now, referenced by that request."""
        self.ready.add(group)
        self.refs[group] = 1

    def unpin(self, group: int) -> None:
        """A request referencing ``group``'s prefix is done with it: where none is left, the
        prefix stays cached, evictable, the most recently released."""
        left = self.refs[group] - 1
        if left:
            self.refs[group] = left
            return
        del self.refs[group]
        self.used -= self.prefix
        self.committed -= self.prefix
        self.lru[group] = None
        self.evictable += self.prefix
        self._evict()

    def _evict(self) -> None:
        """Drop the least recently released cached prefixes until what is stored fits."""
        while self.evictable and self.used + self.evictable > self.capacity:
            group = next(iter(self.lru))
            del self.lru[group]
            self.ready.discard(group)
            self.evictable -= self.prefix


class Request:
    """One request's progress through the scheduler (vLLM's ``Request``)."""

    __slots__ = ("i", "prompt", "done_prompt", "left", "admit", "join_iter", "finish_iter", "live",
                 "held", "cached", "shared", "group", "prefix", "preempted")

    def __init__(self, i: int, prompt: int, out: int, cached: bool = False, prefix: int = 0,
                 group: int = 0):
        self.i, self.prompt = i, prompt
        self.cached = cached  # its prompt's KV arrives computed (disaggregated decode)
        # prefix caching: its prompt's first ``prefix`` tokens are its prefix group's
        # (``deployment.prefix_hit``), served from the cache where the group's is cached;
        # ``shared``: those it references in the group's cache while admitted (0: none, its
        # KV all its own)
        self.prefix, self.group = prefix, group
        self.shared = 0
        self.left = out  # tokens still to generate
        self.done_prompt = 0  # prompt tokens whose KV is computed
        self.admit = 0  # admission order
        self.join_iter = 0  # the iteration its prompt finished (it then decodes)
        self.finish_iter = 0  # the iteration that produces its last token
        self.live = False  # admitted and not finished or preempted
        self.held = 0  # KV tokens its admission set aside (prompt + reserved output)
        self.preempted = False  # preempted once: admitted again, to be recomputed


class Decodes:
    """The decoding sequences as a count, the KV tokens they hold (each reads its own
    context every iteration) and a heap of (finishing iteration, admission, request): one
    iteration of decodes is O(1), never a walk over the sequences. A finished or preempted
    one's KV is freed from ``pool``. Each sequence adds ``gain`` tokens an iteration (1; a
    speculative verify step's mean yield)."""

    __slots__ = ("pool", "count", "context", "heap", "gain")

    def __init__(self, pool: KVPool, gain: float = 1.0) -> None:
        self.pool = pool
        self.gain = gain
        self.count = 0
        self.context = 0.0
        self.heap: list[tuple[int, int, Request]] = []

    def join(self, r: Request, since: int) -> None:
        """``r`` decodes from the iteration after ``since``, one token each, to its last."""
        r.join_iter = since
        r.finish_iter = since + r.left
        heapq.heappush(self.heap, (r.finish_iter, r.admit, r))
        self.count += 1
        self.context += r.prompt

    def advance(self, iterations: int) -> float:
        """Every sequence writes one token per iteration: the tokens they add (the caller
        stores them in the pool with the iteration's prompt chunks)."""
        tokens = self.count * iterations * self.gain
        self.context += tokens
        return tokens

    def held(self, r: Request, it: int) -> float:
        """KV tokens ``r`` holds after iteration ``it``: its prompt and what it decoded."""
        return r.prompt + (it - r.join_iter) * self.gain

    def to_finish(self, it: int) -> int:
        """Iterations from ``it`` (counted in) until the next sequence produces its last token."""
        return self.heap[0][0] - it + 1

    def retire(self, it: int) -> list[Request]:
        """The sequences whose last token iteration ``it`` produced, in the order they finish,
        removed and their cache (the prompt and a token per iteration since they joined) freed."""
        heap = self.heap
        if not heap or heap[0][0] > it:
            return []
        done: list[Request] = []
        while heap and heap[0][0] <= it:
            r = heapq.heappop(heap)[2]
            held = r.prompt + (it - r.join_iter) * self.gain  # self.held(r, it), inlined
            self.count -= 1
            self.context -= held
            self.pool.free(held - r.shared, r.held)
            if r.shared:
                self.pool.unpin(r.group)
            r.live = False
            done.append(r)
        return done

    def remove(self, r: Request, held: float) -> None:
        """Take ``r``, holding ``held`` tokens, out and free its cache (a preemption: rare, so
        a rebuild of the heap)."""
        self.heap = [e for e in self.heap if e[2] is not r]
        heapq.heapify(self.heap)
        self.count -= 1
        self.context -= held
        self.pool.free(held - r.shared, r.held)
        if r.shared:
            self.pool.unpin(r.group)


class Batch:
    """One iteration's work as the scheduler hands it to the model (vLLM's
    ``SchedulerOutput``): every decode, then prompt ``chunks`` within the token ``budget``
    left; ``joined``: requests admitted with their cache computed, decoding from this
    iteration; ``pairs`` and ``prior``: the chunks' causal (query, key) pairs and the KV
    tokens of earlier chunks they re-read (``StepModel.step_seconds``); ``stored``: of the
    ``new_kv`` prompt tokens computed, those stored (all of them: a cached prefix is not
    computed again)."""

    __slots__ = ("budget", "running", "chunks", "joined", "new_kv", "stored", "pairs", "prior", "decoding",
                 "started")

    def __init__(self, budget: int, running: int, decoding: bool = True):
        self.budget = budget
        self.decoding = decoding  # False: a prefill batch alone, the decodes wait (prefill_first)
        self.running = running  # sequences admitted and not finished
        self.chunks: list[tuple[Request, int]] = []
        self.joined: list[Request] = []
        self.new_kv = 0  # prompt tokens the chunks compute
        self.stored = 0
        self.pairs = self.prior = 0.0
        self.started = 0  # requests admitted to prefill here (a vision encoder runs for each)

    def add_chunk(self, r: Request, c: int) -> None:
        """Schedule the next ``c`` tokens of ``r``'s prompt."""
        p = r.done_prompt
        self.chunks.append((r, c))
        self.budget -= c
        self.new_kv += c
        self.stored += c  # its own: a cached prefix is skipped, not computed
        self.pairs += c * p + c * (c + 1) / 2  # causal (query, key) pairs of the chunk
        self.prior += p


class Scheduler:
    """The scheduler of one engine (vLLM V1's ``Scheduler``; SGLang's and TensorRT-LLM's
    in-flight batching schedule the same way): a first-come first-served waiting queue,
    the admitted prompts in admission order, the decodes and the KV cache."""

    __slots__ = ("config", "pool", "waiting", "prefilling", "decodes", "order", "admitted",
                 "preemptions", "cached_tokens")

    def __init__(self, config: SchedulerConfig, pool: KVPool):
        self.config = config
        self.pool = pool
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []  # admitted, prompt not done, in admission order
        self.decodes = Decodes(pool, config.gain)
        self.order: list[Request] = []  # admissions, latest last (lazy: stale entries are skipped)
        self.admitted = 0
        self.preemptions = 0
        # prompt tokens first admissions found computed (prefix cache hits): of the prompts
        # given, not of their recomputation after a preemption
        self.cached_tokens = 0

    def idle(self) -> bool:
        """Nothing waits or runs."""
        return not self.waiting and not self.prefilling and not self.decodes.count

    def _make_room(self, it: int) -> None:
        """The decodes write one more token each: preempt the latest admitted sequence until
        they fit (vLLM V1's FCFS policy, in ``schedule``: ``self.running.pop()``)."""
        dec = self.decodes
        while dec.count and not self.pool.fits(dec.count * dec.gain) and self.order:
            victim = self.order.pop()
            if victim.live:
                self._preempt(victim, it)

    def _preempt(self, victim: Request, it: int) -> None:
        """Free ``victim``'s cache and queue it first to be recomputed from its prompt and
        every token generated so far (vLLM: ``kv_cache_manager.free``,
        ``num_computed_tokens = 0``, ``waiting.prepend_request``)."""
        self.preemptions += 1
        victim.live, victim.preempted = False, True
        if victim in self.prefilling:
            self.prefilling.remove(victim)
            self.pool.free(max(0, victim.done_prompt - victim.shared), victim.held)
            if victim.shared:
                self.pool.unpin(victim.group)
        else:
            held = self.decodes.held(victim, it - 1)  # its prompt and decode steps
            self.decodes.remove(victim, held)
            victim.left = victim.finish_iter - (it - 1)
            victim.prompt = math.ceil(held) + 1
            victim.cached = False
        victim.done_prompt = victim.shared = 0
        self.waiting.appendleft(victim)

    def schedule(self, it: int) -> Batch:
        """Iteration ``it``'s batch: every decode (preempting where the cache cannot hold
        their next tokens), the admitted prompts' next chunks in admission order, then
        admissions from the head of the queue while the budget, ``max_num_seqs`` and the
        cache allow (a request that can never fit is refused)."""
        cfg, waiting = self.config, self.waiting
        if cfg.prefill_first and (self.prefilling or (waiting and not waiting[0].cached)):
            alone = self._fill(Batch(cfg.max_batched_tokens, self.decodes.count + len(self.prefilling),
                                     decoding=False), it)
            if alone.chunks:
                return alone
        if self.decodes.count and not self.pool.fits(self.decodes.count * self.decodes.gain):
            self._make_room(it)
        return self._fill(Batch(cfg.max_batched_tokens - self.decodes.count * cfg.width,
                                self.decodes.count + len(self.prefilling)), it)

    def _fill(self, batch: Batch, it: int) -> Batch:
        """``batch`` with the admitted prompts' next chunks, then admissions from the queue."""
        cfg, waiting = self.config, self.waiting
        for r in self.prefilling:
            c = min(r.prompt - r.done_prompt, batch.budget)
            if c <= 0 or not cfg.schedulable(c, r.prompt - r.done_prompt):
                break
            batch.add_chunk(r, c)
        pool = self.pool
        while waiting and batch.budget > 0 and batch.running < cfg.max_num_seqs:
            r = waiting[0]
            held = cfg.held(r.prompt, r.left)
            if pool.refuses(r.prompt, held):
                waiting.popleft()
                continue
            if r.cached:
                admitted = self._admit_computed(r, held, it, batch)
            elif r.prefix and r.group in pool.ready:  # its group's prefix is cached
                admitted = self._admit_hit(r, batch) or self._admit_prompt(r, held, batch)
            else:
                admitted = self._admit_prompt(r, held, batch)
            if not admitted:
                break
        return batch

    def _admit(self, r: Request, held: int, batch: Batch, stored: int = 0) -> None:
        """Take ``r`` off the queue into the running batch."""
        self.waiting.popleft()
        self.pool.allocate(held, stored)
        r.held = held
        r.admit, r.live = self.admitted, True
        self.admitted += 1
        self.order.append(r)
        batch.running += 1

    def _admit_prompt(self, r: Request, held: int, batch: Batch) -> bool:
        """Admit ``r`` with its prompt's first chunk, where it fits; its KV all its own."""
        c = min(r.prompt, batch.budget)
        if not self.config.schedulable(c, r.prompt) or not self.pool.can_admit(batch.stored + c, held):
            return False
        self._admit(r, held, batch)
        self.prefilling.append(r)
        batch.add_chunk(r, c)
        batch.started += 1
        return True

    def _admit_hit(self, r: Request, batch: Batch) -> bool:
        """Admit ``r`` past its prefix, cached (a prefix cache hit), referencing the group's
        prefix while it runs, where that and the rest of its prompt's first chunk fit (else
        the caller admits it as any other)."""
        pool, shared = self.pool, r.prefix
        cost = pool.pin_cost(r.group)
        own = r.prompt - shared
        held = self.config.held(own, r.left)
        c = min(own, batch.budget)
        if (pool.refuses(own + cost, held + cost) or not self.config.schedulable(c, own)
                or not pool.can_admit(batch.stored + c + cost, held + cost)):
            return False
        r.shared = r.done_prompt = shared
        if not r.preempted:
            self.cached_tokens += shared
        pool.pin(r.group)
        self._admit(r, held, batch)
        self.prefilling.append(r)
        batch.add_chunk(r, c)
        batch.started += 1
        return True

    def _admit_computed(self, r: Request, held: int, it: int, batch: Batch) -> bool:
        """Admit ``r`` whose prompt's KV arrives computed (a disaggregated deployment's
        decode instance): it takes its prompt's cache and decodes from this iteration."""
        if not self.pool.can_admit(batch.stored + r.prompt + 1, held):
            return False
        r.done_prompt = r.prompt
        self._admit(r, held, batch, stored=r.prompt)
        self.decodes.join(r, it - 1)
        batch.budget -= self.config.width
        batch.joined.append(r)
        return True

    def computed(self, batch: Batch) -> list[Request]:
        """Record the batch's prompt chunks as computed: the requests whose prompt is done."""
        done: list[Request] = []
        pool = self.pool
        for r, c in batch.chunks:
            r.done_prompt += c
            if (pool.prefix and not r.shared and r.done_prompt >= pool.prefix
                    and r.group not in pool.ready):
                # it computed its group's whole prefix, which no one has cached: the
                # prefix's KV (stored and set aside as its own) is the group's from now
                pool.cache(r.group)
                r.shared = pool.prefix
                r.held -= pool.prefix
            if r.done_prompt >= r.prompt:
                done.append(r)
        return done

    def prompt_done(self, r: Request, it: int) -> bool:
        """``r``'s prompt finished in iteration ``it`` with its first token: it decodes from
        the next, or, where that was its only token, finishes (True) and frees its cache."""
        self.prefilling.remove(r)
        r.left -= 1
        if r.left <= 0:
            self.pool.free(r.prompt - r.shared, r.held)
            if r.shared:
                self.pool.unpin(r.group)
            r.live = False
            return True
        self.decodes.join(r, it)
        return False
