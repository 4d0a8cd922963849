"""Traffic that changes over the day: the CSV ``serve --traffic FILE.csv`` reads.

One row per period, in order, under a header naming its columns:

- ``start``: when the period begins, ``HH:MM`` (``00:00`` to ``47:59``: a day that begins
  after midnight writes its small hours as ``24:00`` on) or hours from any origin
  (``7.5``);
- ``rate_rps``: requests/s arriving in the period (Poisson), 0 for none; a row may leave it
  empty and give ``concurrency`` instead;
- ``input_len``, ``output_len`` (optional): the period's mean prompt and output tokens,
  in place of the job's means (the job's distribution kept);
- ``concurrency`` (optional): clients in a closed loop (each sends its next request when
  its last one finishes), for a row whose ``rate_rps`` is empty;
- ``end`` (optional): when the last period ends; without it the last period runs to the
  first one's start a day later. Given on another row it must be the next row's start.

A line whose first cell begins with ``#`` is a comment. Read strictly: every problem
names the file, the line and the column (:func:`read_traffic`); the file, its rows and
its values are bounded, and only a regular file is read.
"""

from __future__ import annotations

import csv
import difflib
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from autoplan.descriptors.job import MAX_SEQ_LEN
from autoplan.descriptors.strict import decimal, read_limited, shown
from autoplan.errors import InputError, Problem
from autoplan.serving.planfile import MAX_OUTPUT_TOKENS, MAX_RATE, MAX_REQUESTS
from autoplan.units import MiB

MAX_TRAFFIC_BYTES = 1 * MiB  # thousands of rows of a few short numbers fit many times over
MAX_PERIODS = 10_000  # a week of one-minute periods
MAX_SPAN_H = 24.0 * 366  # a year of hours: past it a number is not a schedule
DAY_H = 24.0
MAX_PROBLEMS = 10  # then stop reading: the rest is likely the same mistake
COLUMNS = ("start", "rate_rps", "input_len", "output_len", "concurrency", "end")
REQUIRED = ("start", "rate_rps")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Period:
    """One row of the traffic file: a span of hours and what arrives in it."""

    line: int  # the file's line (the header is line 1)
    start_h: float
    end_h: float
    rate_rps: float | None  # None: a closed loop of ``concurrency`` clients
    concurrency: int | None = None
    input_len: float | None = None  # None: the job's
    output_len: float | None = None

    @property
    def hours(self) -> float:
        return self.end_h - self.start_h

    def label(self) -> str:
        """``07:30`` where the start is a whole minute within two days, else its hours."""
        minutes = self.start_h * 60.0
        if abs(minutes - round(minutes)) < 1e-6 and minutes < 48 * 60:
            m = int(round(minutes))
            return f"{m // 60:02d}:{m % 60:02d}"
        return f"{self.start_h:g} h"


@dataclass(frozen=True, slots=True)
class Traffic:
    """The periods of a traffic file, in order, each ending where the next begins."""

    path: str
    periods: tuple[Period, ...]

    @property
    def span_h(self) -> float:
        return self.periods[-1].end_h - self.periods[0].start_h


def read_traffic(path: Path, source: str = "--traffic") -> Traffic:
    """The traffic file at ``path`` (module doc); every problem at once (up to
    MAX_PROBLEMS), as an InputError naming the file, line and column."""
    label = str(path)
    data = read_limited(path, MAX_TRAFFIC_BYTES, "a traffic CSV", source=source, label=label)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError.single(label, "", f"not UTF-8 text: {exc}") from None
    return parse_traffic(text, label)


def parse_traffic(text: str, label: str) -> Traffic:
    """The traffic in ``text`` (a file's, decoded), named ``label`` in messages."""
    rows = csv.reader(text.splitlines())
    problems: list[Problem] = []
    header: list[str] | None = None
    header_line = 0
    cells: list[tuple[int, list[str]]] = []
    try:
        for row in rows:
            line = rows.line_num
            if not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue  # blank, or a comment
            if header is None:
                header, header_line = [c.strip() for c in row], line
                continue
            if len(cells) >= MAX_PERIODS:
                raise InputError.single(label, f"line {line}", f"more than {MAX_PERIODS:,} periods")
            cells.append((line, row))
    except csv.Error as exc:  # a NUL, a field past csv's limit
        raise InputError.single(label, f"line {rows.line_num}", f"not CSV: {exc}") from None
    if header is None:
        raise InputError.single(label, "", f"empty: expected a header naming {', '.join(REQUIRED)} "
                                           "and a row per period")
    at = _columns(header, label, header_line)
    periods: list[tuple[Period, float | None]] = []  # each row's period and its end cell
    for line, row in cells:
        if len(problems) >= MAX_PROBLEMS:
            break
        if len(row) > len(header):
            problems.append(Problem(label, f"line {line}", f"{len(row)} cells, but the header names "
                                                            f"{len(header)} columns"))
            continue
        period, end = _row(row, at, line, label, problems)
        if period is not None:
            periods.append((period, end))
    if problems:
        raise InputError(problems)
    if not periods:
        raise InputError.single(label, "", "no periods (a header and no rows)")
    return Traffic(label, tuple(_spans(periods, "end" in at, label)))


def _columns(header: list[str], label: str, line: int) -> dict[str, int]:
    """Each known column's index; an unknown, repeated or missing one refused."""
    problems: list[Problem] = []
    at: dict[str, int] = {}
    for i, name in enumerate(header):
        if name in at:
            problems.append(Problem(label, f"line {line}", f"column {shown(name)} named twice"))
        elif name not in COLUMNS:
            near = difflib.get_close_matches(name, COLUMNS, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(Problem(label, f"line {line}", f"unknown column {shown(name)}{hint}; "
                                                           f"expected {', '.join(COLUMNS)}"))
        else:
            at[name] = i
    missing = [c for c in REQUIRED if c not in at]
    if missing:
        problems.append(Problem(label, f"line {line}", f"missing column {', '.join(missing)}"))
    if problems:
        raise InputError(problems)
    return at


def _cell(row: list[str], at: dict[str, int], name: str) -> str:
    i = at.get(name)
    return row[i].strip() if i is not None and i < len(row) else ""


def hours_of(cell: str) -> float | str:
    """A time cell as hours: ``HH:MM`` (HH 0..47) or decimal hours in 0..MAX_SPAN_H; else why not."""
    clock = _CLOCK.fullmatch(cell)
    if clock is not None:
        h, m = int(clock.group(1)), int(clock.group(2))
        if h > 47 or m > 59:
            return f"expected HH:MM from 00:00 to 47:59, got {shown(cell)}"
        return h + m / 60.0
    value = decimal(cell)
    if value is None:
        return f"expected HH:MM or hours, got {shown(cell)}"
    if not 0 <= value <= MAX_SPAN_H:
        return f"expected hours from 0 to {MAX_SPAN_H:g}, got {shown(cell)}"
    return value


def _number(cell: str, lo: float, hi: float, whole: bool, unit: str) -> float | str:
    value = decimal(cell)
    if value is None:
        return f"expected {unit}, got {shown(cell)}"
    if not lo <= value <= hi or (whole and not value.is_integer()):
        kind = "whole " if whole else ""
        return f"expected {kind}{unit} from {lo:g} to {hi:,.0f}, got {shown(cell)}"
    return value


def _row(row: list[str], at: dict[str, int], line: int, label: str, problems: list[Problem]
         ) -> tuple[Period | None, float | None]:
    """One row's period (its end filled in by :func:`_spans`) and its ``end`` cell; None
    where a cell is wrong (the problems recorded)."""
    before = len(problems)

    def fail(column: str, why: str) -> None:
        problems.append(Problem(label, f"line {line}, {column}", why))

    def read(column: str, lo: float, hi: float, whole: bool, unit: str) -> float | None:
        cell = _cell(row, at, column)
        if not cell:
            return None
        value = _number(cell, lo, hi, whole, unit)
        if isinstance(value, str):
            fail(column, value)
            return None
        return value

    times: list[float | None] = []
    for column in ("start", "end"):
        cell = _cell(row, at, column)
        value = hours_of(cell) if cell else None
        if isinstance(value, str):
            fail(column, value)
            value = None
        elif value is None and column == "start":
            fail(column, "missing: when the period begins (HH:MM or hours)")
        times.append(value)
    start, end = times
    rate = read("rate_rps", 0.0, MAX_RATE, False, "requests/s")
    clients = read("concurrency", 1, MAX_REQUESTS, True, "clients")
    inp = read("input_len", 1, MAX_SEQ_LEN, False, "mean prompt tokens")
    out = read("output_len", 1, MAX_OUTPUT_TOKENS, False, "mean output tokens")
    given = (_cell(row, at, "rate_rps"), _cell(row, at, "concurrency"))
    if all(given):
        fail("concurrency", "give rate_rps or concurrency, not both")
    elif not any(given):
        fail("rate_rps", "missing: requests/s (or the clients of a closed loop in concurrency)")
    if len(problems) > before or start is None:
        return None, end
    return (Period(line=line, start_h=start, end_h=math.nan, rate_rps=rate,
                   concurrency=None if clients is None else int(clients), input_len=inp,
                   output_len=out), end)


def _spans(rows: list[tuple[Period, float | None]], has_end: bool, label: str) -> list[Period]:
    """Each period ending where the next begins, the last at its ``end`` or a day after the
    first start; starts must increase, an ``end`` given on another row must be the next start."""
    problems: list[Problem] = []
    out: list[Period] = []
    periods = [p for p, _ in rows]
    for i, (p, end) in enumerate(rows):
        line = p.line
        if i < len(rows) - 1:
            nxt = periods[i + 1]
            if nxt.start_h <= p.start_h:
                problems.append(Problem(label, f"line {nxt.line}, start", (
                    f"periods go in order: {nxt.label()} is not after line {p.line}'s {p.label()} "
                    "(past midnight of a day that began later, write 24:00 on)")))
            elif end is not None and abs(end - nxt.start_h) > 1e-9:
                problems.append(Problem(label, f"line {line}, end", (
                    f"periods follow each other: this one ends where line {nxt.line}'s begins "
                    f"({nxt.label()}); leave end empty on all but the last row")))
            out.append(replace(p, end_h=nxt.start_h))
            continue
        first = periods[0].start_h
        if end is None:
            if has_end:
                problems.append(Problem(label, f"line {line}, end", "missing: when the last period ends"))
                continue
            end = first + DAY_H
            if end <= p.start_h:
                problems.append(Problem(label, f"line {line}, start", (
                    f"the last period runs to the first one's start a day later ({end:g} h), "
                    f"not after its own start {p.label()}: give an end column for a span past a day")))
                continue
        elif end <= p.start_h:
            problems.append(Problem(label, f"line {line}, end", f"expected a time after the period's "
                                                                 f"start {p.label()}"))
            continue
        if end - first > MAX_SPAN_H:
            problems.append(Problem(label, f"line {line}, end", f"the periods span {end - first:g} h, "
                                                                 f"more than {MAX_SPAN_H:g}"))
            continue
        out.append(replace(p, end_h=end))
    if problems:
        raise InputError(problems[:MAX_PROBLEMS])
    return out
