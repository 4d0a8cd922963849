"""The traffic file of ``serve --traffic`` (autoplan.serving.traffic): what it reads, and
every way it refuses a file, naming the file, the line and the column."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.errors import InputError
from autoplan.serving.traffic import MAX_PERIODS, parse_traffic, read_traffic


def _write(tmp_path: Path, text: str, name: str = "day.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _refusal(text: str) -> str:
    with pytest.raises(InputError) as caught:
        parse_traffic(text, "day.csv")
    return str(caught.value)


def test_clock_times_run_each_period_to_the_next_and_the_last_to_the_next_days_first() -> None:
    t = parse_traffic("start,rate_rps\n06:00,2\n12:30,10\n20:00,4\n", "day.csv")
    assert [(p.start_h, p.end_h) for p in t.periods] == [(6.0, 12.5), (12.5, 20.0), (20.0, 30.0)]
    assert [p.rate_rps for p in t.periods] == [2.0, 10.0, 4.0]
    assert t.span_h == 24.0
    assert [p.label() for p in t.periods] == ["06:00", "12:30", "20:00"]


def test_hours_an_end_column_lengths_and_comments_are_read() -> None:
    text = ("# a comment line\nstart,rate_rps,input_len,output_len,end\n"
            "0,1.5,2000,,\n\n2.5,3,,128,\n# another\n4,0,,,30\n")
    t = parse_traffic(text, "day.csv")
    assert [(p.start_h, p.end_h) for p in t.periods] == [(0.0, 2.5), (2.5, 4.0), (4.0, 30.0)]
    assert [(p.input_len, p.output_len) for p in t.periods] == [(2000.0, None), (None, 128.0), (None, None)]
    assert [p.line for p in t.periods] == [3, 5, 7]


def test_a_row_may_give_clients_of_a_closed_loop_instead_of_a_rate() -> None:
    t = parse_traffic("start,rate_rps,concurrency\n00:00,5,\n12:00,,64\n", "day.csv")
    assert (t.periods[1].rate_rps, t.periods[1].concurrency) == (None, 64)


@pytest.mark.parametrize("text, names", [
    ("start,rate\n0,1\n", ["line 1", "unknown column 'rate'", "did you mean rate_rps",
                           "missing column rate_rps"]),
    ("start,rate_rps,rate_rps\n0,1,1\n", ["line 1", "named twice"]),
    ("start,rate_rps\n0,fast\n", ["line 2, rate_rps", "expected requests/s, got 'fast'"]),
    ("start,rate_rps\n0,-1\n", ["line 2, rate_rps", "from 0"]),
    ("start,rate_rps\n0,1e9\n", ["line 2, rate_rps", "1,000,000"]),
    ("start,rate_rps\n0,nan\n", ["line 2, rate_rps", "expected requests/s"]),
    ("start,rate_rps\n25:61,1\n", ["line 2, start", "00:00 to 47:59"]),
    ("start,rate_rps\n9000,1\n", ["line 2, start", "expected hours from 0"]),
    ("start,rate_rps\n,1\n", ["line 2, start", "missing"]),
    ("start,rate_rps,concurrency\n0,1,4\n", ["line 2, concurrency", "not both"]),
    ("start,rate_rps,concurrency\n0,,\n", ["line 2, rate_rps", "missing"]),
    ("start,rate_rps,concurrency\n0,,2.5\n", ["line 2, concurrency", "whole clients"]),
    ("start,rate_rps,input_len\n0,1,0\n", ["line 2, input_len", "from 1"]),
    ("start,rate_rps\n08:00,1\n07:00,2\n", ["line 3, start", "in order", "24:00"]),
    ("start,rate_rps\n0,1\n30,2\n", ["line 3, start", "a day later", "end column"]),
    ("start,rate_rps,end\n0,1,5\n6,2,9\n", ["line 2, end", "line 3's begins"]),
    ("start,rate_rps,end\n0,1,\n6,2,\n", ["line 3, end", "missing"]),
    ("start,rate_rps,end\n0,1,\n6,2,5\n", ["line 3, end", "after the period's start"]),
    ("start,rate_rps\n0,1,7\n", ["line 2", "3 cells", "2 columns"]),
    ("start,rate_rps\n", ["no periods"]),
    ("# only a comment\n", ["empty"]),
])
def test_each_bad_file_is_refused_naming_the_file_line_and_column(text: str, names: list[str]) -> None:
    message = _refusal(text)
    assert message.startswith("day.csv")
    for name in names:
        assert name in message, (name, message)


def test_too_many_periods_are_refused_at_the_first_past_the_limit() -> None:
    rows = "".join(f"{i / 1000:.3f},1\n" for i in range(MAX_PERIODS + 1))
    message = _refusal("start,rate_rps,end\n" + rows)
    assert f"line {MAX_PERIODS + 2}" in message and "more than 10,000 periods" in message


def test_a_file_too_large_a_fifo_and_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    big = _write(tmp_path, "start,rate_rps\n" + "0,1\n" * 400_000, "big.csv")
    with pytest.raises(InputError, match="larger than"):
        read_traffic(big)
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)  # opening it would block until a writer came
    with pytest.raises(InputError, match="not a regular file"):
        read_traffic(fifo)
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"start,rate_rps\n0,1\xe9\n")
    with pytest.raises(InputError, match="latin.csv.*not UTF-8"):
        read_traffic(latin)
    with pytest.raises(InputError, match="file not found"):
        read_traffic(tmp_path / "missing.csv")


def test_a_byte_order_mark_and_crlf_line_ends_are_read(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfstart,rate_rps\r\n00:00,1\r\n12:00,2\r\n")
    assert [p.rate_rps for p in read_traffic(path).periods] == [1.0, 2.0]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(alphabet=st.sampled_from(list("start,rate_ps0123456789.:-e\n #\"\x00")), max_size=120))
def test_arbitrary_text_is_read_or_refused_with_a_named_problem_never_a_crash(text: str) -> None:
    try:
        t = parse_traffic(text, "fuzz.csv")
    except InputError as exc:
        assert all(p.source == "fuzz.csv" for p in exc.problems)
        return
    assert t.periods and all(p.end_h > p.start_h for p in t.periods)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.floats(0, 5000, allow_nan=False)), min_size=1, max_size=30))
def test_any_valid_table_is_read_back_to_its_own_numbers(rows: list[tuple[int, float]]) -> None:
    starts, t = [], 0
    for step, _ in rows:
        t += step
        starts.append(t)
    text = "start,rate_rps,end\n" + "".join(
        f"{s / 60:.6f},{r!r},{'' if i < len(rows) - 1 else f'{starts[-1] / 60 + 1:.6f}'}\n"
        for i, (s, (_, r)) in enumerate(zip(starts, rows, strict=True)))
    got = parse_traffic(text, "ok.csv")
    assert [p.rate_rps for p in got.periods] == [r for _, r in rows]
    assert all(abs(a.end_h - b.start_h) < 1e-9 for a, b in zip(got.periods, got.periods[1:], strict=False))
