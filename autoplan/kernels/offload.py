"""Offload: what keeping optimizer states or activations in host memory costs.

Optimizer offload (ZeRO-Offload, Ren et al. 2021; Megatron-Core's --optimizer-cpu-offload):
each rank's shard of the fp32 master weights and Adam moments lives in host memory. Per
step, per parameter of the rank's shard, the gradient goes down the host link, the CPU
runs Adam, and the updated weight comes back up in the model's dtype:

    down = g / L,  up = w / L,  cpu = G (A + g + w) / M

with g and w the gradient and weight bytes (``memory.bytes_per_param``), L the GPU's host
link (per direction, ``Cluster.host_link_Bps`` x HOST_LINK_EFFICIENCY), G the GPUs of a
node, whose shards one host steps at once, A = CPU_ADAM_BYTES the optimizer's own host
traffic and M the node's host memory bandwidth (``host_mem_Bps`` x HOST_MEM_EFFICIENCY);
the copies' g + w bytes cross host memory too. The stack says how the three overlap
(``vocab.OffloadOverlap``): in turn (sum), the gradients behind the backward
(max(cpu + up, down)), or pipelined in chunks (max). Each is linear in the shard's
parameters: seconds = ``optimizer_seconds_per_param`` x parameters.

Activation offload (PipeOffload, Wan et al. 2025): a fraction a of the activations each
microbatch leaves on a stage goes to the host after its forward and comes back before its
backward, on the copy engines, beside compute (GEMMs ran at 0.993-0.997x their speed
during device-to-host copies on an H200: benchmarks/host_offload.py). A stage holding n
microbatch-chunks keeps 1 + (n - 1)(1 - a) of them on the GPU (the one being worked on
stays); each copy of a bytes is exposed where it outlasts the forward (down) or backward
(up) of the chunk it hides behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan.descriptors.hardware import HOST_LINK_EFFICIENCY, HOST_MEM_EFFICIENCY
from autoplan.kernels import memory
from autoplan.vocab import OffloadOverlap

# Adam's host traffic per parameter: fp32 weight, gradient and two moments read (16 B), the
# weight and moments written (12 B): the streams of DeepSpeedCPUAdam (Ren et al. 2021,
# Sec. 5) and of torch's fused AdamW, which Megatron-Core's CPU offload steps
# (torch.optim.AdamW with fused=True: megatron/core/optimizer/__init__.py, 0.16).
# Measured on 16 cores of an H200 host: torch 2.11's fused CPU AdamW stepped 4.2-4.4 G
# parameters/s, 117-124 GB/s at these 28 B (benchmarks/host/h200-2026-11-26.json).
CPU_ADAM_BYTES = 28
# Host memory a parameter of the shard takes: fp32 master weight and two moments (12 B)
# and the fp32 gradient the step reads (4 B) (ZeRO-Offload keeps all four on the host).
HOST_STATE_BYTES = 16

if TYPE_CHECKING:
    from autoplan.plan import Plan


def link_Bps(plan: Plan) -> float:
    """A GPU's achievable host-link bandwidth, per direction."""
    host = plan.cluster.host_link_Bps
    assert host is not None, "offload on a cluster without a host (parallel/offload.py rules)"
    return host * HOST_LINK_EFFICIENCY


def optimizer_seconds_per_param(plan: Plan) -> float:
    """Seconds an offloaded optimizer step takes per parameter of the fullest rank's shard
    (module doc); every rank of the node steps a shard that large on the one host."""
    c = plan.cluster
    assert c.host_mem_Bps is not None
    per = memory.bytes_per_param(plan.job.dtype, plan.states)
    link = link_Bps(plan)
    down, up = per.grads / link, per.weights / link
    cpu = (c.gpus_per_node * (CPU_ADAM_BYTES + per.grads + per.weights)
           / (c.host_mem_Bps * HOST_MEM_EFFICIENCY))
    mode = plan.stack.offload_overlap
    if mode is OffloadOverlap.PIPELINED:
        return max(down, cpu, up)
    if mode is OffloadOverlap.BACKWARD:
        return max(cpu + up, down)
    return down + cpu + up


def kept_chunks(inflight: float, fraction: float) -> float:
    """Microbatch-chunks' worth of activations a stage holding ``inflight`` keeps on the GPU."""
    if fraction <= 0 or inflight <= 1:
        return inflight
    return 1 + (inflight - 1) * (1 - fraction)


def activation_copy_exposed(plan: Plan, chunk_bytes: float, forward_s: float,
                            backward_s: float) -> float:
    """Seconds one offloaded microbatch-chunk's copies add: ``chunk_bytes`` of its
    activations, the offloaded fraction of them, down during its ``forward_s`` and up during
    its ``backward_s`` (each exposed only past the compute it hides behind)."""
    copy = plan.offload.activations * chunk_bytes / link_Bps(plan)
    return max(0.0, copy - forward_s) + max(0.0, copy - backward_s)
