"""Timing repeated calls: warm-up, a number of timed calls fitted to a time budget, and the
median with 10th/90th percentiles (the ``seconds*`` and ``repeats`` columns of a profile).

CPU calls are timed with ``time.perf_counter``; CUDA calls with CUDA events recorded around
each call on the current stream, read after one synchronize (events time the device, not
the host's launch overhead). As Triton's ``triton.testing.do_bench`` does, the CUDA clock
can overwrite a buffer larger than the L2 cache before each timed call, so a kernel reads
its inputs from HBM as it does in training rather than from the cache its previous call
warmed. CPU calls are not flushed: rows whose tensors fit the CPU's caches measure the
caches. torch is imported only by the CUDA clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from autoplan.errors import AutoplanError

Row = dict[str, Any]  # one profile row: columns of autoplan.measured.profile.COLUMNS
Step = Callable[[str], None]  # called once per finished case with a short label


class BenchError(AutoplanError):
    """A benchmark could not run here (no torch, no CUDA, a failed or hung worker)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """How long to measure one case."""

    warmup: int  # untimed calls first (caches, allocator, lazy initialisation)
    min_repeats: int  # timed calls, at least (percentiles need a few)
    max_repeats: int  # timed calls, at most (tiny kernels would otherwise run thousands)
    seconds: float  # target time of one case's timed calls: sets repeats between the bounds

    def repeats(self, call_s: float) -> int:
        """Timed calls for a call that takes ``call_s`` seconds (measured in the warm-up)."""
        if call_s <= 0 or not math.isfinite(call_s):
            return self.max_repeats
        return max(self.min_repeats, min(self.max_repeats, math.ceil(self.seconds / call_s)))


@dataclass(frozen=True, slots=True)
class Timing:
    """Median and percentiles of the timed calls of one case."""

    seconds: float
    seconds_p10: float
    seconds_p90: float
    repeats: int

    def columns(self) -> Row:
        return {"seconds": self.seconds, "seconds_p10": self.seconds_p10,
                "seconds_p90": self.seconds_p90, "repeats": self.repeats}


def summarize(samples: Sequence[float]) -> Timing:
    """Median, p10 and p90 (linear interpolation, so p10 <= median <= p90) of ``samples``."""
    assert samples, "no timed calls"
    p10, med, p90 = np.percentile(np.asarray(samples, dtype=float), [10, 50, 90])
    return Timing(float(med), float(p10), float(p90), len(samples))


class Clock(Protocol):
    def times(self, fn: Callable[[], Any], n: int) -> list[float]:
        """Seconds of each of ``n`` back-to-back calls of ``fn``."""
        ...

    def once(self, fn: Callable[[], Any]) -> float:
        """Seconds of one call of ``fn``, the device idle before and after."""
        ...


class CpuClock:
    def times(self, fn: Callable[[], Any], n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    def once(self, fn: Callable[[], Any]) -> float:
        return self.times(fn, 1)[0]


L2_FLUSH_BYTES = 256 * 2**20  # > the L2 of current GPUs (H100: 50 MB); do_bench's 256 MB


class CudaClock:
    """CUDA events around each call; one synchronize after the batch, so calls queue back to
    back as they do in training and the host's launch latency stays out of small kernels.
    With ``flush_l2``, a buffer of L2_FLUSH_BYTES is zeroed before each call, untimed."""

    def __init__(self, flush_l2: bool = False) -> None:
        import torch

        self._torch = torch
        self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None

    def times(self, fn: Callable[[], Any], n: int) -> list[float]:
        cuda = self._torch.cuda
        marks = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in marks:
            if self._flush is not None:
                self._flush.zero_()
            start.record()
            fn()
            end.record()
        cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in marks]  # elapsed_time is in ms

    def once(self, fn: Callable[[], Any]) -> float:
        self._torch.cuda.synchronize()
        return self.times(fn, 1)[0]


def measure(fn: Callable[[], Any], clock: Clock, budget: Budget) -> list[float]:
    """Warm up, then time as many calls as the budget allows (between its bounds)."""
    warm = clock.times(fn, max(1, budget.warmup))
    return clock.times(fn, budget.repeats(warm[-1]))
