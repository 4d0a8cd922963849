"""Wall time of full searches. Targets (issue 48, best of 3 on the 2-core machine), of the
default search (every launcher's space, ``search/launchable.py``): under 1 s, DeepSeek-V3
under 2 s (issue 13's, of the launcher-free space: under 1 s, the 16k-GPU Llama 3 405B 3 s,
DeepSeek-V3 5 s).

    python benchmarks/search_speed.py [--repeat N] [--space NAME] [--no-offload]

``--space``: launchable (the default), any, a launcher's (megatron, ...) or a path.

Prints one row per case: the best of N cold runs (caches cleared between runs).
"""

from __future__ import annotations

import argparse
import platform
import time

from autoplan.caches import clear as clear_caches
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.search.launchable import resolve_space, search
from autoplan.vocab import NO_OFFLOAD

CASES = [
    # (model, cluster, gpus, global batch, seq len, target seconds)
    ("gpt3-175b", "dgx-a100", 1024, 1536, 2048, 1.0),
    ("llama3-405b", "dgx-h100", 16384, 2048, 8192, 1.0),
    ("deepseek-v3", "dgx-h100", 2048, 15360, 4096, 2.0),
    ("llama3-70b", "dgx-h100", 256, 64, 131072, 1.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--space", default="launchable")
    parser.add_argument("--no-offload", action="store_true", help="as search --no-offload")
    args = parser.parse_args()
    space = resolve_space(args.space)
    if args.no_offload:
        space = space.changed(offload=(NO_OFFLOAD,))
    print(f"python {platform.python_version()} on {platform.machine()}, space {space.name}"
          f"{' without offload' if args.no_offload else ''}, best of {args.repeat} cold runs")
    print(f"{'model':<12} {'GPUs':>6} {'generated':>10} {'evaluated':>9} {'seconds':>8} "
          f"{'target':>7}  best plan")
    for name, cluster, gpus, gbs, seq, target in CASES:
        model = resolve_model(name)
        c = with_gpus(resolve_cluster(cluster), gpus)
        job = Job(global_batch=gbs, seq_len=seq)
        best = float("inf")
        for _ in range(args.repeat):
            clear_caches()
            t0 = time.perf_counter()
            result = search(model, c, job, space)
            best = min(best, time.perf_counter() - t0)
        top = result.plans[0].plan
        lay = top.layout
        desc = (f"dp{lay.dp} tp{lay.tp} pp{lay.pp} cp{lay.cp} vpp{lay.vpp} mbs{top.micro_batch} "
                f"{top.schedule.value} {top.recompute.value} zero{int(top.zero)}")
        if model.is_moe:
            desc += f" ep{lay.ep} etp{lay.etp}"
        if lay.cp > 1:
            desc += f" cp_comm {top.cp_comm.value}"
        if top.offload.any:
            desc += f" offload optimizer={top.offload.optimizer} activations={top.offload.activations:g}"
        shown = f"{target:>7.1f}" if target else f"{'-':>7}"
        print(f"{name:<12} {gpus:>6} {result.stats.generated:>10,} {result.stats.evaluated:>9,} "
              f"{best:>8.2f} {shown}  {desc}")


if __name__ == "__main__":
    main()
