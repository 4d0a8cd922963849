"""What a launch runs on: the cluster's nodes, or across pools the nodes of each pool the
plan places stages on, and which node ranks must be which pool's.

Megatron-LM and torchtitan number ranks with pipeline parallelism outermost
(Megatron's tp-cp-ep-dp-pp order; torchtitan's mesh ["pp", "dp_replicate", "dp_shard",
"cp", "tp"]) and torchrun gives node n the ranks n*g .. n*g + g - 1 (g GPUs per node). So
stage s, ranks s*b .. (s+1)*b - 1 for b = dp*tp*cp, runs on node ranks s*b/g onwards: a
run of stages on one pool is a run of node ranks, and those nodes must be that pool's
(``parallel.rules`` makes each run fill whole nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.plan import Plan


@dataclass(frozen=True, slots=True)
class Launch:
    what: str  # "64 x h100-sxm (8 x 8 GPUs, dgx-h100)", for a header
    nodes: int
    gpus_per_node: int
    pools: tuple[str, ...]  # one comment line per run of stages on a pool; () on one pool


def launch(plan: Plan) -> Launch:
    c = plan.cluster
    if plan.placement is None:
        return Launch(f"{c.gpus} x {c.device.name} ({c.nodes} x {c.gpus_per_node} GPUs, {c.name})",
                      c.nodes, c.gpus_per_node, ())
    placement, lay = plan.placement, plan.layout
    block = lay.dp * lay.tp * lay.cp
    g = c.gpus_per_node  # every pool used has it (``problems``)
    lines = [f"node ranks {stages[0] * block // g}-{(stages[-1] + 1) * block // g - 1}: pool "
             f"{pool.name} ({pool.device.name}), pipeline {placement.span(stages)}"
             for pool, stages in placement.runs()]
    used = lay.gpus // g
    devices = ", ".join(dict.fromkeys(
        placement.cluster.pools[i].device.name for i in placement.stage_pools))
    return Launch(f"{lay.gpus} GPUs of {devices} ({used} x {g} GPUs, pools of "
                  f"{placement.cluster.name})", used, g, tuple(lines))


def problems(plan: Plan) -> list[tuple[str, str]]:
    """What a torchrun launch across pools cannot express."""
    if plan.placement is None:
        return []
    per_node = {plan.placement.cluster.pools[i].gpus_per_node for i in plan.placement.stage_pools}
    if len(per_node) > 1:
        return [("placement", f"the pools it uses have {sorted(per_node)} GPUs per node; "
                              "torchrun starts the same --nproc-per-node on every node")]
    return []


def pool_lines(where: Launch) -> list[str]:
    """Comment lines naming which node ranks must be which pool's (none on one pool)."""
    from autoplan.shell import comment

    if not where.pools:
        return []
    return [comment("Across pools: start each node with the NODE_RANK of its pool's range:"),
            *(comment("  " + line) for line in where.pools)]
