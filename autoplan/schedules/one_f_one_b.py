"""One-forward-one-backward (PipeDream-Flush; Narayanan et al. 2021)."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register


def one_f_one_b(stage: int, p: int, m: int, v: int = 1) -> Iterator[Op]:
    """PipeDream-Flush (Narayanan et al. 2021, Fig. 4 top): p - s - 1 warm-up
    forwards, then alternate one forward and one backward, then drain."""
    warmup = min(p - stage - 1, m)
    yield from (("F", j, 0) for j in range(warmup))
    for j in range(m - warmup):
        yield ("F", warmup + j, 0)
        yield ("B", j, 0)
    yield from (("B", j, 0) for j in range(m - warmup, m))


def peak(p: int, m: int, v: int, stage: int) -> int:
    """min(p - s, m) (Narayanan et al. 2021, Sec. 2.2.1)."""
    return min(p - stage, m)


ONE_F_ONE_B = register(ScheduleSpec(
    name="1f1b", attr="ONE_F_ONE_B",
    doc="One-forward-one-backward (PipeDream-Flush; Narayanan et al. 2021).",
    chunks=Chunks.ONE, splits_backward=False, stage_order=one_f_one_b, peak_inflight=peak,
    torch_class="Schedule1F1B", torchtitan="1F1B"))
