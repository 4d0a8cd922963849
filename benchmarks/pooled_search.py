"""Searches across the pools of a heterogeneous cluster: wall time and what they find.

    python benchmarks/pooled_search.py [--repeat N]

One row per case: the best of N cold runs (caches cleared between runs), the candidates
the walk across pools generated and evaluated, the best plan's tokens/s against the best
on one pool alone, and the verdict (which pools it uses or leaves out). No target: the
walk evaluates what its bounds cannot rule out (search/pooled.py).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

from autoplan.caches import clear as clear_caches
from autoplan.descriptors.hardware import PooledCluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_any_cluster, resolve_model
from autoplan.descriptors.space import load_space
from autoplan.search.pooled import search_pooled


def _pools(**pools: tuple[str, int]) -> dict[str, Any]:
    return {"name": "+".join(pools), "between_pools": {"bandwidth_GBps": 25, "latency_us": 10},
            "pools": [{"name": n, "cluster": c, "nodes": k} for n, (c, k) in pools.items()]}


ROOT = Path(__file__).resolve().parents[1]

CASES: list[tuple[str, Any, str, int, int, str]] = [
    # (model, cluster (file or mapping), space, global batch, seq len, label)
    ("llama3-70b", "examples/clusters/h100-a100.yaml", "default", 1024, 8192, "32 H100 + 32 A100"),
    ("llama3-70b", "examples/clusters/h100-a100.yaml", "megatron", 1024, 8192, "32 H100 + 32 A100"),
    ("llama3-8b", _pools(hopper=("dgx-h100", 4), lovelace=("l40s-node", 1)), "default", 256, 4096,
     "32 H100 + 8 L40S"),
    ("llama3-8b", _pools(hopper=("dgx-h100", 1), ampere=("dgx-a100", 1)), "megatron", 256, 4096,
     "8 H100 + 8 A100"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, best of {args.repeat} "
          "cold runs")
    print("| model | pools | space | generated | evaluated | seconds | tokens/s | vs best alone "
          "| verdict |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for name, ref, space_name, gbs, seq, label in CASES:
        cluster = resolve_any_cluster(str(ROOT / ref) if isinstance(ref, str) else ref)
        assert isinstance(cluster, PooledCluster)
        model, space, job = resolve_model(name), load_space(space_name), Job(global_batch=gbs,
                                                                             seq_len=seq)
        best = float("inf")
        for _ in range(args.repeat):
            clear_caches()
            t0 = time.perf_counter()
            result = search_pooled(model, cluster, job, space, top_k=10)
            best = min(best, time.perf_counter() - t0)
        top = result.plans[0].prediction.tokens_per_s
        alone = result.best_alone()
        ratio = f"{top / alone[1].prediction.tokens_per_s:.2f}x" if alone else "-"
        print(f"| {name} | {label} | {space_name} | {result.stats.generated:,} | "
              f"{result.stats.evaluated:,} | {best:.1f} | {top:,.0f} | {ratio} | "
              f"{result.verdict()} |")


if __name__ == "__main__":
    main()
