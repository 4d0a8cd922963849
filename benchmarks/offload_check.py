"""Offload predictions against published measurements that were never fitted to.

    python benchmarks/offload_check.py

Source (reserved for validation; nothing in kernels/offload.py is fitted to it):
NVIDIA-NeMo/Megatron-Bridge, docs/training/cpu-offloading.md (commit b00deab), "Expected
Metric Changes": Qwen3-30B-A3B pretraining, TP2 PP2 EP4 on 2 nodes of H100, Megatron-Core's
HybridDeviceOptimizer with optimizer_offload_fraction 1.0: step time 4.2x the no-offload
step, 3.9x with overlap_cpu_optimizer_d2h_h2d; optimizer offload freed 15.3 GB per GPU.

The doc gives global batch 8 and micro-batch 1 (its runnable example); the recipe
(qwen3_30b_a3b_pretrain_config) turns recompute on and its common pretraining defaults
give 4096-token sequences: those are assumed, with and without recompute (the doc does not
say which granularity). dgx-h100 is the cluster (2 TB host, 2x Xeon 8480C); the doc does
not name its hosts.

Prints predicted against measured slowdown and memory freed.
"""

from __future__ import annotations

import dataclasses

from autoplan import caches
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import builtin_stack, resolve_cluster, resolve_model, with_gpus
from autoplan.plan import Layout, Plan
from autoplan.schedules import Schedule
from autoplan.vocab import Offload, OffloadOverlap, Recompute, ZeroStage

MEASURED = {OffloadOverlap.NONE: 4.2, OffloadOverlap.PIPELINED: 3.9}
MEASURED_FREED_GB = 15.3


def main() -> None:
    model = resolve_model("qwen3-30b-a3b")
    cluster = with_gpus(resolve_cluster("dgx-h100"), 16)
    print("Qwen3-30B-A3B, TP2 PP2 EP4 on 16 H100 (2 nodes), global batch 8, micro-batch 1, "
          "4096 tokens, 100% optimizer offload")
    print(f"{'recompute':<10} {'overlap':<10} {'step s':>8} {'offloaded s':>12} "
          f"{'predicted x':>12} {'measured x':>11} {'error':>7} {'freed GB':>9} {'measured':>9}")
    for recompute in (Recompute.NONE, Recompute.FULL):
        for mode, measured in MEASURED.items():
            stack = dataclasses.replace(builtin_stack("megatron-core"), offload_overlap=mode)
            plan = Plan(model=model, cluster=cluster, job=Job(global_batch=8, seq_len=4096),
                        layout=Layout(dp=4, tp=2, pp=2, ep=4), micro_batch=1,
                        schedule=Schedule.ONE_F_ONE_B, recompute=recompute,
                        zero=ZeroStage.OPTIMIZER, sequence_parallel=True, stack=stack)
            kept, moved = evaluate(plan), evaluate(plan.replace(offload=Offload(optimizer=True)))
            ratio = moved.step_time_s / kept.step_time_s
            freed = (kept.memory.peak - moved.memory.peak) / 1e9
            print(f"{recompute.value:<10} {mode.value:<10} {kept.step_time_s:8.3f} "
                  f"{moved.step_time_s:12.3f} {ratio:12.2f} {measured:11.1f} "
                  f"{ratio / measured - 1:+7.1%} {freed:9.1f} {MEASURED_FREED_GB:9.1f}")


if __name__ == "__main__":
    with caches.scope():  # one cost scope for the run (autoplan.caches)
        main()
