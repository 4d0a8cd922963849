"""One plan in, one Prediction out: per-stage work (``cost.stage``), the simulated
pipeline, the data-parallel gradient sync, the optimizer step and memory per stage."""

from __future__ import annotations

from autoplan import caches
from autoplan.cost.placed import evaluate_placed
from autoplan.cost.stage import memory_shortfall, stage_memory, stage_work
from autoplan.cost.step import (
    activation_copies_exposed,
    hardware_flops,
    model_flops,
    plan_durations,
    step_breakdown,
)
from autoplan.parallel import dp, mesh
from autoplan.plan import Plan, Prediction
from autoplan.schedules.simulator import SimResult, simulate, simulate_exact
from autoplan.units import GiB


def evaluate(plan: Plan) -> Prediction:
    """Predict step time and memory of a valid plan (see ``parallel.rules.plan_problems``),
    in a cost scope of its own unless a search or sweep holds one (``autoplan.caches``)."""
    with caches.scope():
        return _evaluate(plan)


def _evaluate(plan: Plan) -> Prediction:
    if plan.placement is not None:
        return evaluate_placed(plan)
    works = stage_work(plan)  # memoized: the search computed it for the bound
    lay, m = plan.layout, plan.num_microbatches
    v = lay.vpp
    sim = simulate(plan.schedule, *plan_durations(plan, works), m, v,
                   per_chunk=plan.chunks is not None)
    dp_exposed = dp.grad_sync_exposed(plan, mesh.groups(plan), works, sim.makespan, sim.finish)
    optimizer = dp.optimizer_seconds(plan, works)  # on the host where offloaded
    copies = activation_copies_exposed(plan, works, sim.peak_inflight)
    step = sim.makespan + dp_exposed + optimizer + copies
    overhead = dp.step_overhead(plan)

    per_stage = tuple(stage_memory(plan, s, w, sim.peak_inflight[s]) for s, w in enumerate(works))
    worst = max(range(lay.pp), key=lambda s: (per_stage[s].peak, -s))
    capacity = plan.cluster.device.mem_bytes
    feasible = per_stage[worst].peak <= capacity
    reason = "" if feasible else memory_shortfall(plan, worst, per_stage[worst], capacity)
    host = plan.cluster.gpus_per_node * max(m.host for m in per_stage)
    host_capacity = plan.cluster.host_mem_bytes
    if feasible and host and host_capacity is not None and host > host_capacity:
        feasible = False
        reason = (f"offload needs {host / GiB:.0f} GiB of host memory per node, the node has "
                  f"{host_capacity / GiB:.0f} GiB (cluster host_mem_GiB)")
    overhead += dp.memory_pressure(step, per_stage[worst].peak, capacity)
    step += overhead

    breakdown = step_breakdown(plan, works, sim, dp_exposed, optimizer, copies, overhead)
    gpus = lay.gpus
    peak = plan.cluster.device.peak_flops(plan.job.dtype)
    mflops = model_flops(plan)
    return Prediction(
        feasible=feasible,
        step_time_s=step,
        tokens_per_s=plan.job.tokens_per_step / step,
        tflops_per_gpu=mflops / gpus / step / 1e12,
        hw_tflops_per_gpu=hardware_flops(plan) / gpus / step / 1e12,
        mfu=mflops / (gpus * peak * step),
        memory=per_stage[worst],
        memory_per_stage=per_stage,
        breakdown=breakdown,
        capacity_bytes=capacity,
        reason=reason,
        host_memory_bytes_per_node=host,
    )


def simulate_timeline(plan: Plan, microbatches: int | None = None) -> SimResult:
    """The plan's pipeline step, every operation traced (for ``autoplan explain``).

    ``microbatches`` simulates fewer microbatches than the plan runs, to draw a
    readable picture of the same schedule; None simulates all of them."""
    works = stage_work(plan)
    m = plan.num_microbatches if microbatches is None else microbatches
    v = plan.layout.vpp
    return simulate_exact(plan.schedule, *plan_durations(plan, works), m, v, trace=True,
                          per_chunk=plan.chunks is not None)
