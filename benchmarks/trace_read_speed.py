"""CPU time and peak memory of reading an arrival trace (``serving.planfile.read_trace``,
as ``serve --trace`` and a job file's ``arrival: {trace: ...}`` read one), good and bad.
Issue 47: a 10^6-row trace of ``arrival_s,input_len,output_len`` took 9.5 s and 411 MB
(a row at a time through the csv module and strict.decimal). The target: a valid
10^6-row trace in well under a second with a few tens of MB beyond its text, a bad one
refused as fast, in the same words.

    python benchmarks/trace_read_speed.py [--rows 10000,100000,1000000] [--repeat N] [--before]

Prints one row per size and case: rows, MB of the file, the best CPU seconds of N reads,
the peak memory traced during one more read (the file's bytes and the trace it makes
included), and the outcome. ``--before`` adds the row-by-row reader of before issue 47
(tests/unit/test_trace_reading.py keeps it) on the same text.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for --before

from autoplan.errors import InputError  # noqa: E402
from autoplan.serving.planfile import read_trace  # noqa: E402

HEADER = "arrival_s,input_len,output_len\n"


def rows_of(n: int, line: Callable[[int], str]) -> str:
    return "".join(map(line, range(n)))


def issue(i: int) -> str:  # the issue's shape: arrival with 3 decimals, lengths 100..2099, 10..509
    return f"{i * 0.01:.3f},{100 + i * 7919 % 2000},{10 + i * 104729 % 500}\n"


CASES: list[tuple[str, Callable[[int], str]]] = [
    ("plain", lambda n: HEADER + rows_of(n, issue)),
    ("crlf, a blank line between rows", lambda n: HEADER + rows_of(n, lambda i: issue(i)[:-1] + "\r\n\r\n")),
    ("id and model columns (text)",
     lambda n: "request_id,model,arrival_s,input_len,output_len\n"
               + rows_of(n, lambda i: f"req-{i},llama 3 8B,{issue(i)}")),
    ("every cell quoted", lambda n: HEADER + rows_of(n, lambda i: '"' + issue(i)[:-1].replace(",", '","')
                                                      + '"\n')),
    ("unix times, 6 decimals", lambda n: HEADER + rows_of(n, lambda i: f"{1.7e9 + i * 0.01:.6f},512,64\n")),
    ("arrivals in exponent form", lambda n: HEADER + rows_of(n, lambda i: f"{(i + 1) * 0.01:.3e},512,64\n")),
    ("numpy.savetxt's %.18e (880,000 rows at most: 64 MiB)",
     lambda n: HEADER + rows_of(min(n, 880_000), lambda i: f"{i * 0.01:.18e},{512:.18e},{64:.18e}\n")),
    ("bad: first row", lambda n: HEADER + "x,1,1\n" + rows_of(n - 1, issue)),
    ("bad: last row", lambda n: HEADER + rows_of(n - 1, issue) + "1.5,2_0,1\n"),
    ("bad: a text column", lambda n: HEADER + rows_of(n, lambda i: f"{i},text,1\n")),
    ("bad at 10^6 rows: one row too many", lambda n: HEADER + rows_of(n + 1, issue)),
]


def outcome(path: Path) -> str:
    try:
        trace = read_trace(str(path), "--trace", "")
    except InputError as err:
        first = err.problems[0]
        return f"refused: {first.field}: {first.message}"[:80]
    return f"read {len(trace):,}"


def best_cpu(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def peak_mb(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,100000,1000000", help="sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="reads timed per case (the best is shown)")
    parser.add_argument("--before", action="store_true", help="also the row-by-row reader of before")
    args = parser.parse_args()
    import numpy  # noqa: F401  - imported once before timing (serve has imported it by then)

    if args.before:
        from tests.unit.test_trace_reading import _reference
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}: CPU seconds (best of {args.repeat}), peak MB traced")
    print(f"{'rows':>9} {'MB':>6} {'read s':>7} {'peak MB':>8} {'before s':>8}  case -> outcome")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.csv"
        for n in (int(r) for r in args.rows.split(",")):
            for name, make in CASES:
                path.write_text(make(n))
                size = path.stat().st_size / 1e6
                took = best_cpu(lambda: outcome(path), args.repeat)
                peak = peak_mb(lambda: outcome(path))
                before = ""
                if args.before:
                    text = path.read_text()

                    def old(text: str = text) -> None:
                        try:
                            _reference(text, str(path))
                        except InputError:
                            pass

                    before = f"{best_cpu(old, 1):.3f}"
                print(f"{n:>9,} {size:>6.1f} {took:>7.3f} {peak:>8.1f} {before:>8}  {name} -> "
                      f"{outcome(path)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
