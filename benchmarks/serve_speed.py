"""Wall time of `autoplan serve` searches. Target (issue 15): under 5 s for the issue's
question, best of N on the 2-core machine.

    python benchmarks/serve_speed.py [--repeat N]

Prints one row per case: deployments simulated, the best of N runs (the library call;
imports excluded) and the best deployment.
"""

from __future__ import annotations

import argparse
import platform
import time

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.serving.deployment import Arrival, ArrivalKind, Engine, Lengths, Slo, Workload
from autoplan.serving.search import serve_search

CASES = [
    # (model, cluster, gpus, input, output, arrival, engine, ttft ms, tpot ms[, disaggregated])
    ("llama3-70b", "dgx-h100", 8, 2048, 256, Arrival(ArrivalKind.RATE, rate_rps=6.0), Engine.VLLM, 2000, 50),
    # the same with a tight TPOT, prefill/decode splits tried too (serve --disaggregated)
    ("llama3-70b", "dgx-h100", 8, 2048, 256, Arrival(ArrivalKind.RATE, rate_rps=6.0), Engine.VLLM, 2000, 30,
     True),
    ("llama3-8b", "dgx-h100", 64, 2048, 256, Arrival(ArrivalKind.RATE, rate_rps=100.0), Engine.VLLM, None,
     30, True),
    ("llama3-8b", "dgx-h100", 8, 1024, 512, Arrival(ArrivalKind.CONCURRENCY, concurrency=256),
     Engine.SGLANG, None, None),
    ("mixtral-8x7b", "dgx-a100", 8, 512, 512, Arrival(ArrivalKind.OFFLINE), Engine.TRTLLM, None, None),
    ("deepseek-v3", "dgx-h200", 16, 4096, 512, Arrival(ArrivalKind.RATE, rate_rps=4.0), Engine.SGLANG,
     5000, 100),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, best of {args.repeat}")
    print(f"{'model':<13} {'GPUs':>4} {'engine':<7} {'workload':<22} {'simulated':>9} {'seconds':>8}  best")
    for name, cluster, gpus, inp, out, arrival, engine, ttft, tpot, *split in CASES:
        model = resolve_model(name)
        c = with_gpus(resolve_cluster(cluster), gpus)
        workload = Workload(Lengths(float(inp)), Lengths(float(out)), arrival, 1000)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = serve_search(model, c, engine, workload, Slo(ttft, tpot), disaggregated=bool(split))
            best = min(best, time.perf_counter() - t0)
        top = result.plans[0].plan.deployment.label() if result.plans else "nothing fits"
        shown = f"{inp}/{out} {arrival.label()}" + (" P/D" if split else "")
        print(f"{name:<13} {gpus:>4} {engine.value:<7} {shown:<22} {result.evaluated:>9} {best:>8.2f}  {top}")


if __name__ == "__main__":
    main()
