"""What the search needs from the cost model, in one narrow module: lower bounds on a
plan's step time, and the per-stage work and memory those bounds and the memory
checks are built from. The search imports from here and ``cost.evaluate.evaluate``
only."""

from __future__ import annotations

from autoplan.cost.stage import (
    StageWork,
    cost_key,
    memory_shortfall,
    stage_memory,
    stage_state_params,
    stage_work,
    stage_work_for,
)
from autoplan.parallel import mesh
from autoplan.parallel.dp import (
    grad_sync_floor,
    memory_pressure,
    optimizer_seconds,
    state_bytes,
    step_overhead,
)
from autoplan.parallel.pp import dense_per_stage, output_stage
from autoplan.plan import Plan
from autoplan.vocab import Axis

__all__ = [
    "StageWork", "cost_key", "dense_per_stage", "memory_pressure", "memory_shortfall",
    "optimizer_seconds",
    "output_stage", "stage_memory", "stage_state_params", "stage_work", "stage_work_for",
    "state_bytes", "step_overhead", "busiest_stage_bound", "step_time_lower_bound",
]


def step_time_lower_bound(plan: Plan, works: tuple[StageWork, ...]) -> float:
    """A bound no schedule beats: stage s cannot start before the first microbatch's
    forward crosses the stages before it, must run m forwards and backwards, and its
    last backward must still cross those stages back; then the optimizer step, the
    stack's per-step overhead and the gradient sync no drain hides
    (``dp.grad_sync_floor``).
    Exact for 1F1B and GPipe with uniform stages ((m + p - 1)(f + b))."""
    m, v = plan.num_microbatches, plan.layout.vpp
    best, fill, drain = 0.0, 0.0, 0.0
    for w in works:
        best = max(best, fill + m * (w.forward + w.backward) + drain)
        fill += w.forward / v
        drain += w.backward / v
    return (best + optimizer_seconds(plan, works) + step_overhead(plan)
            + grad_sync_floor(plan, mesh.groups(plan), works))


def busiest_stage_bound(plan: Plan, works: tuple[StageWork, ...], without_cp: bool) -> float:
    """m times the busiest stage's forward + backward, plus the optimizer step: no
    schedule of the plan's layout beats it (fill and drain are >= 0; vpp = 1 sends the
    fewest activations). ``without_cp`` leaves out all context-parallel communication,
    so the bound holds for every CP exchange."""
    m = plan.num_microbatches
    per_stage = []
    for w in works:
        t = w.forward + w.backward
        if without_cp:
            cp_f, cp_b = w.comm[Axis.CP]
            t -= cp_f + cp_b
        per_stage.append(t)
    return m * max(per_stage) + optimizer_seconds(plan, works) + step_overhead(plan)
