"""A plan across the pools of a heterogeneous cluster (``Plan.placement``): each stage on
its own pool, the sends between pools on the link that joins them.

Stage s's ranks run exactly what stage s of the same plan runs on a cluster of identical
nodes of its pool (``Plan.on_stage``): its layers at that pool's device speeds, its tensor,
context, expert and data parallel groups on that pool's nodes and links (they never leave
the pool: ``parallel.rules`` places whole stages). So every per-stage term is the one
``cost.evaluate`` computes, taken from the stage's own pool. Three things join the stages:

- **Sends between pools.** A pipeline send from a stage to a neighbour on another pool is
  one two-rank transfer over ``between_pools`` (``comm.p2p``'s alpha-beta time on that
  link, as between two nodes of one pool).
- **The pipeline.** The stages' forward and backward times differ (devices and layer
  counts), so the schedule is simulated on per-stage durations, as for any uneven split.
- **The step's end.** Each stage's gradient sync and optimizer step run on its pool; the
  step ends when the slowest is done (the maximum over stages, as ``evaluate`` takes it
  over the stages of one pool). Memory is each stage's against its own device.

MFU divides by the peak of the GPUs the plan uses: dp*tp*cp GPUs of each stage's device.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from autoplan.cost import comm
from autoplan.cost.evaluate import chunk_durations, hardware_flops, model_flops, step_breakdown
from autoplan.cost.stage import (
    COMM_AXES,
    AxisComm,
    StageWork,
    activation_bytes,
    memory_shortfall,
    stage_memory,
    stage_work,
)
from autoplan.descriptors.hardware import Cluster, Link
from autoplan.parallel import dp, mesh, pp
from autoplan.plan import Plan, Prediction
from autoplan.schedules.simulator import simulate
from autoplan.vocab import Axis

_PP = COMM_AXES.index(Axis.PP)


def between_send_seconds(plan: Plan, stage: int) -> float:
    """One send of a microbatch's activations (or gradients) from ``stage`` to a neighbour
    on another pool: ``pp.send_seconds``' bytes (1/tp of them with sequence parallelism)
    over the ``between_pools`` link."""
    assert plan.placement is not None
    view = plan.on_stage(stage)
    nbytes = activation_bytes(view) / (plan.layout.tp if plan.sequence_parallel else 1)
    return comm.p2p(nbytes, True, _bridge(view.cluster, plan.placement.cluster.between_pools))


@lru_cache(maxsize=256)
def _bridge(pool: Cluster, between: Link) -> Cluster:
    """The pool as its ranks see the other pools: ``between`` in place of its own network."""
    return dataclasses.replace(pool, inter_node=between)


def placed_stage_work(plan: Plan, stage: int, work: StageWork,
                      crossing: float | None = None) -> StageWork:
    """``work`` (the stage's on its own pool) with each send to a neighbour on another pool
    costed on the link between pools instead; ``crossing``: that send's seconds where the
    caller has them (``between_send_seconds``)."""
    assert plan.placement is not None
    pools = plan.placement.stage_pools
    sends_f, sends_b = pp.sends(plan, stage)  # vpp = 1: to stage + 1 and to stage - 1
    fwd, bwd = work.comm.seconds[_PP]
    if crossing is None:
        crossing = between_send_seconds(plan, stage)
    if sends_f and pools[stage + 1] != pools[stage]:
        fwd = sends_f * crossing
    if sends_b and pools[stage - 1] != pools[stage]:
        bwd = sends_b * crossing
    if (fwd, bwd) == work.comm.seconds[_PP]:
        return work
    seconds = list(work.comm.seconds)
    seconds[_PP] = (fwd, bwd)
    return dataclasses.replace(work, comm=AxisComm(tuple(seconds)))


def placed_works(plan: Plan) -> tuple[StageWork, ...]:
    """Per-stage work of a placed plan, each stage on its pool."""
    return tuple(placed_stage_work(plan, s, stage_work(plan.on_stage(s))[s])
                 for s in range(plan.layout.pp))


def evaluate_placed(plan: Plan) -> Prediction:
    """Step time and memory of a valid plan across pools (module doc)."""
    assert plan.placement is not None
    lay, m = plan.layout, plan.num_microbatches
    works = placed_works(plan)
    views = [plan.on_stage(s) for s in range(lay.pp)]
    sim = simulate(plan.schedule, *chunk_durations(works, 1), m, 1)
    dp_exposed = max(dp.grad_sync_exposed(v, mesh.groups(v), [w], sim.makespan, [end])
                     for v, w, end in zip(views, works, sim.finish, strict=True))
    optimizer = max(dp.optimizer_seconds(v, [w]) for v, w in zip(views, works, strict=True))
    step = sim.makespan + dp_exposed + optimizer
    overhead = dp.step_overhead(plan)

    per_stage = tuple(stage_memory(v, s, w, sim.peak_inflight[s])
                      for s, (v, w) in enumerate(zip(views, works, strict=True)))
    capacity = tuple(v.cluster.device.mem_bytes for v in views)
    # the stage with the least memory left on its own device
    worst = min(range(lay.pp), key=lambda s: (capacity[s] - per_stage[s].peak, s))
    feasible = all(mem.peak <= cap for mem, cap in zip(per_stage, capacity, strict=True))
    reason = "" if feasible else memory_shortfall(views[worst], worst, per_stage[worst],
                                                  capacity[worst])
    overhead += max(dp.memory_pressure(step, mem.peak, cap)
                    for mem, cap in zip(per_stage, capacity, strict=True))
    step += overhead

    breakdown = step_breakdown(plan, works, sim, dp_exposed, optimizer, 0.0, overhead)
    block = lay.dp * lay.tp * lay.cp
    peak = block * sum(v.cluster.device.peak_flops(plan.job.dtype) for v in views)
    mflops = model_flops(plan)
    return Prediction(
        feasible=feasible,
        step_time_s=step,
        tokens_per_s=plan.job.tokens_per_step / step,
        tflops_per_gpu=mflops / lay.gpus / step / 1e12,
        hw_tflops_per_gpu=hardware_flops(plan) / lay.gpus / step / 1e12,
        mfu=mflops / (peak * step),
        memory=per_stage[worst],
        memory_per_stage=per_stage,
        breakdown=breakdown,
        capacity_bytes=capacity[worst],
        reason=reason,
        stage_pools=tuple(v.cluster.name for v in views),
        stage_busy_s=tuple(sim.busy),
        stage_capacity_bytes=capacity,
    )
