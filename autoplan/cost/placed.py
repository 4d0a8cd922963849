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

from autoplan.cost.stage import memory_shortfall, placed_works, stage_memory
from autoplan.cost.step import chunk_durations, hardware_flops, model_flops, step_breakdown
from autoplan.parallel import dp, mesh
from autoplan.plan import Plan, Prediction
from autoplan.schedules.simulator import simulate


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
