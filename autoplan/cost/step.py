"""The pieces of a step both evaluations share (one pool: ``cost.evaluate``; across
pools: ``cost.placed``): model and hardware FLOPs, the durations the pipeline simulator
takes, the activation copies offload exposes, and the breakdown read off the critical stage."""

from __future__ import annotations

from autoplan.cost.stage import StageWork, chunk_work, offloaded_chunk_bytes
from autoplan.kernels import flops, offload, packing
from autoplan.plan import Plan, TimeBreakdown
from autoplan.schedules.simulator import SimResult
from autoplan.vocab import Axis, Recompute


def attention_seq_len(plan: Plan) -> float:
    """The sequence length the attention FLOPs count: seq_len, or for packed documents its
    share of seq_len (a token attends to its own document's keys: kernels/packing.py)."""
    docs, s = plan.job.documents, plan.job.seq_len
    return s if docs is None else s * packing.attention_share(docs, s)


def model_flops(plan: Plan) -> float:
    return flops.model_flops_per_step(plan.model, plan.job.tokens_per_step,
                                      attention_seq_len(plan))  # type: ignore[arg-type]


def hardware_flops(plan: Plan) -> float:
    extra = 0.0
    seq = attention_seq_len(plan)
    if plan.recompute_modules:  # selective, by module
        extra = plan.job.tokens_per_step * flops.module_recompute_flops_per_token(
            plan.model, seq, plan.recomputed)  # type: ignore[arg-type]
    elif plan.recompute is not Recompute.NONE:
        extra = plan.job.tokens_per_step * flops.recompute_flops_per_token(
            plan.model, seq, full=plan.recompute is Recompute.FULL)  # type: ignore[arg-type]
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
    """Seconds activation offload adds to the step (kernels/offload.py): on the stage where
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
