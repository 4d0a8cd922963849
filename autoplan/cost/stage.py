"""What one pipeline stage costs per microbatch, and what it holds in memory: the
compute of its layers (``kernels.compute``) plus each axis's exposed communication and
memory terms (``autoplan.parallel``), added up in one place."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from autoplan.caches import memo
from autoplan.descriptors.hardware import Cluster, Device, Link
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import MOE, NO_MIXER, NO_MLP, Model
from autoplan.descriptors.pipeline_layout import Chunk
from autoplan.descriptors.stack import Stack
from autoplan.kernels import comm, compute, memory, offload, packing
from autoplan.kernels.compute import LayerTimes, layer_times, logits_times, module_forward
from autoplan.kernels.layer import (
    BF16_BYTES,
    Gemm,
    Shard,
    attention_gemms,
    expert_params_per_rank,
    layer_params_per_rank,
    mlp_gemms,
    stage_params,
)
from autoplan.kernels.mixers import kind_params_per_rank
from autoplan.parallel import cp, dp, ep, mesh, pp, tp
from autoplan.parallel.mesh import count_free
from autoplan.plan import Layout, Memory, Plan
from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_held
from autoplan.schedules.registry import alike
from autoplan.units import GiB
from autoplan.vocab import (
    NO_OFFLOAD,
    Axis,
    CpComm,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    TpOverlap,
    ZeroStage,
)

# Per parameter and microbatch, where the stack does not fuse gradient accumulation into the
# weight-gradient GEMM (Stack.grad_accumulation_fusion): the bf16 gradient cast to fp32
# (read 2, write 4 bytes) and added into the fp32 main gradient (read 4 + 4, write 4), as
# autoplan validate's torch model does (bench/torch_model.py RankStates._accumulate; FSDP2
# copies each gradient into its fp32 reduce buffer and out again, about as much)
GRAD_ACCUMULATION_BYTES = 18.0

COMM_AXES = (Axis.TP, Axis.CP, Axis.EP, Axis.PP, Axis.DP)
"""The axes whose communication a stage exposes, in the order their seconds add up
(DP: ZeRO-3's per-microbatch gathers; the per-step gradient sync is ``dp.grad_sync_exposed``)."""


@dataclass(frozen=True, slots=True)
class AxisComm(Mapping[Axis, tuple[float, float]]):
    """Exposed communication per microbatch by axis: (forward, backward) seconds, the
    backward part charged to input-gradient (B) work. Hashable, in ``COMM_AXES`` order."""

    seconds: tuple[tuple[float, float], ...]  # one (forward, backward) per COMM_AXES

    def __getitem__(self, axis: Axis) -> tuple[float, float]:
        return self.seconds[COMM_AXES.index(axis)]

    def __iter__(self) -> Iterator[Axis]:
        return iter(COMM_AXES)

    def __len__(self) -> int:
        return len(COMM_AXES)

    @property
    def total(self) -> float:
        """Forward and backward of every axis."""
        t = 0.0
        for f, b in self.seconds:
            t = t + f + b
        return t


@dataclass(frozen=True, slots=True)
class StageWork:
    """Seconds one pipeline stage spends per microbatch (all its chunks), by cause."""

    layers: int
    compute_f: float
    compute_b: float  # input-gradient (B) compute
    compute_w: float  # weight-gradient (W) compute
    recompute: float
    comm: AxisComm  # exposed communication by axis, (forward, backward)
    params: float  # non-expert parameters held by one rank of this stage (before ZeRO)
    expert_params: float = 0.0  # routed-expert parameters on one rank (before ZeRO)
    dense: int = 0  # of ``layers``, those with a dense MLP (the rest are MoE layers)
    mtp: int = 0  # multi-token-prediction layers held here (the output stage)
    # a hybrid model's layers here by kind, in the order of ``Model.kinds`` (else ())
    mix: tuple[int, ...] = ()
    # F and B: compute plus the communication each exposes; summed once, here, because
    # the search and the simulator read them millions of times
    forward: float = field(init=False, compare=False)
    backward_input: float = field(init=False, compare=False)  # B, recompute included
    backward: float = field(init=False, compare=False)  # B + W

    def __post_init__(self) -> None:
        f = self.compute_f
        b = self.compute_b + self.recompute
        for af, ab in self.comm.seconds:
            f += af
            b += ab
        object.__setattr__(self, "forward", f)
        object.__setattr__(self, "backward_input", b)
        object.__setattr__(self, "backward", b + self.compute_w)

    @property
    def backward_weight(self) -> float:
        """W: the weight-gradient GEMMs (zero-bubble schedules run them apart)."""
        return self.compute_w


def host_kernel_seconds(plan: Plan) -> tuple[float, float]:
    """Host seconds of a layer's forward per kernel it launches, and of its backward per
    forward kernel: none under CUDA graphs (the step is replayed); measured on the device's
    host where its profile has ``host`` rows (``bench/host.py``); else the stack's prior
    (``host_kernel_us``), the backward launching twice the forward's kernels."""
    return _host_kernel_seconds(plan.stack, plan.cluster.device)


def _host_kernel_seconds(stack: Stack, device: Device) -> tuple[float, float]:
    if stack.cuda_graphs:
        return 0.0, 0.0
    correction = device.correction
    measured = correction.host_kernel_s() if correction is not None else None
    return measured or (stack.host_kernel_s, 2 * stack.host_kernel_s)


def shard_of(plan: Plan) -> Shard:
    """What one rank computes of one of the plan's layers for one microbatch: read off its
    model, job, stack, device and the layout's shard (tp, cp, ep, etp) alone, not dp, pp,
    the node count, its schedule, recompute, ZeRO stage or offload, so the plans alike in
    those share one (a search asks it of tens of thousands of plans, a few hundred shards)."""
    lay = plan.layout
    return _shard(plan.model, plan.job, plan.stack, plan.cluster.device, lay.tp, lay.cp, lay.ep,
                  lay.etp, plan.micro_batch, plan.sequence_parallel, plan.cp_comm,
                  plan.moe_dispatch)


@memo(16384)
def _shard(model: Model, job: Job, stack: Stack, device: Device, tp: int, cp: int, ep_: int,
           etp: int, mbs: int, sp: bool, cp_comm: CpComm, dispatch: MoeDispatch) -> Shard:
    moe = model.is_moe
    host_f, host_b = _host_kernel_seconds(stack, device)
    docs = job.documents
    packed = {} if docs is None else dict(
        attention_share=packing.attention_share(docs, job.seq_len),
        attention_seq=packing.attention_length(docs, job.seq_len),
        attention_imbalance=(packing.cp_imbalance(docs, job.seq_len, cp)
                             if cp_comm is CpComm.RING else 1.0))
    return Shard(mbs, job.seq_len, tp, cp, sp, job.dtype, ep=ep_ if moe else 1,
                 etp=etp if moe else 1, expert_load=ep.expert_load(model, job) if moe else 1.0,
                 cp_ring=cp_comm is CpComm.RING, moe_dispatch=dispatch,
                 attention_kernel=stack.attention,
                 layer_kernels=stack.layer_kernels,
                 host_kernel_s=host_f, host_backward_kernel_s=host_b,
                 kernel_efficiency=stack.compute_efficiency,
                 sp_saves_gathered=stack.sp_saves_gathered,
                 moe_probs_in_activation=stack.moe_probs_in_activation, **packed)


@memo(16384)
def _layer_times(model: Model, shard: Shard, device: Device, moe: bool = False) -> LayerTimes:
    return layer_times(model, shard, device, moe)


@memo(16384)
def _logits_times(model: Model, shard: Shard, device: Device) -> tuple[float, float, float]:
    return logits_times(model, shard, device)


# ----------------------------------------------------------------------------- parameters

def stage_state_params(model: Model, lay: Layout, first: bool, last: bool, layers: int,
                       dense: int, mtp: int | None = None,
                       mix: tuple[int, ...] = ()) -> tuple[float, float]:
    """(non-expert, routed-expert) parameters on one rank of a stage (or chunk) holding
    ``layers`` layers, ``dense`` of them with a dense MLP, and ``mtp`` MTP modules (None:
    the model's, if it is the output stage, ``last``); a hybrid model's by kind (``mix``).
    Experts: experts/ep per MoE layer, each split by etp."""
    if mtp is None:
        mtp = model.mtp_layers if last else 0
    if mix:
        params = stage_params(model, lay.tp, first, last, 0, 0, mtp) + sum(
            k * kind_params_per_rank(model, lay.tp, kind)
            for kind, k in zip(model.kinds, mix, strict=True) if k)
    else:
        params = stage_params(model, lay.tp, first, last, layers, dense, mtp)
    if not model.is_moe:
        return params, 0.0
    moe = layers - dense + mtp
    return params, moe * expert_params_per_rank(model, lay.ep, lay.etp)


# ----------------------------------------------------------------------------- time

@memo(16384)
def cost_key(plan: Plan) -> Plan:
    """The plan as far as per-stage work depends on it. The schedule enters only through
    its spec's ``work_key`` (whether it splits the backward, runs in a V, or gathers ZeRO-3
    once a step: ``schedules.registry.alike``); ZeRO 0-2 differ only in memory (their
    collectives run after the pipeline); the layer split is applied per stage; offload
    moves memory and adds its own time (``evaluate``), not the stage's."""
    return plan.replace(
        schedule=alike(plan.schedule),
        zero=plan.zero if plan.zero is ZeroStage.PARAMETERS else ZeroStage.NONE, stages=None,
        chunks=None, offload=NO_OFFLOAD)


def stage_work(plan: Plan) -> tuple[StageWork, ...]:
    """Per-stage work of a plan, one entry per pipeline stage (across pools, each stage's
    on its own pool: ``cost.placed``)."""
    if plan.placement is not None:
        return placed_works(plan)
    if plan.chunks is not None:
        return _chunked_stage_works(cost_key(plan), plan.chunks)
    return _stage_works(cost_key(plan), plan.stage_layers, pp.dense_per_stage(plan),
                        pp.mix_per_stage(plan))


def chunk_work(plan: Plan) -> tuple[StageWork, ...]:
    """Work per microbatch of each model chunk, in virtual-stage order, for a plan with a
    per-chunk layout (``plan.chunks``)."""
    assert plan.chunks is not None, "chunk_work needs a per-chunk layout"
    return _chunk_works(cost_key(plan), plan.chunks)


@memo(4096)
def _chunk_works(key: Plan, chunks: tuple[Chunk, ...]) -> tuple[StageWork, ...]:
    """Each chunk as a stage of its own (``_stage``): its layers (the model's first
    dense layers wherever they fall), the embedding, loss and MTP it holds, and a send
    on to the next virtual stage (forward) and back to the previous one (backward)."""
    model, p = key.model, key.layout.pp
    one = _one_chunk(key)
    last = len(chunks) - 1
    out, start = [], 0
    for vs, c in enumerate(chunks):
        dense, mix = pp.layer_counts(model, start, start + c.layers)
        start += c.layers
        out.append(_stage(one, c.embedding, c.loss, c.mtp, c.layers, dense,
                          int(p > 1 and vs < last), int(p > 1 and vs > 0), mix))
    return tuple(out)


@memo(4096)
def _chunked_stage_works(key: Plan, chunks: tuple[Chunk, ...]) -> tuple[StageWork, ...]:
    """Per pipeline stage, the sum of its chunks' work (virtual stage i on rank i % pp)."""
    works = _chunk_works(key, chunks)
    p = key.layout.pp
    return tuple(_summed(works[s::p]) for s in range(p))


def _summed(works: tuple[StageWork, ...]) -> StageWork:
    comm = AxisComm(tuple((sum(w.comm.seconds[a][0] for w in works),
                           sum(w.comm.seconds[a][1] for w in works))
                          for a in range(len(COMM_AXES))))
    return StageWork(
        layers=sum(w.layers for w in works), compute_f=sum(w.compute_f for w in works),
        compute_b=sum(w.compute_b for w in works), compute_w=sum(w.compute_w for w in works),
        recompute=sum(w.recompute for w in works), comm=comm,
        params=sum(w.params for w in works), expert_params=sum(w.expert_params for w in works),
        dense=sum(w.dense for w in works), mtp=sum(w.mtp for w in works),
        mix=tuple(map(sum, zip(*(w.mix for w in works), strict=True))))


@memo(16384)
def _stage_works(key: Plan, stage_layers: tuple[int, ...], dense: tuple[int, ...],
                 mixes: tuple[tuple[int, ...], ...] = ()) -> tuple[StageWork, ...]:
    out = pp.output_stage(key)
    one = _one_chunk(key)
    mtp = key.model.mtp_layers
    last = len(stage_layers) - 1
    works = []
    seen: dict[tuple[int, int, tuple[int, ...]], StageWork] = {}  # middle stages: most repeat
    for s, layers in enumerate(stage_layers):
        mix = mixes[s] if mixes else ()
        if 0 < s < last and s != out:
            mid = (layers, dense[s], mix)
            work = seen.get(mid)
            if work is None:
                work = seen[mid] = _stage(one, False, False, 0, layers, dense[s], *pp.sends(key, s),
                                          mix)
        else:
            work = _stage(one, s == 0, s == out, mtp if s == out else 0, layers, dense[s],
                          *pp.sends(key, s), mix)
        works.append(work)
    return tuple(works)


@memo(8192)
def _one_chunk(key: Plan) -> Plan:
    """The key with one model chunk per stage: a stage's work depends on its chunks only
    through its sends, which ``_stage`` takes apart (so interleaved plans of every vpp
    share one memo)."""
    if key.layout.vpp == 1:
        return key
    return key.replace(layout=dataclasses.replace(key.layout, vpp=1))


def stage_work_for(plan: Plan, stage: int, layers: int, dense: int | None = None,
                   extra: tuple[str, str] | None = None) -> StageWork:
    """Work of ``stage`` if it held ``layers`` layers, ``dense`` of them with a dense MLP
    (None: as many as the model's layer kinds allow, all for a dense model, none for a
    mixture of experts). The partitioner asks this. A hybrid model's layers are all of its
    lightest kind (:func:`lightest_kind`: a bound below any stage of as many layers), but
    one of kind ``extra`` where given."""
    key = cost_key(plan)
    model = plan.model
    mix: tuple[int, ...] = ()
    if model.is_hybrid:
        kinds = tuple(model.kinds)
        light = lightest_kind(key)
        counts = [0] * len(kinds)
        counts[kinds.index(light)] = layers
        if extra is not None and layers:
            counts[kinds.index(light)] -= 1
            counts[kinds.index(extra)] += 1
        mix = tuple(counts)
        dense = sum(n for k, n in zip(kinds, mix, strict=True) if k[1] != MOE)
    elif dense is None:
        dense = layers if not model.is_moe else 0
    last = stage == pp.output_stage(key)
    return _stage(_one_chunk(key), stage == 0, last, model.mtp_layers if last else 0,
                  layers, dense, *pp.sends(key, stage), mix)


@memo(4096)
def lightest_kind(key: Plan) -> tuple[str, str]:
    """A hybrid model's layer kind of the fewest seconds (forward and backward) on the
    plan's shard: the partitioner's and the bounds' reference layer."""
    core = _shared_of(_layer_key(key)).core
    kinds = tuple(key.model.kinds)
    seconds = [lt.forward + lt.backward for lt in core.kinds]
    return kinds[seconds.index(min(seconds))]


@dataclass(frozen=True, slots=True)
class TpExposed:
    """One layer's TP collectives per microbatch as its stack overlaps them
    (``Stack.tp_overlap``): what each pass exposes by itself, and what runs beside the
    stage's weight-gradient GEMMs (``tp.exposed_backward``)."""

    forward: float  # exposed in the forward (and again in a full recompute's forward)
    backward: float  # exposed in the backward, W in place
    deferred: float  # exposed in the backward of a schedule that defers W
    hideable: float  # backward collectives beside the stage's W GEMMs


@dataclass(frozen=True, slots=True)
class LayerCore:
    """What a layer costs on a shard, whatever the dp and pp around it."""

    lt: LayerTimes  # a dense layer
    lt_moe: LayerTimes  # an MoE layer (the dense one's for a dense model)
    act_bytes: float  # one layer's output, unsplit by TP
    tp_layer: float  # the layer's TP collectives, one direction
    tp_dense: TpExposed  # a dense layer's, as the stack overlaps them
    tp_moe: TpExposed  # an MoE layer's (the dense one's for a dense model)
    cp_f: float  # exposed context-parallel communication per layer, forward
    cp_b: float  # ... backward
    ep_layer: float  # MoE token dispatch and combine per MoE layer, one direction
    logits: tuple[float, float, float]  # the output layer's logits' compute: F, B and W
    # a hybrid model's layers by kind (``Model.kinds`` order): times and TP collectives
    kinds: tuple[LayerTimes, ...] = ()
    tp_kinds: tuple[TpExposed, ...] = ()


@dataclass(frozen=True, slots=True)
class _Shared:
    """Per-plan quantities every stage uses: its layers' costs, its communicators and
    one pipeline send."""

    core: LayerCore
    groups: dict[Axis, comm.Group]
    pp_send: float


@memo(8192)
def _layer_key(plan: Plan) -> Plan:
    """The plan as far as its layers' compute and communication depend on it
    (``_shared_of``, ``_stage_terms``): not its schedule, recompute or ZeRO stage, which
    ``_stage`` applies on top (so the variants of a layout share one memo)."""
    return plan.replace(schedule=Schedule.ONE_F_ONE_B, recompute=Recompute.NONE,
                        zero=ZeroStage.NONE)


@memo(8192)
def _shared_of(plan: Plan) -> _Shared:
    core = _layer_core(plan.model, count_free(plan.cluster), shard_of(plan),
                       plan.stack.tp_overlap)
    send = pp.send_seconds(plan, core.act_bytes * plan.model.pipeline_rows)
    return _Shared(core, mesh.groups(plan), send)


@memo(16384)
def _dense_shard(shard: Shard) -> Shard:
    """``shard`` as a dense layer and the output layer read it: neither routes tokens, so
    neither reads the expert degrees, the busiest expert rank's load or the dispatcher
    (``layer_times`` without ``moe``, ``logits_times``): an MoE model's shards that differ
    only in those share one. DeepSeek-V3 over 16 counts: 3,368 shards, 215 so."""
    return dataclasses.replace(shard, ep=1, etp=1, expert_load=1.0,
                               moe_dispatch=MoeDispatch.ALLTOALL)


@memo(8192)
def _layer_core(model: Model, cluster: Cluster, shard: Shard,
                overlap: TpOverlap = TpOverlap.WGRAD) -> LayerCore:
    device = cluster.device
    dense = _dense_shard(shard) if model.is_moe else shard
    lt = _layer_times(model, dense, device)
    lt_moe = _layer_times(model, shard, device, True) if model.is_moe else lt
    groups = mesh.layer_groups(cluster, shard.tp, shard.cp, shard.ep, shard.etp)
    act_bytes = BF16_BYTES * shard.tokens * model.hidden  # one layer's output, unsplit by TP
    tp_layer = tp.layer_seconds(act_bytes, groups[Axis.TP], shard.sequence_parallel)
    tp_dense, tp_moe = _tp_exposed(model, device, shard, groups[Axis.TP], act_bytes, tp_layer,
                                   overlap)
    cp_f, cp_b = cp.exposed(model, cluster, shard, lt, groups[Axis.CP])
    ep_layer = (ep.layer_seconds(model, shard, groups[Axis.EP], groups[Axis.ETP])
                if model.is_moe else 0.0)
    kinds: list[LayerTimes] = []
    tp_kinds: list[TpExposed] = []
    if model.is_hybrid:
        for kind in model.kinds:
            moe = kind[1] == MOE
            kinds.append(layer_times(model, shard if moe else dense, device, kind=kind))
            # a layer of one block (no mixer, or no MLP: Nemotron-H) runs half a
            # standard layer's TP collectives (one all-gather and reduce-scatter pair)
            blocks = (kind[0] != NO_MIXER) + (kind[1] != NO_MLP)
            base = tp_moe if moe else tp_dense
            tp_kinds.append(base if blocks == 2 else TpExposed(
                *(x * blocks / 2 for x in dataclasses.astuple(base))))
    return LayerCore(lt, lt_moe, act_bytes, tp_layer, tp_dense, tp_moe, cp_f, cp_b, ep_layer,
                     _logits_times(model, dense, device), tuple(kinds), tuple(tp_kinds))


def layer_core(plan: Plan) -> LayerCore:
    """What one layer of the plan costs on its shard (times, TP, CP and EP communication;
    and the output layer's logits), whatever the dp and pp around it."""
    return _layer_core(plan.model, count_free(plan.cluster), shard_of(plan),
                       plan.stack.tp_overlap)


def tp_overlap_of(overlap: TpOverlap, shard: Shard, group: comm.Group) -> TpOverlap:
    """The overlap a stack's ``overlap`` gives a shard: Transformer Engine's and PyTorch's
    comm-GEMM overlaps pipeline sequence parallelism's all-gathers and reduce-scatters, so
    without SP (or without TP) the collectives run as Megatron-LM's plain layers do;
    userbuffers also needs the TP group inside one NVLink domain (TE's
    examples/pytorch/comm_gemm_overlap/README.md: "Tensor-parallel GPUs must be on a single
    node")."""
    if overlap in (TpOverlap.USERBUFFERS, TpOverlap.ASYNC) and (
            shard.tp == 1 or not shard.sequence_parallel):
        return TpOverlap.WGRAD
    if overlap is TpOverlap.USERBUFFERS and group.per_domain < group.size:
        return TpOverlap.WGRAD
    return overlap


def tp_overlap_in(plan: Plan) -> TpOverlap:
    """The TP overlap ``plan`` runs under (:func:`tp_overlap_of` its stack's): what the
    exports turn on."""
    return tp_overlap_of(plan.stack.tp_overlap, shard_of(plan), mesh.groups(plan)[Axis.TP])


def _linear(m: float, n: float, k: float, device: Device, shard: Shard) -> tp.LinearGemms:
    """A linear's forward (m x k) @ (k x n), its dgrad and its wgrad on this rank, as
    ``layer_times`` charges them (``compute.backward_gemm_times``: each at its own shape
    where the device has measured grids, else the forward's time), at the stack's
    sustained share of the kernels' rates."""
    eff, dt = shard.kernel_efficiency, shard.dtype
    forward = compute.gemm_time(m, n, k, device, dt)
    dgrad, wgrad = compute.backward_gemm_times([Gemm(m, n, k)], device, dt, forward)
    return tp.LinearGemms(forward / eff, dgrad / eff, wgrad / eff)


def _block(gemms: list[Gemm], device: Device, shard: Shard) -> tp.TpBlock:
    """The column-parallel GEMMs (all but the last of ``gemms``: QKV, or MLA's projections
    up to the heads, summed) and the row-parallel output GEMM after them."""
    cols = [_linear(g.m, g.n, g.k, device, shard) for g in gemms[:-1]]
    column = tp.LinearGemms(sum(c.fprop for c in cols), sum(c.dgrad for c in cols),
                            sum(c.wgrad for c in cols))
    last = gemms[-1]
    return tp.TpBlock(column, _linear(last.m, last.n, last.k, device, shard))


def _tp_exposed(model: Model, device: Device, shard: Shard, group: comm.Group,
                act_bytes: float, tp_layer: float,
                overlap: TpOverlap) -> tuple[TpExposed, TpExposed]:
    """(a dense layer's, an MoE layer's) TP collectives as ``overlap`` leaves them. The
    overlaps pipeline the attention block's collectives with its projections and a dense
    MLP's with its FC1 and FC2; an MoE layer's two collectives around its experts keep the
    plain layers' terms (forward exposed, backward beside W; exposed under PyTorch's TP)."""
    overlap = tp_overlap_of(overlap, shard, group)
    if not device.overlaps_communication:  # one CPU core per rank: the collectives run alone
        overlap = TpOverlap.NONE
    if overlap is TpOverlap.WGRAD:
        plain = TpExposed(tp_layer, 0.0, 0.0, tp_layer)
        return plain, plain
    if overlap is TpOverlap.NONE:
        plain = TpExposed(tp_layer, tp_layer, tp_layer, 0.0)
        return plain, plain
    gather = comm.all_gather(act_bytes, group)
    scatter = comm.reduce_scatter(act_bytes, group)
    tokens, t = shard.tokens, shard.tp
    attention = _block(attention_gemms(model, tokens, t), device, shard)
    mlp = _block(mlp_gemms(model, tokens, t, model.ffn_hidden), device, shard)
    half = gather + scatter  # the experts' pair, un-overlapped

    def exposed(blocks: tuple[tp.TpBlock, ...], rest: float) -> TpExposed:
        if overlap is TpOverlap.USERBUFFERS:
            f, b, d = tp.userbuffers_exposed(gather, scatter, blocks, t, device.sms)
            return TpExposed(f + rest, b, d, rest)
        f, b = tp.async_exposed(gather, scatter, blocks, t)
        return TpExposed(f + rest, b + rest, b + rest, 0.0)

    dense = exposed((attention, mlp), 0.0)
    return dense, (exposed((attention,), half) if model.is_moe else dense)


def activation_bytes(plan: Plan) -> float:
    """Bytes of one layer's output for one microbatch, unsplit by TP (what a pipeline
    send carries, before sequence parallelism scatters it): every copy of hidden a send
    carries (``Model.pipeline_rows``: DeepSeek-V4's hc_mult streams, Kimi-K3's attention-
    residual bank)."""
    return layer_core(plan).act_bytes * plan.model.pipeline_rows


@dataclass(frozen=True, slots=True)
class _StageTerms:
    """What a stage's work is made of before its schedule, recompute and ZeRO stage."""

    shared: _Shared
    n: int  # layers run (MTP modules included)
    compute_f: float
    compute_b: float
    compute_w: float
    tp_recompute: float  # the layers' forward TP exposure, again in a full recompute
    tp_f: float  # forward TP, the embedding's and heads' boundaries included
    tp_b_fixed: float  # backward TP the layers expose themselves, W in place
    tp_b_deferred: float  # ... under a schedule that defers W
    tp_b_total: float  # backward TP that hides behind W (what of it W outlasts)
    ep: float  # MoE dispatch and combine, one direction
    cp_f: float
    cp_b: float
    full_recompute: float  # the layers' forward again
    selective_recompute: float  # their attention's forward again
    params: float
    expert_params: float


@memo(65536)
def _stage_terms(plan: Plan, first: bool, last: bool, mtp: int, layers: int,
                 dense: int, mix: tuple[int, ...] = ()) -> _StageTerms:
    """``_stage``'s terms that its schedule, recompute and ZeRO stage leave alone
    (``plan``: a ``_layer_key``). ``mix``: a hybrid model's layers by kind."""
    model, lay = plan.model, plan.layout
    shared = _shared_of(plan)
    core, groups = shared.core, shared.groups
    lt, lt_moe, act_bytes = core.lt, core.lt_moe, core.act_bytes
    # layers run, by kind: the MTP modules repeat the model's last layer kind
    moe_n = layers - dense + (mtp if model.is_moe else 0)
    dense_n = dense + (0 if model.is_moe else mtp)
    n = dense_n + moe_n
    # (count, times, TP) of each kind of layer run: dense and MoE, or a hybrid's kinds
    # (its MTP modules as the model's attention layer)
    runs = [(dense_n, lt, core.tp_dense), (moe_n, lt_moe, core.tp_moe)]
    if mix:
        mtp_lt, mtp_tp = (lt_moe, core.tp_moe) if model.is_moe else (lt, core.tp_dense)
        runs = [(mtp, mtp_lt, mtp_tp), *zip(mix, core.kinds, core.tp_kinds, strict=True)]

    def summed(of: Callable[[LayerTimes], float]) -> float:
        return sum(k * of(t) for k, t, _ in runs if k)

    compute_f = summed(lambda t: t.forward)
    compute_b = summed(lambda t: t.backward_input)
    compute_w = summed(lambda t: t.backward_weight)
    tp_d, tp_m = core.tp_dense, core.tp_moe

    def layers_of(of: Callable[[TpExposed], float]) -> float:
        # n * x where both kinds agree (dense_n and moe_n copies summed could differ in
        # the last bit)
        if mix:
            return sum(k * of(e) for k, _, e in runs if k)
        return n * of(tp_d) if tp_d == tp_m else dense_n * of(tp_d) + moe_n * of(tp_m)

    tp_recompute = tp_f = layers_of(lambda e: e.forward)
    tp_b_total = layers_of(lambda e: e.hideable)
    if first:
        tp_f += tp.boundary_seconds(act_bytes, groups[Axis.TP])
    if last or mtp:
        lf, lb, lw = core.logits
        heads = last + mtp  # each MTP depth predicts one more token through the shared head
        compute_f += heads * lf
        compute_b += heads * lb
        compute_w += heads * lw
        tp_f += heads * tp.boundary_seconds(act_bytes, groups[Axis.TP])
        tp_b_total += heads * tp.boundary_seconds(act_bytes, groups[Axis.TP])
    params, expert_params = stage_state_params(model, lay, first, last, layers, dense, mtp, mix)
    return _StageTerms(
        shared=shared, n=n, compute_f=compute_f, compute_b=compute_b, compute_w=compute_w,
        tp_recompute=tp_recompute, tp_f=tp_f, tp_b_fixed=layers_of(lambda e: e.backward),
        tp_b_deferred=layers_of(lambda e: e.deferred), tp_b_total=tp_b_total,
        ep=moe_n * core.ep_layer,
        cp_f=n * core.cp_f, cp_b=n * core.cp_b,
        full_recompute=summed(lambda t: t.forward),
        selective_recompute=summed(lambda t: t.attention_forward),
        params=params, expert_params=expert_params)


@memo(4096)
def module_recompute(plan: Plan) -> tuple[float, float]:
    """(a dense layer's, an MoE layer's) seconds of recomputing the modules ``plan``'s
    selective recompute names, as ``_stage`` charges them (the search's bounds read it)."""
    return _module_recompute(_layer_key(plan), plan.recomputed)


@memo(4096)
def _module_recompute(plan: Plan, modules: frozenset[RecomputeModule]) -> tuple[float, float]:
    """(a dense layer's, an MoE layer's) seconds of recomputing ``modules`` in backward
    (``plan``: a ``_layer_key``): each module's forward (``compute.module_forward``), the
    attention core as the layer times give it."""
    core, shard, device = _shared_of(plan).core, shard_of(plan), plan.cluster.device
    out = []
    for moe, lt in ((False, core.lt), (True, core.lt_moe)):
        out.append(sum(lt.attention_forward if module is RecomputeModule.CORE_ATTN
                       else module_forward(plan.model, shard, device, module, moe)
                       for module in modules))
    return out[0], out[1]


@memo(65536)
def _stage(plan: Plan, first: bool, last: bool, mtp: int, layers: int, dense: int,
           sends_f: int, sends_b: int, mix: tuple[int, ...] = ()) -> StageWork:
    """One stage (or model chunk): ``first`` holds the embedding, ``last`` the output
    layer and logits, ``mtp`` MTP layers (each with its own logits through the shared
    head); ``dense`` of its ``layers`` have a dense MLP, the others experts; ``mix``: a
    hybrid model's layers by kind."""
    t = _stage_terms(_layer_key(plan), first, last, mtp, layers, dense, mix)
    # backward TP collectives hide behind the weight-gradient GEMMs, on a device where
    # communication runs beside compute (not one CPU core per rank: Device.overlaps_communication)
    hides = t.compute_w if plan.cluster.device.overlaps_communication else 0.0
    tp_b = (tp.exposed_backward(t.tp_b_total, hides, plan.schedule)
            + (t.tp_b_fixed if plan.schedule.spec.hides_tp_behind_w else t.tp_b_deferred))
    ep_f = ep_b = t.ep
    cp_f, cp_b = t.cp_f, t.cp_b
    recompute = 0.0
    if plan.recompute is Recompute.FULL:
        recompute = t.full_recompute
        tp_b += t.tp_recompute  # the recomputed forward repeats its collectives
        ep_b += ep_f
        cp_b += cp_f
    elif plan.recompute is Recompute.SELECTIVE:
        recompute = t.selective_recompute
        if plan.recompute_modules:  # Megatron-Core's modules: each one's forward again
            dense_s, moe_s = _module_recompute(_layer_key(plan), plan.recomputed)
            moe_n = layers - dense + (mtp if plan.model.is_moe else 0)
            dense_n = dense + (0 if plan.model.is_moe else mtp)
            recompute = dense_n * dense_s + moe_n * moe_s
            if mix:  # the attention core by kind, the modules by MLP kind
                core_s = _kinds_core_recompute(_layer_key(plan), mix, plan.recomputed)
                recompute += core_s
            if RecomputeModule.MOE in plan.recomputed:
                ep_b += ep_f  # the recomputed MoE layer dispatches and combines again
    if plan.ep_overlap and (ep_f or ep_b):
        ep_f, ep_b = ep.overlap_exposed(plan, ep_f, ep_b, t.compute_f,
                                        t.compute_b + t.compute_w + recompute)
    m = plan.num_microbatches
    passes = plan.schedule.spec.zero3_passes(m)
    if passes != m:
        # a chunk's gathers and reduce-scatter once every m / passes microbatches, behind
        # their compute (``ScheduleSpec.zero3_passes``: breadth-first, Lamy-Poirier 2023,
        # Sec. 3): per microbatch, a share of that
        k = m // passes
        zero3_f, zero3_b = (x / k for x in dp.zero3_exposed(
            plan, t.shared.groups, t.params, t.expert_params, k * t.compute_f, k * t.compute_b,
            k * t.compute_w, t.n))
    else:
        zero3_f, zero3_b = dp.zero3_exposed(plan, t.shared.groups, t.params, t.expert_params,
                                            t.compute_f, t.compute_b, t.compute_w, t.n)
    pp_send = t.shared.pp_send
    axis_comm = AxisComm(((t.tp_f, tp_b), (cp_f, cp_b), (ep_f, ep_b),
                          (sends_f * pp_send, sends_b * pp_send), (zero3_f, zero3_b)))
    compute_w = t.compute_w
    if not plan.stack.grad_accumulation_fusion:  # each gradient cast and added apart
        device = plan.cluster.device
        compute_w += ((t.params + t.expert_params) * GRAD_ACCUMULATION_BYTES
                      / (device.hbm_Bps * device.hbm_efficiency))
    return StageWork(
        layers=layers, compute_f=t.compute_f, compute_b=t.compute_b, compute_w=compute_w,
        recompute=recompute, comm=axis_comm, params=t.params, expert_params=t.expert_params,
        dense=dense, mtp=mtp, mix=mix,
    )


def _kinds_core_recompute(plan: Plan, mix: tuple[int, ...],
                          modules: frozenset[RecomputeModule]) -> float:
    """What a hybrid stage's recomputed attention cores differ by from the model's full
    attention core that ``_module_recompute`` charges every layer: each kind's own core
    (a linear layer's scan, a sliding layer's window) in its place."""
    if RecomputeModule.CORE_ATTN not in modules:
        return 0.0
    core = _shared_of(plan).core
    return sum(k * (t.attention_forward - core.lt.attention_forward)
               for k, t in zip(mix, core.kinds, strict=True) if k)


# ----------------------------------------------------------------------------- across pools

_PP = COMM_AXES.index(Axis.PP)


def between_send_seconds(plan: Plan, stage: int) -> float:
    """One send of a microbatch's activations (or gradients) from ``stage`` to a neighbour
    on another pool: ``pp.send_seconds``' bytes (1/tp of them with sequence parallelism)
    over the ``between_pools`` link."""
    assert plan.placement is not None
    view = plan.on_stage(stage)
    nbytes = activation_bytes(view) / (plan.layout.tp if plan.sequence_parallel else 1)
    return comm.p2p(nbytes, True, _bridge(view.cluster, plan.placement.cluster.between_pools))


@memo(256)
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


# ----------------------------------------------------------------------------- memory

def static_memory(plan: Plan, work: StageWork) -> memory.BytesPerParam:
    """Weights, gradients and optimizer states of one rank of the stage."""
    return dp.state_bytes(plan, work.params, work.expert_params)


@dataclass(frozen=True, slots=True)
class _ActivationTerms:
    per_layer: float  # one dense layer, one microbatch
    per_moe_layer: float  # one MoE layer, one microbatch
    per_kind: tuple[float, ...]  # a hybrid model's layers by kind (``Model.kinds``)
    working: float  # held once per stage (full recompute's one rebuilt layer)
    embedding: float  # first stage, per microbatch held
    logits: float  # last stage, per microbatch held


@memo(16384)
def _activation_terms(model: Model, shard: Shard, recompute: Recompute,
                      modules: frozenset[RecomputeModule] = frozenset()) -> _ActivationTerms:
    working = 0.0
    if recompute is Recompute.FULL:
        working = memory.full_recompute_working_bytes(model, shard, moe=model.is_moe)
        if model.layers > model.moe_layers:
            working = max(working, memory.full_recompute_working_bytes(model, shard))
    per_layer = memory.layer_activation_bytes(model, shard, recompute, modules=modules)
    per_kind = tuple(memory.layer_activation_bytes(model, shard, recompute, modules=modules,
                                                   kind=kind)
                     for kind in model.kinds) if model.is_hybrid else ()
    return _ActivationTerms(
        per_layer=per_layer,
        per_moe_layer=(memory.layer_activation_bytes(model, shard, recompute, moe=True, modules=modules)
                       if model.is_moe else per_layer),
        per_kind=per_kind,
        working=working,
        embedding=memory.embedding_output_bytes(model, shard),
        logits=memory.logits_bytes(model, shard),
    )


@memo(16384)
def activation_terms(plan: Plan) -> _ActivationTerms:
    """What one microbatch's activations weigh, per layer and at the model's ends
    (``_activation_terms`` of the plan's shard and recompute, looked up by the plan: asked
    of each stage; the same for every schedule, chunk count, ZeRO stage and offload)."""
    return _activation_terms(plan.model, shard_of(plan), plan.recompute, plan.recomputed)


def stage_memory(plan: Plan, stage: int, work: StageWork, inflight_chunks: int) -> Memory:
    """Bytes on one GPU of ``stage`` holding ``inflight_chunks`` microbatch-chunks (and
    what its offload keeps in host memory: ``Memory.host``)."""
    return memory_with(plan, work, *held_activations(plan, stage, work, inflight_chunks))


def held_activations(plan: Plan, stage: int, work: StageWork,
                     inflight_chunks: int) -> tuple[float, float]:
    """(activation bytes on one GPU of ``stage`` holding ``inflight_chunks``
    microbatch-chunks, those its activation offload moves to host memory): what
    ``stage_memory`` reads of the schedule, the chunks and the recompute."""
    lay = plan.layout
    terms = activation_terms(plan)
    if plan.chunks is not None:
        # chunks of their own sizes: each in-flight (microbatch, chunk) weighs what that
        # chunk keeps, walked through the stage's operation order
        fraction, moved = plan.offload.activations, 0.0
        weights = _chunk_weights(plan, stage, terms)
        held = peak_held(plan.schedule, lay.pp, plan.num_microbatches, lay.vpp, stage, weights)
        if fraction and held > max(weights):
            # all but the heaviest chunk at hand may go to the host (kernels/offload.py)
            moved = fraction * (held - max(weights))
            held = held - moved
        return held + terms.working, moved
    return held_in_equal_chunks(plan, terms, lay.vpp, pp.output_stage(plan), stage, work,
                                inflight_chunks)


def held_in_equal_chunks(plan: Plan, terms: _ActivationTerms, vpp: int, output: int,
                         stage: int, work: StageWork, inflight_chunks: int) -> tuple[float, float]:
    """``held_activations`` of ``plan`` run on ``vpp`` equal chunks a stage, its output
    layer on stage ``output``, its terms ``terms`` (``activation_terms``): its schedule and
    chunks are read from these alone, so the members of a group ask it with the group's
    plan (``search.floors``)."""
    mtp_layer = terms.per_moe_layer if plan.model.is_moe else terms.per_layer
    fraction = plan.offload.activations
    # a stage's chunks hold equal layer counts; the dense layers are averaged over them
    per_chunk = _layer_activations(terms, work) / vpp
    kept = offload.kept_chunks(inflight_chunks, fraction)
    activations = kept * per_chunk + terms.working
    moved = (inflight_chunks - kept) * per_chunk
    microbatches_held = -(-inflight_chunks // vpp)
    if stage == 0:
        activations += microbatches_held * terms.embedding
    if stage == output:
        # the MTP modules run at the end of the last chunk: one layer and logits each
        activations += microbatches_held * (
            terms.logits + work.mtp * (mtp_layer + terms.logits + terms.embedding))
    return activations, moved


def memory_with(plan: Plan, work: StageWork, activations: float, moved: float) -> Memory:
    """One GPU of a stage holding ``work``'s parameters: its model states, the reserve
    and ZeRO-3's gathered buffers beside ``activations``, and on the host its offloaded
    optimizer shard and the ``moved`` activations (``held_activations``). Reads the
    plan's layout, ZeRO stage, offload and stack, not its schedule or chunks."""
    lay = plan.layout
    states = static_memory(plan, work)
    host = dp.host_state_bytes(plan, work.params, work.expert_params) + moved
    other = plan.cluster.device.reserve_bytes
    if plan.zero is ZeroStage.PARAMETERS:
        model = plan.model
        largest = layer_params_per_rank(model, lay.tp)
        if model.is_moe:
            largest = max(largest, layer_params_per_rank(model, lay.tp, True)
                          + expert_params_per_rank(model, lay.ep, lay.etp))
        other += dp.zero3_buffer_bytes(largest, plan.stack.zero3_max_live_params)
    return Memory(weights=states.weights, grads=states.grads, optimizer=states.optimizer,
                  activations=activations, other=other, host=host)


def offloaded_chunk_bytes(plan: Plan, stage: int, work: StageWork) -> float:
    """Activations one microbatch leaves in one chunk of ``stage`` (its layers, the
    heaviest chunk's with a per-chunk layout): what activation offload copies of it, times
    the fraction (kernels/offload.py)."""
    terms = activation_terms(plan)
    if plan.chunks is not None:
        return max(_chunk_weights(plan, stage, terms))
    return _layer_activations(terms, work) / plan.layout.vpp


def _layer_activations(terms: _ActivationTerms, work: StageWork) -> float:
    """Activations one microbatch leaves in the layers of ``work``, dense and MoE (a
    hybrid model's by kind)."""
    if work.mix:
        return sum(k * a for k, a in zip(work.mix, terms.per_kind, strict=True))
    return work.dense * terms.per_layer + (work.layers - work.dense) * terms.per_moe_layer


def _chunk_weights(plan: Plan, stage: int, terms: _ActivationTerms) -> tuple[float, ...]:
    """What one microbatch leaves in each chunk of ``stage`` (a per-chunk layout)."""
    assert plan.chunks is not None
    mtp_layer = terms.per_moe_layer if plan.model.is_moe else terms.per_layer
    pp_ = plan.layout.pp
    return tuple(_chunk_activations(terms, mtp_layer, c, w) for c, w in zip(
        plan.chunks[stage::pp_], chunk_work(plan)[stage::pp_], strict=True))


def _chunk_activations(terms: _ActivationTerms, mtp_layer: float, chunk: Chunk,
                       work: StageWork) -> float:
    """Activations one microbatch leaves in one chunk: its layers, the embedding output,
    the logits, and per MTP layer one layer, its logits and its embedding."""
    out = _layer_activations(terms, work)
    out += chunk.embedding * terms.embedding + chunk.loss * terms.logits
    return out + chunk.mtp * (mtp_layer + terms.logits + terms.embedding)


def memory_shortfall(plan: Plan, stage: int, mem: Memory, capacity: float) -> str:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in mem.to_gib_dict().items() if k != "peak")
    where = f"stage {stage} " if plan.layout.pp > 1 else ""
    return (f"{where}needs {mem.peak / GiB:.1f} GiB per GPU on {plan.cluster.device.name} "
            f"({capacity / GiB:.0f} GiB): {parts}")
