"""One plan in, one Prediction out: per-stage work, the simulated pipeline,
data-parallel communication, the optimizer step and memory per stage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from autoplan.cost import comm, flops, memory
from autoplan.cost.compute import BF16_BYTES, LayerTimes, Shard, layer_times, logits_times
from autoplan.descriptors.hardware import Cluster, Device
from autoplan.descriptors.model import Model
from autoplan.plan import Layout, Memory, Plan, Prediction, TimeBreakdown
from autoplan.schedules.simulator import SimResult, simulate, simulate_exact
from autoplan.units import GiB
from autoplan.vocab import Axis, CpComm, Dtype, Recompute, Schedule, ZeroStage

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
    params: float  # non-expert parameters held by one rank of this stage (before ZeRO)
    ep_f: float = 0.0  # MoE all-to-all dispatch and combine (+ expert-TP gathers), forward
    ep_b: float = 0.0  # ... and backward
    expert_params: float = 0.0  # routed-expert parameters on one rank (before ZeRO)
    dense: int = 0  # of ``layers``, those with a dense MLP (the rest are MoE layers)
    mtp: int = 0  # multi-token-prediction layers held here (the output stage)

    @property
    def forward(self) -> float:
        return self.compute_f + self.tp_f + self.cp_f + self.ep_f + self.pp_f + self.zero3_f

    @property
    def backward_input(self) -> float:
        """B: recompute, input-gradient kernels and the communication they expose."""
        return (self.compute_b + self.recompute + self.tp_b + self.cp_b + self.ep_b + self.pp_b
                + self.zero3_b)

    @property
    def backward_weight(self) -> float:
        """W: the weight-gradient GEMMs (zero-bubble schedules run them apart)."""
        return self.compute_w

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight


def expert_load(plan: Plan) -> float:
    """Tokens of the busiest expert rank over the mean: the capacity factor where routing
    drops (and pads to) capacity, else the job's imbalance for dropless routing."""
    return plan.model.capacity_factor or plan.job.moe_imbalance


def shard_of(plan: Plan) -> Shard:
    lay = plan.layout
    moe = plan.model.is_moe
    return Shard(plan.micro_batch, plan.job.seq_len, lay.tp, lay.cp, plan.sequence_parallel,
                 plan.job.dtype, ep=lay.ep if moe else 1, etp=lay.etp if moe else 1,
                 expert_load=expert_load(plan) if moe else 1.0,
                 cp_ring=plan.cp_comm is CpComm.RING)


@lru_cache(maxsize=16384)
def _layer_times(model: Model, shard: Shard, device: Device, moe: bool = False) -> LayerTimes:
    return layer_times(model, shard, device, moe)


@lru_cache(maxsize=1024)
def _layer_params_per_rank(model: Model, tp: int, moe: bool = False) -> float:
    """Non-expert weights of one layer on one rank: GEMMs split by TP (MLA's down
    projections and latent norms are replicated), norms replicated; an MoE layer's
    router and shared experts in place of the dense MLP."""
    attn = model.params_attention
    replicated = 2 * model.params_norm
    if model.is_mla:
        down = model.hidden * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
        norms = model.q_lora_rank + model.kv_lora_rank
        attn -= down + norms
        replicated += down + norms
    if not moe:
        return (attn + model.params_mlp) / tp + replicated
    return (attn + model.params_shared_experts) / tp + replicated + model.params_router


def _expert_params_per_rank(model: Model, ep: int, etp: int) -> float:
    """One MoE layer's routed experts on one rank: experts/ep of them, split by etp."""
    return model.experts // ep * model.params_expert / etp


def _mtp_params_per_rank(model: Model, tp: int) -> float:
    """One MTP module without its transformer layer: three norms and the 2h -> h
    projection (TP-split); embedding and output head are the model's own."""
    return 3 * model.params_norm + 2 * model.hidden * model.hidden / tp


@lru_cache(maxsize=16384)
def stage_params(model: Model, tp: int, embedding: bool, output: bool, layers: int,
                 dense: int | None = None, mtp: int = 0) -> float:
    """Non-expert parameters on one rank of a stage: its layers (``dense`` of them with a
    dense MLP; None: all of a dense model), plus the vocab-parallel embedding where the
    model starts and the final norm and output layer where it ends. Tied embeddings on
    another stage than the embedding keep their own copy (Megatron-LM)."""
    dense = layers if dense is None else dense
    params = dense * _layer_params_per_rank(model, tp)
    params += (layers - dense + (mtp if model.is_moe else 0)) * _layer_params_per_rank(model, tp, True)
    if mtp:
        params += mtp * _mtp_params_per_rank(model, tp)
        params += 0 if model.is_moe else mtp * _layer_params_per_rank(model, tp)
    if embedding:
        params += model.vocab * model.hidden / tp + (model.params_embedding - model.vocab * model.hidden)
    if output:
        params += model.params_norm
        if not model.tied_embeddings or not embedding:
            params += model.vocab * model.hidden / tp
    return params


def stage_state_params(model: Model, lay: Layout, first: bool, last: bool, layers: int,
                       dense: int) -> tuple[float, float]:
    """(non-expert, routed-expert) parameters on one rank of a stage holding ``layers``
    layers, ``dense`` of them with a dense MLP, and the MTP modules if it is the output
    stage (``last``). Experts: experts/ep per MoE layer, each split by etp."""
    mtp = model.mtp_layers if last else 0
    params = stage_params(model, lay.tp, first, last, layers, dense, mtp)
    if not model.is_moe:
        return params, 0.0
    moe = layers - dense + mtp
    return params, moe * _expert_params_per_rank(model, lay.ep, lay.etp)


def stage_dense_layers(plan: Plan) -> tuple[int, ...]:
    """Of each stage's layers, those with a dense MLP (the first ``dense_layers`` of the
    model). Interleaved and V-shape stages hold several chunks: chunk c of stage s is
    virtual stage c*p + s (Narayanan et al. 2021), or 2p - 1 - s for a V's second."""
    model = plan.model
    if not model.is_moe:
        return plan.stage_layers
    return _dense_per_stage(model.layers, model.layers - model.moe_layers, plan.stage_layers,
                            plan.layout.vpp, plan.schedule.v_shape)


@lru_cache(maxsize=4096)
def _dense_per_stage(n_layers: int, k: int, layers: tuple[int, ...], v: int,
                     v_shape: bool) -> tuple[int, ...]:
    p = len(layers)
    if k == 0:
        return (0,) * p
    if v == 1:
        starts = [sum(layers[:s]) for s in range(p)]
        return tuple(max(0, min(k - a, n)) for a, n in zip(starts, layers, strict=True))
    n = n_layers // (p * v)  # layers per chunk (pp*vpp divides layers)

    def dense_in(virtual: int) -> int:
        return max(0, min(k - virtual * n, n))

    out = []
    for s in range(p):
        chunks = (s, 2 * p - 1 - s) if v_shape else tuple(c * p + s for c in range(v))
        out.append(sum(dense_in(c) for c in chunks))
    return tuple(out)


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
    """Communicators by axis, placed in the rank order of ``Axis`` (TP innermost); the
    expert axes by Megatron-Core's expert rank order etp-ep-edp over the same ranks."""
    return _groups_of(plan.cluster, plan.layout)


@lru_cache(maxsize=4096)
def _groups_of(c: Cluster, lay: Layout) -> dict[Axis, comm.Group]:
    return {
        Axis.TP: comm.place_group(c, lay.tp, 1),
        Axis.CP: comm.place_group(c, lay.cp, lay.tp),
        # gradients are reduced (and ZeRO shards) over dp x cp (Megatron-LM)
        Axis.DP: comm.place_group(c, lay.dp * lay.cp, lay.tp),
        Axis.ETP: comm.place_group(c, lay.etp, 1),
        Axis.EP: comm.place_group(c, lay.ep, lay.etp),
        Axis.EDP: comm.place_group(c, lay.edp, lay.etp * lay.ep),
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
    return _stage_works(_cost_key(plan), plan.stage_layers, stage_dense_layers(plan))


@lru_cache(maxsize=16384)
def _stage_works(key: Plan, stage_layers: tuple[int, ...],
                 dense: tuple[int, ...]) -> tuple[StageWork, ...]:
    out = output_stage(key)
    return tuple(_stage(key, s == 0, s == out, layers, dense[s], *_sends(key, s))
                 for s, layers in enumerate(stage_layers))


def stage_work_for(plan: Plan, stage: int, layers: int, dense: int | None = None) -> StageWork:
    """Work of ``stage`` if it held ``layers`` layers, ``dense`` of them with a dense MLP
    (None: as many as the model's layer kinds allow, all for a dense model, none for a
    mixture of experts). The partitioner asks this."""
    key = _cost_key(plan)
    if dense is None:
        dense = layers if not plan.model.is_moe else 0
    return _stage(key, stage == 0, stage == output_stage(key), layers, dense, *_sends(key, stage))


@dataclass(frozen=True, slots=True)
class _Shared:
    """Per-plan quantities every stage uses."""

    lt: LayerTimes  # a dense layer
    lt_moe: LayerTimes  # an MoE layer (the dense one's for a dense model)
    groups: dict[Axis, comm.Group]
    act_bytes: float
    tp_layer: float
    cp_f: float  # exposed context-parallel communication per layer, forward
    cp_b: float  # ... backward
    ep_layer: float  # MoE token dispatch and combine per MoE layer, one direction
    pp_send: float


@lru_cache(maxsize=8192)
def _shared(plan: Plan) -> _Shared:
    model, lay, device = plan.model, plan.layout, plan.cluster.device
    shard = shard_of(plan)
    lt = _layer_times(model, shard, device)
    lt_moe = _layer_times(model, shard, device, True) if model.is_moe else lt
    groups = _groups(plan)
    act_bytes = BF16_BYTES * shard.tokens * model.hidden  # one layer's output, unsplit by TP
    # Megatron-LM: 2 all-reduces per layer forward and 2 backward (Shoeybi et al. 2019, Fig. 4);
    # with SP each becomes an all-gather + reduce-scatter of the same total time.
    tp_layer = 2 * comm.all_reduce(act_bytes, groups[Axis.TP])
    cp_f, cp_b = _cp_exposed(plan, shard, lt, groups[Axis.CP])
    ep_layer = _ep_layer(plan, shard, groups) if model.is_moe else 0.0
    # pipeline p2p: Megatron's scatter-gather sends 1/t of the activation with SP
    pp_bytes = act_bytes / (lay.tp if plan.sequence_parallel else 1)
    pp_send = comm.p2p(pp_bytes, _pp_cross_domain(plan), plan.cluster) if lay.pp > 1 else 0.0
    return _Shared(lt, lt_moe, groups, act_bytes, tp_layer, cp_f, cp_b, ep_layer, pp_send)


def _cp_exposed(plan: Plan, shard: Shard, lt: LayerTimes, group: comm.Group
                ) -> tuple[float, float]:
    """Exposed context-parallel communication of one layer, (forward, backward).

    Ring (Liu et al. 2023; Megatron-LM/Transformer Engine p2p with causal load balancing,
    so every step carries equal work): cp - 1 steps, each passing this rank's K and V
    chunk to the next rank while attention runs on the chunk in hand, so a step costs
    max(0, transfer - attention/cp) beyond compute; backward passes K, V and their grads.
    All-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023, Sec. 3.1): Q, K, V are exchanged
    before attention and the output after it, forward and (as their grads) backward,
    with nothing to hide behind."""
    model, lay = plan.model, plan.layout
    if lay.cp == 1:
        return 0.0, 0.0
    q, k, v, out = model.attn_widths
    tokens = shard.tokens
    if plan.cp_comm is CpComm.A2A:
        qkv = comm.all_to_all(BF16_BYTES * tokens * (q + k + v) / lay.tp, group)
        after = comm.all_to_all(BF16_BYTES * tokens * out / lay.tp, group)
        return qkv + after, qkv + after
    kv_chunk = BF16_BYTES * tokens * (k + v) / lay.tp
    step = comm.p2p(kv_chunk, group.domains > 1, plan.cluster)
    steps = lay.cp - 1
    return (steps * max(0.0, step - lt.attention_forward / lay.cp),
            steps * max(0.0, 2 * step - lt.attention_backward / lay.cp))


def _ep_layer(plan: Plan, shard: Shard, groups: dict[Axis, comm.Group]) -> float:
    """One direction's MoE communication of one layer: the all-to-all dispatching each
    routed token copy to its expert's rank and the one combining the outputs back
    (Lepikhin et al. 2021, GShard; Megatron-Core MoEAlltoAllTokenDispatcher), on the
    busiest rank's volume; with expert TP the dispatched tokens are all-gathered over
    etp ranks before the experts and reduce-scattered after."""
    model = plan.model
    routed = BF16_BYTES * shard.routed_tokens(model) * model.hidden
    out = 2 * comm.all_to_all(routed, groups[Axis.EP])
    if plan.layout.etp > 1:
        gathered = routed * plan.layout.etp
        out += comm.all_gather(gathered, groups[Axis.ETP]) + comm.reduce_scatter(
            gathered, groups[Axis.ETP])
    return out


@lru_cache(maxsize=65536)
def _stage(plan: Plan, first: bool, last: bool, layers: int, dense: int, sends_f: int,
           sends_b: int) -> StageWork:
    """One stage: ``first`` holds the embedding, ``last`` the output layer and logits;
    ``dense`` of its ``layers`` have a dense MLP, the others experts."""
    model, lay, device = plan.model, plan.layout, plan.cluster.device
    shard = shard_of(plan)
    shared = _shared(plan)
    lt, lt_moe, groups, act_bytes = shared.lt, shared.lt_moe, shared.groups, shared.act_bytes
    tp_layer, pp_send = shared.tp_layer, shared.pp_send
    mtp = model.mtp_layers if last else 0
    # layers run, by kind: the MTP modules repeat the model's last layer kind
    moe_n = layers - dense + (mtp if model.is_moe else 0)
    dense_n = dense + (0 if model.is_moe else mtp)
    n = dense_n + moe_n
    compute_f = dense_n * lt.forward + moe_n * lt_moe.forward
    compute_b = dense_n * lt.backward_input + moe_n * lt_moe.backward_input
    compute_w = dense_n * lt.backward_weight + moe_n * lt_moe.backward_weight
    tp_f = n * tp_layer
    tp_b_total = n * tp_layer
    if first:  # vocab-parallel embedding output is all-reduced (reduce-scattered with SP)
        tp_f += comm.all_reduce(act_bytes, groups[Axis.TP])
    if last:
        lf, lb, lw = logits_times(model, shard, device)
        heads = 1 + mtp  # each MTP depth predicts one more token through the shared head
        compute_f += heads * lf
        compute_b += heads * lb
        compute_w += heads * lw
        tp_f += heads * comm.all_reduce(act_bytes, groups[Axis.TP])
        tp_b_total += heads * comm.all_reduce(act_bytes, groups[Axis.TP])
    # backward TP collectives overlap the weight-gradient GEMMs (Megatron-LM's
    # LinearWithGradAccumulationAndAsyncCommunication); a schedule that defers W to
    # fill bubbles leaves nothing to hide them behind
    overlap = 0.0 if plan.schedule.splits_backward else compute_w
    tp_b = max(0.0, tp_b_total - overlap)
    ep_f = ep_b = moe_n * shared.ep_layer  # not overlapped (Megatron-LM's default)
    cp_f, cp_b = n * shared.cp_f, n * shared.cp_b
    recompute = 0.0
    if plan.recompute is Recompute.FULL:
        recompute = dense_n * lt.forward + moe_n * lt_moe.forward
        tp_b += n * tp_layer  # the recomputed forward repeats its collectives
        ep_b += ep_f
        cp_b += cp_f
    elif plan.recompute is Recompute.SELECTIVE:
        recompute = dense_n * lt.attention_forward + moe_n * lt_moe.attention_forward
    params, expert_params = stage_state_params(model, lay, first, last, layers, dense)
    zero3_f = zero3_b = 0.0
    if plan.zero is ZeroStage.PARAMETERS and groups[Axis.DP].size > 1:
        gather = comm.all_gather(params * BF16_BYTES, groups[Axis.DP])
        scatter = comm.reduce_scatter(params * _grad_bytes(plan.job.dtype), groups[Axis.DP])
        if expert_params:
            gather += comm.all_gather(expert_params * BF16_BYTES, groups[Axis.EDP])
            scatter += comm.reduce_scatter(expert_params * _grad_bytes(plan.job.dtype),
                                           groups[Axis.EDP])
        zero3_f = max(0.0, gather - compute_f)
        zero3_b = max(0.0, gather + scatter - compute_b - compute_w)
    return StageWork(
        layers=layers, compute_f=compute_f, compute_b=compute_b, compute_w=compute_w,
        recompute=recompute, tp_f=tp_f, tp_b=tp_b, cp_f=cp_f, cp_b=cp_b,
        pp_f=sends_f * pp_send, pp_b=sends_b * pp_send,
        zero3_f=zero3_f, zero3_b=zero3_b, params=params, ep_f=ep_f, ep_b=ep_b,
        expert_params=expert_params, dense=dense, mtp=mtp,
    )


def _grad_bytes(dtype: Dtype) -> float:
    """Bytes per gradient element reduced: Megatron-LM reduces bf16 grads in fp32."""
    return memory.bytes_per_param(dtype).grads


def state_bytes(plan: Plan, params: float, expert_params: float) -> memory.BytesPerParam:
    """Weights, gradients and optimizer states of one rank: ZeRO shards the non-expert
    states over dp x cp and the experts' over the expert-data-parallel group (Megatron-Core
    distributed optimizer)."""
    lay = plan.layout
    dense = memory.sharded_state_bytes(params, plan.job.dtype, plan.zero, lay.dp * lay.cp)
    if not expert_params:
        return dense
    experts = memory.sharded_state_bytes(expert_params, plan.job.dtype, plan.zero, lay.edp)
    return memory.BytesPerParam(weights=dense.weights + experts.weights,
                                grads=dense.grads + experts.grads,
                                optimizer=dense.optimizer + experts.optimizer)


def static_memory(plan: Plan, work: StageWork) -> memory.BytesPerParam:
    """Weights, gradients and optimizer states of one rank of the stage."""
    return state_bytes(plan, work.params, work.expert_params)


@dataclass(frozen=True, slots=True)
class _ActivationTerms:
    per_layer: float  # one dense layer, one microbatch
    per_moe_layer: float  # one MoE layer, one microbatch
    working: float  # held once per stage (full recompute's one rebuilt layer)
    embedding: float  # first stage, per microbatch held
    logits: float  # last stage, per microbatch held


@lru_cache(maxsize=16384)
def _activation_terms(model: Model, shard: Shard, recompute: Recompute) -> _ActivationTerms:
    working = 0.0
    if recompute is Recompute.FULL:
        working = memory.full_recompute_working_bytes(model, shard, moe=model.is_moe)
        if model.layers > model.moe_layers:
            working = max(working, memory.full_recompute_working_bytes(model, shard))
    per_layer = memory.layer_activation_bytes(model, shard, recompute)
    return _ActivationTerms(
        per_layer=per_layer,
        per_moe_layer=(memory.layer_activation_bytes(model, shard, recompute, moe=True)
                       if model.is_moe else per_layer),
        working=working,
        embedding=memory.embedding_output_bytes(model, shard),
        logits=memory.logits_bytes(model, shard),
    )


def stage_memory(plan: Plan, stage: int, work: StageWork, inflight_chunks: int) -> Memory:
    """Bytes on one GPU of ``stage`` holding ``inflight_chunks`` microbatch-chunks."""
    lay = plan.layout
    terms = _activation_terms(plan.model, shard_of(plan), plan.recompute)
    states = static_memory(plan, work)
    # a stage's chunks hold equal layer counts; the dense layers are averaged over them
    per_chunk = (work.dense * terms.per_layer
                 + (work.layers - work.dense) * terms.per_moe_layer) / lay.vpp
    activations = inflight_chunks * per_chunk + terms.working
    microbatches_held = -(-inflight_chunks // lay.vpp)
    if stage == 0:
        activations += microbatches_held * terms.embedding
    if stage == output_stage(plan):
        # the MTP modules run at the end of the last chunk: one layer and logits each
        mtp_layer = terms.per_moe_layer if plan.model.is_moe else terms.per_layer
        activations += microbatches_held * (
            terms.logits + work.mtp * (mtp_layer + terms.logits + terms.embedding))
    other = plan.cluster.device.reserve_bytes
    if plan.zero is ZeroStage.PARAMETERS:
        # FSDP/ZeRO-3 hold the gathered current layer and prefetch the next one
        model = plan.model
        largest = _layer_params_per_rank(model, lay.tp)
        if model.is_moe:
            largest = max(largest, _layer_params_per_rank(model, lay.tp, True)
                          + _expert_params_per_rank(model, lay.ep, lay.etp))
        other += 2 * BF16_BYTES * largest
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
    groups = _groups(plan)
    exposed = 0.0
    for work, end in zip(works, finish, strict=True):
        reduce_s = gather_s = 0.0
        for params, group in ((work.params, groups[Axis.DP]),
                              (work.expert_params, groups[Axis.EDP])):
            if not params or group.size <= 1:
                continue
            grads = params * _grad_bytes(plan.job.dtype)
            if plan.zero is ZeroStage.NONE:
                reduce_s += comm.all_reduce(grads, group)
            else:
                reduce_s += comm.reduce_scatter(grads, group)
                gather_s += comm.all_gather(params * BF16_BYTES, group)
        window = makespan - end + work.backward / plan.layout.vpp
        exposed = max(exposed, max(0.0, reduce_s - window)
                      + max(0.0, gather_s - work.forward / plan.layout.vpp))
    return exposed


def optimizer_time(plan: Plan, works: tuple[StageWork, ...]) -> float:
    """The Adam step of the rank with the most optimizer state (memory-bound)."""
    device = plan.cluster.device
    sharded = plan.zero >= ZeroStage.OPTIMIZER
    dense_group = plan.layout.dp * plan.layout.cp if sharded else 1
    expert_group = plan.layout.edp if sharded else 1
    largest = max(w.params / dense_group + w.expert_params / expert_group for w in works)
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
        ep_comm=m * (w.ep_f + w.ep_b),
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
