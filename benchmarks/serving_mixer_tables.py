"""What the measured token-mixer tables (profiles/measured/mixers/) do to serving predictions
of hybrid flagships: each plan evaluated with its device's tables (the serving door's) and
without them (the roofline), TTFT and TPOT means and what the prediction says of each mixer.

    python benchmarks/serving_mixer_tables.py [--rate 2] [--requests 200]

No measured end-to-end run of these models is in the calibration data: this shows the size
of the change, not whether it is right (profiles/measured/README.md).
"""

from __future__ import annotations

import argparse
import dataclasses

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.measured.door import corrected
from autoplan.serving.deployment import (
    Arrival,
    ArrivalKind,
    Deployment,
    Engine,
    Lengths,
    Precision,
    ServingPlan,
    Slo,
    Workload,
)
from autoplan.serving.evaluate import evaluate_serving

# (model, cluster, GPUs = TP, engine, release, weights)
CASES = (
    ("qwen3-next-80b-a3b", "dgx-h200", 2, Engine.VLLM, "0.24.0", Precision.BF16),
    ("qwen3-next-80b-a3b", "dgx-h200", 1, Engine.TRTLLM, "1.3.0rc20", Precision.FP8),
    ("qwen3.5-397b-a17b", "dgx-h200", 8, Engine.SGLANG, "0.5.14", Precision.FP8),
    ("nemotron-h-56b", "dgx-h200", 2, Engine.TRTLLM, "1.3.0rc20", Precision.BF16),
    ("deepseek-v3.2", "dgx-h200", 8, Engine.VLLM, "0.24.0", Precision.FP8),
    ("deepseek-v3.2", "dgx-h200", 8, Engine.TRTLLM, "1.3.0rc20", Precision.FP8),
    ("deepseek-v3.2", "dgx-b200", 8, Engine.VLLM, "0.24.0", Precision.FP8),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals, requests/s")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--input-len", type=float, default=2000.0)
    parser.add_argument("--output-len", type=float, default=200.0)
    args = parser.parse_args()
    workload = Workload(Lengths(args.input_len), Lengths(args.output_len),
                        Arrival(ArrivalKind.RATE, rate_rps=args.rate), args.requests)
    print(f"{args.input_len:.0f} in / {args.output_len:.0f} out, {args.rate:g} req/s, "
          f"{args.requests} requests")
    print("| model | GPUs | engine | weights | mixers | TTFT ms: roofline -> tables "
          "| TPOT ms: roofline -> tables |")
    print("| --- | --- | --- | --- | --- | ---: | ---: |")
    for name, cluster_name, tp, engine, version, weights in CASES:
        model = resolve_model(name)
        door = corrected(with_gpus(resolve_cluster(cluster_name), tp), engine=engine, version=version).cluster
        bare = dataclasses.replace(door, device=dataclasses.replace(door.device, mixer_kernels=None))
        got = []
        for cluster in (bare, door):
            plan = ServingPlan(model, cluster, engine, Deployment(replicas=1, tp=tp, weights=weights),
                               workload, Slo(), version)
            got.append(evaluate_serving(plan))
        roof, tables = got
        assert tables.evidence is not None
        mixers = ", ".join(f"{m} {how}" for m, how in tables.evidence.provenance.mixers)
        print(f"| {name} | {tp} x {door.device.name} | {engine.value} {version} | {weights.value} | {mixers} "
              f"| {roof.ttft_ms.mean:.1f} -> {tables.ttft_ms.mean:.1f} "
              f"| {roof.tpot_ms.mean:.2f} -> {tables.tpot_ms.mean:.2f} |")


if __name__ == "__main__":
    main()
