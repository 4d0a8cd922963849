"""What every axis module shares: the shape of a rule of a valid plan."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autoplan.plan import Plan


class Scope(enum.IntEnum):
    """What of a plan a rule reads, in the order the search fixes those choices: a rule
    of scope S can be decided once everything up to S is chosen."""

    JOB = 0
    """The job and the cluster's device (precision support)."""
    LAYOUT = 1
    """The degrees dp, tp, pp, cp, ep, etp (vpp = 1) against model, job and cluster."""
    CP_COMM = 2
    """How context parallelism exchanges the sequence."""
    MICRO_BATCH = 3
    """The micro-batch size."""
    SEQUENCE_PARALLEL = 4
    """The sequence-parallel flag."""
    SCHEDULE = 5
    """The pipeline schedule and its vpp (the microbatch count follows from above)."""
    STAGES = 6
    """An explicit layer-to-stage split."""
    OFFLOAD = 7
    """What goes to host memory (chosen beside ZeRO and recompute; the search generates
    only offload choices that pass, ``offload_choices``)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a valid plan. ``id`` is stable (scripts and search statistics key on
    it); ``field`` is the plan field a broken rule is reported on; ``summary`` states the
    rule in general; ``broken`` returns the message for one plan, or None if it holds."""

    id: str
    field: str
    scope: Scope
    summary: str
    broken: Callable[[Plan], str | None]


def divisors(n: int) -> list[int]:
    """Every degree that divides ``n``, ascending (the pairs d, n/d with d up to sqrt(n):
    a 262,144-GPU sweep asks it thousands of times)."""
    return list(_divisors(n))


@functools.lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return (*small, *reversed(large))


def capped_divisors(n: int, cap: int) -> list[int]:
    """Divisors of ``n`` up to ``cap``: the degrees a space allows for one axis."""
    return [d for d in divisors(n) if d <= cap]
