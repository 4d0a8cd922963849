"""Each schedule is a generator of per-stage operation orders.

An operation is (kind, microbatch, chunk): kind "F" or "B"; chunk is the model
chunk on this stage (0 unless interleaved). Virtual stage of (stage s, chunk c)
is c * p + s, as in Megatron-LM's interleaved schedule.
"""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.vocab import Schedule

Op = tuple[str, int, int]


def gpipe(stage: int, p: int, m: int) -> Iterator[Op]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    yield from (("F", j, 0) for j in range(m))
    yield from (("B", j, 0) for j in range(m))


def one_f_one_b(stage: int, p: int, m: int) -> Iterator[Op]:
    """PipeDream-Flush (Narayanan et al. 2021, Fig. 4 top): p - s - 1 warm-up
    forwards, then alternate one forward and one backward, then drain."""
    warmup = min(p - stage - 1, m)
    yield from (("F", j, 0) for j in range(warmup))
    for j in range(m - warmup):
        yield ("F", warmup + j, 0)
        yield ("B", j, 0)
    yield from (("B", j, 0) for j in range(m - warmup, m))


def interleaved(stage: int, p: int, m: int, v: int) -> Iterator[Op]:
    """Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2), in the order of
    Megatron-LM's ``forward_backward_pipelining_with_interleaving``: microbatches
    go through chunks in groups of p; warm-up is 2(p - s - 1) + (v - 1)p."""
    total = m * v

    def op(kind: str, k: int) -> Op:
        in_group = k % (p * v)
        chunk = in_group // p
        if kind == "B":
            chunk = v - 1 - chunk
        return (kind, (k // (p * v)) * p + k % p, chunk)

    warmup = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)
    yield from (op("F", k) for k in range(warmup))
    for k in range(total - warmup):
        yield op("F", warmup + k)
        yield op("B", k)
    yield from (op("B", k) for k in range(total - warmup, total))


def stage_orders(schedule: Schedule, p: int, m: int, v: int = 1) -> list[list[Op]]:
    if schedule is Schedule.GPIPE:
        return [list(gpipe(s, p, m)) for s in range(p)]
    if schedule is Schedule.ONE_F_ONE_B:
        return [list(one_f_one_b(s, p, m)) for s in range(p)]
    if schedule is Schedule.INTERLEAVED:
        return [list(interleaved(s, p, m, v)) for s in range(p)]
    raise ValueError(f"no operation order for schedule {schedule.value}")
