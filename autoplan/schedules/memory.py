"""Peak in-flight activations per stage, in closed form.

The count is in (microbatch, chunk) activations, as the simulator keeps it
(see :mod:`autoplan.schedules.simulator`): +1 when an F finishes, -1 when its
fused B finishes or, for schedules that split the backward, when its W
finishes. A stage's count depends only on its own operation order, never on
durations, so each formula below is exact for any stage times; the tests check
them against the simulator for random p, m and durations.

A chunk holds 1/v of the stage's layers, so the activation memory in
microbatches of a whole stage is ``peak_inflight / v`` (V-shape: / 2).
"""

from __future__ import annotations

from autoplan.caches import memo
from autoplan.schedules.orders import PERIOD, check, stage_orders, v_block
from autoplan.vocab import Schedule


@memo(65536)
def peak_inflight(schedule: Schedule, p: int, m: int, v: int, stage: int) -> int:
    """Most (microbatch, chunk) activations stage ``stage`` of p holds at once.

    * GPipe: m (all forwards before any backward).
    * 1F1B: min(p - s, m) (Narayanan et al. 2021, Sec. 2.2.1).
    * interleaved: warm-up 2(p - s - 1) + (v - 1)p plus one, at most m*v; all m*v
      when m = p (Megatron-LM runs every forward first then).
    * ZB-H1: min(p, m) on every stage: p - s awaiting B plus s awaiting W
      (Qi et al. 2024, Sec. 2.3: (p - i + 1)M_B + (i - 1)M_W for worker i = s + 1).
      Stage 0 holds what 1F1B's stage 0 does; later stages hold more than 1F1B's,
      but W-only activations (M_W) are smaller than M_B.
    * ZB-H2: min(2p - 1, m) on every stage ((2p - 2i + 1)M_B + (2i - 2)M_W).
    * ZB-V: min(2p - s - 1, m) + min(s + 1, m); 2p when m >= 2p - 1, i.e. p
      microbatches of the whole stage, 1F1B's stage-0 memory (Qi et al. 2024, Sec. 6).
    * V-Half, V-Min: the building block's activations alive at once (lifespan over
      the repeating interval, as Qi et al. 2024b bound it); see :func:`block_peak`.
      For m large the most loaded stage holds 2 * ((p + 2) // 2) (V-Half) and
      2 * ((p + 4) // 3) (V-Min) chunk activations.
    """
    check(schedule, p, m, v)
    assert 0 <= stage < p, f"stage {stage} of {p}"
    s = stage
    if schedule is Schedule.GPIPE:
        return m
    if schedule is Schedule.ONE_F_ONE_B:
        return min(p - s, m)
    if schedule is Schedule.INTERLEAVED:
        if m == p:
            return m * v
        return min(2 * (p - s - 1) + (v - 1) * p + 1, m * v)
    if schedule is Schedule.ZB_H1:
        return min(p, m)
    if schedule is Schedule.ZB_H2:
        return min(2 * p - 1, m)
    if schedule is Schedule.ZB_V:
        return min(2 * p - s - 1, m) + min(s + 1, m)
    if schedule in (Schedule.V_HALF, Schedule.V_MIN):
        return block_peak(schedule, p, m, s)
    raise ValueError(f"no in-flight count for schedule {schedule.value}")


def block_peak(schedule: Schedule, p: int, m: int, stage: int) -> int:
    """Peak of a repeated building block (V-Half, V-Min).

    Chunk c's activation of microbatch j lives from its F's slot a_c + 6j to its
    W's slot e_c + 6j, so after slot t the stage holds
    sum_c #{j < m : a_c + 6j <= t < e_c + 6j}. The count only rises at an F, and
    from the microbatch K = ceil(max lifespan / 6) + 1 on it repeats with period
    6 (or falls, once m cuts it), so the maximum over the F slots of the first
    min(m, K + 1) microbatches is the peak: O(p) work, independent of m."""
    f0, f1, _, _, w1, w0 = v_block(schedule, stage, p)
    lives = ((f0, w0), (f1, w1))
    horizon = -(-max(e - a for a, e in lives) // PERIOD) + 1
    best = 0
    for a_first, _ in lives:
        for k in range(min(m - 1, horizon) + 1):
            t = a_first + PERIOD * k
            alive = sum(max(0, min(m - 1, (t - a) // PERIOD) - max(-1, (t - e) // PERIOD))
                        for a, e in lives)
            best = max(best, alive)
    return best


@memo(4096)
def peak_held(schedule: Schedule, p: int, m: int, v: int, stage: int,
              weights: tuple[float, ...]) -> float:
    """Most activation bytes ``stage`` holds at once when its chunk c keeps ``weights[c]``
    per microbatch: :func:`peak_inflight` with chunks of their own sizes. Walks the
    stage's operation order (+ at an F, - at its fused B or at its W), which like the
    count does not depend on durations."""
    split = schedule.splits_backward
    held = peak = 0.0
    for kind, _, c in stage_orders(schedule, p, m, v)[stage]:
        if kind == "F":
            held += weights[c]
            peak = max(peak, held)
        elif kind == "W" or not split:
            held -= weights[c]
    return peak
