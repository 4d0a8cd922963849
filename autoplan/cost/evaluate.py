"""One plan in, one Prediction out: per-stage work (``cost.stage``), the simulated
pipeline, the data-parallel gradient sync, the optimizer step and memory per stage."""

from __future__ import annotations

from autoplan.cost import flops, offload
from autoplan.cost.stage import (
    StageWork,
    chunk_work,
    memory_shortfall,
    offloaded_chunk_bytes,
    stage_memory,
    stage_work,
)
from autoplan.parallel import dp, mesh
from autoplan.plan import Plan, Prediction, TimeBreakdown
from autoplan.schedules.simulator import SimResult, simulate, simulate_exact
from autoplan.units import GiB
from autoplan.vocab import Axis, Recompute


def model_flops(plan: Plan) -> float:
    return flops.model_flops_per_step(plan.model, plan.job.tokens_per_step, plan.job.seq_len)


def hardware_flops(plan: Plan) -> float:
    extra = 0.0
    if plan.recompute is not Recompute.NONE:
        extra = plan.job.tokens_per_step * flops.recompute_flops_per_token(
            plan.model, plan.job.seq_len, full=plan.recompute is Recompute.FULL)
    return model_flops(plan) + extra


def chunk_durations(works: tuple[StageWork, ...], v: int
                    ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Per-stage F, B and W seconds of one model chunk (a stage's work split over vpp)."""
    return (tuple(w.forward / v for w in works), tuple(w.backward_input / v for w in works),
            tuple(w.backward_weight / v for w in works))


def plan_durations(plan: Plan, works: tuple[StageWork, ...]
                   ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """F, B and W seconds the simulator takes: per stage for equal chunks, per virtual
    stage for a per-chunk layout (``simulate(..., per_chunk=True)``)."""
    if plan.chunks is None:
        return chunk_durations(works, plan.layout.vpp)
    chunks = chunk_work(plan)
    return (tuple(w.forward for w in chunks), tuple(w.backward_input for w in chunks),
            tuple(w.backward_weight for w in chunks))


def evaluate(plan: Plan) -> Prediction:
    """Predict step time and memory of a valid plan (see ``parallel.rules.plan_problems``)."""
    if plan.placement is not None:
        from autoplan.cost.placed import evaluate_placed

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


def step_breakdown(plan: Plan, works: tuple[StageWork, ...], sim: SimResult, dp_exposed: float,
                   optimizer: float, copies: float, overhead: float) -> TimeBreakdown:
    """Where the step goes, read off the critical stage (the busiest): its compute and
    exposed communication over the m microbatches, its idle time (the bubble), and the
    step's own terms; the optimizer's host step counts as offload."""
    m = plan.num_microbatches
    crit = max(range(plan.layout.pp), key=lambda s: (sim.busy[s], -s))
    w = works[crit]
    tp_s, cp_s, ep_s, pp_s, zero3_s = (w.comm[a] for a in (Axis.TP, Axis.CP, Axis.EP, Axis.PP,
                                                            Axis.DP))
    return TimeBreakdown(
        compute=m * (w.compute_f + w.compute_b + w.compute_w),
        recompute=m * w.recompute,
        tp_comm=m * (tp_s[0] + tp_s[1]),
        cp_comm=m * (cp_s[0] + cp_s[1]),
        ep_comm=m * (ep_s[0] + ep_s[1]),
        pp_comm=m * (pp_s[0] + pp_s[1]),
        dp_comm=dp_exposed + m * (zero3_s[0] + zero3_s[1]),
        # idle time of the critical stage; exactly 0 without a pipeline (no float residue)
        bubble=max(0.0, sim.makespan - sim.busy[crit]) if plan.layout.pp > 1 else 0.0,
        optimizer=0.0 if plan.offload.optimizer else optimizer,
        offload=(optimizer if plan.offload.optimizer else 0.0) + copies,
        overhead=overhead,
    )


def activation_copies_exposed(plan: Plan, works: tuple[StageWork, ...],
                              inflight: tuple[int, ...]) -> float:
    """Seconds activation offload adds to the step (cost/offload.py): on the stage where
    they are most, each of its microbatch-chunks' copies past the compute they hide behind.
    Stages that hold one microbatch-chunk at most offload nothing."""
    if not plan.offload.activations:
        return 0.0
    m, v = plan.num_microbatches, plan.layout.vpp
    worst = 0.0
    for s, w in enumerate(works):
        if inflight[s] > 1:
            per_chunk = offload.activation_copy_exposed(
                plan, offloaded_chunk_bytes(plan, s, w), w.forward / v, w.backward / v)
            worst = max(worst, m * v * per_chunk)
    return worst


def simulate_timeline(plan: Plan, microbatches: int | None = None) -> SimResult:
    """The plan's pipeline step, every operation traced (for ``autoplan explain``).

    ``microbatches`` simulates fewer microbatches than the plan runs, to draw a
    readable picture of the same schedule; None simulates all of them."""
    works = stage_work(plan)
    m = plan.num_microbatches if microbatches is None else microbatches
    v = plan.layout.vpp
    return simulate_exact(plan.schedule, *plan_durations(plan, works), m, v, trace=True,
                          per_chunk=plan.chunks is not None)


def clear_caches() -> None:
    """Drop every memoized cost: stages, groups, placements, schedules (cold runs)."""
    from autoplan import plan
    from autoplan.cost import stage
    from autoplan.parallel import ep, pp
    from autoplan.schedules import memory, simulator

    stage.clear_caches()
    ep.expert_params_per_rank.cache_clear()
    mesh.clear_caches()
    pp.clear_caches()
    dp.clear_caches()
    memory.peak_inflight.cache_clear()
    simulator.simulate.cache_clear()
    simulator._compiled_orders.cache_clear()
    plan._views.cache_clear()
