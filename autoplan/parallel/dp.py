"""Data parallel and ZeRO (Rajbhandari et al. 2020): the batch rule, the ZeRO stages
the search tries, the sharded model states, the gradient reduction and ZeRO-3
parameter gathers left exposed, and the optimizer step.

Gradients are reduced, and ZeRO shards, over dp x cp for the dense weights and over
the expert-data-parallel group for the routed experts (Megatron-Core's distributed
optimizer); the groups come from ``mesh``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from autoplan.caches import memo
from autoplan.descriptors.precision import StatePrecision
from autoplan.kernels import comm, memory, offload
from autoplan.kernels.layer import BF16_BYTES
from autoplan.parallel.common import Rule, Scope
from autoplan.vocab import Axis, Dtype, MasterWeights, Offload, StateDtype, ZeroStage

if TYPE_CHECKING:
    from autoplan.descriptors.hardware import Cluster
    from autoplan.descriptors.space import SearchSpace
    from autoplan.plan import Layout, Plan

# Adam step per parameter: read fp32 master, m, v and grad, write master, m, v and
# the 16-bit weight: 4*4 + 3*4 + 2 bytes (memory-bound; ZeRO paper's K=12 states).
ADAM_BYTES_PER_PARAM = 30


class StageShare(Protocol):
    """What the DP terms read of a stage's work (cost.stage.StageWork)."""

    @property
    def params(self) -> float: ...
    @property
    def expert_params(self) -> float: ...
    @property
    def forward(self) -> float: ...
    @property
    def backward(self) -> float: ...


# ----------------------------------------------------------------------------- rules

def _batch(plan: Plan) -> str | None:
    dp, mbs, gbs = plan.layout.dp, plan.micro_batch, plan.job.global_batch
    if gbs % (dp * mbs):
        return f"dp*micro_batch = {dp}*{mbs} must divide global_batch={gbs}"
    return None


def _offload_host(plan: Plan) -> str | None:
    return None if not plan.offload.any else _no_host(plan.cluster)


def _no_host(cluster: Cluster) -> str | None:
    if not cluster.offloads:
        return (f"cluster {cluster.name} describes no host to offload to (give "
                f"host_link_GBps, host_mem_GiB and host_mem_GBps in its cluster file)")
    return None


def _offload_zero(plan: Plan) -> str | None:
    return _optimizer_refused(plan.offload, plan.zero)


def _optimizer_refused(off: Offload, zero: ZeroStage) -> str | None:
    if off.optimizer and zero is ZeroStage.NONE:
        return ("an offloaded optimizer needs ZeRO stage 1 or more (DeepSpeed's "
                "offload_optimizer and Megatron's --optimizer-cpu-offload with its distributed "
                "optimizer both step each rank's shard)")
    return None


def _offload_activations(plan: Plan) -> str | None:
    return _activations_refused(plan.offload, plan.layout.pp)


def _activations_refused(off: Offload, pp: int) -> str | None:
    if off.activations > 0 and pp == 1:
        return ("activation offload moves what the pipeline holds for later backwards; "
                "without one (pp = 1) there is nothing to move")
    return None


def _dp_shard_divides(plan: Plan) -> str | None:
    lay = plan.layout
    if lay.dp % lay.dp_shard:
        return f"dp_shard={lay.dp_shard} must divide dp={lay.dp} (dp = replicas x dp_shard)"
    return None


def _dp_shard_zero(plan: Plan) -> str | None:
    if plan.layout.dp_shard < plan.layout.dp and plan.zero is ZeroStage.NONE:
        return (f"dp_shard={plan.layout.dp_shard} shards ZeRO's states over part of dp: it needs "
                "zero 1, 2 or 3 (zero 0 shards nothing)")
    return None


RULES = (
    Rule("dp-shard-divides", "layout.dp_shard", Scope.LAYOUT,
         "dp_shard must divide dp", _dp_shard_divides),
    Rule("dp-batch", "micro_batch", Scope.MICRO_BATCH,
         "dp*micro_batch must divide global_batch", _batch),
)
OFFLOAD_RULES = (
    Rule("offload-needs-host", "offload", Scope.OFFLOAD,
         "offload needs the cluster's host link and memory", _offload_host),
    Rule("offload-optimizer-needs-zero", "offload.optimizer", Scope.OFFLOAD,
         "an offloaded optimizer steps a ZeRO shard", _offload_zero),
    Rule("offload-activations-needs-pp", "offload.activations", Scope.OFFLOAD,
         "activation offload needs a pipeline", _offload_activations),
    Rule("dp-shard-needs-zero", "layout.dp_shard", Scope.OFFLOAD,
         "hybrid sharding (dp_shard < dp) shards ZeRO states: zero >= 1", _dp_shard_zero),
)


# ----------------------------------------------------------------------------- degrees

def zero_stages(lay: Layout, space: SearchSpace) -> list[ZeroStage]:
    """The space's ZeRO stages, capped where the launcher cannot combine them with pp."""
    if lay.pp > 1 and space.zero_with_pp:  # the launcher's own sharding under a pipeline
        stages: tuple[ZeroStage, ...] = space.zero_with_pp
    else:
        cap = space.zero_max_with_pp if lay.pp > 1 else ZeroStage.PARAMETERS
        stages = tuple(z for z in space.zero if z <= cap)
    return [z for z in stages if not plain_dp_refused(lay, z, space)
            and not (z is ZeroStage.NONE and lay.dp_shard < lay.dp)]  # HSDP shards: zero >= 1


def hybrid_shards(lay: Layout, cluster: Cluster, space: SearchSpace) -> list[int]:
    """The dp_shard degrees the search tries besides all of dp (``SearchSpace.hybrid_shard``):
    the data-parallel ranks within one node (FSDP2 HSDP and Megatron's distributed optimizer
    instances shard there and replicate across nodes), where that is a proper divisor."""
    if not space.hybrid_shard:
        return []
    in_node = cluster.gpus_per_node // (lay.tp * lay.cp)
    return [in_node] if 1 < in_node < lay.dp and lay.dp % in_node == 0 else []


def plain_dp_refused(lay: Layout, zero: ZeroStage, space: SearchSpace) -> bool:
    """The launcher's plain data parallel (zero 0) cannot join tensor, pipeline or context
    parallelism (``SearchSpace.plain_dp_with_model_parallel``; torchtitan shards the
    parameters over the context-parallel ranks whatever the replicate degree: FSDP over
    dp_shard x cp, torchtitan/models/llama3/infra/parallelize.py apply_fsdp)."""
    return (not space.plain_dp_with_model_parallel and zero is ZeroStage.NONE and lay.dp > 1
            and lay.tp * lay.pp * lay.cp > 1)


def offload_choices(lay: Layout, zero: ZeroStage, cluster: Cluster,
                    space: SearchSpace) -> list[Offload]:
    """The space's offload choices a plan of this layout, ZeRO stage and cluster may take:
    what passes the offload rules (the same predicates), no offload first."""
    if len(space.offload) == 1 or _no_host(cluster):
        return [space.offload[0]]
    return [o for o in space.offload
            if not _optimizer_refused(o, zero) and not _activations_refused(o, lay.pp)]


# ----------------------------------------------------------------------------- memory

def grad_bytes(dtype: Dtype, main_grads: StateDtype = StateDtype.FP32) -> float:
    """Bytes per gradient element reduced: Megatron-LM reduces bf16 grads in fp32 unless
    told to reduce them in bf16 (``Plan.states.main_grads``)."""
    return memory.bytes_per_param(dtype, StatePrecision(main_grads=main_grads)).grads


def state_bytes(plan: Plan, params: float, expert_params: float) -> memory.BytesPerParam:
    """Weights, gradients and optimizer states of one rank: ZeRO shards the non-expert
    states over dp x cp (under hybrid sharding dp_shard x cp: FSDP2 HSDP, Megatron-Core's
    distributed optimizer instances) and the experts' over the expert-data-parallel group
    (Megatron-Core distributed optimizer)."""
    lay = plan.layout
    return state_bytes_of(plan.job.dtype, plan.states, plan.zero, lay.dp_shard * lay.cp, lay.edp,
                          plan.offload.optimizer, params, expert_params)


# plain arithmetic on enums and numbers, no descriptor in its key: kept for the process
# (bounded), not dropped with a question's costs; the search asks it for every stage of
# every memory floor, a sweep hundreds of thousands of times
@functools.lru_cache(maxsize=65536)
def state_bytes_of(dtype: Dtype, states: StatePrecision, zero: ZeroStage, shards: int, edp: int,
                   offloaded: bool, params: float, expert_params: float) -> memory.BytesPerParam:
    """:func:`state_bytes` of a rank keeping ``states`` (``Plan.states``) whose non-expert
    states ZeRO shards over ``shards`` ranks and expert states over ``edp`` (the
    optimizer's offloaded or not)."""
    dense = memory.sharded_state_bytes(params, dtype, zero, shards, states)
    if expert_params:
        experts = memory.sharded_state_bytes(expert_params, dtype, zero, edp, states)
        dense = memory.BytesPerParam(weights=dense.weights + experts.weights,
                                     grads=dense.grads + experts.grads,
                                     optimizer=dense.optimizer + experts.optimizer)
    if offloaded:  # master weights and moments live in host memory
        return memory.BytesPerParam(weights=dense.weights, grads=dense.grads, optimizer=0.0)
    return dense


def time_twin(zero: ZeroStage) -> ZeroStage:
    """The ZeRO stage whose step time every plan at ``zero`` shares: ZeRO-2 runs ZeRO-1's
    collectives (gradients reduce-scattered, parameters all-gathered: ``_sync_seconds``)
    and optimizer step (sharded: ``_optimizer_groups``), its stage works are ZeRO 0-2's
    (``cost.stage.cost_key``); it differs in memory alone (its gradients sharded too).
    The search's step-time bounds are memoized on it."""
    return ZeroStage.OPTIMIZER if zero is ZeroStage.GRADIENTS else zero


def optimizer_params(plan: Plan, params: float, expert_params: float) -> float:
    """Parameters whose optimizer state one rank of a stage holding ``params`` dense and
    ``expert_params`` expert parameters steps (its ZeRO shard)."""
    dense, expert = _optimizer_groups(plan)
    return params / dense + expert_params / expert


def host_state_bytes(plan: Plan, params: float, expert_params: float) -> float:
    """Host memory an offloaded optimizer's shard of one rank takes (kernels/offload.py)."""
    if not plan.offload.optimizer:
        return 0.0
    return optimizer_params(plan, params, expert_params) * offload.HOST_STATE_BYTES


def zero3_buffer_bytes(largest_layer_params: float, max_live_params: float = 0.0) -> float:
    """FSDP/ZeRO-3 hold the gathered current layer and prefetch the next one; DeepSpeed
    caps the gathered parameters alive at once (``stage3_max_live_parameters``, 1e9 by
    default in deepspeed/runtime/zero/config.py), given as ``max_live_params`` (0: no cap)."""
    live = 2 * largest_layer_params
    if max_live_params:
        live = min(live, max_live_params)
    return BF16_BYTES * live


# ----------------------------------------------------------------------------- communication

def overlapped(comm_s: float, compute_s: float, slowdown: float) -> float:
    """Seconds a collective adds to the compute it runs behind: what sticks out, plus the
    compute slowed while both run (NCCL's kernels hold SMs: one CTA per channel)."""
    return max(0.0, comm_s - compute_s) + slowdown * min(comm_s, compute_s)


def zero3_exposed(plan: Plan, groups: dict[Axis, comm.Group], params: float,
                  expert_params: float, forward: float, backward_input: float,
                  backward_weight: float, layers: int = 1) -> tuple[float, float]:
    """ZeRO-3 per microbatch, (forward, backward) exposed: the parameter all-gather
    before forward, again before backward with the gradient reduce-scatter after it.
    FSDP and ZeRO-3 gather one layer ahead (FSDP's forward/backward prefetch; DeepSpeed's
    stage-3 prefetch bucket), so each pass waits for its first layer's gather, and the
    rest hide behind the layers' compute, slowed while they share the SMs; the gathers
    and reduce-scatters of a pass share one link. All per layer, ``layers`` of them."""
    if plan.zero is not ZeroStage.PARAMETERS or groups[Axis.DP].size <= 1:
        return 0.0, 0.0
    gather = comm.all_gather(params * BF16_BYTES, groups[Axis.DP])
    grads = params * grad_bytes(plan.job.dtype, plan.states.main_grads)
    reduced = plan.states.main_grads.value  # the dtype the gradients are summed in
    scatter = comm.reduce_scatter(grads, groups[Axis.DP], reduced)
    if groups[Axis.DPR].size > 1:  # HSDP: the shard's gradients all-reduced over the replicas
        scatter += comm.all_reduce(grads / groups[Axis.DP].size, groups[Axis.DPR], reduced)
    if expert_params:
        gather += comm.all_gather(expert_params * BF16_BYTES, groups[Axis.EDP])
        scatter += comm.reduce_scatter(expert_params * grad_bytes(plan.job.dtype,
                                                                  plan.states.main_grads),
                                       groups[Axis.EDP], reduced)
    if not plan.cluster.device.overlaps_communication:  # one core per rank: nothing hides
        return gather, gather + scatter
    slow = plan.stack.comm_compute_slowdown
    first = gather / max(1, layers)  # the first layer's gather, before any compute
    return (first + overlapped(gather, forward, slow),
            first + overlapped(gather + scatter, backward_input + backward_weight, slow))


def grad_sync_exposed(plan: Plan, groups: dict[Axis, comm.Group], works: Sequence[StageShare],
                      makespan: float, finish: Sequence[float]) -> float:
    """Gradient reduction (and the ZeRO-1/2 parameter all-gather) left after the pipeline.

    The reduction of a stage overlaps its last backward and the time until the
    whole pipeline drains (Megatron-LM --overlap-grad-reduce); the parameter
    all-gather overlaps the next step's first forward (--overlap-param-gather).
    A stack that does not overlap them (``Stack.overlap_grad_reduce`` /
    ``overlap_param_gather``) runs them after the pipeline, exposed.
    """
    if plan.zero is ZeroStage.PARAMETERS:
        return 0.0  # ZeRO-3 communicates per microbatch, inside the stage times
    return max(_stage_sync(plan, groups, work, makespan - end)
               for work, end in zip(works, finish, strict=True))


def grad_sync_floor(plan: Plan, groups: dict[Axis, comm.Group],
                    works: Sequence[StageShare]) -> float:
    """What :func:`grad_sync_exposed` charges of the stage with the most parameters
    whatever the pipeline's drain (a bound for the search: any one stage's part bounds
    the maximum over stages): the overlapped reduction still slows its last backward,
    the gather its first forward, and what a stack does not overlap stays exposed."""
    if plan.zero is ZeroStage.PARAMETERS:
        return 0.0
    heaviest = max(works, key=lambda w: w.params + w.expert_params)
    return _stage_sync(plan, groups, heaviest, float("inf"))


def grad_sync_bound(plan: Plan, groups: dict[Axis, comm.Group],
                    works: Sequence[StageShare]) -> float:
    """At most what :func:`grad_sync_exposed` charges the plan whatever its pipeline
    (the bound the search charges a plan of known stage works): the more of
    :func:`grad_sync_floor` and the least any stage's sync exposes with no drain at
    all. The latter holds because the stage ending the step (its finish is the
    makespan) has no drain, and the maximum over stages is at least its part: where a
    reduction outlasts the last backward, what a drain would hide counts here. A run of
    stages sharing one work (equal middle stages) is asked once."""
    if plan.zero is ZeroStage.PARAMETERS:
        return 0.0
    drained = float("inf")
    previous = None
    for w in works:
        if w is not previous:
            previous = w
            drained = min(drained, _stage_sync(plan, groups, w, 0.0))
    return max(grad_sync_floor(plan, groups, works), drained)


def grad_sync_after(plan: Plan, groups: dict[Axis, comm.Group], works: Sequence[StageShare],
                    makespan: float, ends: Sequence[float]) -> float:
    """At most the makespan plus :func:`grad_sync_exposed` of every pipeline of the plan
    whose makespan is at least ``makespan`` and whose stage s ends no earlier than
    ``ends[s]``.

    With T the makespan and f_s >= ends[s] when stage s ends, stage s's drain is
    T - f_s <= T - ends[s], and its part of the sync falls as its drain grows (the
    overlapped reduction max(0, r - d - b) + slow * min(r, b); nothing else in it reads
    the drain): T + sync >= T + part_s(T - ends[s]) = max(T, r + ends[s] - b) + the rest,
    which grows with T, and T >= max(makespan, ends[s]). The most over stages of that
    bounds the sum; of a run of stages sharing one work (equal middle stages) the one
    ending latest bounds the others'."""
    if plan.zero is ZeroStage.PARAMETERS:
        return makespan
    best = makespan
    n, i = len(works), 0
    while i < n:
        w, end = works[i], ends[i]
        i += 1
        while i < n and works[i] is w:
            end = max(end, ends[i])
            i += 1
        t = max(makespan, end)
        best = max(best, t + _stage_sync(plan, groups, w, t - end))
    return best


def grad_sync_after_least(plan: Plan, groups: dict[Axis, comm.Group], params: float,
                          expert_params: float, backward: float, forward: float | None,
                          makespan: float, end: float) -> float:
    """At most the makespan plus :func:`grad_sync_exposed` of every plan of ``plan``'s
    layout, ZeRO stage and stack whose makespan is at least ``makespan`` and one of whose
    stages, holding ``params`` and ``expert_params``, ends no earlier than ``end`` with a
    last backward per chunk of at least ``backward``; ``forward``: that stage's forward per
    chunk where all such plans run it and it is known, else None.

    As :func:`grad_sync_after`, with the backward b unknown but for its floor: the stage's
    overlapped reduction max(0, r - d - b) + slow * min(r, b) at drain d falls as b grows
    to r - d and grows after (slow <= 1, as a stack file must give it), so it is at least
    slow * min(r, max(backward, r - d)); with the makespan T >= ``makespan``, d <= T - end,
    and T plus that grows with T. The gather counts as in :func:`grad_sync_least`."""
    if plan.zero is ZeroStage.PARAMETERS:
        return makespan
    reduce_s, gather_s = _sync_seconds(plan.zero, plan.job.dtype, params, expert_params,
                                       groups[Axis.DP], groups[Axis.EDP], plan.states.main_grads,
                                       groups[Axis.DPR])
    t = max(makespan, end)
    stack = plan.stack
    slow = stack.comm_compute_slowdown
    if not plan.cluster.device.overlaps_communication:
        # nothing overlaps (``_exposed``): max(0, r - d) with d <= T - end, and T plus
        # that grows with T
        return t + max(0.0, reduce_s - (t - end)) + gather_s
    if stack.overlap_grad_reduce:
        reduce_s = slow * min(reduce_s, max(backward, reduce_s - (t - end)))
    if stack.overlap_param_gather:
        gather_s = overlapped(gather_s, forward, slow) if forward is not None else slow * gather_s
    return t + reduce_s + gather_s


def grad_sync_drained_least(plan: Plan, groups: dict[Axis, comm.Group],
                            stages: Sequence[tuple[float, float, float]]) -> float:
    """At most :func:`grad_sync_exposed` of every plan of ``plan``'s layout, ZeRO stage
    and stack whose stage s holds ``stages[s] = (params, expert_params, longest)``, its
    last backward per chunk taking at most ``longest`` seconds.

    The stage ending the step has no drain (its finish is the makespan), and the maximum
    over stages is at least its part (as :func:`grad_sync_bound`). With no drain, its
    overlapped reduction max(0, r - x) + slow * min(r, x) falls as its backward per
    chunk x grows (slow <= 1, as a stack file must give it): it is least at ``longest``.
    Its overlapped gather is at least slow * g whatever the forward
    (:func:`grad_sync_least`). The least over stages of that bounds every such plan."""
    if plan.zero is ZeroStage.PARAMETERS:
        return 0.0
    return min(_exposed(plan, groups, params, expert_params, longest, 0.0, None)
               for params, expert_params, longest in stages)


def grad_sync_least(plan: Plan, groups: dict[Axis, comm.Group], params: float,
                    expert_params: float, backward: float, forward: float | None,
                    most_vpp: int) -> float:
    """At most :func:`grad_sync_floor` of every plan of ``plan``'s layout, ZeRO stage and
    stack whose heaviest stage holds ``params`` and ``expert_params`` with a backward per
    microbatch of at least ``backward``, run at up to ``most_vpp`` chunks; ``forward``:
    their heaviest stage's forward per chunk where all run the same chunks and it is
    known, else None.

    Of that stage's exposed sync (``_stage_sync`` with no drain), the overlapped
    reduction slow * min(r, B/v) grows with B and falls with v: least at ``backward``
    and ``most_vpp``. The overlapped gather max(0, g - x) + slow * min(g, x), x = F/v,
    falls as x grows, to slow * g at x >= g and never below it (slow <= 1, as a stack
    file must give it): with F unknown that is its bound."""
    if plan.zero is ZeroStage.PARAMETERS:
        return 0.0
    # with no drain counted (an infinite one) the reduction exposes slow * min(r, B/v)
    return _exposed(plan, groups, params, expert_params, backward / most_vpp, float("inf"),
                    forward)


@memo(16384)
def _sync_seconds(zero: ZeroStage, dtype: Dtype, params: float, expert_params: float,
                  dp: comm.Group, edp: comm.Group,
                  main_grads: StateDtype = StateDtype.FP32,
                  replicas: comm.Group | None = None) -> tuple[float, float]:
    """(reduction, parameter all-gather) seconds of one stage's gradient sync. Under hybrid
    sharding (``replicas``: the dp / dp_shard copies of the shard) the non-expert gradients
    are reduce-scattered over the shard group and the shard all-reduced over the replicas
    (FSDP2 HSDP; Megatron-Core's distributed optimizer instances)."""
    reduce_s = gather_s = 0.0
    for n, group in ((params, dp), (expert_params, edp)):
        if not n or group.size <= 1:
            continue
        grads = n * grad_bytes(dtype, main_grads)
        if zero is ZeroStage.NONE:
            reduce_s += comm.all_reduce(grads, group, main_grads.value)
        else:
            reduce_s += comm.reduce_scatter(grads, group, main_grads.value)
            gather_s += comm.all_gather(n * BF16_BYTES, group)
    if zero is not ZeroStage.NONE and params and replicas is not None and replicas.size > 1:
        reduce_s += comm.all_reduce(params * grad_bytes(dtype, main_grads) / max(1, dp.size),
                                    replicas, main_grads.value)
    return reduce_s, gather_s


def _stage_sync(plan: Plan, groups: dict[Axis, comm.Group], work: StageShare,
                drain: float) -> float:
    """One stage's exposed reduction and gather, the pipeline draining ``drain`` seconds
    after the stage's last backward."""
    vpp = plan.layout.vpp
    return _exposed(plan, groups, work.params, work.expert_params, work.backward / vpp, drain,
                    work.forward / vpp)


def _exposed(plan: Plan, groups: dict[Axis, comm.Group], params: float, expert_params: float,
             last_b: float, drain: float, forward: float | None) -> float:
    """The exposed reduction and gather of a stage holding ``params`` and
    ``expert_params``: the reduction beside its last backward per chunk, ``last_b``, which
    computes beside it while the ``drain`` seconds after it idle (Megatron-LM
    --overlap-grad-reduce); the gather beside the next step's first forward per chunk,
    ``forward`` (--overlap-param-gather; None: not known, so at least its slowed share). A
    stack that overlaps neither runs them exposed."""
    reduce_s, gather_s = _sync_seconds(plan.zero, plan.job.dtype, params, expert_params,
                                       groups[Axis.DP], groups[Axis.EDP], plan.states.main_grads,
                                       groups[Axis.DPR])
    stack = plan.stack
    slow = stack.comm_compute_slowdown
    if not plan.cluster.device.overlaps_communication:
        # one core per rank (a CPU): the collectives run only where nothing computes, the
        # pipeline's drain after the stage's last backward
        return max(0.0, reduce_s - drain) + gather_s
    if stack.overlap_grad_reduce:
        reduce_s = max(0.0, reduce_s - drain - last_b) + slow * min(reduce_s, last_b)
    if stack.overlap_param_gather:
        gather_s = overlapped(gather_s, forward, slow) if forward is not None else slow * gather_s
    return reduce_s + gather_s


def step_overhead(plan: Plan) -> float:
    """The stack's fixed cost per step outside the layers: optimizer kernel launches, the
    gradient-norm and loss syncs, logging (``Stack.step_overhead_s``)."""
    return plan.stack.step_overhead_s


# Allocator pressure near capacity. PyTorch's caching allocator, when a request finds no
# cached block, frees its cache (synchronizing the device) and retries cudaMalloc
# (torch.cuda.memory_stats "num_alloc_retries"; PyTorch docs "CUDA semantics: memory
# management" warn that frequent retries slow training and suggest expandable_segments).
# How much is not documented: this model charges nothing below PRESSURE_START of the
# device's memory and up to PRESSURE_MAX of the step at 100%, quadratically between (an
# assumption, stated in docs/ACCURACY.md), so a plan at 98% ranks below one at 70%.
PRESSURE_START = 0.90
PRESSURE_MAX = 0.10


def memory_pressure(step_s: float, peak_bytes: float, capacity_bytes: float) -> float:
    """Seconds the allocator's retries add to a step at ``peak_bytes`` of ``capacity_bytes``."""
    used = peak_bytes / capacity_bytes
    if used <= PRESSURE_START:
        return 0.0
    x = min(1.0, (used - PRESSURE_START) / (1.0 - PRESSURE_START))
    return step_s * PRESSURE_MAX * x * x


def optimizer_seconds(plan: Plan, works: Sequence[StageShare]) -> float:
    """The Adam step of the rank with the most optimizer state (memory-bound): the most
    ``optimizer_params`` of any stage (written out here: the search asks it of every
    stage of some 10^4 candidates)."""
    dense, expert = _optimizer_groups(plan)
    most, previous = 0.0, None
    for w in works:
        if w is not previous:  # a run of stages sharing one work (equal middle stages): once
            previous = w
            shard = w.params / dense + w.expert_params / expert
            if shard > most:
                most = shard
    return _adam_seconds(plan, most)


def optimizer_seconds_floor(plan: Plan, works: Sequence[StageShare]) -> float:
    """The least :func:`optimizer_seconds` of any layer split of ``works``: the stages'
    parameters sum to the model's whatever the split, so the fullest holds at least
    their mean."""
    dense, expert = _optimizer_groups(plan)
    total = sum(w.params / dense + w.expert_params / expert for w in works)
    return _adam_seconds(plan, total / len(works))


def _optimizer_groups(plan: Plan) -> tuple[int, int]:
    """The ranks a dense and an expert parameter's optimizer state is sharded over."""
    if plan.zero >= ZeroStage.OPTIMIZER:
        return plan.layout.dp_shard * plan.layout.cp, plan.layout.edp
    return 1, 1


def _adam_seconds(plan: Plan, params: float) -> float:
    return params * optimizer_seconds_per_param(plan)


def optimizer_seconds_per_param(plan: Plan) -> float:
    """The optimizer step's seconds per parameter of a rank's shard: on the GPU, bound by
    HBM (ADAM_BYTES_PER_PARAM); offloaded, the host's (``offload.optimizer_seconds_per_param``)."""
    if plan.offload.optimizer:
        return offload.optimizer_seconds_per_param(plan)
    device = plan.cluster.device
    return adam_bytes_moved(plan.states) / (device.hbm_Bps * device.hbm_efficiency)


def adam_bytes_moved(states: StatePrecision) -> float:
    """Bytes the Adam step reads and writes per parameter (``ADAM_BYTES_PER_PARAM`` with
    fp32 states): the gradient read, the master weight and the two moments read and
    written, the 16-bit weight written; bf16 gradients read 2 bytes fewer, bf16 moments
    read and write 2 x 2 fewer; a master kept as int16 remainders (or not at all) reads
    and writes its 2 bytes (or none) and reads the 16-bit weight it completes (apex 810ffae3
    distributed_fused_adam.py: ``_local_step_with_param_remainders`` L2490-2555,
    multi_tensor_fused_adam_with_param_remainders; ``_local_step`` L2437-2443 reads the
    bf16 weight where no master is kept)."""
    grad = 2.0 if states.main_grads is StateDtype.BF16 else 4.0
    moments = 4.0 if states.optimizer_states is StateDtype.BF16 else 8.0
    master = memory.MASTER_BYTES[states.master_weights]
    weight_read = 0.0 if states.master_weights is MasterWeights.FP32 else 2.0
    return grad + 2 * master + 2 * moments + 2.0 + weight_read
