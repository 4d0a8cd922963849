"""Reading launchers' logs under hostile input (issue 47): the parser's work is linear in
the log whatever it holds, a log read in pieces reads as read whole, every number is
checked (a bad one is a problem of its line, never a traceback), and good logs read as
they always did (tests/unit/test_tune.py)."""

from __future__ import annotations

import gc
import time
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.tune import logs
from autoplan.tune.logs import MAX_LINE_CHARS, MEGATRON, TORCHTITAN, LogReader, LogReading, read_log
from tests.helpers import cpu_seconds

MEGA = " [2026-11-27 10:00:0{i}] iteration {i:8d}/       6 | consumed samples: 8 | " \
       "elapsed time per iteration (ms): {ms} | learning rate: 3.0E-04 |\n"
MEMORY = "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1000.0 | max allocated: {a} | " \
         "reserved: 2000.0 | max reserved: {r}\n"
TITAN = "[titan] 2026 - root - INFO - \x1b[31mstep: {i:2}  \x1b[32mloss: 10.4  \x1b[34mmemory: {gib}GiB" \
        "(12.50%)  \x1b[36mtps: {tps}  \x1b[35mtflops: 0.10\x1b[39m\n"


def mega(*ms: str) -> str:
    return "".join(MEGA.format(i=i, ms=m) for i, m in enumerate(ms, start=1))


# --------------------------------------------------------------------------- linear time

# the issue's inputs, each past a minute before: the torchtitan pattern was cubic in a
# line of these, the Megatron-LM one quadratic; 150 MB of newlines took 36 s (here 15 MB)
PATHOLOGICAL = {
    "torchtitan, cubic": "step: 1 loss: memory: 1GiB " * 800,
    "megatron, quadratic": "iteration 1/1 | " * 40_000,
    "newlines": "\n" * 15_000_000,
    "torchtitan lines": ("step: 1 loss: memory: 1GiB " * 800 + "\n") * 20,
    "megatron lines": ("iteration 1/1 | " * 4000 + "elapsed time per iteration (ms): 1\n") * 10,
    "memory lines": ("memory (MB) | max allocated: " * 2000 + "\n") * 10,
    "out of memory words": "out of memor " * 50_000 + "emory" * 50_000,
}


@pytest.mark.parametrize("text", list(PATHOLOGICAL.values()), ids=list(PATHOLOGICAL))
def test_the_issues_pathological_logs_are_read_in_well_under_a_second(text):
    with cpu_seconds() as took:
        reading = read_log(text, tokens_per_step=2048, gpus=2)
    assert took[0] < 1.0, took
    assert reading.step_times_s in ((), ((1, 1e-3),))


def _cpu(text: str, chunk: int | None) -> float:
    """The least CPU seconds of three reads of ``text`` (fed in ``chunk``-character
    pieces, or whole), the garbage collector off."""
    best = float("inf")
    gc.disable()
    try:
        for _ in range(3):
            start = time.process_time()
            reader = LogReader(tokens_per_step=2048, gpus=2)
            if chunk is None:
                reader.feed(text)
            else:
                for at in range(0, len(text), chunk):
                    reader.feed(text[at:at + chunk])
            reader.finish()
            reader.reading()
            best = min(best, time.process_time() - start)
    finally:
        gc.enable()
    return best


UNITS = st.lists(st.sampled_from([
    "iteration 1/1 | ", "elapsed time per iteration (ms): ", "1", "1.", "e", "9" * 20, " ", "|",
    "step: 1 loss: ", "memory: ", "1GiB ", "tps: ", "1,0", ",", "memory (MB) | ", "max allocated: ",
    "max reserved: ", "out of memor", "emory", "EMORY", "\x1b[3", "\x1b[31m", "\r", "\n", "x" * 50,
]), min_size=1, max_size=8).map("".join)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(unit=UNITS, lines=st.booleans(), chunked=st.booleans())
def test_reading_takes_time_linear_in_the_log(unit, lines, chunked):
    # n and 8n repeats of one unit, as one line (of 8,000 and 64,000 characters: under the
    # cap, so both are read as lines) or as lines (64,000 and 512,000 characters): linear
    # work takes about 8x as long, a quadratic pattern 64x, a cubic one 512x. The least CPU
    # time of three reads, a factor of 3 and 10 ms of slack: a loaded machine does not
    # fail it.
    unit = unit.replace("\n", " ") + ("\n" if lines else "")
    n = (64_000 if lines else 8_000) // len(unit)
    assert len(unit) * 8 * n <= MAX_LINE_CHARS or lines
    chunk = 4096 if chunked else None
    small, large = _cpu(unit * n, chunk), _cpu(unit * (8 * n), chunk)
    assert large < 3 * 8 * small + 0.01, (small, large)


def test_a_line_past_the_cap_is_searched_for_out_of_memory_only():
    long = "x" * MAX_LINE_CHARS
    reading = read_log(mega("5") + long + "elapsed time per iteration (ms): 1e308 " + "\n" + mega("6"))
    assert reading.problems == () and reading.step_times_s == ((1, 0.006),)  # the last line is step 1 too
    assert read_log(long + "CUDA out of memory\n").oom
    reader = LogReader()
    for at in range(0, len(long), 1000):
        reader.feed(long[at:at + 1000])
    reader.feed("torch.OutOfMemory")
    assert not reader.reading().oom
    reader.feed("Error: CUDA\n")
    assert reader.reading().oom  # a message across two pieces of a long line


def test_the_steps_a_reading_keeps_are_bounded(monkeypatch):
    monkeypatch.setattr(logs, "MAX_STEPS", 3)
    reading = read_log(mega("1", "2", "3", "4", "5"))
    assert [s for s, _ in reading.step_times_s] == [1, 2, 3]
    assert "2 more step lines not kept" in reading.notes[0]


# --------------------------------------------------------------------------- numbers

ELAPSED = "elapsed time per iteration (ms)"


@pytest.mark.parametrize(("line", "field", "value"), [
    (mega("..."), ELAPSED, "'...'"),
    (mega("1.2.3"), ELAPSED, "'1.2.3'"),
    (mega("1e308"), ELAPSED, "'1e308'"),
    (mega("inf"), ELAPSED, "'inf'"),
    (mega("nan"), ELAPSED, "'nan'"),
    (mega("0"), ELAPSED, "'0'"),
    (mega("1e-300"), ELAPSED, "'1e-300'"),
    (mega("-5"), ELAPSED, "'-5'"),
    (mega(""), ELAPSED, "''"),
    (mega("9" * 300), ELAPSED, "'" + "9" * 40 + "...'"),
    (" iteration " + "9" * 300 + "/ 3 | elapsed time per iteration (ms): 5 |\n", "iteration", "'999"),
    (TITAN.format(i=1, gib="1.5", tps=",,,"), "tps", "',,,'"),
    (TITAN.format(i=1, gib="1.2.3", tps="1,024"), "memory", "'1.2.3'"),
    (TITAN.format(i=1, gib="nan", tps="1,024"), "memory", "'nan'"),
    (TITAN.format(i=1, gib="1e44", tps="1,024"), "memory", "'1e44'"),
    (TITAN.format(i=1, gib="1.5", tps="0.0001"), "tps", "'0.0001'"),  # a step of 10 million s
    (TITAN.format(i=1, gib="1.5", tps="0"), "tps", "'0'"),
    (TITAN.format(i=1, gib="1.5", tps="1e9"), "tps", "'1e9'"),
    (MEMORY.format(a="1500.0", r="1e44"), "max reserved (MB)", "'1e44'"),
    (MEMORY.format(a="1500.0", r="0"), "max reserved (MB)", "'0'"),
    ("[Rank 0] memory (MB) | allocated: 1 | max allocated: 1.2.3\n", "max allocated (MB)", "'1.2.3'"),
])
def test_a_number_that_is_no_measurement_is_a_problem_of_its_line(line, field, value):
    text = "building the model ...\n" + line
    reading = read_log(text, tokens_per_step=2048, gpus=2)
    ((number, message),) = reading.problems
    assert number == 2 and message.startswith(f"{field}: ")
    assert value in message and len(message) < 200
    assert reading.step_times_s == () and reading.peak_gib is None  # the line gives nothing


def test_a_line_with_a_problem_gives_no_step_and_the_others_read():
    reading = read_log(mega("100.0", "1e308", "300.0") + MEMORY.format(a="1", r="2048"))
    assert reading.format == MEGATRON and reading.step_times_s == ((1, 0.1), (3, 0.3))
    assert reading.peak_gib == 2.0
    assert reading.problems == ((2, f"{ELAPSED}: expected a number of milliseconds between 0.001 and "
                                    "1e9, got '1e308'"),)


def test_numbers_at_their_bounds_are_measurements():
    reading = read_log(mega("0.001", "1e9", "1E3", ".5") + MEMORY.format(a="1", r="1024e6"))
    assert reading.problems == ()
    assert reading.step_times_s == ((1, 1e-6), (2, 1e6), (3, 1.0), (4, 5e-4))
    assert reading.peak_gib == 1e6
    titan = read_log(TITAN.format(i=1, gib="0.01", tps="1,024,000") + TITAN.format(i=2, gib="1e6", tps="7.5"),
                     tokens_per_step=2048, gpus=2)
    assert titan.format == TORCHTITAN and titan.problems == ()
    assert titan.step_times_s == ((1, 2048 / (1_024_000 * 2)), (2, 2048 / 15))


def test_a_reader_stops_reading_after_its_problems_and_only_counts_lines():
    text = mega(*["1e308"] * (logs.MAX_PROBLEMS + 5)) + mega("1")
    reader = LogReader()
    reader.feed(text)
    reader.finish()
    reading = reader.reading()
    assert len(reading.problems) == logs.MAX_PROBLEMS and reading.step_times_s == ()
    assert f"stopped reading at line {logs.MAX_PROBLEMS}" in reading.notes[-1]
    assert reader.lines == text.count("\n")
    with cpu_seconds() as took:
        read_log(mega("1e308") * 200_000)  # 15 MB
    assert took[0] < 0.5, took


def test_a_bad_value_is_quoted_escaped_and_short():
    (_, message), = read_log(mega("\x07\u202e\ud800" + "x" * 100)).problems
    assert "\\x07\\u202e\\ud800" in message and "x" * 41 not in message and message.isascii()


# --------------------------------------------------------------------------- pieces

def test_a_line_is_read_once_complete_and_the_last_at_finish():
    reader = LogReader()
    reader.feed(mega("12")[:-1])  # its newline not yet written: 1 of "12" ms is not read
    assert reader.reading().step_times_s == () and reader.lines == 0
    reader.feed("\n" + mega("12", "13")[len(mega("12")):-1])
    assert reader.reading().step_times_s == ((1, 0.012),) and reader.lines == 1
    reader.finish()
    assert reader.reading().step_times_s == ((1, 0.012), (2, 0.013)) and reader.lines == 2


def test_bytes_split_inside_a_character_read_as_the_whole():
    text = ("é€😀 " + mega("5")).encode() + b"\xff\xfe\n" + "\u2028".encode()
    reader = LogReader()
    for byte in text:
        reader.feed(bytes([byte]))
    reader.finish()
    assert reader.reading() == read_log(text.decode("utf-8", "replace")) == read_log(text)
    assert reader.reading().step_times_s == ((1, 0.005),)


FRAGMENTS = st.one_of(
    st.sampled_from([
        " iteration ", "       3/       6 |", " consumed samples: 8 |", " elapsed time per iteration (ms):",
        "[Rank 0] (after 1 iterations) memory (MB) | allocated: 1 |", " max allocated:", " | reserved: 2 |",
        " max reserved:", "step:", "  loss: 10.4  ", "memory:", "GiB(12.5%)", "  tps:", "  wps:", " ",
        "\t", "|", "\n", "\r", "\r\n", "\x1b[31m", "\x1b[39m", "\x1b[", "CUDA out of memory",
        "torch.OutOfMemoryError", "OUT OF MEMORY", "emory", "\x00", "\u202e", "\ufffd",
    ]),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: f" {x!r}"),
    st.floats(min_value=0, max_value=1e10).map(lambda x: f" {x:,.2f}"),
    st.integers(min_value=-10, max_value=10**30).map(lambda x: f" {x}"),
    st.integers(min_value=0, max_value=10**9).map(lambda x: f" {x:,}"),
    st.sampled_from([" 1.2.3", " ...", " ,,,", " 1e308", " 1e-300", " 0", " .5", " 5.", " 1E3", " -1",
                     " nan", " inf", " 0.0001", " 1,2,3", " 12,345.6"]),
    st.text(max_size=8),
    st.tuples(st.sampled_from(["x", "9", "step: 1 loss: memory: 1GiB ", "iteration 1/1 | ", "emory"]),
              st.integers(min_value=1, max_value=120)).map(lambda t: t[0] * t[1]),
)
LOGS = st.lists(st.one_of(FRAGMENTS.map(str.encode), st.binary(max_size=6)), max_size=60).map(b"".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=LOGS, cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
       known=st.booleans(), cap=st.sampled_from([40, 200, MAX_LINE_CHARS]),
       problems=st.sampled_from([1, 3, logs.MAX_PROBLEMS]))
def test_a_log_in_any_pieces_reads_as_the_whole_and_nothing_raises(log, cuts, known, cap, problems):
    # long lines against a small cap: the overlong path in pieces and whole; and a reader
    # that stops after a few problems
    kwargs = {"tokens_per_step": 2048, "gpus": 2} if known else {}
    with mock.patch.object(logs, "MAX_LINE_CHARS", cap), mock.patch.object(logs, "MAX_PROBLEMS", problems):
        whole = read_log(log.decode("utf-8", "replace"), **kwargs)
        assert read_log(log, **kwargs) == whole
        reader = LogReader(**kwargs)
        at = 0
        for cut in sorted(min(c, len(log)) for c in cuts):
            reader.feed(log[at:cut])
            reader.reading()
            at = cut
        reader.feed(log[at:])
        reader.finish()
        assert reader.reading() == whole
        # as text, in the same pieces (of characters)
        text = log.decode("utf-8", "replace")
        reader = LogReader(**kwargs)
        at = 0
        for cut in sorted(min(c, len(text)) for c in cuts):
            reader.feed(text[at:cut])
            at = cut
        reader.feed(text[at:])
        reader.finish()
        assert reader.reading() == whole
    assert isinstance(whole, LogReading)
    for number, message in whole.problems:
        assert 1 <= number <= log.count(b"\n") + 1 and ": " in message
    for _, seconds in whole.step_times_s:
        assert logs.MIN_STEP_S <= seconds <= logs.MAX_STEP_S
    assert whole.peak_gib is None or 0 < whole.peak_gib <= logs.MAX_PEAK_GIB


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=()), max_size=200))
def test_read_log_never_raises_on_any_text(text):
    read_log(text)
    read_log(text + "\ud800 elapsed time per iteration (ms): 1 step: 1 loss: memory: 1GiB tps: 1\n",
             tokens_per_step=2048, gpus=2)
