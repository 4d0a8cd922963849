"""Reading serving plan files (``kind: serving``): every problem named by file and field."""

from __future__ import annotations

import bisect
import codecs
import csv
import dataclasses
import functools
import io
import itertools
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.descriptors.hardware import Cluster, PooledCluster
from autoplan.descriptors.job import MAX_SEQ_LEN
from autoplan.descriptors.model import Model
from autoplan.descriptors.strict import Fields, decimal, read_limited, shown
from autoplan.errors import InputError, Problem
from autoplan.measured.door import corrected
from autoplan.measured.profile import Profile
from autoplan.serving.autoscale import Autoscale, ScalingMetric, ScalingPeriod
from autoplan.serving.deployment import (
    KV_PRECISIONS,
    Arrival,
    ArrivalKind,
    Deployment,
    Disaggregated,
    Dist,
    Lengths,
    Pool,
    Precision,
    Prefix,
    ServingPlan,
    Slo,
    SpecMethod,
    Speculative,
    Trace,
    Workload,
)
from autoplan.serving.engine import Engine
from autoplan.serving.versions import VersionError
from autoplan.units import MiB

if TYPE_CHECKING:
    import numpy as np

MAX_DEGREE = 1 << 16  # replicas, TP, PP, EP or attention DP: past any cluster
MAX_REQUESTS = 1_000_000
# a multimodal request's images and the language-model tokens each becomes: past any
# engine's limits (vLLM's --limit-mm-per-prompt, a 16K-token image at the largest resolutions)
MAX_IMAGES = 1 << 10
MAX_IMAGE_TOKENS = 1 << 17
MAX_RATE = 1e6  # requests/s
MIN_RATE = 1e-4  # requests/s: one every 2.8 hours; a slower stream is a series of single requests
# SLOs from a microsecond (no engine step is shorter) to about 11 days
MIN_SLO_MS, MAX_SLO_MS = 1e-3, 1e9
# output tokens per request: the simulation steps once per output token, and no model
# generates more than this in one answer today
MAX_OUTPUT_TOKENS = 1 << 17


# an arrival trace: at most MAX_REQUESTS rows; 64 MiB holds a million rows of three numbers
# with room for the extra columns recorded traces carry (ignored)
MAX_TRACE_BYTES = 64 * MiB
# arrival times from any origin up to Unix seconds 30 centuries on, and a trace spanning at
# most about 116 days: past those a number is not a time a replay can mean
MAX_ARRIVAL_S = 1e11
MAX_TRACE_SPAN_S = 1e7
TRACE_COLUMNS = ("arrival_s", "input_len", "output_len")
MAX_TRACE_PROBLEMS = 10  # then stop reading: the rest is likely the same mistake


def read_trace(ref: Any, source: str, field: str) -> Trace:
    """An arrival trace: a CSV file with a header naming ``arrival_s`` (seconds, any
    origin), ``input_len`` and ``output_len`` (tokens), other columns ignored, one request
    per row. ``ref`` is relative to the folder of ``source`` (a plan or job file), or to the
    working directory where ``source`` is a command-line flag (``--trace``). Rows are
    sorted by arrival and shifted so the first arrives at 0. Every problem names the file,
    row and column."""
    if not isinstance(ref, str) or not ref.strip():
        raise InputError.single(source, field, "expected the path of a CSV file with columns "
                                               f"{', '.join(TRACE_COLUMNS)}")
    base = Path() if not source or source.startswith("-") else Path(source).parent  # a flag: cwd
    # absolute, links left to the stat below (Path.resolve raises on a link loop)
    path = Path(os.path.abspath(base / ref)) if not os.path.isabs(ref) else Path(ref)
    data = read_limited(path, MAX_TRACE_BYTES, "a request trace CSV", source=source, field=field,
                        label=ref)
    if not data.isascii():  # ASCII is UTF-8; else decoded once to find the first bad byte
        try:
            data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError.single(source, field, f"{ref}: cannot read: {exc}") from None
    return _trace_rows(data, str(path))


# Reading a trace's rows. A million rows read one by one through the csv module and
# strict.decimal took 9.5 s and 411 MB (issue 47); numpy reads the rows that are plain
# numbers a column at a time instead, and any other row is read as before, one by one,
# so that every row is accepted or refused with the same words.
_TRACE_CHUNK = 1 << 18  # bytes per numpy pass (about 15,000 rows): its work a few MB
# a plain number (digits and at most one point) of at most this many digits, whose digits
# make an integer of at most 2**53, is that integer over a power of ten, both exact in a
# double, so one division rounds it as float() does (Clinger 1990, "How to read floating
# point numbers accurately", the fast path)
_PLAIN_DIGITS = 16
_TRIM_STEPS = 8  # blanks stripped around a cell by numpy; a cell with more is read by Python
_TENS = tuple(float(f"1e{k}") for k in range(23))  # exact: 10**22 is the largest power of ten a double holds


def _parse_trace(text: str, label: str) -> Trace:
    """The trace in ``text`` (decoded: a byte-order mark in it is a character of the header)."""
    return _trace_rows(text.encode("utf-8", "surrogatepass"), label, mark=False)


def _byte_lines(data: bytes, at: int) -> Iterator[str]:
    """The lines of UTF-8 ``data`` from byte ``at`` on, as text."""
    while at < len(data):
        end = data.find(b"\n", at) + 1 or len(data)
        yield data[at:end].decode("utf-8", "surrogatepass")
        at = end


def _trace_rows(data: bytes, label: str, mark: bool = True) -> Trace:
    """The requests in ``data`` (UTF-8, after a byte-order mark if ``mark``, as the
    ``utf-8-sig`` codec reads it). The header is read by the csv module; the rows that are
    plain numbers by numpy (:func:`_plain_rows`), every other one as the csv module and
    :func:`_trace_number` read it, in the file's order, so that the limits on requests and
    on problems stop where a reading row by row stops."""
    import numpy as np

    skip = len(codecs.BOM_UTF8) if mark and data.startswith(codecs.BOM_UTF8) else 0
    rows = csv.reader(_byte_lines(data, skip))
    try:
        header = next(rows, None)
    except csv.Error as exc:  # a field past csv's limit (128 KiB), a stray NUL in a quote
        raise InputError.single(label, f"row {rows.line_num}", f"not CSV: {exc}") from None
    names = [c.strip() for c in header] if header else []
    missing = [c for c in TRACE_COLUMNS if c not in names]
    if missing:
        raise InputError.single(label, "header", f"expected columns {', '.join(TRACE_COLUMNS)}; "
                                                 f"missing {', '.join(missing)}")
    at = tuple(names.index(c) for c in TRACE_COLUMNS)
    header_lines = rows.line_num  # a quoted name can hold several
    start = skip
    for _ in range(header_lines):
        start = data.find(b"\n", start) + 1 or len(data)
    limit = MAX_REQUESTS
    problems: list[Problem] = []
    kept: list[list[np.ndarray]] = [[], [], [], []]  # runs of plain rows: row, arrival, input, output
    extra: list[tuple[int, float, int, int]] = []  # (row, arrival, input, output) read by csv
    count = past = shift = 0  # shift: rows fewer than lines (a quoted cell holding a newline)
    plain: list[np.ndarray] = [np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int32),
                               np.zeros(0, np.int32)]

    def keep(lines: np.ndarray, taken: np.ndarray, lo: int, hi: int) -> bool:
        """A chunk's plain rows lo..hi kept (their rows ``shift`` short of their lines), or
        False where one passes the limit on requests."""
        nonlocal count
        if hi == lo:
            return True
        if count + hi - lo > limit:
            problems.append(_too_many(label, int(lines[lo + limit - count]) + 2 - shift, limit))
            return False
        taken[lo:hi] = shift
        count += hi - lo
        return True

    for plain, others, others_at, others_end in _plain_rows(data, start, at):  # a chunk at a time
        odd, odd_at, odd_end = others.tolist(), others_at.tolist(), others_end
        lines = plain[0].tolist() if odd else []  # to look up in, where rows are read by csv too
        if odd:
            runs = np.append(np.flatnonzero(np.diff(others) != 1), len(odd) - 1)  # each run's last
            odd_last = others[runs].tolist()  # the last line of each run of lines next to each other
            odd_run = np.searchsorted(runs, np.arange(len(odd))).tolist()  # the run of each
        taken = np.full(len(plain[0]), -1, np.int32)  # the shift of each row kept, -1 where not kept
        lo = int(np.searchsorted(plain[0], past))
        i = bisect.bisect_left(odd, past)
        stop = False
        while i < len(odd) and not stop:  # a run of lines next to each other read by csv
            line = odd[i]
            if not keep(plain[0], taken, lo, bisect.bisect_left(lines, line, lo)):
                stop = True
                break
            # the csv module reads the run's lines (split in C), and on where a quoted cell goes on
            last, end = odd_last[odd_run[i]], int(odd_end[odd_run[i]])
            if last == line:  # one line (maybe long: no copy in StringIO's four bytes a character)
                reader, begun = csv.reader(_byte_lines(data, odd_at[i])), line
            else:
                text = io.StringIO(data[odd_at[i]:end].decode("utf-8", "surrogatepass"))
                reader, begun = csv.reader(itertools.chain(text, _byte_lines(data, end))), line
            while True:
                before = reader.line_num
                try:
                    row = next(reader)
                except csv.Error as exc:
                    raise InputError.single(label, f"row {header_lines + begun + reader.line_num}",
                                            f"not CSV: {exc}") from None
                number = line + 2 - shift
                if "".join(row).strip():  # not blank: a cell holds more than white space
                    if count >= limit:
                        problems.append(_too_many(label, number, limit))
                        stop = True
                        break
                    record = _trace_record(row, at, number, label, problems)
                    if record is not None:
                        extra.append((number, *record))
                        count += 1
                used = reader.line_num - before  # lines the row took
                shift += used - 1
                past = line = line + used
                if len(problems) >= MAX_TRACE_PROBLEMS:
                    stop = True
                    break
                if line > last:
                    break
            i = bisect.bisect_left(odd, past, i)
            lo = bisect.bisect_left(lines, past, lo)
        if stop or not keep(plain[0], taken, lo, len(plain[0])):
            break
        held = taken >= 0
        plain[0] += 2 - taken  # lines to rows
        for kept_run, column in zip(kept, plain, strict=True):
            if held.any():
                kept_run.append(column if held.all() else column[held])
    if problems:
        raise InputError(problems)
    plain = [np.concatenate([*run, column[:0]]) for run, column in zip(kept, plain, strict=True)]
    for run in kept:
        run.clear()  # the pieces freed
    if extra:
        where = np.searchsorted(plain[0], [r[0] for r in extra])
        plain = [np.insert(column, where, [r[i] for r in extra]) for i, column in enumerate(plain)]
    row_numbers, arrival, inputs, outputs = plain
    del plain
    if not len(arrival):
        raise InputError.single(label, "", "no requests (a header and no rows)")
    order = np.argsort(arrival, kind="stable")  # stable: equal arrivals keep the file's order
    first, last = int(order[0]), int(order[-1])
    t0 = float(arrival[first])
    if float(arrival[last]) - t0 > MAX_TRACE_SPAN_S:
        raise InputError.single(label, f"row {int(row_numbers[last])}, arrival_s", (
            f"arrives {float(arrival[last]) - t0:.6g} s after the first request "
            f"(row {int(row_numbers[first])}): "
            f"a trace spans at most {MAX_TRACE_SPAN_S:.0e} s ({MAX_TRACE_SPAN_S / 86400:.0f} days)"))
    del row_numbers
    # sorted, then each column made a tuple in turn, every array freed once done with (a
    # million requests: 32 MB of floats, 8 MB for each length column)
    inputs, outputs, arrival = inputs[order], outputs[order], arrival[order]
    del order
    arrival -= t0
    arrival_s = tuple(arrival.tolist())
    del arrival
    return Trace(label, arrival_s, _whole(inputs), _whole(outputs))


def _numbers(cells: list[bytes]) -> np.ndarray:
    """strict.decimal of each cell, nan where it is None. The cells hold no ASCII but
    digits, points, e, signs and white space (no _ nor inf), so that float() of the bytes
    reads what decimal reads where it reads at all (it strips less white space than
    str.strip and no other text)."""
    import numpy as np

    try:
        return np.array(list(map(float, cells)))  # inf (1e400) is not finite: refused
    except ValueError:
        pass
    numbers = []
    for cell in cells:
        try:
            numbers.append(float(cell))
        except ValueError:
            number = decimal(cell.decode("utf-8", "surrogatepass"))
            numbers.append(math.nan if number is None else number)
    return np.array(numbers)


def _too_many(label: str, row: int, limit: int) -> Problem:
    return Problem(label, f"row {row}", f"more than {limit:,} requests")


def _trace_record(row: list[str], at: tuple[int, ...], number: int, label: str,
                  problems: list[Problem]) -> tuple[float, int, int] | None:
    """One row's request as the csv module read it, or None with its problems added."""
    values: list[float] = []
    for col, i, hi in zip(TRACE_COLUMNS, at, (None, MAX_SEQ_LEN, MAX_OUTPUT_TOKENS), strict=True):
        cell = row[i].strip() if i < len(row) else ""
        value = _trace_number(cell, hi)
        if isinstance(value, str):
            problems.append(Problem(label, f"row {number}, {col}", value))
        else:
            values.append(value)
    if len(values) < len(TRACE_COLUMNS):
        return None
    return values[0], int(values[1]), int(values[2])


def _whole(counts: np.ndarray) -> tuple[int, ...]:
    """Whole numbers as a tuple of ints, each value one object (a million requests have a
    few thousand lengths: 8 bytes a request, not 36)."""
    import numpy as np

    ints = counts
    if len(ints) and int(ints.max()) <= 1 << 17:
        table = np.arange(int(ints.max()) + 1).astype(object)
    else:
        uniques, ints = np.unique(ints, return_inverse=True)
        table = uniques.astype(object)
    return tuple(table[ints].tolist())


def _plain_rows(data: bytes, start: int, at: tuple[int, ...]
                ) -> Iterator[tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]]:
    """The lines of ``data`` from byte ``start`` on (0 the first), read by numpy a chunk
    at a time, for each: [the lines whose cells at ``at`` are numbers within their limits,
    their arrivals, inputs and outputs]; the lines to read one by one; the byte each of
    those begins at; for each run of those next to each other, the byte after it. Blank
    lines are in neither."""
    import numpy as np

    lines = 0
    pos = start
    field_limit = csv.field_size_limit()  # the csv module's, as set now
    none: list[np.ndarray] = [np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int32),
                              np.zeros(0, np.int32)]
    while pos < len(data):
        cut = data.find(b"\n", pos + _TRACE_CHUNK - 1)
        end = len(data) if cut < 0 else cut + 1
        if end - pos > 2 * _TRACE_CHUNK:  # a long line: the lines before it, then it alone
            end = data.rfind(b"\n", pos, pos + _TRACE_CHUNK) + 1
            if not end:  # the line at pos: past csv's limit on a cell, or cells of csv's to read
                end = data.find(b"\n", pos) + 1 or len(data)
                yield none, np.array([lines]), np.array([pos]), np.array([end])
                lines += 1
                pos = end
                continue
        found, values, other, begins = _plain_chunk(data, pos, end, at, field_limit)
        odd = other.nonzero()[0]
        after = np.append(begins[1:], end - pos)  # where the line after each begins
        runs = np.append(np.flatnonzero(np.diff(odd) != 1), len(odd) - 1)  # each run's last
        yield ([(found + lines).astype(np.int32), *values], odd + lines, begins[odd] + pos,
               after[odd[runs]] + pos if len(odd) else odd)
        lines += len(begins)
        pos = end


@functools.cache
def _byte_kinds() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per byte value: blank around a cell (space, tab, the CR of a CRLF, the quote of a
    quoted cell); not blank in a row (all but white space, the comma and the quote; bytes
    of a character past ASCII are, but for those of white space: _unmark_blanks); in no
    number, its blanks around it included (an ASCII byte but a digit, point, e, sign or
    white space)."""
    import numpy as np

    trim = np.zeros(256, bool)
    trim[[ord(c) for c in ' \t\r"']] = True
    marked = np.array([not (chr(b).isspace() or chr(b) in ',"') if b < 128 else 1 for b in range(256)],
                      np.uint8)
    alien = np.zeros(256, np.int32)
    alien[:128] = [not (chr(b) in "0123456789.eE+-" or chr(b).isspace()) for b in range(128)]
    return trim, marked, alien


def _plain_chunk(data: bytes, pos: int, end: int, at: tuple[int, ...], field_limit: int
                 ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
    """:func:`_plain_rows` for the lines of ``data[pos:end]`` (whole lines): the plain
    lines, their numbers (a column each), which lines are to be read one by one, and the
    byte where each line begins."""
    import numpy as np

    trim, marked, alien = _byte_kinds()
    a = np.frombuffer(data, np.uint8, end - pos, pos)
    n = len(a)
    ends = np.flatnonzero(a == 10)  # each line's LF, or the end of the text
    if a[-1] != 10:
        ends = np.append(ends, n)
    begins = np.empty_like(ends)
    begins[0], begins[1:] = 0, ends[:-1] + 1
    # read one by one wherever the csv module could read the line otherwise than as cells
    # between commas: a cell longer than its limit, a NUL (refused before Python 3.11), a
    # CR before anything but LF (an error), a quote but around a whole cell
    other = ends - begins > field_limit
    if data.find(b"\0", pos, end) >= 0:
        other[np.searchsorted(ends, np.flatnonzero(a == 0))] = True
    if data.find(b"\r", pos, end) >= 0:
        cr = np.flatnonzero(a == 13)
        after = a[np.minimum(cr + 1, n - 1)]
        other[np.searchsorted(ends, cr[(cr + 1 < n) & (after != 10) & (after != 13)])] = True
    # a line of white space, commas and quotes around nothing is blank (as csv reads the
    # others: quoted cells whole), skipped
    mark = marked[a]
    quoted = data.find(b'"', pos, end) >= 0
    if not quoted and not mark.any() and not other.any():  # blank lines only
        none = np.zeros(0, np.int32)
        return none, [np.zeros(0), none, none], other, begins
    if (a >= 0x80).any():  # white space past ASCII (a no-break space) is blank too
        _unmark_blanks(a, mark)
    seen = np.zeros(n + 1, np.int32)  # bytes not blank before each
    np.cumsum(mark, out=seen[1:])
    blank = seen[ends] == seen[begins]
    commas = np.flatnonzero(a == 44)
    if quoted:
        odd, commas = _quoted(a, begins, ends, commas)
        other |= odd
    first = np.searchsorted(commas, begins)
    count = np.searchsorted(commas, ends) - first
    bounds = np.append(commas, n)  # each cell ends at a comma, or at the end of its line
    rows = np.flatnonzero(~other & ~blank & (count >= max(at)))  # with every cell: the others one by one
    begins_, ends_, first_, count_ = begins[rows], ends[rows], first[rows], count[rows]
    good = np.ones(len(rows), bool)
    foreign = None
    columns = []
    for j, hi in zip(at, (None, MAX_SEQ_LEN, MAX_OUTPUT_TOKENS), strict=True):
        s = begins_.copy() if j == 0 else bounds[first_ + (j - 1)] + 1
        e = np.where(count_ > j, bounds[first_ + j], ends_)
        for _ in range(_TRIM_STEPS):
            step = trim[a[np.minimum(s, n - 1)]] & (s < e)
            if not step.any():
                break
            s += step
        for _ in range(_TRIM_STEPS):
            step = trim[a[np.maximum(e - 1, 0)]] & (e > s)
            if not step.any():
                break
            e -= step
        value, read = _plain_numbers(data, pos, s, e)
        rest = np.flatnonzero(~read & (s < e) & good)  # not plain: as strict.decimal reads it
        if len(rest):
            if foreign is None:  # how many bytes up to each that no number holds (a letter, _)
                foreign = np.zeros(n + 1, np.int32)
                np.cumsum(alien[a], out=foreign[1:])
            hopeless = foreign[e[rest]] > foreign[s[rest]]
            rest = rest[~hopeless]
            where = zip((s[rest] + pos).tolist(), (e[rest] + pos).tolist(), strict=True)
            number = _numbers([data[i:j] for i, j in where])
            value[rest], read[rest] = number, np.isfinite(number)
        if hi is None:
            read &= np.abs(value) <= MAX_ARRIVAL_S
        else:
            read &= (value == np.floor(value)) & (value >= 1) & (value <= hi)
        good &= read
        columns.append(value)
    other |= ~blank  # a line not blank and not plain: one by one
    other[rows[good]] = False
    return rows[good], [columns[0][good], *(c[good].astype(np.int32) for c in columns[1:])], other, begins


@functools.cache
def _unicode_blank_bytes() -> tuple[bytes, ...]:
    """The UTF-8 of the white space past ASCII that str.strip takes off a cell (U+0085,
    U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000 in Unicode 15;
    none lies past the first plane)."""
    return tuple(chr(c).encode() for c in range(0x80, 0x10000) if chr(c).isspace())


def _unmark_blanks(a: np.ndarray, mark: np.ndarray) -> None:
    """Clear ``mark`` on the bytes of ``a`` that make white space past ASCII (UTF-8 never
    begins one character inside another: where the bytes of one are, it is)."""
    import numpy as np

    n = len(a)
    for code in _unicode_blank_bytes():
        at = np.flatnonzero(a[:n - len(code) + 1] == code[0])
        for i in range(1, len(code)):
            at = at[a[at + i] == code[i]]
        for i in range(len(code)):
            mark[at + i] = 0


def _quoted(a: np.ndarray, begins: np.ndarray, ends: np.ndarray, commas: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """The lines whose quotes the csv module could read otherwise than as a pair around a
    whole cell ("5",1,2 is 5,1,2 and "a,b",1 is a,b then 1; 5",1,2 or "5"x or "a""b" or a
    quote left open are not), and the commas less those inside a pair of quotes."""
    import numpy as np

    quotes = np.flatnonzero(a == 34)
    line = np.searchsorted(ends, quotes)
    odd = np.bincount(line, minlength=len(ends)) % 2 == 1
    paired = quotes[~odd[line]]  # lines of an even count: their quotes in pairs, in order
    commas = commas[np.searchsorted(paired, commas) % 2 == 0]  # not between an open and its close
    opens, closes = paired[0::2], paired[1::2]
    n = len(a)
    after = a[np.minimum(closes + 1, n - 1)]
    whole = (((opens == begins[np.searchsorted(ends, opens)]) | (a[opens - 1] == 44))
             & ((closes + 1 == n) | (after == 44) | (after == 10) | (after == 13)))
    odd[np.searchsorted(ends, opens[~whole])] = True
    return odd, commas


def _plain_numbers(data: bytes, pos: int, s: np.ndarray, e: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The cells ``data[pos + s:pos + e]`` that are plain numbers (digits and at most one
    point, at most _PLAIN_DIGITS digits making an integer of at most 2**53) as float()
    reads them, and which those are. A cell is read right-aligned in 8-byte words, eight
    characters at once: SWAR tests for a byte's class, and the digits' value in three
    multiplications (Lemire, "Fast number parsing without fallback", 2021; fast_float)."""
    import numpy as np

    u = np.uint64
    size = e - s
    words = min((int(size.max()) + 7) // 8, 3) if len(size) else 0
    width = 8 * words
    end = len(data) - pos
    if not words or end < width:
        return np.zeros(len(s)), np.zeros(len(s), bool)
    fits = (size >= 1) & (size <= min(width, _PLAIN_DIGITS + 1)) & (e >= width)
    first = np.where(fits, e - width, 0)
    # the 8 bytes from every byte on, as little-endian words (characters 0..7 low to high)
    at = np.ndarray((end - 7,), "<u8", data, pos, (1,))
    full = (1 << 64) - 1
    highs_of = np.array([(full << 8 * k) & full for k in range(9)], u)  # the high 8-k bytes
    ones, lows, highs = u(0x0101010101010101), u(0x7F7F7F7F7F7F7F7F), u(0x8080808080808080)
    bad = ~fits
    digits, points = [], []
    for k in range(words):
        x = at[first + 8 * k]
        inside = highs_of[np.minimum(np.maximum(width - size - 8 * k, 0), 8)]
        t = x ^ (u(0x30) * ones)  # a digit's value where the byte is a digit
        other = (((t & lows) + u(0x76) * ones) | t) & highs  # bytes not 0..9
        y = x ^ (u(0x2E) * ones)
        point = ~(((y & lows) + lows) | y | lows) & highs & inside  # bytes that are '.'
        bad |= (other & ~point & inside) != 0
        bad |= (point & (point - u(1))) != 0  # two points in one word
        digits.append(t & ((((~other & highs) >> u(7)) * u(0xFF)) & inside))
        points.append(point)
    held = [p != 0 for p in points]
    count = np.sum(held, axis=0)
    bad |= count > 1
    # the point taken out: the digits before it move one character right (into its place)
    later = np.zeros(len(s), bool)  # a point in a later word
    for k in range(words - 1, -1, -1):
        points[k] = np.where(later, u(full), np.where(held[k], (points[k] >> u(7)) - u(1), u(0)))
        later |= held[k]
    mantissa = np.zeros(len(s), u)
    q = np.zeros(len(s), np.int64)  # characters after the point
    carry = np.zeros(len(s), u)
    seen = np.zeros(len(s), bool)
    for k in range(words):
        before = digits[k] & points[k]  # points[k] now: the bytes before the point
        word = (before << u(8)) | (digits[k] & ~points[k]) | carry
        carry = before >> u(56)
        word = ((word & u(0x0F0F0F0F0F0F0F0F)) * u(2561)) >> u(8)
        word = ((word & u(0x00FF00FF00FF00FF)) * u(6553601)) >> u(16)
        word = ((word & u(0x0000FFFF0000FFFF)) * u(42949672960001)) >> u(32)
        mantissa = mantissa * u(10**8) + word
        after = 7 - ((points[k] & ones) * ones >> u(56)).astype(np.int64)  # bytes after the point
        q += np.where(seen, 8, np.where(held[k], after, 0))
        seen |= held[k]
    read = ~bad & (size - count >= 1) & (size - count <= _PLAIN_DIGITS) & (mantissa <= u(1 << 53))
    return mantissa.astype(np.float64) / np.array(_TENS)[np.minimum(q, len(_TENS) - 1)], read


def _trace_number(cell: str, hi: int | None) -> float | str:
    """A trace cell: seconds (``hi`` None) or a whole token count in 1..hi; else why not."""
    value = decimal(cell)  # as written: no 2_5 (float() reads 25), inf or nan
    if value is None:
        try:
            float(cell)
        except ValueError:
            return f"expected a number, got {shown(cell)}"
        return f"expected a finite number in decimal digits, got {shown(cell)}"
    if hi is None:  # seconds from any origin: the trace is shifted to start at 0
        if abs(value) > MAX_ARRIVAL_S:
            return (f"expected seconds within {MAX_ARRIVAL_S:.0e} of 0 (a Unix time is ~1.8e9), "
                    f"got {cell[:40]!r}")
        return value
    if not value.is_integer() or not 1 <= value <= hi:
        return f"expected whole tokens from 1 to {hi:,}, got {cell[:40]!r}"
    return value


def is_serving(data: Any) -> bool:
    """Whether a plan-file mapping is a serving plan."""
    return isinstance(data, Mapping) and data.get("kind") == "serving"


def _lengths(f: Fields, key: str) -> Lengths | None:
    raw = f.raw(key)
    if raw is None:
        return None
    hi = MAX_OUTPUT_TOKENS if key == "output_len" else MAX_SEQ_LEN
    if not isinstance(raw, Mapping):
        value = f.int(key, min=1, max=hi)
        return None if value is None else Lengths(float(value))
    g = f.child(key, raw)
    dist = g.enum("dist", Dist, Dist.FIXED)
    mean = g.float("mean", min=1, max=hi)
    sigma = g.float("sigma", 0.5 if dist is Dist.LOGNORMAL else 0.0, min=0.0, max=4.0)
    low = g.int("low", 1, min=1, max=MAX_SEQ_LEN)
    high = g.int("high", 0, min=0, max=hi)
    g.close()
    if None in (dist, mean, sigma, low, high):
        return None
    if dist is Dist.TRACE:
        g.fail("dist", "a trace's lengths come from its file: give workload.arrival: {trace: FILE.csv}")
        return None
    if dist is Dist.UNIFORM and not (high and low <= mean <= high):
        g.fail("high", f"uniform lengths need low <= mean <= high, got {low}, {mean:g}, {high}")
        return None
    return Lengths(mean, dist, sigma, low, high)


def _arrival(f: Fields) -> Arrival | None:
    raw = f.raw("arrival")
    if raw is None:
        return None
    if raw == "offline":
        return Arrival(ArrivalKind.OFFLINE)
    g = f.child("arrival", raw)
    if not g.ok:
        return None
    if sum(g.has(k) for k in ("rate_rps", "concurrency", "trace")) != 1:
        g.fail("", "expected one of rate_rps, concurrency, trace (or the word offline)")
        return None
    if g.has("trace"):
        ref = g.raw("trace")
        g.close()
        try:
            trace = read_trace(ref, f.source, g.key_path("trace"))
        except InputError as exc:
            f.problems.extend(exc.problems)
            return None
        return Arrival(ArrivalKind.TRACE, trace=trace)
    if g.has("rate_rps"):
        rate = g.float("rate_rps", min=MIN_RATE, max=MAX_RATE)
        g.close()
        return None if rate is None else Arrival(ArrivalKind.RATE, rate_rps=rate)
    c = g.int("concurrency", min=1, max=MAX_REQUESTS)
    g.close()
    return None if c is None else Arrival(ArrivalKind.CONCURRENCY, concurrency=c)


def trace_too_long(workload: Workload, model: Model) -> str:
    """Why the trace's longest request is one the engines refuse (past the model's
    max_seq_len), or ""."""
    trace = workload.arrival.trace
    assert trace is not None
    longest = max(range(workload.requests), key=lambda i: trace.input_len[i] + trace.output_len[i])
    most = trace.input_len[longest] + trace.output_len[longest]
    if most <= model.max_seq_len:
        return ""
    return (f"request {longest + 1} (by arrival) has input + output {most:,} tokens, past "
            f"{model.name}'s max_seq_len {model.max_seq_len:,}: engines refuse such requests")


def _no_lengths_beside(w: Fields) -> None:
    """A trace gives each request's lengths: input_len and output_len beside it are refused."""
    for key in ("input_len", "output_len"):
        if w.has(key):
            w.fail(key, "the arrival trace gives each request's lengths: leave this out")
            w.raw(key)  # read: not reported again as unknown


def _trace_workload(w: Fields, trace: Trace, prefix: Prefix | None,
                    images: tuple[int, int] = (0, 0)) -> Workload | None:
    """The trace's first ``requests`` requests (all of them by default)."""
    requests = w.int("requests", len(trace), min=1, max=len(trace))
    return None if requests is None else Workload.of_trace(trace, requests, prefix, images)


def _prefix(w: Fields) -> Prefix | None:
    """The workload's ``prefix``: ``{share: S, groups: G}`` (prefix caching); None where
    absent or wrong (the problem recorded)."""
    if not w.has("prefix"):
        return None
    g = w.child("prefix", w.raw("prefix"))
    if not g.ok:
        return None
    share = g.float("share", min=0.0, max=1.0)
    groups = g.int("groups", 1, min=1, max=MAX_REQUESTS)
    g.close()
    if share is None or groups is None:
        return None
    return Prefix(share, groups)


def _images(w: Fields) -> tuple[int, int] | None:
    """The workload's ``images_per_request`` and ``tokens_per_image`` (0 and 0 where absent:
    text only); None where wrong (the problem recorded). Either without the other is refused."""
    images = w.int("images_per_request", 0, min=0, max=MAX_IMAGES)
    tokens = w.int("tokens_per_image", 0, min=0, max=MAX_IMAGE_TOKENS)
    if images is None or tokens is None:
        return None
    if images and not tokens:
        w.fail("tokens_per_image", "missing: images_per_request needs the language-model tokens each "
                                   "image becomes")
        return None
    if tokens and not images:
        w.fail("images_per_request", "missing: tokens_per_image is for requests with images: give "
                                     "images_per_request >= 1 (or leave both out)")
        return None
    return images, tokens


def image_problems(model: Model, images: int) -> list[str]:
    """Why a workload whose requests carry ``images`` images cannot run on ``model``."""
    if images and model.vision is None:
        return [f"requests with images need a model with a vision encoder; {model.name} has none "
                "(model.vision)"]
    return []


def _model_and_cluster(f: Fields, required: bool,
                       pooled: bool = False) -> tuple[Model | None, Any]:
    """The ``model`` and ``cluster`` fields resolved (built-in, path or mapping); their
    problems recorded with the rest. ``pooled``: the cluster may be a heterogeneous one
    (``pools:``: a disaggregated plan's sides on different pools)."""
    from autoplan.descriptors.library import resolve_any_cluster, resolve_cluster, resolve_model

    out: list[Any] = []
    for key, resolve in (("model", resolve_model),
                         ("cluster", resolve_any_cluster if pooled else resolve_cluster)):
        value = None
        try:
            if (ref := f.raw(key) if required else f.raw(key, None)) is not None:
                value = resolve(ref, f.source, key)
        except InputError as exc:
            f.problems.extend(exc.problems)
        out.append(value)
    return out[0], out[1]


def _slo(f: Fields) -> Slo:
    """The ``slo`` mapping: TTFT and TPOT in ms (either may be absent), the percentile."""
    s = f.child("slo", f.raw("slo"))
    ttft = s.float("ttft_ms", None, min=MIN_SLO_MS, max=MAX_SLO_MS)
    tpot = s.float("tpot_ms", None, min=MIN_SLO_MS, max=MAX_SLO_MS)
    pct = s.float("percentile", 99.0, positive=True, max=100.0)
    s.close()
    return Slo(ttft, tpot, pct if pct is not None else 99.0)


def _deployment(f: Fields) -> Deployment | None:
    g = f.child("deployment", f.raw("deployment"))
    if not g.ok:
        return None
    split = _disaggregated(g) if g.has("disaggregated") else None
    if split is not None:  # the deployment's own widths are the decode pool's (Deployment.split)
        d = split.decode
        shape: dict[str, Any] = dict(replicas=d.replicas, tp=d.tp, pp=d.pp, ep=d.ep,
                                     attention_dp=d.attention_dp)
    elif g.has("disaggregated"):  # its pools' problems are reported: no shape of its own to read
        shape = dict(replicas=None, tp=None, pp=None, ep=None, attention_dp=None)
    else:
        shape = _widths(g)
    values = dict(
        **shape,
        weights=g.enum("weights", Precision, Precision.BF16),
        kv_cache=g.enum("kv_cache", Precision, Precision.BF16),
        max_num_seqs=g.int("max_num_seqs", None, min=1, max=MAX_REQUESTS),
        max_batched_tokens=g.int("max_batched_tokens", None, min=1, max=MAX_SEQ_LEN),
        chunked_prefill=g.bool("chunked_prefill", None),
    )
    speculative = _speculative(g, f.source) if g.has("speculative") else None
    g.close()
    if values["kv_cache"] is not None and values["kv_cache"] not in KV_PRECISIONS:
        g.fail("kv_cache", f"expected one of {', '.join(p.value for p in KV_PRECISIONS)}, "
                           f"got {values['kv_cache'].value}")
        return None
    required = ("replicas", "tp", "pp", "ep", "attention_dp", "weights", "kv_cache")
    if any(values[k] is None for k in required) or (g.has("disaggregated") and split is None):
        return None
    if g.has("speculative") and speculative is None:
        return None
    return Deployment(**values, disaggregated=split, speculative=speculative)  # type: ignore[arg-type]


MAX_SPEC_TOKENS = 16  # proposals per step: past what the engines take (vLLM, SGLang, TensorRT-LLM)


def speculative_choice_problems(method: SpecMethod, tokens: int, length: float | None,
                                rate: float | None, has_draft: bool) -> list[tuple[str, str]]:
    """What is wrong with speculative decoding's choices taken together (each one's own
    range is checked where it is read), as (field, why): one acceptance figure, a length
    a step of ``tokens`` proposals can yield, a draft model for the draft method alone.
    Plan files and ``serve``'s options both ask it."""
    out: list[tuple[str, str]] = []
    if (length is None) == (rate is None):
        out.append(("", "give one of acceptance_length (mean tokens a verify step yields) or "
                        "acceptance_rate (each proposed token accepted with this probability)"))
    elif length is not None and length > tokens + 1:
        out.append(("acceptance_length", f"a step of {tokens} proposals yields at most {tokens + 1} "
                                         f"tokens, got {length:g}"))
    if (method is SpecMethod.DRAFT) != has_draft:
        out.append(("draft_model", "the draft method needs a draft_model (built-in name, descriptor "
                                   "or config.json)" if not has_draft else
                    f"only the draft method runs a draft model, not {method.value}"))
    return out


def speculative_model_problems(spec: Speculative, model: Model) -> list[tuple[str, str]]:
    """What the target ``model`` cannot verify or run of ``spec``, as (field, why): a draft
    of another vocabulary, a draft no smaller than the target (by the parameters a token
    runs through: its proposals would cost a target's step each, Leviathan et al. 2023
    "Fast Inference from Transformers via Speculative Decoding", Sec. 3: the speedup needs
    the draft's cost ratio c well below 1), MTP on a model without the module."""
    out: list[tuple[str, str]] = []
    draft = spec.draft
    if draft is not None and draft.vocab != model.vocab:
        out.append(("draft_model", f"{draft.name}'s vocabulary ({draft.vocab:,}) is not "
                                   f"{model.name}'s ({model.vocab:,}): its proposals cannot be verified"))
    elif draft is not None and draft.params_active >= model.params_active:
        out.append(("draft_model", f"{draft.name} ({draft.params_active / 1e9:,.1f}B parameters a "
                                   f"token) is no smaller than the target {model.name} "
                                   f"({model.params_active / 1e9:,.1f}B): a draft must be a "
                                   "smaller model than the one it proposes for"))
    if spec.method is SpecMethod.MTP and not model.mtp_layers:
        out.append(("method", f"{model.name} has no multi-token-prediction module (mtp_layers 0): "
                              "give eagle, draft or ngram"))
    return out


def _speculative(g: Fields, source: str) -> Speculative | None:
    """``speculative: {method, tokens, acceptance_length | acceptance_rate, draft_model}``
    (:class:`Speculative`); None where wrong (the problems recorded)."""
    from autoplan.descriptors.library import resolve_model

    h = g.child("speculative", g.raw("speculative"))
    if not h.ok:
        return None
    method = h.enum("method", SpecMethod)
    tokens = h.int("tokens", min=1, max=MAX_SPEC_TOKENS)
    length = h.float("acceptance_length", None, min=1.0, max=MAX_SPEC_TOKENS + 1)
    rate = h.float("acceptance_rate", None, min=0.0, max=1.0)
    draft = None
    if h.has("draft_model"):
        try:
            draft = resolve_model(h.raw("draft_model"), source, h.key_path("draft_model"))
        except InputError as exc:
            h.problems.extend(exc.problems)
            return None
    h.close()
    if method is None or tokens is None:
        return None
    problems = speculative_choice_problems(method, tokens, length, rate, draft is not None)
    for field, why in problems:
        h.fail(field, why)
    if problems:
        return None
    return Speculative(method, tokens, rate, length, draft)


WIDTHS = ("replicas", "tp", "pp", "ep", "attention_dp")


def _widths(g: Fields) -> dict[str, Any]:
    """A replica's widths (an aggregated deployment's, or a pool's): replicas (1), tp, pp
    (1), ep (1), attention_dp (1); None where wrong (the problems recorded)."""
    return dict(replicas=g.int("replicas", 1, min=1, max=MAX_DEGREE), tp=g.int("tp", min=1, max=MAX_DEGREE),
                pp=g.int("pp", 1, min=1, max=MAX_DEGREE), ep=g.int("ep", 1, min=1, max=MAX_DEGREE),
                attention_dp=g.int("attention_dp", 1, min=1, max=MAX_DEGREE))


def _disaggregated(g: Fields) -> Disaggregated | None:
    """``disaggregated: {prefill: {replicas, tp, pp, attention_dp, ep}, decode: {...}}``: each
    pool's workers, with the widths an aggregated deployment's replica takes (pp,
    attention_dp and ep optional, 1 by default). Beside it the deployment gives no shape of
    its own."""
    for key in WIDTHS:
        if g.has(key):
            g.fail(key, "with disaggregated, each pool gives its own replicas, tp, pp, attention_dp "
                        "and ep")
            g.raw(key)  # read: not reported again as unknown
    h = g.child("disaggregated", g.raw("disaggregated"))
    if not h.ok:
        return None
    pools: list[Pool | None] = []
    on: list[str] = []
    for side in ("prefill", "decode"):
        q = h.child(side, h.raw(side))
        if not q.ok:
            pools.append(None)
            on.append("")
            continue
        widths = _widths(q)
        on.append(q.str("pool", None) or "")  # a heterogeneous cluster's pool (_pooled_sides)
        q.close()
        pools.append(None if None in widths.values() else Pool(**widths))
    h.close()
    prefill, decode = pools
    return (None if prefill is None or decode is None
            else Disaggregated(prefill, decode, on[0], on[1]))


def shape_problems(model: Model, tp: int, pp: int, ep: int, attention_dp: int) -> list[tuple[str, str]]:
    """What is wrong with a replica's widths for ``model``, as (field, why): tp dividing the
    attention heads, pp at most the layers, ep and attention_dp for mixture-of-experts
    models only, ep dividing a stage's tp x attention_dp GPUs and the experts. An
    aggregated deployment's replica and each pool of a disaggregated one are checked alike."""
    m = model
    out: list[tuple[str, str]] = []
    if m.heads % tp:
        out.append(("tp", f"must divide {m.name}'s {m.heads} attention heads, got {tp}"))
    if pp > m.layers:
        out.append(("pp", f"at most {m.name}'s {m.layers} layers, got {pp}"))
    stage = tp * attention_dp
    if not m.is_moe and (ep > 1 or attention_dp > 1):
        out.append(("", f"ep and attention_dp are for mixture-of-experts models; {m.name} is dense"))
    elif m.is_moe and (stage % ep or m.experts % ep):
        out.append(("ep", f"must divide tp x attention_dp ({stage}) and the {m.experts} experts, got {ep}"))
    return out


def _check(plan: ServingPlan, f: Fields) -> None:
    d, m, c = plan.deployment, plan.model, plan.cluster
    if plan.autoscale is not None:
        _check_autoscale(plan, f)
    elif plan.pools is None and d.gpus != c.gpus:
        shape = "replicas x tp x pp x attention_dp"
        if d.disaggregated is not None:
            shape = f"the prefill and decode pools' {shape}"
        f.fail("deployment", f"{shape} = {d.gpus} GPUs, but the cluster has {c.gpus}")
    spec = d.speculative
    for field, why in (speculative_model_problems(spec, m) if spec is not None else []):
        f.fail(f"deployment.speculative.{field}", why)
    if spec is not None and spec.draft is not None and d.tp > 1 and spec.draft.heads % d.tp:
        f.fail("deployment.speculative.draft_model", f"the draft runs on the target's TP group: "
                                                     f"{d.tp} must divide {spec.draft.name}'s "
                                                     f"{spec.draft.heads} heads")
    if spec is not None and d.disaggregated is not None:
        f.fail("deployment.speculative", "speculative decoding on a disaggregated deployment is not "
                                         "modelled: give it on an aggregated one")
    if d.disaggregated is not None:
        for side, pool in (("prefill", d.disaggregated.prefill), ("decode", d.disaggregated.decode)):
            for field, why in shape_problems(m, pool.tp, pool.pp, pool.ep, pool.attention_dp):
                f.fail(f"deployment.disaggregated.{side}" + (f".{field}" if field else ""), why)
    else:
        for field, why in shape_problems(m, d.tp, d.pp, d.ep, d.attention_dp):
            f.fail(f"deployment.{field}" if field else "deployment", why)
    tokens, seqs = d.max_batched_tokens, d.max_num_seqs
    if tokens is not None and seqs is not None and tokens < seqs:
        # each running sequence decodes a token an iteration (vLLM refuses this at start)
        f.fail("deployment.max_batched_tokens", f"must be at least max_num_seqs ({d.max_num_seqs:,}), "
                                                f"got {d.max_batched_tokens:,}")
    if plan.workload.arrival.trace is not None:
        too_long = trace_too_long(plan.workload, m)
        if too_long:
            f.fail("workload.arrival.trace", too_long)
    elif (total := plan.workload.input_len.mean + plan.workload.image_tokens
          + plan.workload.output_len.mean) > m.max_seq_len:
        images = " (images' tokens included)" if plan.workload.image_tokens else ""
        f.fail("workload", f"input + output length {total:,.0f} tokens{images} exceeds {m.name}'s "
                           f"max_seq_len {m.max_seq_len:,}: engines refuse such requests")
    for why in image_problems(m, plan.workload.images_per_request):
        f.fail("workload.images_per_request", why)
    for field, why in plan.engine.spec.model_refusals(plan.engine_release, m):
        f.fail(field, why)
    if d.chunked_prefill is False and d.max_batched_tokens is not None:
        prompt = plan.workload.input_len.ceiling
        if d.max_batched_tokens < prompt:
            f.fail("deployment.max_batched_tokens", f"without chunked prefill a prompt must fit one "
                                                    f"iteration: at least {prompt:,.0f}, got "
                                                    f"{d.max_batched_tokens:,}")


# an autoscale block's periods: a year of hourly periods is far fewer; hours a period spans
MAX_SCALING_PERIODS = 10_000
MAX_SCALING_HOURS = 24.0 * 366


def _autoscale(f: Fields) -> Autoscale | None:
    """``autoscale: {min_replicas, max_replicas, metric, target, at_capacity: {rate_rps,
    requests_in_flight, kv_cache_usage}, periods: [{start_h, hours, rate_rps, replicas}]}``
    (:class:`autoplan.serving.autoscale.Autoscale`, written by ``serve --traffic``); None
    where wrong (the problems recorded)."""
    g = f.child("autoscale", f.raw("autoscale"))
    if not g.ok:
        return None
    lo = g.int("min_replicas", min=1, max=MAX_DEGREE)
    hi = g.int("max_replicas", min=1, max=MAX_DEGREE)
    metric = g.enum("metric", ScalingMetric)
    target = g.float("target", positive=True, max=MAX_REQUESTS)
    cap = g.child("at_capacity", g.raw("at_capacity"))
    rate = in_flight = kv = None
    if cap.ok:
        rate = cap.float("rate_rps", positive=True, max=MAX_RATE)
        in_flight = cap.float("requests_in_flight", positive=True, max=MAX_REQUESTS)
        kv = cap.float("kv_cache_usage", min=0.0, max=1.0)
        cap.close()
    periods = _scaling_periods(g)
    g.close()
    if lo is None or hi is None or metric is None or target is None or rate is None \
            or in_flight is None or kv is None or periods is None:
        return None
    if lo > hi:
        g.fail("min_replicas", f"expected at most max_replicas ({hi}), got {lo}")
        return None
    for i, p in enumerate(periods):
        if not lo <= p.replicas <= hi:
            g.fail(f"periods[{i}].replicas", f"expected min_replicas to max_replicas ({lo} to {hi}), "
                                             f"got {p.replicas}")
            return None
    return Autoscale(min_replicas=lo, max_replicas=hi, metric=metric, target=target, capacity_rps=rate,
                     requests_in_flight=in_flight, kv_cache_usage=kv, periods=periods)


def _scaling_periods(g: Fields) -> tuple[ScalingPeriod, ...] | None:
    """The autoscale block's ``periods``: a list, each starting where the one before ends."""
    raw = g.raw("periods")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        g.fail("periods", "expected a list of {start_h, hours, rate_rps, replicas}")
        return None
    if len(raw) > MAX_SCALING_PERIODS:
        g.fail("periods", f"expected at most {MAX_SCALING_PERIODS:,} periods, got {len(raw):,}")
        return None
    out: list[ScalingPeriod] = []
    for i, item in enumerate(raw):
        h = g.child(f"periods[{i}]", item)
        if not h.ok:
            return None
        start = h.float("start_h", min=0.0, max=MAX_SCALING_HOURS)
        hours = h.float("hours", positive=True, max=MAX_SCALING_HOURS)
        rate = h.float("rate_rps", min=0.0, max=MAX_RATE)
        replicas = h.int("replicas", min=1, max=MAX_DEGREE)
        h.close()
        if None in (start, hours, rate, replicas):
            return None
        if out and abs(start - (out[-1].start_h + out[-1].hours)) > 1e-6:
            h.fail("start_h", f"expected {out[-1].start_h + out[-1].hours:g}, where the period before "
                              f"ends, got {start:g}")
            return None
        out.append(ScalingPeriod(start_h=start, hours=hours, rate_rps=rate, replicas=replicas))
    return tuple(out)


def _check_autoscale(plan: ServingPlan, f: Fields) -> None:
    """An autoscaled plan: an aggregated deployment of its most replicas, on a cluster of
    the nodes that hold them (part of one node, or whole nodes: the last may be shared)."""
    d, c, a = plan.deployment, plan.cluster, plan.autoscale
    assert a is not None
    if d.disaggregated is not None:
        f.fail("autoscale", "autoscaling a disaggregated deployment (two pools) is not planned: "
                            "give it on an aggregated one")
        return
    if d.replicas != a.max_replicas:
        f.fail("deployment.replicas", f"expected autoscale.max_replicas ({a.max_replicas}): an "
                                      f"autoscaled plan's deployment is its most replicas, got {d.replicas}")
    holding = holding_gpus(d.gpus, c.gpus_per_node)
    if c.gpus != holding:
        f.fail("deployment", f"replicas x tp x pp x attention_dp = {d.gpus} GPUs, but the cluster has "
                             f"{c.gpus} (expected the nodes that hold them: {holding})")


def holding_gpus(gpus: int, per_node: int) -> int:
    """The GPUs of the nodes that hold ``gpus``: part of one node as they are, else whole
    nodes (the cluster an autoscaled plan names; ``with_gpus`` sizes it so)."""
    return gpus if gpus <= per_node else -(-gpus // per_node) * per_node


def read_engine(f: Fields, default: Engine | None) -> tuple[Engine | None, str | None]:
    """``engine``: a registered engine's name (its default release line, the newest fitted),
    or ``{name, version}`` naming the release (``serving.engine``: the line that predicts
    it). (engine, version), version None where not given."""
    if not f.has("engine") or not isinstance(f.raw("engine"), Mapping):
        return f.enum("engine", Engine, default), None
    e = f.child("engine", f.raw("engine"))
    engine = e.enum("name", Engine)
    version = e.raw("version", None)
    e.close()
    if version is not None:
        try:
            if engine is not None:
                engine.spec.resolve(version)
            else:  # the name is wrong: still say what is wrong with the version
                from autoplan.serving.versions import parse_version

                parse_version(version)
        except VersionError as exc:
            e.fail("version", str(exc))
            return engine, None
        version = str(version).strip()
    return engine, version


@dataclass(frozen=True, slots=True)
class ServingJob:
    """What ``autoplan serve JOB.yaml`` reads: every field optional (flags fill the rest)."""

    model: Model | None = None
    cluster: Cluster | PooledCluster | None = None  # pools: prefill and decode apart
    gpus: int | None = None
    engine: Engine | None = None
    engine_version: str | None = None  # the engine release (engine: {name, version})
    input_len: Lengths | None = None
    output_len: Lengths | None = None
    arrival: Arrival | None = None
    requests: int | None = None
    slo: Slo | None = None
    prefix: Prefix | None = None
    images: tuple[int, int] = (0, 0)  # images per request, tokens per image (workload)
    # speculative decoding tried beside every deployment (``serve --speculative``), as a
    # plan's ``deployment.speculative``
    speculative: Speculative | None = None


def read_serving_job(data: Any, source: str) -> ServingJob:
    """A serving job file: ``model``, ``cluster``, ``gpus``, ``engine``, ``workload``
    (as in a plan), ``slo`` and ``speculative`` (as a plan's ``deployment.speculative``:
    what ``--speculative`` and its flags give); no deployment (that is what ``serve``
    finds)."""
    problems: list[Problem] = []
    f = Fields(data, source, "", problems)
    if not f.ok:
        raise InputError(problems)
    if f.has("deployment"):
        f.fail("deployment", "a job file leaves the deployment to `autoplan serve`; a plan with "
                             "one is read by `autoplan evaluate`")
    f.raw("autoplan", None)
    kind = f.str("kind", "serving")
    if kind is not None and kind != "serving":
        f.fail("kind", f"expected serving, got {kind!r}"[:120])
    model, cluster = _model_and_cluster(f, required=False, pooled=True)
    gpus = f.int("gpus", None, min=1, max=MAX_DEGREE * 16)
    engine, engine_version = read_engine(f, None)
    inp = out = arrival = prefix = None
    requests = None
    images: tuple[int, int] | None = (0, 0)
    if f.has("workload"):
        w = f.child("workload", f.raw("workload"))
        if w.ok:
            prefix = _prefix(w)
            images = _images(w)
            arrival = _arrival(w) if w.has("arrival") else None
            if arrival is not None and arrival.trace is not None:
                _no_lengths_beside(w)  # the trace's (serve reads them from it)
                requests = w.int("requests", None, min=1, max=len(arrival.trace))
            else:
                inp = _lengths(w, "input_len") if w.has("input_len") else None
                out = _lengths(w, "output_len") if w.has("output_len") else None
                requests = w.int("requests", None, min=1, max=MAX_REQUESTS)
            w.close()
    slo = _slo(f) if f.has("slo") else None
    spec = _speculative(f, source) if f.has("speculative") else None
    f.close()
    if model is not None and spec is not None:
        for field, why in speculative_model_problems(spec, model):
            f.fail(f"speculative.{field}" if field else "speculative", why)
    if model is not None and images is not None:
        for why in image_problems(model, images[0]):
            f.fail("workload.images_per_request", why)
    if problems or images is None:
        raise InputError(problems)
    return ServingJob(model=model, cluster=cluster, gpus=gpus, engine=engine, engine_version=engine_version,
                      input_len=inp, output_len=out, arrival=arrival, requests=requests, slo=slo,
                      prefix=prefix, images=images, speculative=spec)


def read_serving_plan(data: Any, source: str, *, profile: Profile | None = None,
                      correct: bool = True) -> ServingPlan:
    """Build and check a serving plan from a plan-file mapping; every problem at once. Its
    cluster comes through the one door of measured profiles (``measured.door.corrected``:
    ``profile``, else the one shipped for its device and the plan's engine), as training plans' do
    (``planfile.read_plan``); ``correct=False`` leaves it analytic (export)."""
    from autoplan.plan import SCHEMA_VERSION

    problems: list[Problem] = []
    f = Fields(data, source, "", problems)
    if not f.ok:
        raise InputError(problems)
    version = f.int("autoplan")
    if version is not None and version != SCHEMA_VERSION:
        f.fail("autoplan", f"expected schema version {SCHEMA_VERSION}, got {version}")
    f.str("kind")
    model, cluster = _model_and_cluster(f, required=True, pooled=True)
    engine, engine_version = read_engine(f, Engine.VLLM)
    deployment = _deployment(f)
    w = f.child("workload", f.raw("workload"))
    workload = None
    if w.ok:
        arrival = _arrival(w)
        prefix = _prefix(w)
        images = _images(w)
        if arrival is not None and arrival.trace is not None:
            _no_lengths_beside(w)
            workload = _trace_workload(w, arrival.trace, prefix, images or (0, 0))
        else:
            inp, out = _lengths(w, "input_len"), _lengths(w, "output_len")
            requests = w.int("requests", 1000, min=1, max=MAX_REQUESTS)
            if None not in (inp, out, arrival, requests):
                workload = Workload(inp, out, arrival, requests, prefix,  # type: ignore[arg-type]
                                    *(images or (0, 0)))
        if images is None:
            workload = None
        w.close()
    slo = _slo(f) if f.has("slo") else Slo()
    autoscale = _autoscale(f) if f.has("autoscale") else None
    if f.has("prediction") and not isinstance(f.raw("prediction"), Mapping):
        f.fail("prediction", "expected a mapping (written by autoplan serve or evaluate)")
    if f.has("measured") and not isinstance(f.raw("measured"), Mapping):
        f.fail("measured", "expected a mapping (written by autoplan tune --serving)")
    f.close()
    if problems or None in (model, cluster, engine, deployment, workload):
        raise InputError(problems or [Problem(source, "", "incomplete serving plan")])
    pools = cluster if isinstance(cluster, PooledCluster) else None
    if pools is not None:
        cluster = _pooled_sides(pools, deployment, f)  # type: ignore[arg-type]
        if cluster is None:
            raise InputError(problems)
    elif deployment is not None and deployment.disaggregated is not None:
        for side in ("prefill", "decode"):
            if getattr(deployment.disaggregated, f"{side}_on"):
                f.fail(f"deployment.disaggregated.{side}.pool",
                       "names a pool of a heterogeneous cluster (pools:); this plan's cluster has none")
        if problems:
            raise InputError(problems)
    plan = ServingPlan(model, cluster, engine, deployment, workload, slo,  # type: ignore[arg-type]
                       engine_version, autoscale, pools)
    _check(plan, f)
    if problems:
        raise InputError(problems)
    if correct:
        plan = corrected_plan(plan, profile)
    return plan


def corrected_plan(plan: ServingPlan, profile: Profile | None = None) -> ServingPlan:
    """The plan's cluster through the one door of measured profiles (``measured.door``):
    each pool's of a heterogeneous one, by its own device."""
    def fix(c: Cluster) -> Cluster:
        return corrected(c, profile, plan.engine, plan.engine_version).cluster
    if plan.pools is None:
        return dataclasses.replace(plan, cluster=fix(plan.cluster))
    pools = dataclasses.replace(plan.pools, pools=tuple(fix(p) for p in plan.pools.pools))
    dis = plan.deployment.disaggregated
    assert dis is not None
    return dataclasses.replace(plan, pools=pools, cluster=pools.pools[pools.index(dis.decode_on)])


def _pooled_sides(pools: PooledCluster, d: Deployment | None, f: Fields) -> Cluster | None:
    """A plan on a heterogeneous cluster: a disaggregated deployment whose sides each name a
    pool (``deployment.disaggregated.prefill.pool``), each within its pool's GPUs; the decode
    side's pool is the plan's ``cluster``."""
    names = [p.name for p in pools.pools]
    dis = None if d is None else d.disaggregated
    if dis is None:
        f.fail("deployment", f"{pools.name} has pools of unlike nodes: a serving plan on it is "
                             f"disaggregated, each side on a pool (disaggregated.prefill.pool, "
                             f"disaggregated.decode.pool: one of {', '.join(names)})")
        return None
    ok = True
    for side, pool, name in (("prefill", dis.prefill, dis.prefill_on), ("decode", dis.decode, dis.decode_on)):
        key = f"deployment.disaggregated.{side}.pool"
        if name not in names:
            got = shown(name) if name else "nothing"
            f.fail(key, f"expected one of {', '.join(names)} (the cluster's pools), got {got}")
            ok = False
            continue
        have = pools.pools[pools.index(name)].gpus
        if pool.gpus > have:
            f.fail(f"deployment.disaggregated.{side}", f"{pool.gpus} GPUs, but pool {name} has {have}")
            ok = False
    if ok and dis.prefill_on == dis.decode_on and sum(
            p.gpus for p in (dis.prefill, dis.decode)) > pools.pools[pools.index(dis.decode_on)].gpus:
        f.fail("deployment.disaggregated", f"both sides on pool {dis.decode_on} need more GPUs than it has")
        ok = False
    return pools.pools[pools.index(dis.decode_on)] if ok else None
