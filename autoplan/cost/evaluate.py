"""One plan in, one Prediction out: per-stage work, the simulated pipeline,
data-parallel communication, the optimizer step and memory per stage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from autoplan.cost import comm, flops, memory
from autoplan.cost.compute import BF16_BYTES, LayerTimes, Shard, layer_times, logits_times
from autoplan.descriptors.hardware import Device, GiB
from autoplan.descriptors.model import Model
from autoplan.plan import Memory, Plan, Prediction, TimeBreakdown
from autoplan.schedules.simulator import SimResult, simulate, simulate_exact
from autoplan.vocab import Axis, Dtype, Recompute, Schedule, ZeroStage

# Adam step per parameter: read fp32 master, m, v and grad, write master, m, v and
# the 16-bit weight: 4*4 + 3*4 + 2 bytes (memory-bound; ZeRO paper's K=12 states).
ADAM_BYTES_PER_PARAM = 30


@dataclass(frozen=True, slots=True)
class StageWork:
    """Seconds one pipeline stage spends per microbatch (all its chunks), by cause."""

    layers: int
    compute_f: float
    compute_b: float  # input-gradient (B) compute
    compute_w: float  # weight-gradient (W) compute
    recompute: float
    tp_f: float
    tp_b: float  # exposed part of backward TP communication
    cp_f: float  # exposed ring-attention transfers in forward
    cp_b: float  # ... and in backward
    pp_f: float  # blocking send of activations (0 on the last stage)
    pp_b: float  # blocking send of gradients (0 on the first stage)
    zero3_f: float  # exposed ZeRO-3 parameter gather in forward
    zero3_b: float  # exposed ZeRO-3 gather + gradient reduce-scatter in backward
    params: float  # parameters held by one rank of this stage (before ZeRO)

    @property
    def forward(self) -> float:
        return self.compute_f + self.tp_f + self.cp_f + self.pp_f + self.zero3_f

    @property
    def backward_input(self) -> float:
        """B: recompute, input-gradient kernels and the communication they expose."""
        return (self.compute_b + self.recompute + self.tp_b + self.cp_b + self.pp_b
                + self.zero3_b)

    @property
    def backward_weight(self) -> float:
        """W: the weight-gradient GEMMs (zero-bubble schedules run them apart)."""
        return self.compute_w

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight


def shard_of(plan: Plan) -> Shard:
    lay = plan.layout
    return Shard(plan.micro_batch, plan.job.seq_len, lay.tp, lay.cp, plan.sequence_parallel,
                 plan.job.dtype)


@lru_cache(maxsize=16384)
def _layer_times(model: Model, shard: Shard, device: Device) -> LayerTimes:
    return layer_times(model, shard, device)


@lru_cache(maxsize=1024)
def _layer_params_per_rank(model: Model, tp: int) -> float:
    """GEMM weights split by TP; the norms are replicated on every TP rank."""
    return (model.params_attention + model.params_mlp) / tp + 2 * model.params_norm


@lru_cache(maxsize=16384)
def stage_params(model: Model, tp: int, embedding: bool, output: bool, layers: int) -> float:
    """Parameters on one rank of a stage: its layers, plus the vocab-parallel embedding
    where the model starts and the final norm and output layer where it ends. Tied
    embeddings on another stage than the embedding keep their own copy (Megatron-LM)."""
    params = layers * _layer_params_per_rank(model, tp)
    if embedding:
        params += model.vocab * model.hidden / tp + (model.params_embedding - model.vocab * model.hidden)
    if output:
        params += model.params_norm
        if not model.tied_embeddings or not embedding:
            params += model.vocab * model.hidden / tp
    return params


def output_stage(plan: Plan) -> int:
    """The stage holding the output layer and the logits: the last, except for V-shape
    schedules, whose last model chunk comes back to stage 0."""
    return 0 if plan.schedule.v_shape else plan.layout.pp - 1


def _sends(plan: Plan, stage: int) -> tuple[int, int]:
    """Activation sends (forward) and gradient sends (backward) of one stage per microbatch.

    Every chunk hands its output on, except the model's last chunk (forward) and first
    chunk (backward); interleaved chunks wrap between the end stages; in a V the turning
    stage passes chunk 0 to its own chunk 1 without a send."""
    p, v = plan.layout.pp, plan.layout.vpp
    if p == 1:
        return 0, 0
    if plan.schedule.v_shape:
        both = (stage < p - 1) + (stage > 0)
        return both, both
    return (v - 1 if stage == p - 1 else v), (v - 1 if stage == 0 else v)


def _groups(plan: Plan) -> dict[Axis, comm.Group]:
    """Communicators by axis, placed in the rank order of ``Axis`` (TP innermost)."""
    lay, c = plan.layout, plan.cluster
    return {
        Axis.TP: comm.place_group(c, lay.tp, 1),
        Axis.CP: comm.place_group(c, lay.cp, lay.tp),
        # gradients are reduced (and ZeRO shards) over dp x cp (Megatron-LM)
        Axis.DP: comm.place_group(c, lay.dp * lay.cp, lay.tp),
    }


def _pp_cross_domain(plan: Plan) -> bool:
    lay = plan.layout
    return lay.tp * lay.cp * lay.dp >= min(plan.cluster.nvlink_domain, plan.cluster.gpus)


def _cost_key(plan: Plan) -> Plan:
    """The plan as far as per-stage work depends on it. The schedule enters only through
    whether it splits the backward; ZeRO 0-2 differ only in memory (their collectives run
    after the pipeline); the layer split is applied per stage."""
    schedule = (Schedule.ZB_V if plan.schedule.v_shape
                else Schedule.ZB_H1 if plan.schedule.splits_backward else Schedule.ONE_F_ONE_B)
    return dataclasses.replace(
        plan, schedule=schedule,
        zero=plan.zero if plan.zero is ZeroStage.PARAMETERS else ZeroStage.NONE, stages=None)


def stage_work(plan: Plan) -> tuple[StageWork, ...]:
    """Per-stage work of a plan, one entry per pipeline stage."""
    return _stage_works(_cost_key(plan), plan.stage_layers)


@lru_cache(maxsize=16384)
def _stage_works(key: Plan, stage_layers: tuple[int, ...]) -> tuple[StageWork, ...]:
    out = output_stage(key)
    return tuple(_stage(key, s == 0, s == out, layers, *_sends(key, s))
                 for s, layers in enumerate(stage_layers))


def stage_work_for(plan: Plan, stage: int, layers: int) -> StageWork:
    """Work of ``stage`` if it held ``layers`` layers (the partitioner asks this)."""
    key = _cost_key(plan)
    return _stage(key, stage == 0, stage == output_stage(key), layers, *_sends(key, stage))


@dataclass(frozen=True, slots=True)
class _Shared:
    """Per-plan quantities every stage uses."""

    lt: LayerTimes
    groups: dict[Axis, comm.Group]
    act_bytes: float
    tp_layer: float
    cp_ring: float
    pp_send: float


@lru_cache(maxsize=8192)
def _shared(plan: Plan) -> _Shared:
    model, lay, device = plan.model, plan.layout, plan.cluster.device
    shard = shard_of(plan)
    lt = _layer_times(model, shard, device)
    groups = _groups(plan)
    act_bytes = BF16_BYTES * shard.tokens * model.hidden  # one layer's output, unsplit by TP
    # Megatron-LM: 2 all-reduces per layer forward and 2 backward (Shoeybi et al. 2019, Fig. 4);
    # with SP each becomes an all-gather + reduce-scatter of the same total time.
    tp_layer = 2 * comm.all_reduce(act_bytes, groups[Axis.TP])
    # ring attention (Liu et al. 2023): cp - 1 steps, each passing this rank's K and V chunk
    kv_chunk = 2 * BF16_BYTES * shard.tokens * model.kv_dim / lay.tp
    cp_ring = (lay.cp - 1) * comm.p2p(kv_chunk, groups[Axis.CP].domains > 1, plan.cluster)
    # pipeline p2p: Megatron's scatter-gather sends 1/t of the activation with SP
    pp_bytes = act_bytes / (lay.tp if plan.sequence_parallel else 1)
    pp_send = comm.p2p(pp_bytes, _pp_cross_domain(plan), plan.cluster) if lay.pp > 1 else 0.0
    return _Shared(lt, groups, act_bytes, tp_layer, cp_ring, pp_send)


@lru_cache(maxsize=65536)
def _stage(plan: Plan, first: bool, last: bool, layers: int, sends_f: int,
           sends_b: int) -> StageWork:
    """One stage: ``first`` holds the embedding, ``last`` the output layer and logits."""
    model, lay, device = plan.model, plan.layout, plan.cluster.device
    shard = shard_of(plan)
    shared = _shared(plan)
    lt, groups, act_bytes, tp_layer = shared.lt, shared.groups, shared.act_bytes, shared.tp_layer
    cp_ring, pp_send = shared.cp_ring, shared.pp_send
    compute_f = layers * lt.forward
    compute_b, compute_w = layers * lt.backward_input, layers * lt.backward_weight
    tp_f = layers * tp_layer
    tp_b_total = layers * tp_layer
    if first:  # vocab-parallel embedding output is all-reduced (reduce-scattered with SP)
        tp_f += comm.all_reduce(act_bytes, groups[Axis.TP])
    if last:
        lf, lb, lw = logits_times(model, shard, device)
        compute_f, compute_b, compute_w = compute_f + lf, compute_b + lb, compute_w + lw
        tp_f += comm.all_reduce(act_bytes, groups[Axis.TP])
        tp_b_total += comm.all_reduce(act_bytes, groups[Axis.TP])
    # backward TP collectives overlap the weight-gradient GEMMs (Megatron-LM's
    # LinearWithGradAccumulationAndAsyncCommunication); a schedule that defers W to
    # fill bubbles leaves nothing to hide them behind
    overlap = 0.0 if plan.schedule.splits_backward else compute_w
    tp_b = max(0.0, tp_b_total - overlap)
    recompute = 0.0
    if plan.recompute is Recompute.FULL:
        recompute = layers * lt.forward
        tp_b += layers * tp_layer  # the recomputed forward repeats its collectives
    elif plan.recompute is Recompute.SELECTIVE:
        recompute = layers * lt.attention_forward
    # exposed = max(0, comm - attention compute); backward passes K, V and their grads
    cp_f = layers * max(0.0, cp_ring - lt.attention_forward)
    cp_b = layers * max(0.0, 2 * cp_ring - lt.attention_backward)
    params = stage_params(model, lay.tp, first, last, layers)
    zero3_f = zero3_b = 0.0
    if plan.zero is ZeroStage.PARAMETERS and groups[Axis.DP].size > 1:
        gather = comm.all_gather(params * BF16_BYTES, groups[Axis.DP])
        scatter = comm.reduce_scatter(params * _grad_bytes(plan.job.dtype), groups[Axis.DP])
        zero3_f = max(0.0, gather - compute_f)
        zero3_b = max(0.0, gather + scatter - compute_b - compute_w)
    return StageWork(
        layers=layers, compute_f=compute_f, compute_b=compute_b, compute_w=compute_w,
        recompute=recompute, tp_f=tp_f, tp_b=tp_b, cp_f=cp_f, cp_b=cp_b,
        pp_f=sends_f * pp_send, pp_b=sends_b * pp_send,
        zero3_f=zero3_f, zero3_b=zero3_b, params=params,
    )


def _grad_bytes(dtype: Dtype) -> float:
    """Bytes per gradient element reduced: Megatron-LM reduces bf16 grads in fp32."""
    return memory.bytes_per_param(dtype).grads


def static_memory(plan: Plan, work: StageWork) -> memory.BytesPerParam:
    """Weights, gradients and optimizer states of one rank of the stage."""
    return memory.sharded_state_bytes(work.params, plan.job.dtype, plan.zero,
                                      plan.layout.dp * plan.layout.cp)


@dataclass(frozen=True, slots=True)
class _ActivationTerms:
    per_layer: float  # one layer, one microbatch
    working: float  # held once per stage (full recompute's one rebuilt layer)
    embedding: float  # first stage, per microbatch held
    logits: float  # last stage, per microbatch held


@lru_cache(maxsize=16384)
def _activation_terms(model: Model, shard: Shard, recompute: Recompute) -> _ActivationTerms:
    working = 0.0
    if recompute is Recompute.FULL:
        working = memory.full_recompute_working_bytes(model, shard)
    return _ActivationTerms(
        per_layer=memory.layer_activation_bytes(model, shard, recompute),
        working=working,
        embedding=memory.embedding_output_bytes(model, shard),
        logits=memory.logits_bytes(model, shard),
    )


def stage_memory(plan: Plan, stage: int, work: StageWork, inflight_chunks: int) -> Memory:
    """Bytes on one GPU of ``stage`` holding ``inflight_chunks`` microbatch-chunks."""
    lay = plan.layout
    terms = _activation_terms(plan.model, shard_of(plan), plan.recompute)
    states = static_memory(plan, work)
    activations = inflight_chunks * (work.layers / lay.vpp) * terms.per_layer + terms.working
    microbatches_held = -(-inflight_chunks // lay.vpp)
    if stage == 0:
        activations += microbatches_held * terms.embedding
    if stage == output_stage(plan):
        activations += microbatches_held * terms.logits
    other = plan.cluster.device.reserve_bytes
    if plan.zero is ZeroStage.PARAMETERS:
        # FSDP/ZeRO-3 hold the gathered current layer and prefetch the next one
        other += 2 * BF16_BYTES * _layer_params_per_rank(plan.model, lay.tp)
    return Memory(weights=states.weights, grads=states.grads, optimizer=states.optimizer,
                  activations=activations, other=other)


def _dp_exposed(plan: Plan, works: tuple[StageWork, ...], makespan: float,
                finish: tuple[float, ...]) -> float:
    """Gradient reduction (and the ZeRO-1/2 parameter all-gather) left after the pipeline.

    The reduction of a stage overlaps its last backward and the time until the
    whole pipeline drains (Megatron-LM --overlap-grad-reduce); the parameter
    all-gather overlaps the next step's first forward (--overlap-param-gather).
    """
    if plan.zero is ZeroStage.PARAMETERS:
        return 0.0  # ZeRO-3 communicates per microbatch, inside the stage times
    group = _groups(plan)[Axis.DP]
    if group.size <= 1:
        return 0.0
    exposed = 0.0
    for work, end in zip(works, finish, strict=True):
        grads = work.params * _grad_bytes(plan.job.dtype)
        if plan.zero is ZeroStage.NONE:
            reduce_s, gather_s = comm.all_reduce(grads, group), 0.0
        else:
            reduce_s = comm.reduce_scatter(grads, group)
            gather_s = comm.all_gather(work.params * BF16_BYTES, group)
        window = makespan - end + work.backward / plan.layout.vpp
        exposed = max(exposed, max(0.0, reduce_s - window)
                      + max(0.0, gather_s - work.forward / plan.layout.vpp))
    return exposed


def optimizer_time(plan: Plan, works: tuple[StageWork, ...]) -> float:
    device = plan.cluster.device
    shard_group = plan.layout.dp * plan.layout.cp if plan.zero >= ZeroStage.OPTIMIZER else 1
    largest = max(w.params for w in works) / shard_group
    return largest * ADAM_BYTES_PER_PARAM / (device.hbm_Bps * device.hbm_efficiency)


def step_time_lower_bound(plan: Plan, works: tuple[StageWork, ...]) -> float:
    """A bound no schedule beats: stage s cannot start before the first microbatch's
    forward crosses the stages before it, must run m forwards and backwards, and its
    last backward must still cross those stages back; then the optimizer step.
    Exact for 1F1B and GPipe with uniform stages ((m + p - 1)(f + b))."""
    m, v = plan.num_microbatches, plan.layout.vpp
    best, fill, drain = 0.0, 0.0, 0.0
    for w in works:
        best = max(best, fill + m * (w.forward + w.backward) + drain)
        fill += w.forward / v
        drain += w.backward / v
    return best + optimizer_time(plan, works)


def model_flops(plan: Plan) -> float:
    return flops.model_flops_per_step(plan.model, plan.job.tokens_per_step, plan.job.seq_len)


def hardware_flops(plan: Plan) -> float:
    extra = 0.0
    if plan.recompute is not Recompute.NONE:
        extra = plan.job.tokens_per_step * flops.recompute_flops_per_token(
            plan.model, plan.job.seq_len, full=plan.recompute is Recompute.FULL)
    return model_flops(plan) + extra


def _chunk_durations(works: tuple[StageWork, ...], v: int
                     ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Per-stage F, B and W seconds of one model chunk (a stage's work split over vpp)."""
    return (tuple(w.forward / v for w in works), tuple(w.backward_input / v for w in works),
            tuple(w.backward_weight / v for w in works))


def evaluate(plan: Plan) -> Prediction:
    """Predict step time and memory of a valid plan (see ``plan.plan_problems``)."""
    works = stage_work(plan)  # memoized: the search computed it for the bound
    lay, m = plan.layout, plan.num_microbatches
    v = lay.vpp
    sim = simulate(plan.schedule, *_chunk_durations(works, v), m, v)
    dp_exposed = _dp_exposed(plan, works, sim.makespan, sim.finish)
    optimizer = optimizer_time(plan, works)
    step = sim.makespan + dp_exposed + optimizer

    per_stage = tuple(stage_memory(plan, s, w, sim.peak_inflight[s]) for s, w in enumerate(works))
    worst = max(range(lay.pp), key=lambda s: (per_stage[s].peak, -s))
    capacity = plan.cluster.device.mem_bytes
    feasible = per_stage[worst].peak <= capacity
    reason = "" if feasible else memory_shortfall(plan, worst, per_stage[worst], capacity)

    crit = max(range(lay.pp), key=lambda s: (sim.busy[s], -s))
    w = works[crit]
    breakdown = TimeBreakdown(
        compute=m * (w.compute_f + w.compute_b + w.compute_w),
        recompute=m * w.recompute,
        tp_comm=m * (w.tp_f + w.tp_b),
        cp_comm=m * (w.cp_f + w.cp_b),
        pp_comm=m * (w.pp_f + w.pp_b),
        dp_comm=dp_exposed + m * (w.zero3_f + w.zero3_b),
        # idle time of the critical stage; exactly 0 without a pipeline (no float residue)
        bubble=max(0.0, sim.makespan - sim.busy[crit]) if lay.pp > 1 else 0.0,
        optimizer=optimizer,
    )
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
    )


def memory_shortfall(plan: Plan, stage: int, mem: Memory, capacity: float) -> str:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in mem.to_gib_dict().items() if k != "peak")
    where = f"stage {stage} " if plan.layout.pp > 1 else ""
    return (f"{where}needs {mem.peak / GiB:.1f} GiB per GPU on {plan.cluster.device.name} "
            f"({capacity / GiB:.0f} GiB): {parts}")



def simulate_timeline(plan: Plan, microbatches: int | None = None) -> SimResult:
    """The plan's pipeline step, every operation traced (for ``autoplan explain``).

    ``microbatches`` simulates fewer microbatches than the plan runs, to draw a
    readable picture of the same schedule; None simulates all of them."""
    works = stage_work(plan)
    m = plan.num_microbatches if microbatches is None else microbatches
    v = plan.layout.vpp
    return simulate_exact(plan.schedule, *_chunk_durations(works, v), m, v, trace=True)
