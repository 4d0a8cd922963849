"""A discrete-event simulator of a pipeline step.

Each stage runs its operations in the order its schedule gives
(:mod:`autoplan.schedules.orders`); an operation starts when the stage is free
and its dependency has finished:

* F of virtual stage k after F of k - 1 (same microbatch);
* B of k after B of k + 1, and B of the last virtual stage after its own F;
* W after the B of the same (virtual stage, microbatch), on the same stage.

Durations are per stage and per chunk: ``forward[s]``, ``backward_input[s]``,
``backward_weight[s]`` are one chunk's F, B and W on stage s. Schedules that
do not split the backward (GPipe, 1F1B, interleaved) run B and W as one
operation of b + w, reported as kind "B". Point-to-point transfers are part of
the durations (blocking sends, as in Megatron-LM's non-interleaved 1F1B); a
``p2p_latency_s`` can instead delay every dependency that crosses stages
without occupying either stage, which is how Qi et al. 2024 (Sec. 5.3,
Appendix G, Eq. 4-5) count T_comm.

Activation accounting, in (microbatch, chunk) activations per stage: +1 when
an F finishes; -1 when the fused B finishes, or for split schedules when the W
finishes. W still needs the layer inputs and the output gradients B saved, so
a microbatch between B and W is counted as held: conservative, since Qi et al.
2024 (Table 1) put W's memory M_W below B's M_B. ``memory.peak_inflight`` gives
the same peaks in closed form.

Orders given to :func:`compile_orders` are checked: each (kind, virtual stage,
microbatch) exactly once, on the stage that holds that chunk; the schedules' own
orders are checked so by the tests, over every schedule and a grid of (p, m, v),
and compiled unchecked for the search. An order whose dependencies cannot all be
met (a deadlock, or a W before its own B) fails an assertion when simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.caches import memo
from autoplan.schedules.events import Event
from autoplan.schedules.orders import Op, chunks_per_stage, stage_orders, virtual_stage
from autoplan.schedules.registry import Schedule

KINDS = ("F", "B", "W")
F, B, W = 0, 1, 2  # kind codes in compiled orders

# A compiled operation: (kind code, the end-time slot it waits on, the slot its end goes
# to, 1 if its dependency is on another stage else 0, virtual stage, microbatch, chunk).
# F of (virtual stage vs, microbatch j) ends in slot vs*m + j, B in (V + vs)*m + j; slot
# 2Vm is always 0.0 (no dependency) and 2Vm + 1 takes W's ends (nothing waits on W).
CompiledOp = tuple[int, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class SimResult:
    makespan: float  # seconds from the first forward to the end of the last operation
    busy: tuple[float, ...]  # seconds each stage computes (or transfers)
    finish: tuple[float, ...]  # when each stage ends its last operation
    peak_inflight: tuple[int, ...]  # most (microbatch, chunk) activations held per stage
    events: tuple[Event, ...] = ()  # every operation, only when simulated with trace=True


@dataclass(frozen=True, slots=True)
class Compiled:
    """Operation orders ready to simulate, checked once."""

    orders: tuple[tuple[CompiledOp, ...], ...]  # per stage
    virtual_stages: int
    split: bool  # B and W are separate operations
    counts: tuple[tuple[int, int, int], ...]  # per stage: number of F, B, W
    homed: tuple[tuple[int, ...], ...]  # per stage: the virtual stages it runs


def compile_orders(schedule: Schedule, p: int, m: int, v: int,
                   orders: Sequence[Sequence[Op]], check: bool = True) -> Compiled:
    """Check ``orders`` (one list of (kind, microbatch, chunk) per stage) and compile them.

    Asserts that every operation the schedule needs appears exactly once, on the
    stage that holds its chunk, and nothing else does. ``check=False`` compiles
    without those checks: for the schedules' own orders, which the tests check
    over every schedule and a grid of (p, m, v) (``_compiled_orders``)."""
    assert len(orders) == p, f"{schedule.value}: {len(orders)} stage orders for p={p}"
    chunks = chunks_per_stage(schedule, v)
    vstages = p * chunks
    split = schedule.splits_backward
    kinds = KINDS if split else KINDS[:2]
    codes = {kind: KINDS.index(kind) for kind in kinds}
    home = [-1] * vstages
    placed = [[virtual_stage(schedule, p, s, c) for c in range(chunks)] for s in range(p)]
    for s in range(p):
        for c in range(chunks):
            home[placed[s][c]] = s
    assert -1 not in home, f"{schedule.value}: placement misses a virtual stage"
    seen: set[tuple[int, int, int]] = set()
    out = []
    counts = []
    none, sink = 2 * vstages * m, 2 * vstages * m + 1  # the slots of ``CompiledOp``
    for s, order in enumerate(orders):
        ops = []
        n = [0, 0, 0]
        here = placed[s]
        for kind, j, c in order:
            if check:
                assert kind in kinds, f"{schedule.value}: stage {s} runs {kind!r}; kinds are {kinds}"
                assert 0 <= j < m and 0 <= c < chunks, (
                    f"{schedule.value}: stage {s} runs {kind}{j} of chunk {c} (m={m}, {chunks} chunks)")
            code, vs = codes[kind], here[c]
            if check:
                assert (code, vs, j) not in seen, f"{schedule.value}: {kind}{j} of chunk {c} runs twice"
                seen.add((code, vs, j))
            if code == F:
                cross = int(vs > 0 and home[vs - 1] != s)
                dep, end = ((vs - 1) * m + j if vs else none), vs * m + j
            elif code == B:
                cross = int(vs < vstages - 1 and home[vs + 1] != s)
                dep = vs * m + j if vs == vstages - 1 else (vstages + vs + 1) * m + j
                end = (vstages + vs) * m + j
            else:
                cross = 0
                dep, end = (vstages + vs) * m + j, sink
            ops.append((code, dep, end, cross, vs, j, c))
            n[code] += 1
        out.append(tuple(ops))
        counts.append((n[0], n[1], n[2]))
    if check:
        missing = len(kinds) * vstages * m - len(seen)
        assert not missing, f"{schedule.value}: {missing} operations never run (p={p}, m={m}, v={v})"
    return Compiled(tuple(out), vstages, split, tuple(counts),
                    tuple(tuple({op[4] for op in ops}) for ops in out))


@memo(256)
def _compiled_orders(schedule: Schedule, p: int, m: int, v: int) -> Compiled:
    """The schedule's own orders, compiled (raises ValueError for an undefined (p, m, v))
    without the checks, which the tests make of every schedule's orders."""
    return compile_orders(schedule, p, m, v, stage_orders(schedule, p, m, v), check=False)


def simulate_exact(
    schedule: Schedule,
    forward: Sequence[float],
    backward_input: Sequence[float],
    backward_weight: Sequence[float],
    m: int,
    v: int = 1,
    trace: bool = False,
    *,
    p2p_latency_s: float = 0.0,
    per_chunk: bool = False,
) -> SimResult:
    """Simulate every operation of one step on ``len(forward)`` stages.

    ``forward[s]``, ``backward_input[s]``, ``backward_weight[s]``: one chunk's F, B,
    W time on stage s; with ``per_chunk``, one per virtual stage (``p * v`` of each:
    chunks of their own sizes), the time of each model chunk.
    ``trace`` records every operation as an :class:`Event`.
    Raises ValueError where the schedule is not defined (see ``orders.check``)."""
    n = len(forward)
    assert len(backward_input) == n == len(backward_weight), "one duration per stage and kind"
    p = n // v if per_chunk else n
    assert not per_chunk or p * v == n, "per_chunk: one duration per virtual stage (p*v)"
    return run(_compiled_orders(schedule, p, m, v), schedule, forward, backward_input,
               backward_weight, m, trace, p2p_latency_s, per_chunk)


def run(compiled: Compiled, schedule: Schedule, forward: Sequence[float],
        backward_input: Sequence[float], backward_weight: Sequence[float], m: int,
        trace: bool = False, p2p_latency_s: float = 0.0, per_chunk: bool = False,
        times: list[list[tuple[float, float]]] | None = None) -> SimResult:
    """Simulate compiled orders (see :func:`simulate_exact`). ``times``: one empty list
    per stage, filled with each operation's (start, end) in the stage's compiled order
    (what :func:`critical_chain` walks; no events built, sweeps as without a trace).

    Each stage runs its next operations until one waits on an operation not yet run,
    in sweeps over the stages until all have run. An operation's end is a function of
    its dependency's end and its stage's previous one only, so the order of the sweeps
    changes no time: they alternate direction (a backward's dependency lies on the next
    stage, so a backward sweep carries a gradient down the pipeline in one sweep), but
    for a trace, whose events are listed in the order run."""
    # per_chunk: durations by virtual stage, B fused with W unless the schedule splits
    split = compiled.split
    fused = [bi if split else bi + wi
             for bi, wi in zip(backward_input, backward_weight, strict=True)] if per_chunk else []
    by_chunk = [(f, b, w) for f, b, w in zip(forward, fused, backward_weight, strict=True)
                ] if per_chunk else []
    p = len(compiled.orders)
    lat = p2p_latency_s
    # held microbatch-chunks: +1 at F, -1 at the fused B or at W
    change = (1, 0 if split else -1, -1)
    slots = 2 * compiled.virtual_stages * m
    end = [float("nan")] * (slots + 2)  # NaN: not run yet
    end[slots] = 0.0  # what an operation without a dependency waits for
    pos = [0] * p
    free = [0.0] * p
    held = [0] * p
    peak = [0] * p
    log: list[tuple[int, int, int, int, float, float]] = []
    record = trace or times is not None
    remaining = sum(len(o) for o in compiled.orders)
    ahead, back = range(p), range(p - 1, -1, -1)
    sweep = 0
    while remaining:
        progressed = False
        for s in (back if sweep & 1 and not trace else ahead):
            order, i = compiled.orders[s], pos[s]
            n = len(order)
            if i == n:
                continue
            t, h, top = free[s], held[s], peak[s]
            durations = (forward[s], backward_input[s] if split else
                         backward_input[s] + backward_weight[s], backward_weight[s])
            while i < n:
                kind, dep, out, cross, vs, j, c = order[i]
                ready = end[dep]
                if ready != ready:  # NaN: the dependency has not run yet
                    break
                if cross:
                    ready += lat
                start = t if t > ready else ready
                t = start + (by_chunk[vs] if per_chunk else durations)[kind]
                end[out] = t
                h += change[kind]
                if h > top:
                    top = h
                if record:
                    log.append((s, kind, j, c, start, t))
                i += 1
            if i != pos[s]:
                remaining -= i - pos[s]
                pos[s], free[s], held[s], peak[s] = i, t, h, top
                progressed = True
        assert progressed, f"{schedule.value}: operation order deadlocks ({_stuck(compiled, pos)})"
        sweep += 1
    if per_chunk:  # each virtual stage runs m of each kind on its home stage
        busy = tuple(m * sum(forward[vs] + fused[vs] + (backward_weight[vs] if split else 0.0)
                             for vs in homed)
                     for homed in compiled.homed)
    else:
        busy = tuple(nf * forward[s] + nb * (backward_input[s] if split else
                                              backward_input[s] + backward_weight[s])
                     + nw * backward_weight[s]
                     for s, (nf, nb, nw) in enumerate(compiled.counts))
    if times is not None:
        for s, _, _, _, a, b in log:
            times[s].append((a, b))
    events = tuple(Event(s, KINDS[k], j, c, a, b) for s, k, j, c, a, b in log) if trace else ()
    return SimResult(max(free), busy, tuple(free), tuple(peak), events)


@dataclass(frozen=True, slots=True)
class Chain:
    """Operations on one dependency chain of a step, counted per virtual stage: each
    follows the one before it on the same stage or depends on it. Whatever the
    durations, no operation starts before its predecessor on a chain ends, so the
    makespan is at least the chain's total duration (:meth:`length`)."""

    counts: tuple[tuple[int, int, int], ...]  # per virtual stage: F, B, W on the chain
    home: tuple[int, ...]  # per virtual stage: the pipeline stage that runs it
    split: bool  # B and W are separate operations (else B runs b + w)

    def length(self, forward: Sequence[float], backward_input: Sequence[float],
               backward_weight: Sequence[float], per_chunk: bool = False) -> float:
        """Seconds of the chain's operations, durations as :func:`simulate_exact` takes them."""
        total = 0.0
        for vs, (nf, nb, nw) in enumerate(self.counts):
            i = vs if per_chunk else self.home[vs]
            b = backward_input[i] if self.split else backward_input[i] + backward_weight[i]
            total += nf * forward[i] + nb * b + nw * backward_weight[i]
        return total


@memo(1024)
def critical_chain(schedule: Schedule, p: int, m: int, v: int = 1) -> Chain:
    """The critical path of the step with equal durations (F = B = W = 1; B + W = 2
    where fused), walked back from the last operation to end through, at each
    operation, whatever made it start when it did: its dependency, else the operation
    before it on its stage. A lower bound of the makespan for any durations
    (``Chain.length``), tight where the stages are near equal."""
    compiled = _compiled_orders(schedule, p, m, v)
    ones = (1.0,) * p
    # per stage, (start, end) of its operations in its compiled order
    per_stage: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    run(compiled, schedule, ones, ones, ones, m, times=per_stage)
    where: dict[int, tuple[int, int]] = {}  # end-time slot -> (stage, index) of its op
    home = [0] * compiled.virtual_stages
    for s, order in enumerate(compiled.orders):
        for i, (_, _, end, _, vs, _, _) in enumerate(order):
            where[end] = (s, i)
            home[vs] = s
    counts = [[0, 0, 0] for _ in range(compiled.virtual_stages)]
    s = max(range(p), key=lambda q: per_stage[q][-1][1] if per_stage[q] else -1.0)
    i = len(per_stage[s]) - 1
    while True:
        kind, dep, _, _, vs, _, _ = compiled.orders[s][i]
        counts[vs][kind] += 1
        start = per_stage[s][i][0]
        found = where.get(dep)  # none for the first F (its slot is no op's end)
        if found is not None:
            ds, di = found
            if per_stage[ds][di][1] == start:
                s, i = ds, di
                continue
        if i == 0:
            break
        assert per_stage[s][i - 1][1] == start, "an operation starts when nothing ends"
        i -= 1
    return Chain(tuple((a, b, c) for a, b, c in counts), tuple(home), compiled.split)


def _stuck(compiled: Compiled, pos: list[int]) -> str:
    """Each unfinished stage's next operation, e.g. 'stage 1 waits to run B0 of chunk 0'."""
    waits = []
    for s, order in enumerate(compiled.orders):
        if pos[s] < len(order):
            kind, _, _, _, _, j, c = order[pos[s]]
            waits.append(f"stage {s} waits to run {KINDS[kind]}{j} of chunk {c}")
    return "; ".join(waits)


@memo(4096)
def simulate(
    schedule: Schedule,
    forward: tuple[float, ...],
    backward_input: tuple[float, ...],
    backward_weight: tuple[float, ...],
    m: int,
    v: int = 1,
    *,
    p2p_latency_s: float = 0.0,
    per_chunk: bool = False,
) -> SimResult:
    """Memoized :func:`simulate_exact` without a trace. Every operation is simulated:
    extrapolating long runs from short ones is not exact for uneven stages (the
    max-plus transient can outlast several periods), and the search bounds before
    it simulates, so few simulations run."""
    return simulate_exact(schedule, forward, backward_input, backward_weight, m, v,
                          p2p_latency_s=p2p_latency_s, per_chunk=per_chunk)
