"""One simulated operation on one pipeline stage: what a timeline draws."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    stage: int  # pipeline stage (rank along the pp axis), 0-based
    kind: str  # "F" forward, "B" input-gradient backward (with W when not split), "W" weight-gradient
    microbatch: int  # 0-based
    chunk: int  # model chunk on this stage (0 unless the schedule places several)
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s
