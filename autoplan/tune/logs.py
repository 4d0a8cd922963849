"""Step times and peak memory read back from the launchers' own training logs.

- Megatron-LM (``megatron/training/training.py``, ``training_log``): with
  ``--log-interval 1`` a line per iteration, `` [date] iteration   N/   M | consumed
  samples: ... | elapsed time per iteration (ms): T | ...``; the memory report once,
  ``[Rank r] (after N iterations) memory (MB) | allocated: ... | max allocated: A |
  reserved: ... | max reserved: R`` (``report_memory``). Peak: the largest max reserved
  (what the caching allocator held, as ``nvidia-smi`` sees it), else max allocated.
- torchtitan (``torchtitan/components/metrics.py``, ``MetricsProcessor.log``): with
  ``metrics.log_freq = 1`` a line per step, ``step: N  loss: L  [grad_norm: G]  memory:
  M.MMGiB(P%)  tps: 12,345  [tflops: ...  mfu: ...%]`` (``wps:`` before 2025), colored
  with ANSI escapes on a terminal. tps is tokens per second per device: the rank's tokens
  over the step's time and its non-data-parallel degree, so a step takes
  global batch x sequence / (tps x GPUs). Peak: the largest max-reserved GiB.

A CUDA out-of-memory error anywhere in a log (``torch.OutOfMemoryError``, ``CUDA out of
memory``) marks the run out of memory."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MEGATRON_STEP = re.compile(
    r"\biteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+(?:[eE][-+]?\d+)?)")
_MEGATRON_MEMORY = re.compile(
    r"memory \(MB\)\s*\|\s*allocated:\s*([0-9.]+)\s*\|\s*max allocated:\s*([0-9.]+)"
    r"(?:\s*\|\s*reserved:\s*([0-9.]+)\s*\|\s*max reserved:\s*([0-9.]+))?")
_TITAN_STEP = re.compile(
    r"\bstep:\s*(\d+)\s+loss:.*?memory:\s*([0-9.]+)\s*GiB.*?\b(?:tps|wps):\s*([0-9,]+(?:\.\d+)?)")
_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|out of memory", re.I)

MEGATRON = "megatron"
TORCHTITAN = "torchtitan"
FORMATS = (MEGATRON, TORCHTITAN)


@dataclass(frozen=True, slots=True)
class LogReading:
    """What a training log says: each logged step's time (in order, by step number), the
    peak memory it reports, and whether it ran out of memory."""

    format: str  # megatron | torchtitan | "" (no step line found)
    step_times_s: tuple[tuple[int, float], ...] = ()  # (step, seconds)
    peak_gib: float | None = None
    oom: bool = False
    notes: tuple[str, ...] = field(default=())

    def timed(self, warmup: int) -> list[float]:
        """The step times after the first ``warmup`` logged steps."""
        return [t for _, t in self.step_times_s[warmup:]]


def read_log(text: str, *, tokens_per_step: int | None = None, gpus: int | None = None) -> LogReading:
    """Parse a Megatron-LM or torchtitan log (see module doc). ``tokens_per_step`` and
    ``gpus`` turn torchtitan's tokens per second per device into step times."""
    text = _ANSI.sub("", text)
    oom = bool(_OOM.search(text))
    mega: dict[int, float] = {}
    titan: dict[int, tuple[float, float]] = {}
    peaks: list[float] = []
    for line in text.splitlines():
        if (m := _MEGATRON_STEP.search(line)) is not None:
            mega[int(m.group(1))] = float(m.group(2)) / 1e3
        elif (m := _TITAN_STEP.search(line)) is not None:
            titan[int(m.group(1))] = (float(m.group(2)), float(m.group(3).replace(",", "")))
        if (m := _MEGATRON_MEMORY.search(line)) is not None:
            reserved = m.group(4)
            peaks.append(float(reserved if reserved is not None else m.group(2)) / 1024)
    if mega:
        steps = tuple(sorted(mega.items()))
        return LogReading(MEGATRON, steps, max(peaks) if peaks else None, oom)
    if titan:
        notes: list[str] = []
        times: list[tuple[int, float]] = []
        if tokens_per_step is None or gpus is None:
            notes.append("torchtitan logs tokens per second per device: step times need the "
                         "plan's tokens per step and GPU count")
        else:
            for step, (_, tps) in sorted(titan.items()):
                if tps > 0:
                    times.append((step, tokens_per_step / (tps * gpus)))
        peak = max(mem for mem, _ in titan.values())
        return LogReading(TORCHTITAN, tuple(times), peak, oom, tuple(notes))
    return LogReading("", (), max(peaks) if peaks else None, oom)
