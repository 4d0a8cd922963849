"""Eager PyTorch's host time per launched kernel, measured here, and the layer-pass floor
it sets for each built-in stack.

``autoplan bench`` writes the same measurement into every profile (rows of kind ``host``,
``autoplan/bench/host.py``); a device whose profile has them takes them in place of the
stack's ``host_kernel_us`` prior. This script runs the probe alone, several times, and
prints the spread, the kernels one eager decoder layer issues, and - per stack - the
forward and backward host floor of a layer pass (stack kernels x measured time per
kernel) against the prior's. On a GPU the probe times the host side of real launches
(the device is synchronized between passes, outside the timing).

    python benchmarks/host_dispatch.py [--device cpu|cuda] [--runs 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

from autoplan.bench.host import HIDDEN, TOKENS, measure
from autoplan.bench.timing import Budget
from autoplan.descriptors.library import builtin_names, builtin_stack

BUDGET = Budget(warmup=5, min_repeats=50, max_repeats=400, seconds=1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="also write the rows and the machine here")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: as each of validate's CPU ranks computes)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)

    runs = [measure(args.device, BUDGET, "bf16" if args.device == "cuda" else "fp32")
            for _ in range(args.runs)]
    fwd = [r[0]["seconds"] for r in runs]
    bwd = [r[1]["seconds"] for r in runs]
    k_f, k_b = runs[0][0]["k"], runs[0][1]["k"]
    where = (torch.cuda.get_device_name(0) if args.device == "cuda"
             else platform.processor() or platform.machine())
    print(f"host time per launched kernel: eager decoder layer (hidden {HIDDEN}, {TOKENS} tokens), "
          f"{args.device} ({where}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'pass':<10} {'kernels':>8} {'median us':>10} {'min us':>8} {'max us':>8}"
          f"  (medians of {args.runs} runs)")
    for name, k, xs in (("forward", k_f, fwd), ("backward", k_b, bwd)):
        print(f"{name:<10} {k:>8} {statistics.median(xs) * 1e6:>10.2f} {min(xs) * 1e6:>8.2f} "
              f"{max(xs) * 1e6:>8.2f}")
    f_us, b_us = statistics.median(fwd) * 1e6, statistics.median(bwd) * 1e6
    print()
    print("layer-pass host floor per stack: kernels x host time per kernel (forward); the backward's "
          f"host time per forward kernel is the measured {b_us:.2f} us x {k_b}/{k_f} kernels "
          "(the prior: 2 x its forward's)")
    print(f"{'stack':<22} {'kernels':>8} {'prior us':>9} {'fwd floor us (prior)':>21} "
          f"{'fwd floor us (measured)':>24} {'bwd floor us (measured)':>24}")
    for name in builtin_names("stack"):
        stack = builtin_stack(name)
        if stack.cuda_graphs:
            print(f"{name:<22} {stack.layer_kernels:>8}   (CUDA graphs: no per-kernel host dispatch)")
            continue
        k = stack.layer_kernels
        prior = stack.host_kernel_s * 1e6
        print(f"{name:<22} {k:>8} {prior:>9.1f} {k * prior:>21.0f} {k * f_us:>24.0f} "
              f"{k * b_us * k_b / k_f:>24.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": args.device, "device_name": where, "torch": torch.__version__,
                       "python": sys.version.split()[0], "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
