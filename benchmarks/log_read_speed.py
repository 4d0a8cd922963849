"""CPU time and peak memory of reading training logs (autoplan.tune.logs), good and
hostile, whole (read_log, as `runs import` reads one) and in 1 MiB pieces (LogReader, as
the tune runner reads a growing log). Issue 47: before, a 21 KB line of
'step: 1 loss: memory: 1GiB ' ran past 60 s (a cubic pattern), 640 KB of
'iteration 1/1 | ' past 60 s (quadratic), 150 MB of newlines took 36 s and 1.3 GB. The
target: every case linear, a few seconds per 100 MB at most, memory a small multiple of
the text (read whole) or bounded (in pieces).

    python benchmarks/log_read_speed.py [--mb N] [--repeat N]

Prints one row per case: the size, the best CPU seconds of N reads whole and in pieces,
MB/s, and the peak memory traced while reading (the text itself not counted).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import tracemalloc

from autoplan.tune.logs import LogReader, read_log

MEGATRON = (" [2026-11-27 10:00:00] iteration {i:8d}/ 1000000 | consumed samples: {s:12d} | elapsed "
            "time per iteration (ms): 1234.5 | learning rate: 3.000000E-04 | global batch size:   512 | "
            "lm loss: 1.040000E+01 | loss scale: 1.0 | grad norm: 5.000 | number of skipped iterations:"
            "   0 | number of nan iterations:   0 |\n")
TITAN = ("[titan] 2026-11-27 10:00:01,000 - root - INFO - \x1b[31mstep: {i:6}  \x1b[32mloss: 10.4000  "
         "\x1b[33mgrad_norm:  5.0000  \x1b[34mmemory: 61.50GiB(77.50%)  \x1b[36mtps: 12,345  "
         "\x1b[35mtflops: 402.10  mfu: 40.66%\x1b[39m\n")
PROSE = "[2026-11-27 10:00:01] INFO loading checkpoint shard 3 of 10 from /data/ckpt, 0.5 s\n"


def cases(mb: float) -> list[tuple[str, str]]:
    size = int(mb * 1e6)

    def lines(template: str) -> str:
        one = len(template.format(i=1, s=1))
        return "".join(template.format(i=i, s=8 * i) for i in range(1, size // one + 1))

    def repeat(unit: str) -> str:
        return unit * (size // len(unit))

    return [
        ("megatron step lines", lines(MEGATRON)),
        ("torchtitan step lines", lines(TITAN)),
        ("prose lines", repeat(PROSE)),
        ("newlines", repeat("\n")),
        ("'step: 1 loss: memory: 1GiB ' lines of 21 KB", repeat("step: 1 loss: memory: 1GiB " * 800 + "\n")),
        ("'iteration 1/1 | ' lines of 64 KB", repeat("iteration 1/1 | " * 4000 + "\n")),
        ("one line of 'iteration 1/1 | '", repeat("iteration 1/1 | ")),
        ("bad numbers", repeat(" iteration 1/ 3 | elapsed time per iteration (ms): 1e308 |\n")),
    ]


def whole(text: str) -> None:
    read_log(text, tokens_per_step=2048 * 512, gpus=8)


def pieces(data: bytes) -> None:
    reader = LogReader(tokens_per_step=2048 * 512, gpus=8)
    for at in range(0, len(data), 2**20):
        reader.feed(data[at:at + 2**20])
    reader.finish()
    reader.reading()


def best_cpu(fn, text: str | bytes, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn(text)
        best = min(best, time.process_time() - start)
    return best


def peak_mb(fn, text: str | bytes) -> float:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        fn(text)
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=32.0, help="megabytes of each log")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"python {platform.python_version()} on {platform.machine()}, {cpus} CPUs, "
          f"best CPU seconds of {args.repeat} reads")
    print(f"{'case':<46} {'MB':>6} {'whole s':>8} {'MB/s':>7} {'pieces s':>9} {'peak MB whole':>14} "
          f"{'peak MB pieces':>15}")
    for label, text in cases(args.mb):
        mb, data = len(text) / 1e6, text.encode()
        w, p = best_cpu(whole, text, args.repeat), best_cpu(pieces, data, args.repeat)
        print(f"{label:<46} {mb:>6.1f} {w:>8.2f} {mb / max(w, 1e-9):>7.0f} {p:>9.2f} "
              f"{peak_mb(whole, text):>14.1f} {peak_mb(pieces, data):>15.1f}")


if __name__ == "__main__":
    main()
