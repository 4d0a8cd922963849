"""Peak in-flight activations per stage.

The count is in (microbatch, chunk) activations, as the simulator keeps it
(see :mod:`autoplan.schedules.simulator`): +1 when an F finishes, -1 when its
fused B finishes or, for schedules that split the backward, when its W
finishes. A stage's count depends only on its own operation order, never on
durations, so each schedule's closed form (its file's ``peak``) is exact for any stage
times; where a schedule gives none the order is walked. The tests check both against
the simulator for random p, m and durations.

A chunk holds 1/v of the stage's layers, so the activation memory in
microbatches of a whole stage is ``peak_inflight / v`` (V-shape: / 2).
"""

from __future__ import annotations

from autoplan.caches import memo
from autoplan.schedules.orders import check, stage_orders
from autoplan.schedules.registry import Schedule


@memo(65536)
def peak_inflight(schedule: Schedule, p: int, m: int, v: int, stage: int) -> int:
    """Most (microbatch, chunk) activations stage ``stage`` of p holds at once: the
    schedule's closed form (see each schedule's file), else its order walked."""
    check(schedule, p, m, v)
    assert 0 <= stage < p, f"stage {stage} of {p}"
    closed = schedule.spec.peak_inflight
    if closed is not None:
        return closed(p, m, v, stage)
    return round(_walk(schedule, p, m, v, stage, None))


@memo(4096)
def peak_held(schedule: Schedule, p: int, m: int, v: int, stage: int,
              weights: tuple[float, ...]) -> float:
    """Most activation bytes ``stage`` holds at once when its chunk c keeps ``weights[c]``
    per microbatch: :func:`peak_inflight` with chunks of their own sizes."""
    return _walk(schedule, p, m, v, stage, weights)


def _walk(schedule: Schedule, p: int, m: int, v: int, stage: int,
          weights: tuple[float, ...] | None) -> float:
    """Walks the stage's operation order (+ at an F, - at its fused B or at its W), which
    like the count does not depend on durations; ``weights`` None counts one per chunk."""
    split = schedule.splits_backward
    held = peak = 0.0
    for kind, _, c in stage_orders(schedule, p, m, v)[stage]:
        if kind == "F":
            held += 1.0 if weights is None else weights[c]
            peak = max(peak, held)
        elif kind == "W" or not split:
            held -= 1.0 if weights is None else weights[c]
    return peak
