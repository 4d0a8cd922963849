"""GPipe (Huang et al. 2019): all forwards, then all backwards."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register


def gpipe(stage: int, p: int, m: int, v: int = 1) -> Iterator[Op]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    yield from (("F", j, 0) for j in range(m))
    yield from (("B", j, 0) for j in range(m))


def peak(p: int, m: int, v: int, stage: int) -> int:
    """m: every forward before any backward."""
    return m


GPIPE = register(ScheduleSpec(
    name="gpipe", attr="GPIPE", doc="All forwards, then all backwards (Huang et al. 2019).",
    chunks=Chunks.ONE, splits_backward=False, stage_order=gpipe, peak_inflight=peak,
    torch_class="ScheduleGPipe", torchtitan="GPipe"))
