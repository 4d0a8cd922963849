"""A discrete-event simulator of a pipeline step.

Each stage runs its operations in the order its schedule gives; an operation
starts when the stage is free and its dependency has finished: F of virtual
stage k after F of k - 1 (same microbatch), B of k after B of k + 1, and B of
the last virtual stage after its own F. Point-to-point transfers are blocking
(Megatron-LM's non-interleaved 1F1B sends and receives synchronously), so they
are part of an operation's duration. Times are per stage and per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from autoplan.schedules.orders import stage_orders as orders_for
from autoplan.vocab import Schedule


@dataclass(frozen=True, slots=True)
class SimResult:
    makespan: float  # seconds from the first forward to the last backward
    busy: tuple[float, ...]  # seconds each stage computes (or transfers)
    finish: tuple[float, ...]  # when each stage ends its last operation
    peak_inflight: tuple[int, ...]  # most (microbatch, chunk) activations held per stage


def simulate_exact(
    schedule: Schedule,
    forward: Sequence[float],
    backward: Sequence[float],
    m: int,
    v: int = 1,
) -> SimResult:
    """Simulate every operation. ``forward[s]``/``backward[s]``: one chunk's time on stage s."""
    p = len(forward)
    orders = _compiled_orders(schedule, p, m, v)
    last_vs = p * v - 1
    nan = float("nan")
    f_end = [[nan] * m for _ in range(p * v)]  # [virtual stage][microbatch] -> end time
    b_end = [[nan] * m for _ in range(p * v)]
    pos = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    held = [0] * p
    peak = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            order, i, t = orders[s], pos[s], free[s]
            n = len(order)
            while i < n:
                is_f, j, vs = order[i]
                if is_f:
                    ready = 0.0 if vs == 0 else f_end[vs - 1][j]
                else:
                    ready = f_end[vs][j] if vs == last_vs else b_end[vs + 1][j]
                if ready != ready:  # NaN: the dependency has not run yet
                    break
                if is_f:
                    t = (t if t > ready else ready) + forward[s]
                    f_end[vs][j] = t
                    held[s] += 1
                    if held[s] > peak[s]:
                        peak[s] = held[s]
                else:
                    t = (t if t > ready else ready) + backward[s]
                    b_end[vs][j] = t
                    held[s] -= 1
                i += 1
            if i != pos[s]:
                remaining -= i - pos[s]
                done_f = sum(1 for k in range(pos[s], i) if order[k][0])
                busy[s] += done_f * forward[s] + (i - pos[s] - done_f) * backward[s]
                pos[s], free[s] = i, t
                progressed = True
        assert progressed, f"{schedule.value}: operation order deadlocks (p={p}, m={m}, v={v})"
    return SimResult(max(free), tuple(busy), tuple(free), tuple(peak))


@lru_cache(maxsize=256)
def _compiled_orders(schedule: Schedule, p: int, m: int, v: int) -> tuple[tuple, ...]:
    """Operation orders as (is_forward, microbatch, virtual stage) tuples."""
    return tuple(
        tuple((kind == "F", j, chunk * p + s) for kind, j, chunk in order)
        for s, order in enumerate(orders_for(schedule, p, m, v))
    )


@lru_cache(maxsize=4096)
def simulate(
    schedule: Schedule,
    forward: tuple[float, ...],
    backward: tuple[float, ...],
    m: int,
    v: int = 1,
) -> SimResult:
    """Memoized :func:`simulate_exact`. Every operation is simulated: extrapolating
    long runs from short ones is not exact for uneven stages (the max-plus
    transient can outlast several periods), and the search bounds before it
    simulates, so few simulations run."""
    return simulate_exact(schedule, forward, backward, m, v)
