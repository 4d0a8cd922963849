"""What the measured token-mixer tables (profiles/measured/mixers/) do to serving predictions
of hybrid flagships: each plan evaluated with its device's tables (the serving door's) and
without them (the roofline), TTFT and TPOT means and what the prediction says of each mixer;
then DeepSeek-V4-Flash's compressed layers (C, H) one at a time: the table's time of one
layer's whole attention module against the roofline's time of the same (its projections at
fp8 and its window, pooled keys and indexer: ``StepModel._table_roofline``), at a few
prefill and decode shapes.

    python benchmarks/serving_mixer_tables.py [--rate 2] [--requests 200]

No measured end-to-end run of these models is in the calibration data: this shows the size
of the change, not whether it is right (profiles/measured/README.md).
"""

from __future__ import annotations

import argparse
import dataclasses

from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import CSA, HCA
from autoplan.measured.door import corrected
from autoplan.serving.cost import StepModel
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

BF16, FP8 = Precision.BF16, Precision.FP8
# (model, cluster, GPUs = TP, engine, release, weights, KV cache)
CASES = (
    ("qwen3-next-80b-a3b", "dgx-h200", 2, Engine.VLLM, "0.24.0", BF16, BF16),
    ("qwen3-next-80b-a3b", "dgx-h200", 1, Engine.TRTLLM, "1.3.0rc20", FP8, BF16),
    ("qwen3.5-397b-a17b", "dgx-h200", 8, Engine.SGLANG, "0.5.14", FP8, BF16),
    ("nemotron-h-56b", "dgx-h200", 2, Engine.TRTLLM, "1.3.0rc20", BF16, BF16),
    ("deepseek-v3.2", "dgx-h200", 8, Engine.VLLM, "0.24.0", FP8, BF16),
    ("deepseek-v3.2", "dgx-h200", 8, Engine.TRTLLM, "1.3.0rc20", FP8, BF16),
    ("deepseek-v3.2", "dgx-b200", 8, Engine.VLLM, "0.24.0", FP8, BF16),
    ("deepseek-v4-flash", "dgx-h200", 8, Engine.VLLM, "0.24.0", FP8, FP8),
    ("deepseek-v4-flash", "dgx-b200", 8, Engine.VLLM, "0.24.0", FP8, FP8),
    ("deepseek-v4-flash", "dgx-b200", 8, Engine.TRTLLM, "1.3.0rc23", FP8, FP8),
)
# DeepSeek-V4-Flash's layer shapes: (phase, sequences, tokens a sequence computes or reads)
V4_POINTS = (("context", 1, 2048), ("context", 8, 1024), ("context", 1, 8192), ("context", 1, 32768),
             ("generation", 1, 4096), ("generation", 64, 4096), ("generation", 256, 2048),
             ("generation", 16, 32768))
V4_CASES = (("dgx-h200", 8, Engine.VLLM, "0.24.0"), ("dgx-b200", 8, Engine.TRTLLM, "1.3.0rc23"))


def _cluster(name: str, tp: int, engine: Engine, version: str) -> tuple[Cluster, Cluster]:
    """The serving door's cluster (its device's tables attached) and the same without tables."""
    door = corrected(with_gpus(resolve_cluster(name), tp), engine=engine, version=version).cluster
    return dataclasses.replace(door, device=dataclasses.replace(door.device, mixer_kernels=None)), door


def v4_layers() -> None:
    """DeepSeek-V4-Flash's C and H layers: the table's module time against its roofline."""
    model = resolve_model("deepseek-v4-flash")
    print()
    print("DeepSeek-V4-Flash, one layer on one GPU (TP 8, fp8 weights and KV cache): the measured module "
          "(table) against the roofline of the same; core: less its projections at fp8")
    print("| GPU | engine | layer | phase | sequences x tokens | table us | roofline us | table / roofline "
          "| core: table -> roofline us |")
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for name, tp, engine, version in V4_CASES:
        _, door = _cluster(name, tp, engine, version)
        deployment = Deployment(replicas=1, tp=tp, weights=FP8, kv_cache=FP8)
        step = StepModel(model, door, deployment, engine, version)
        for mixer, layer in ((CSA, "C"), (HCA, "H")):
            if mixer not in step.table_sources():
                print(f"| {door.device.name} | {engine.value} {version} | {layer} | no table | | | | | |")
                continue
            for phase, batch, length in V4_POINTS:
                table = step._table(mixer, phase, batch, length)
                roof = step._table_roofline(mixer, phase, batch, length)
                gemms = step._block_gemms(mixer, batch * length if phase == "context" else batch)
                print(f"| {door.device.name} | {engine.value} {version} | {layer} | {phase} "
                      f"| {batch} x {length:,} | {table * 1e6:,.0f} | {roof * 1e6:,.0f} | {table / roof:.1f} "
                      f"| {(table - gemms) * 1e6:,.0f} -> {(roof - gemms) * 1e6:,.0f} |")


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
    print("| model | GPUs | engine | weights / KV | mixers | TTFT ms: roofline -> tables "
          "| TPOT ms: roofline -> tables |")
    print("| --- | --- | --- | --- | --- | ---: | ---: |")
    for name, cluster_name, tp, engine, version, weights, kv in CASES:
        model = resolve_model(name)
        bare, door = _cluster(cluster_name, tp, engine, version)
        got = []
        for cluster in (bare, door):
            deployment = Deployment(replicas=1, tp=tp, weights=weights, kv_cache=kv)
            plan = ServingPlan(model, cluster, engine, deployment, workload, Slo(), version)
            got.append(evaluate_serving(plan))
        roof, tables = got
        assert tables.evidence is not None
        mixers = ", ".join(f"{m} {how}" for m, how in tables.evidence.provenance.mixers)
        print(f"| {name} | {tp} x {door.device.name} | {engine.value} {version} "
              f"| {weights.value} / {kv.value} | {mixers} "
              f"| {roof.ttft_ms.mean:.1f} -> {tables.ttft_ms.mean:.1f} "
              f"| {roof.tpot_ms.mean:.2f} -> {tables.tpot_ms.mean:.2f} |")
    v4_layers()


if __name__ == "__main__":
    main()
