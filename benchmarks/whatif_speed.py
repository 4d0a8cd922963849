"""Wall time of `autoplan search --train-tokens` over several GPU counts, as a user runs
it (a new process: start-up and imports count). Targets, best of 3 on the 2-core machine:
the README's Llama 3 70B sweep over 64..1024 H100 under 10 s (issue 13); DeepSeek-V3 over
16 counts, 8..262144 H100, under 3 s (issue 34: 2.88 and 2.96 s in two runs of --repeat 5
late on 2026-11-27, single runs 2.9-3.7 s as the machine's load varies; 3.0-3.3 s earlier
that day, 4.0-4.3 s at its start, 4.3-4.6 s the day before).

    python benchmarks/whatif_speed.py [--repeat N]

Prints one row per case: the best of N runs, the GPU counts on the front and the best.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

CASES = [
    # (label, search arguments, target seconds)
    ("llama3-70b 64..1024 x h100, 15T tokens",
     ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64,128,256,512,1024",
      "--global-batch", "1024", "--seq-len", "8192", "--train-tokens", "15e12"], 10.0),
    ("llama3-8b 8..256 x h100, 15T tokens",
     ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8..256",
      "--global-batch", "512", "--seq-len", "8192", "--train-tokens", "15e12"], None),
    ("deepseek-v3 8..262144 x h100, 10T tokens",
     ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "8..262144",
      "--global-batch", "15360", "--seq-len", "4096", "--train-tokens", "1e13"], 3.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"python {platform.python_version()} on {platform.machine()}, {cpus} CPUs, "
          f"best of {args.repeat} runs of a new process")
    print(f"{'case':<42} {'seconds':>8} {'target':>7}  front (GPUs: days, $M)")
    for label, argv, target in CASES:
        best, doc = float("inf"), {}
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "autoplan.cli.main", "search", *argv,
                                  "--format", "json", "--top", "1"],
                                 capture_output=True, text=True, check=True)
            best = min(best, time.perf_counter() - t0)
            doc = json.loads(run.stdout)
        front = ", ".join(f"{p['gpus']}: {p['train_days']:.0f} d ${p['cost_usd'] / 1e6:.2f}M"
                          for p in doc["pareto"])
        shown = f"{target:>7.1f}" if target else f"{'-':>7}"
        print(f"{label:<42} {best:>8.2f} {shown}  {front}")


if __name__ == "__main__":
    main()
