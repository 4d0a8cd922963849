"""ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 2.1): 1F1B's memory."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register


def zb_h1(stage: int, p: int, m: int, v: int = 1) -> Iterator[Op]:
    """ZB-H1 (Qi et al. 2024, Sec. 2.1, Fig. 3 top): 1F1B's p - s - 1 warm-up
    forwards, then F, B and a W that runs s microbatches late, so every stage
    holds min(p, m) microbatches (those awaiting B or W); the late W fill the
    tail. For m >= p and W <= F the bubble is exactly (p - 1)(F + B - W)
    (Table 2), a third of 1F1B's (p - 1)(F + B + W) when F = B = W; for m <= p
    the step takes (m + p - 1)(F + B) + W (Appendix H). Any m >= 1."""
    warmup = min(p - stage - 1, m)
    pending: list[int] = []  # microbatches whose B ran and W has not
    yield from (("F", j, 0) for j in range(warmup))
    for j in range(m - warmup):
        yield ("F", warmup + j, 0)
        yield ("B", j, 0)
        pending.append(j)
        if j >= stage:
            yield ("W", pending.pop(0), 0)
    for j in range(m - warmup, m):
        yield ("B", j, 0)
        pending.append(j)
        yield ("W", pending.pop(0), 0)
    yield from (("W", j, 0) for j in pending)


def peak(p: int, m: int, v: int, stage: int) -> int:
    """min(p, m) on every stage: p - s awaiting B plus s awaiting W (Qi et al. 2024,
    Sec. 2.3: (p - i + 1)M_B + (i - 1)M_W for worker i = s + 1). Stage 0 holds what
    1F1B's stage 0 does; later stages hold more than 1F1B's, but W-only activations (M_W)
    are smaller than M_B."""
    return min(p, m)


ZB_H1 = register(ScheduleSpec(
    name="zb-h1", attr="ZB_H1", doc="Zero-bubble, 1F1B memory (Qi et al. 2024).",
    chunks=Chunks.ONE, splits_backward=True, stage_order=zb_h1, peak_inflight=peak,
    torch_class="ScheduleInterleavedZeroBubble", torch_multi_stage=True))
