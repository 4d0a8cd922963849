"""ZB-H2 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 2.2)."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register


def zb_h2(stage: int, p: int, m: int, v: int = 1) -> Iterator[Op]:
    """ZB-H2 (Qi et al. 2024, Sec. 2.2, Fig. 3 bottom): 2(p - s) - 1 warm-up
    forwards fill the wait for the first B; then B, W, F with every stage's W
    running 2s microbatches late, which turns the tail into a parallelogram.
    Each stage holds min(2p - 1, m) microbatches. For m >= 2p - 1 each stage
    idles (p - 1)(F + B - 2W) between its first and last operation (Table 2;
    exact when 2W <= F + B), zero when F = B = W; the step's makespan still
    includes the (p - 1)F fill, which only the paper's optimizer post-validation
    (Sec. 4) overlaps with the previous step. Any m >= 1 (smaller m: bubbles)."""
    warmup = min(2 * (p - stage) - 1, m)
    pending: list[int] = []
    yield from (("F", j, 0) for j in range(warmup))
    for j in range(m):
        yield ("B", j, 0)
        pending.append(j)
        if len(pending) > 2 * stage:
            yield ("W", pending.pop(0), 0)
        if warmup + j < m:
            yield ("F", warmup + j, 0)
    yield from (("W", j, 0) for j in pending)


def peak(p: int, m: int, v: int, stage: int) -> int:
    """min(2p - 1, m) on every stage ((2p - 2i + 1)M_B + (2i - 2)M_W)."""
    return min(2 * p - 1, m)


ZB_H2 = register(ScheduleSpec(
    name="zb-h2", attr="ZB_H2",
    doc="Zero-bubble, about twice 1F1B's activation memory (Qi et al. 2024).",
    chunks=Chunks.ONE, splits_backward=True, stage_order=zb_h2, peak_inflight=peak))
