"""MoE dispatch and combine against DeepEP's published kernel measurements.

DeepEP's legacy (V1) README, "Normal kernels with NVLink and RDMA forwarding"
(deepseek-ai/DeepEP docs/legacy.md): H800 GPUs (~160 GB/s NVLink) each with a CX7
400 Gb/s NIC (~50 GB/s), 4096 tokens per rank, hidden 7168, top-8 of 256 experts from
the top-4 groups (one group per node), FP8 dispatch and BF16 combine. Its "bottleneck
bandwidth" counts, per rank, every (token, node) pair over RDMA - local node included -
and every (token, GPU) pair over NVLink inside a node, divided by the kernel's time
(tests/test_internode.py: num_rdma_token_sent x hidden x bytes / t).

This prints that figure as autoplan's DeepEP model predicts it (``parallel.ep``: one
copy per other node over the NIC beside one per GPU over NVLink, at the cluster's link
rates times the default link efficiency), and the time of Megatron-Core's NCCL
all-to-all dispatcher on the same tokens. Both figures count the same bytes, so the
dtype cancels: the FP8 dispatch and BF16 combine columns compare alike.

    python benchmarks/moe_dispatch.py
"""

from __future__ import annotations

import dataclasses

from autoplan.descriptors.hardware import GB
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.kernels import comm
from autoplan.kernels.layer import BF16_BYTES, Shard
from autoplan.parallel import ep
from autoplan.vocab import Dtype, MoeDispatch

# (EP ranks, published dispatch GB/s, published combine GB/s, the link it names)
PUBLISHED = [(8, 153, 158, "NVLink"), (16, 43, 43, "RDMA"), (32, 58, 57, "RDMA"),
             (64, 51, 50, "RDMA")]
TOKENS = 4096


def h800_cluster(gpus: int):
    """DGX-H100 nodes with DeepEP's stated H800 links: NVLink ~160 GB/s, one ~50 GB/s NIC."""
    base = with_gpus(resolve_cluster("dgx-h100"), gpus)
    return dataclasses.replace(
        base, intra_node=dataclasses.replace(base.intra_node, bandwidth_Bps=160 * GB),
        inter_node=dataclasses.replace(base.inter_node, bandwidth_Bps=50 * GB))


def main() -> None:
    model = resolve_model("deepseek-v3")
    print("DeepEP normal kernels (docs/legacy.md) against autoplan's DeepEP model, H800 + CX7")
    print(f"{'EP':>4} {'link':>7} {'nodes/token':>12} {'published disp':>15} {'published comb':>15} "
          f"{'model GB/s':>11} {'error disp':>11} {'error comb':>11} {'DeepEP us':>10} {'NCCL a2a us':>12}")
    for ranks, disp, comb, link in PUBLISHED:
        cluster = h800_cluster(max(8, ranks))
        g = comm.place_group(cluster, ranks, 1)
        nodes = g.domains
        groups = nodes if nodes > 1 else 0
        routed = dataclasses.replace(model, route_groups=groups, route_group_topk=min(4, nodes)
                                     if groups else 0)
        shard = Shard(1, TOKENS, 1, 1, False, Dtype.BF16, ep=ranks, etp=1,
                      moe_dispatch=MoeDispatch.DEEPEP)
        seconds = ep.deepep_seconds(routed, shard, g)
        blocks = nodes if link == "RDMA" else ranks
        counted = ep.touched(256, 8, blocks, routed.route_groups, routed.route_group_topk)
        token_bytes = BF16_BYTES * model.hidden * TOKENS
        rate = counted * token_bytes / seconds / GB
        a2a = comm.all_to_all(token_bytes * model.top_k, g)
        touched_nodes = ep.touched(256, 8, nodes, routed.route_groups, routed.route_group_topk)
        print(f"{ranks:>4} {link:>7} {touched_nodes:>12.2f} {disp:>15} {comb:>15} {rate:>11.1f} "
              f"{rate / disp - 1:>+11.1%} {rate / comb - 1:>+11.1%} {seconds * 1e6:>10.0f} "
              f"{a2a * 1e6:>12.0f}")
    print("model GB/s: the published bandwidth's bytes over the model's time (link efficiency "
          f"{h800_cluster(8).inter_node.efficiency:g} of the stated rates)")


if __name__ == "__main__":
    main()
