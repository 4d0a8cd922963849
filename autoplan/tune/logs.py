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
memory``) marks the run out of memory.

How a log is read (:class:`LogReader`; :func:`read_log` is one reader fed the whole text):
line by line as the text arrives, in time linear in its length whatever it holds. Lines
end at ``\\n`` (a ``\\r`` inside one, a progress bar's, separates records on it); only a
line holding one of the keywords above is looked at, each field found with ``str.find``
and its value read from a bounded window after its name by patterns that cannot
backtrack (possessive quantifiers). A line longer than :data:`MAX_LINE_CHARS` is no
launcher's line (a printed tensor, a progress bar that never ends its line): it is
searched for an out-of-memory error only, never held whole. Every number is checked
against the bounds below: one malformed or out of bounds is a problem of its line
(:attr:`LogReading.problems`), and that line gives no step and no memory."""

from __future__ import annotations

import codecs
import math
import re
from dataclasses import dataclass, field

from autoplan.tune.runs import MAX_PEAK_GIB, MAX_STEP_S, MIN_STEP_S

MEGATRON = "megatron"
TORCHTITAN = "torchtitan"
FORMATS = (MEGATRON, TORCHTITAN)

# What a number in a log may be: one outside is no measurement (a corrupted line, a
# stray print), named as a problem rather than taken.
# A step time and a peak: the runs log's own range (tune/runs.py: a microsecond, under one
# kernel launch, to 11.6 days; above 0 and at most a petabyte on one device), so that what a
# log gives the runs log takes.
MAX_STEP_DIGITS = 12  # 10^12 steps of a microsecond each take 11 days
MAX_TPS = 1e10  # tokens per second per device: a GPU trains a tiny model at ~10^6
# Launchers' lines are under a kilobyte (Megatron-LM's longest, with every optional
# field, about 1 KB); a longer line is none of theirs, and holding it would cost memory.
MAX_LINE_CHARS = 64 * 1024
# The steps a reading keeps (by first appearance of their number): the median of more is
# the same measurement, and each kept step costs about 200 bytes.
MAX_STEPS = 100_000
# Lines with problems a reader reads before it stops reading (only counting lines): a
# log with one is no measurement already (runs import refuses it, tune fails its trial),
# and reading on would only cost time.
MAX_PROBLEMS = 20
_WINDOW = 64  # characters after a field's name its value must lie in (blanks included)
_SHOWN = 40  # characters of a bad value a problem quotes

# a terminal's color and cursor escapes (torchtitan colors its step line with them)
ANSI = re.compile(r"\x1b\[[0-9;]*+[A-Za-z]")
# torch's out-of-memory errors in any case, their "memory" in lower or upper case (so that
# every one holds a keyword below: "CUDA out of memory", "torch.OutOfMemoryError")
_OOM = re.compile(r"(?i:outofm)(?:emory|EMORY)(?i:error)|(?i:out of m)(?:emory|EMORY)")
_OOM_AROUND = (8, 10)  # an _OOM match starts at most 8 before its "emory", ends 10 after
_OOM_LONGEST = len("outofmemoryerror")
_MEGATRON_ELAPSED = "elapsed time per iteration (ms):"
# a line holding none of these (in its raw text) says nothing a reading takes: Megatron-LM's
# step line; torchtitan's; memory (MB) and memory:, and the OOM errors
_KEYWORDS = (_MEGATRON_ELAPSED, "step:", "emory", "EMORY")
_MEGATRON_ITERATION = re.compile(r"\biteration\s++(\d++)\s*+/\s*+\d++\s*+\|")
_MEGATRON_MEMORY = "memory (MB)"
_TITAN_STEP = re.compile(r"\bstep:\s*+(\d++)\s++loss:")
_TITAN_MEMORY = "memory:"
_TITAN_TPS = re.compile(r"\b(?:tps|wps):")
_VALUE = re.compile(r"[ \t]*+([^\s|]*+)")  # a field's value: to the next blank or bar
_GIB = re.compile(r"[ \t]*+([^\s|]*?)[ \t]*+GiB")  # torchtitan's M.MMGiB(P%)
_NUMBER = re.compile(r"(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d++)?+")
_TPS_NUMBER = re.compile(r"(?:\d{1,3}+(?:,\d{3})++|\d++)(?:\.\d++)?+")  # 12,345 or 12345.6


@dataclass(frozen=True, slots=True)
class LogReading:
    """What a training log says: each logged step's time (in order, by step number), the
    peak memory it reports, whether it ran out of memory, and the problems of lines whose
    numbers could not be taken ((1-based line, message naming the field and the value):
    such a line gives no step and no memory)."""

    format: str  # megatron | torchtitan | "" (no step line found)
    step_times_s: tuple[tuple[int, float], ...] = ()  # (step, seconds)
    peak_gib: float | None = None
    oom: bool = False
    notes: tuple[str, ...] = field(default=())
    problems: tuple[tuple[int, str], ...] = ()

    def timed(self, warmup: int) -> list[float]:
        """The step times after the first ``warmup`` logged steps."""
        return [t for _, t in self.step_times_s[warmup:]]


def read_log(text: str | bytes, *, tokens_per_step: int | None = None,
             gpus: int | None = None) -> LogReading:
    """Parse a Megatron-LM or torchtitan log (see module doc). ``tokens_per_step`` and
    ``gpus`` turn torchtitan's tokens per second per device into step times. Never raises:
    what cannot be read is in the reading's ``problems``."""
    reader = LogReader(tokens_per_step=tokens_per_step, gpus=gpus)
    reader.feed(text)
    reader.finish()
    return reader.reading()


class LogReader:
    """A log read as it is written: :meth:`feed` it the text (or bytes, UTF-8, a
    character or line split across two pieces read whole) as it comes, and ask
    :meth:`reading` what the complete lines so far say; :meth:`finish` once the log is
    done reads its last line if it has no newline (a line still being written is not
    read before: its number may not be whole). Fed the same text in any pieces, it reads
    what :func:`read_log` reads; its work is linear in the text, its memory bounded by
    one line and the steps it keeps."""

    def __init__(self, *, tokens_per_step: int | None = None, gpus: int | None = None) -> None:
        known = (isinstance(tokens_per_step, int) and isinstance(gpus, int)
                 and tokens_per_step > 0 and gpus > 0)
        self._tokens = tokens_per_step if known else None
        self._gpus = gpus if known else None
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending: list[str] = []  # the line being read, in the pieces it came in
        self._pending_chars = 0
        self._overlong = False  # it is past MAX_LINE_CHARS: searched for OOM only
        self._carry = ""  # its last characters, for an OOM message across two pieces
        self._lines = 0  # complete lines read
        self._megatron: dict[int, float] = {}  # step -> seconds
        self._titan: dict[int, tuple[float, float | None]] = {}  # step -> (GiB, seconds)
        self._megatron_peak: float | None = None  # GiB
        self._oom = False
        self._problems: list[tuple[int, str]] = []
        self._stopped = False  # MAX_PROBLEMS reached: lines are only counted
        self._dropped_steps = 0
        self._cached: LogReading | None = None

    @property
    def lines(self) -> int:
        """The complete lines read so far."""
        return self._lines

    def feed(self, data: str | bytes | bytearray | memoryview) -> None:
        """Read the next piece of the log."""
        if isinstance(data, str):
            # a piece of text ends any character the bytes before it left unfinished
            text = self._decoder.decode(b"", final=True) + data
            self._decoder.reset()
        else:
            text = self._decoder.decode(bytes(data))
        if text:
            self._cached = None
            self._text(text)

    def finish(self) -> None:
        """The log is complete: read its last line though no newline ends it."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        if text:
            self._text(text)
        if self._pending_chars or self._overlong:
            self._end_line()
        self._cached = None

    def reading(self) -> LogReading:
        """What the complete lines read so far say."""
        if self._cached is None:
            self._cached = self._assemble()
        return self._cached

    # ------------------------------------------------------------------ lines

    def _text(self, text: str) -> None:
        pos = 0
        if self._pending_chars or self._overlong:  # the line the last piece left open
            nl = text.find("\n")
            if nl < 0:
                self._grow(text, 0, len(text))
                return
            self._grow(text, 0, nl)
            self._end_line()
            pos = nl + 1
        last = text.rfind("\n", pos)
        if last >= 0:
            self._complete_lines(text, pos, last)
            pos = last + 1
        if pos < len(text):
            self._grow(text, pos, len(text))

    def _grow(self, text: str, start: int, end: int) -> None:
        """``text[start:end]`` continues the open line."""
        if self._stopped:
            self._pending_chars += end - start  # counted, not kept
            return
        if self._overlong:
            self._scan_overlong(text[start:end])
            return
        self._pending.append(text[start:end])
        self._pending_chars += end - start
        if self._pending_chars > MAX_LINE_CHARS:
            held = "".join(self._pending)
            self._pending, self._pending_chars = [], 0
            self._overlong, self._carry = True, ""
            self._scan_overlong(held)

    def _scan_overlong(self, piece: str) -> None:
        if not self._oom:
            text = self._carry + piece
            self._oom = _has_oom(text, 0, len(text))
            self._carry = text[-(_OOM_LONGEST - 1):]

    def _end_line(self) -> None:
        """The open line is complete."""
        self._lines += 1
        line = "".join(self._pending)
        overlong, self._overlong, self._carry = self._overlong, False, ""
        self._pending, self._pending_chars = [], 0
        if not (overlong or self._stopped) and any(word in line for word in _KEYWORDS):
            self._line(line, self._lines)

    def _complete_lines(self, text: str, start: int, last: int) -> None:
        """The complete lines of ``text[start:last]`` (``text[last]`` is a newline): only
        those holding a keyword are looked at (each keyword found by ``str.find``, each
        search going on from where the last stopped), their line numbers counted up to
        them."""
        base, counted, newlines = self._lines, start, 0
        hits = [text.find(word, start, last) for word in _KEYWORDS]
        while not self._stopped and (found := [h for h in hits if h >= 0]):
            hit = min(found)
            begin = text.rfind("\n", start, hit) + 1 or start
            end = text.find("\n", hit, last + 1)
            newlines += text.count("\n", counted, begin)
            counted = begin
            if end - begin > MAX_LINE_CHARS:
                self._oom = self._oom or _has_oom(text, begin, end)
            else:
                self._line(text[begin:end], base + newlines + 1)
            hits = [h if h < 0 or h > end else text.find(word, end + 1, last)
                    for h, word in zip(hits, _KEYWORDS, strict=True)]
        self._lines = base + text.count("\n", start, last + 1)

    def _line(self, line: str, number: int) -> None:
        """One line of at most MAX_LINE_CHARS: its step, its memory, an OOM error."""
        if "\x1b" in line:
            line = ANSI.sub("", line)
        self._oom = self._oom or _has_oom(line, 0, len(line))
        found = _Found()
        for record in line.split("\r"):
            self._record(record, found)
        if found.problems:
            self._problems += [(number, message) for message in found.problems]
            self._stopped = len(self._problems) >= MAX_PROBLEMS
            return
        for step, seconds in found.megatron:
            if step in self._megatron or len(self._megatron) < MAX_STEPS:
                self._megatron[step] = seconds
            else:
                self._dropped_steps += 1
        for step, gib, titan_s in found.titan:
            if step in self._titan or len(self._titan) < MAX_STEPS:
                self._titan[step] = (gib, titan_s)
            else:
                self._dropped_steps += 1
        for gib in found.peaks:
            if self._megatron_peak is None or gib > self._megatron_peak:
                self._megatron_peak = gib

    def _record(self, text: str, found: _Found) -> None:
        """A record of a line (the line, or one of its parts between carriage returns)."""
        elapsed = text.find(_MEGATRON_ELAPSED)
        head = _MEGATRON_ITERATION.search(text, 0, elapsed) if elapsed >= 0 else None
        if head is not None:
            step = _step(head.group(1), "iteration", found)
            ms = _bounded(text, elapsed + len(_MEGATRON_ELAPSED), "elapsed time per iteration (ms)",
                          "a number of milliseconds", MIN_STEP_S * 1e3, MAX_STEP_S * 1e3, found)
            if step is not None and ms is not None:
                found.megatron.append((step, ms / 1e3))
        elif (head := _TITAN_STEP.search(text)) is not None:
            self._titan_record(text, head, found)
        at = text.find(_MEGATRON_MEMORY)
        if at >= 0 and (allocated := text.find("max allocated:", at)) >= 0:
            reserved = text.find("max reserved:", allocated)
            name = "max reserved" if reserved >= 0 else "max allocated"
            mb = _bounded(text, (reserved if reserved >= 0 else allocated) + len(name) + 1,
                          f"{name} (MB)", "a number of megabytes", 0.0, MAX_PEAK_GIB * 1024, found,
                          above=True)
            if mb is not None:
                found.peaks.append(mb / 1024)

    def _titan_record(self, text: str, head: re.Match[str], found: _Found) -> None:
        memory = text.find(_TITAN_MEMORY, head.end())
        tps_at = _TITAN_TPS.search(text, memory) if memory >= 0 else None
        if tps_at is None:
            return  # no step line (torchtitan's has both)
        step = _step(head.group(1), "step", found)
        at = memory + len(_TITAN_MEMORY)
        gib_value = _GIB.match(text, at, min(len(text), at + _WINDOW))
        if gib_value is not None:
            gib = _bounded(gib_value.group(1), 0, "memory", "a number of GiB", 0.0, MAX_PEAK_GIB, found,
                           above=True)
        else:
            token, _ = _token(text, at)
            found.problems.append(f"memory: expected a number of GiB (1.50GiB), got {_shown(token)}")
            gib = None
        token, whole = _token(text, tps_at.end())
        name = tps_at.group()[:-1]
        tps = float(token.replace(",", "")) if whole and _TPS_NUMBER.fullmatch(token) else math.nan
        if not (0 < tps <= MAX_TPS):
            found.problems.append(f"{name}: expected tokens per second per device above 0 and at most "
                                  f"{_g(MAX_TPS)} (12,345 or 12345.6), got {_shown(token, whole)}")
            return
        seconds = None
        if self._tokens is not None and self._gpus is not None:
            seconds = self._tokens / (tps * self._gpus)
            if not (MIN_STEP_S <= seconds <= MAX_STEP_S):
                found.problems.append(
                    f"{name}: {_shown(token)} tokens per second per device makes a step of "
                    f"{seconds:.3g} s ({self._tokens:,} tokens on {self._gpus} GPUs), not between "
                    f"{_g(MIN_STEP_S)} and {_g(MAX_STEP_S)} s")
                return
        if step is not None and gib is not None:
            found.titan.append((step, gib, seconds))

    # ------------------------------------------------------------------ reading

    def _assemble(self) -> LogReading:
        notes: list[str] = []
        if self._dropped_steps:
            notes.append(f"read the first {MAX_STEPS:,} step numbers; {self._dropped_steps:,} more "
                         "step lines not kept")
        if self._stopped:
            notes.append(f"stopped reading at line {self._problems[-1][0]:,}, after {len(self._problems)} "
                         "problems")
        problems = tuple(self._problems)
        if self._megatron:
            return LogReading(MEGATRON, tuple(sorted(self._megatron.items())), self._megatron_peak,
                              self._oom, tuple(notes), problems)
        if self._titan:
            if self._tokens is None:
                notes.insert(0, "torchtitan logs tokens per second per device: step times need the "
                                "plan's tokens per step and GPU count")
            times = tuple((step, s) for step, (_, s) in sorted(self._titan.items()) if s is not None)
            peak = max(gib for gib, _ in self._titan.values())
            return LogReading(TORCHTITAN, times, peak, self._oom, tuple(notes), problems)
        return LogReading("", (), self._megatron_peak, self._oom, tuple(notes), problems)


@dataclass(slots=True)
class _Found:
    """What one line gives, taken only if it has no problem."""

    megatron: list[tuple[int, float]] = field(default_factory=list)
    titan: list[tuple[int, float, float | None]] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)  # GiB
    problems: list[str] = field(default_factory=list)


def _has_oom(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` holds an out-of-memory error: its "emory" found by
    ``str.find``, the pattern tried only around each."""
    before, after = _OOM_AROUND
    for word in ("emory", "EMORY"):
        at = text.find(word, start, end)
        while at >= 0:
            if _OOM.search(text, max(start, at - before), min(end, at + after)) is not None:
                return True
            at = text.find(word, at + 1, end)
    return False


def _token(text: str, at: int) -> tuple[str, bool]:
    """The value after a field's name at ``at``: up to the next blank or bar, within the
    window; False where it runs on past the window."""
    end = min(len(text), at + _WINDOW)
    m = _VALUE.match(text, at, end)
    assert m is not None  # the pattern matches the empty string
    whole = not (m.end() == end < len(text) and not text[end].isspace() and text[end] != "|")
    return m.group(1), whole


def _bounded(text: str, at: int, name: str, what: str, lo: float, hi: float, found: _Found, *,
             above: bool = False) -> float | None:
    """The number after ``name`` at ``at`` in [lo, hi] (above lo where ``above``); a
    problem of the line (None back) where it is not one."""
    token, whole = _token(text, at)
    value = float(token) if whole and _NUMBER.fullmatch(token) else math.nan
    if (lo < value if above else lo <= value) and value <= hi:
        return value
    found.problems.append(f"{name}: expected {what} {'above' if above else 'between'} {_g(lo)} "
                          f"{'and at most' if above else 'and'} {_g(hi)}, got {_shown(token, whole)}")
    return None


def _step(digits: str, name: str, found: _Found) -> int | None:
    if len(digits) > MAX_STEP_DIGITS:
        found.problems.append(f"{name}: expected a step number of at most {MAX_STEP_DIGITS} digits, "
                              f"got {_shown(digits)}")
        return None
    return int(digits)


def _shown(value: str, whole: bool = True) -> str:
    """A value as a problem quotes it: its first characters, escaped where not printable
    ASCII."""
    cut = len(value) > _SHOWN or not whole
    return ascii(value[:_SHOWN] + ("..." if cut else ""))


def _g(x: float) -> str:
    """1e+09 as 1e9."""
    return f"{x:g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
