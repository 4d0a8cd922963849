"""Communicators by axis, placed on the cluster in rank order.

Ranks are numbered with TP innermost, then CP, DP and PP outermost (the order of
``vocab.Axis``; Megatron-LM's default tp-cp-ep-dp-pp). Expert layers fold a stage's
tp x cp x dp ranks as etp x ep x edp, etp innermost (Megatron-Core's MoE parallel
folding). A group's ``stride`` is the product of the degrees inside it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from autoplan.caches import memo
from autoplan.descriptors.hardware import Cluster
from autoplan.kernels import comm
from autoplan.vocab import Axis

if TYPE_CHECKING:
    from autoplan.plan import Layout, Plan


@memo(256)
def count_free(cluster: Cluster) -> Cluster:
    """The cluster as far as a layer's costs depend on it: its node count enters them only
    through ``min(nvlink_domain, gpus)`` (``comm.place_group``), the same at every count
    from one NVLink domain up, so the clusters of a sweep's counts (search --gpus) share
    their layers' costs (``layer_groups`` places the same groups on both)."""
    domain_nodes = -(-cluster.nvlink_domain // cluster.gpus_per_node)
    if cluster.nodes <= domain_nodes:
        return cluster
    return dataclasses.replace(cluster, nodes=domain_nodes)


def groups(plan: Plan) -> dict[Axis, comm.Group]:
    """The plan's communicators by axis."""
    return groups_of(plan.cluster, plan.layout)


@memo(4096)
def groups_of(c: Cluster, lay: Layout) -> dict[Axis, comm.Group]:
    return _groups(c, lay.dp, lay.tp, lay.cp, lay.ep, lay.etp, lay.dp_shard)


@memo(4096)
def _groups(c: Cluster, dp: int, tp: int, cp: int, ep: int, etp: int,
            dp_shard: int) -> dict[Axis, comm.Group]:
    """The communicators of a stage's ranks (one dict for the layouts that differ only in
    pp or vpp: PP is the outermost rank, outside every group)."""
    edp = dp * cp * tp // (ep * etp)  # Layout.edp
    return {
        **layer_groups(c, tp, cp, ep, etp),
        # gradients are reduced (and ZeRO shards) over dp x cp (Megatron-LM); under hybrid
        # sharding over the innermost dp_shard x cp of them, the dp / dp_shard replicas of
        # that shard outside (FSDP2 HSDP: the shard dimension innermost)
        Axis.DP: comm.place_group(c, dp_shard * cp, tp),
        Axis.DPR: comm.place_group(c, dp // dp_shard, tp * cp * dp_shard),
        Axis.EDP: comm.place_group(c, edp, etp * ep),
    }


def layer_groups(c: Cluster, tp: int, cp: int, ep: int, etp: int) -> dict[Axis, comm.Group]:
    """The communicators a layer's own collectives run on (TP, CP, EP, ETP): those that
    depend on neither dp nor pp."""
    return {
        Axis.TP: comm.place_group(c, tp, 1),
        Axis.CP: comm.place_group(c, cp, tp),
        Axis.ETP: comm.place_group(c, etp, 1),
        Axis.EP: comm.place_group(c, ep, etp),
    }
