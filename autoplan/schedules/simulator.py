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

from autoplan.schedules.orders import stage_orders
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
    orders = stage_orders(schedule, p, m, v)
    last_vs = p * v - 1
    f_end: dict[tuple[int, int], float] = {}  # (virtual stage, microbatch) -> end time
    b_end: dict[tuple[int, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    held = [0] * p
    peak = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            order = orders[s]
            while pos[s] < len(order):
                kind, j, chunk = order[pos[s]]
                vs = chunk * p + s
                if kind == "F":
                    ready = 0.0 if vs == 0 else f_end.get((vs - 1, j))
                    duration = forward[s]
                else:
                    ready = f_end.get((vs, j)) if vs == last_vs else b_end.get((vs + 1, j))
                    duration = backward[s]
                if ready is None:
                    break
                end = max(free[s], ready) + duration
                free[s] = end
                busy[s] += duration
                if kind == "F":
                    f_end[(vs, j)] = end
                    held[s] += 1
                    peak[s] = max(peak[s], held[s])
                else:
                    b_end[(vs, j)] = end
                    held[s] -= 1
                pos[s] += 1
                remaining -= 1
                progressed = True
        assert progressed, f"{schedule.value}: operation order deadlocks (p={p}, m={m}, v={v})"
    return SimResult(max(free), tuple(busy), tuple(free), tuple(peak))


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
