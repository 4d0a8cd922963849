"""Communicators by axis, placed on the cluster in rank order.

Ranks are numbered with TP innermost, then CP, DP and PP outermost (the order of
``vocab.Axis``; Megatron-LM's default tp-cp-ep-dp-pp). Expert layers fold a stage's
tp x cp x dp ranks as etp x ep x edp, etp innermost (Megatron-Core's MoE parallel
folding). A group's ``stride`` is the product of the degrees inside it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from autoplan.cost import comm
from autoplan.descriptors.hardware import Cluster
from autoplan.vocab import Axis

if TYPE_CHECKING:
    from autoplan.plan import Layout, Plan


def groups(plan: Plan) -> dict[Axis, comm.Group]:
    """The plan's communicators by axis."""
    return groups_of(plan.cluster, plan.layout)


@lru_cache(maxsize=4096)
def groups_of(c: Cluster, lay: Layout) -> dict[Axis, comm.Group]:
    return {
        Axis.TP: comm.place_group(c, lay.tp, 1),
        Axis.CP: comm.place_group(c, lay.cp, lay.tp),
        # gradients are reduced (and ZeRO shards) over dp x cp (Megatron-LM)
        Axis.DP: comm.place_group(c, lay.dp * lay.cp, lay.tp),
        Axis.ETP: comm.place_group(c, lay.etp, 1),
        Axis.EP: comm.place_group(c, lay.ep, lay.etp),
        Axis.EDP: comm.place_group(c, lay.edp, lay.etp * lay.ep),
    }


def clear_caches() -> None:
    groups_of.cache_clear()
