"""Expert parallel (GShard, Lepikhin et al. 2021) with expert tensor parallel, folded
over a stage's tp x cp x dp ranks as etp x ep x edp (Megatron-Core's MoE parallel
folding; torchtitan's rule): rules, the foldings the search tries, the token
dispatch/combine and the routed experts' weights per rank."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from autoplan.caches import memo
from autoplan.descriptors.model import Model
from autoplan.kernels import comm
from autoplan.kernels.layer import BF16_BYTES, Shard
from autoplan.parallel import dp, mesh
from autoplan.parallel.common import Rule, Scope, divisors
from autoplan.plan import Layout
from autoplan.vocab import Axis, Dtype, MoeDispatch, Recompute, RecomputeModule

if TYPE_CHECKING:
    from autoplan.descriptors.hardware import Cluster
    from autoplan.descriptors.job import Job
    from autoplan.descriptors.space import SearchSpace
    from autoplan.plan import Plan


# ----------------------------------------------------------------------------- rules

def _ep_dense(plan: Plan) -> str | None:
    if not plan.model.is_moe and plan.layout.ep != 1:
        return f"ep={plan.layout.ep} needs a mixture-of-experts model; {plan.model.name} is dense"
    return None


def _etp_dense(plan: Plan) -> str | None:
    lay = plan.layout
    if not plan.model.is_moe and lay.etp != lay.tp:
        return f"etp={lay.etp} needs a mixture-of-experts model; {plan.model.name} is dense"
    return None


def _experts(plan: Plan) -> str | None:
    m, ep = plan.model, plan.layout.ep
    if m.is_moe and m.experts % ep:
        return f"ep={ep} must divide experts={m.experts}"
    return None


def _ranks(plan: Plan) -> str | None:
    lay = plan.layout
    ranks = lay.tp * lay.cp * lay.dp
    if plan.model.is_moe and ranks % (lay.ep * lay.etp):
        return (f"ep*etp = {lay.ep}*{lay.etp} must divide tp*cp*dp = {ranks} "
                "(expert ranks are carved from a stage's ranks)")
    return None


def _width(plan: Plan) -> str | None:
    m, etp = plan.model, plan.layout.etp
    if m.is_moe and m.expert_width % etp:
        return f"etp={etp} must divide moe_ffn_hidden={m.expert_width}"
    return None


def _shared(plan: Plan) -> str | None:
    m, tp = plan.model, plan.layout.tp
    if m.is_moe and m.shared_experts and (m.shared_experts * m.shared_width) % tp:
        return f"tp={tp} must divide the shared experts' width {m.shared_experts * m.shared_width}"
    return None


def _needs_sp(plan: Plan) -> str | None:
    if plan.model.is_moe and plan.layout.tp > 1 and not plan.sequence_parallel:
        return ("mixture-of-experts layers with tp > 1 need sequence "
                "parallelism (Megatron-Core's token dispatcher)")
    return None


def _dispatch(plan: Plan) -> str | None:
    if plan.moe_dispatch is MoeDispatch.DEEPEP and plan.layout.ep < 2:
        return ("moe_dispatch deepep moves tokens between expert-parallel ranks: "
                f"it needs ep > 1, got ep={plan.layout.ep}")
    return None


def _overlap(plan: Plan) -> str | None:
    """Megatron-Core's checks of --overlap-moe-expert-parallel-comm (TransformerConfig
    __post_init__, megatron-core 0.16)."""
    if not plan.ep_overlap:
        return None
    lay = plan.layout
    if lay.ep < 2:
        return f"ep_overlap needs expert parallelism (ep > 1), got ep={lay.ep}"
    if plan.recompute is Recompute.FULL:
        return "ep_overlap cannot run with full recompute (Megatron-Core refuses it)"
    if plan.recompute is Recompute.SELECTIVE and RecomputeModule.MOE in plan.recompute_modules:
        # megatron-core >= 0.17 TransformerConfig.__post_init__: "disable moe in
        # recompute_modules when enabling overlap_moe_expert_parallel_comm"
        return "ep_overlap cannot run with the moe recompute module (Megatron-Core refuses it)"
    if lay.pp > 1 and lay.vpp < 2:
        return ("ep_overlap with pipeline parallelism needs the interleaved schedule "
                "(vpp >= 2): it pairs one chunk's forward with another's backward")
    if plan.model.mtp_layers > 1:
        return f"ep_overlap supports at most one MTP layer, the model has {plan.model.mtp_layers}"
    if plan.model.mtp_layers == 1 and lay.pp < 2:
        return "ep_overlap with an MTP layer needs pipeline parallelism (pp > 1)"
    return None


RULES = (
    Rule("ep-dense-model", "layout.ep", Scope.LAYOUT,
         "expert parallelism needs a mixture-of-experts model", _ep_dense),
    Rule("etp-dense-model", "layout.etp", Scope.LAYOUT,
         "expert tensor parallelism needs a mixture-of-experts model", _etp_dense),
    Rule("ep-experts", "layout.ep", Scope.LAYOUT, "ep must divide experts", _experts),
    Rule("ep-ranks", "layout.ep", Scope.LAYOUT, "ep*etp must divide tp*cp*dp", _ranks),
    Rule("etp-width", "layout.etp", Scope.LAYOUT, "etp must divide moe_ffn_hidden", _width),
    Rule("tp-shared-experts", "layout.tp", Scope.LAYOUT,
         "tp must divide the shared experts' width", _shared),
    Rule("moe-tp-needs-sp", "sequence_parallel", Scope.SEQUENCE_PARALLEL,
         "mixture of experts with tp > 1 needs sequence parallelism", _needs_sp),
    Rule("moe-dispatch-ep", "moe_dispatch", Scope.LAYOUT,
         "DeepEP dispatch needs expert parallelism", _dispatch),
    Rule("ep-overlap", "ep_overlap", Scope.SCHEDULE,
         "EP all-to-all overlap needs ep > 1, no full or moe recompute, and vpp with pp", _overlap),
)


# ----------------------------------------------------------------------------- degrees

def foldings(model: Model, lay: Layout, space: SearchSpace) -> Iterator[Layout]:
    """The layout with each expert folding the space allows: ep dividing the experts,
    etp of 1 or tp, ep*etp dividing the stage's tp*cp*dp ranks (Megatron-Core MoE
    parallel folding; torchtitan's dp_shard*cp*tp = edp*ep with etp 1 or tp)."""
    if not model.is_moe:
        yield lay
        return
    ranks = lay.tp * lay.cp * lay.dp
    etps = sorted({1 if e == "1" else lay.tp for e in space.etp})
    for ep in divisors(model.experts):
        if ep > space.ep_max:
            break
        for etp in etps:
            if ranks % (ep * etp) == 0 and model.expert_width % etp == 0:
                # (built directly: ``dataclasses.replace`` costs half again, thousands a search)
                yield Layout(dp=lay.dp, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=ep, etp=etp,
                             vpp=lay.vpp, dp_shard=lay.dp_shard)


def dispatch_for(model: Model, cluster: Cluster, lay: Layout, space: SearchSpace,
                 seq_len: int) -> MoeDispatch:
    """The space's dispatcher that moves a layer's tokens fastest on this layout (the
    all-to-all where ep = 1, or the model is dense: decided before any memo lookup, as the
    search asks for every probe plan)."""
    if not model.is_moe or lay.ep < 2:
        return MoeDispatch.ALLTOALL
    if len(space.moe_dispatch) == 1:
        return space.moe_dispatch[0]
    # the layer's groups are placed alike on every count from one NVLink domain up: a
    # sweep's counts share the choice
    return _fastest_dispatch(model, mesh.count_free(cluster), lay.tp, lay.cp, lay.ep, lay.etp,
                             space.moe_dispatch, seq_len)


@memo(4096)
def _fastest_dispatch(model: Model, cluster: Cluster, tp: int, cp: int, ep: int, etp: int,
                      dispatchers: tuple[MoeDispatch, ...], seq_len: int) -> MoeDispatch:
    """Of ``dispatchers``, the one whose dispatch and combine of one layer take least, read
    off one sequence (a larger micro-batch scales every dispatcher's bytes alike; only their
    fixed latencies weigh less). Keyed on the degrees a layer's groups span, not the layout:
    the layouts of one search that differ in dp or pp share it."""
    groups = mesh.layer_groups(cluster, tp, cp, ep, etp)
    shards = [Shard(1, seq_len, tp, cp, tp > 1, Dtype.BF16, ep=ep, etp=etp,
                    moe_dispatch=d) for d in dispatchers]
    times = [layer_seconds(model, s, groups[Axis.EP], groups[Axis.ETP]) for s in shards]
    return dispatchers[times.index(min(times))]


# ----------------------------------------------------------------------------- cost terms

def expert_load(model: Model, job: Job) -> float:
    """Tokens of the busiest expert rank over the mean: the capacity factor where routing
    drops (and pads to) capacity, else the job's imbalance for dropless routing."""
    return model.capacity_factor or job.moe_imbalance


def touched(experts: int, top_k: int, parts: int, groups: int = 0, group_topk: int = 0) -> float:
    """Expected number of ``parts`` equal blocks of consecutive experts (the EP ranks, or
    the NVLink domains holding them) that one token's ``top_k`` experts fall in.

    Affinities are taken as i.i.d., as balanced training drives them (DeepSeek-V3 Sec.
    2.1.2; the published runs force-balance). Unrestricted, the experts are a uniform
    k-subset: a block of x of the E experts is missed with probability C(E - x, k) / C(E, k)
    (hypergeometric). Group-limited routing is not uniform within the chosen groups (a
    group is chosen for its best experts, so each chosen group tends to hold some of
    the token's), so its count is taken from the router itself: :func:`_router_blocks`."""
    if groups:
        return _router_blocks(experts, top_k, parts, groups, group_topk)
    x = experts / parts
    if x != int(x):
        return _router_blocks(experts, top_k, parts, 1, 1)
    return parts * (1.0 - math.comb(int(experts - x), top_k) / math.comb(experts, top_k))


# plain arithmetic on a few integers, no descriptor in its key: kept for the process, not
# dropped with a question's costs (``autoplan.caches``), so a sweep's counts, each its own
# question, simulate the router once (8 simulations, 0.2 s, per search before)
@functools.lru_cache(maxsize=256)
def _router_blocks(experts: int, top_k: int, parts: int, groups: int, group_topk: int,
                   tokens: int = 4096) -> float:
    """Mean distinct blocks of ``tokens`` routed by Megatron-Core's group-limited top-k
    (:func:`_routed`) when the experts are cut into ``parts`` equal blocks of consecutive
    experts."""
    import numpy as np

    blocks = np.sort(_routed(experts, top_k, groups, group_topk, tokens) * parts // experts, axis=1)
    return float(np.mean(1 + np.count_nonzero(np.diff(blocks, axis=1), axis=1)))


# one routing serves every block count (the EP sizes and domains of a search): the
# simulation is the cost (40 ms at 256 experts), the blocks of its choice are not
@functools.lru_cache(maxsize=16)
def _routed(experts: int, top_k: int, groups: int, group_topk: int, tokens: int) -> Any:
    """The experts (tokens x top_k) Megatron-Core's group-limited top-k
    (moe_utils.group_limited_topk: a group scores the sum of its top_k // group_topk best
    affinities, the token keeps its group_topk best groups and its top_k experts among
    them) chooses for ``tokens`` of i.i.d. uniform affinities; seeded, so the same every
    call (sampling error of the mean blocks about 0.3% at 4096 tokens, DeepEP's benchmark
    batch). Read-only: shared by every caller."""
    import numpy as np

    rng = np.random.default_rng(20241227)
    scores = rng.random((tokens, experts))
    size = experts // groups
    per = max(1, top_k // group_topk)
    best = np.partition(scores.reshape(tokens, groups, size), size - per, axis=2)[:, :, size - per:]
    keep = np.argpartition(-best.sum(axis=2), group_topk - 1, axis=1)[:, :group_topk]
    mask = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=1)
    masked = np.where(np.repeat(mask, size, axis=1), scores, -1.0)
    chosen = np.argpartition(-masked, top_k - 1, axis=1)[:, :top_k]
    chosen.setflags(write=False)
    return chosen


def layer_seconds(model: Model, shard: Shard, ep_group: comm.Group,
                  etp_group: comm.Group) -> float:
    """One direction's MoE communication of one layer: dispatching each routed token to
    its experts' ranks and combining the outputs back, on the busiest rank's volume
    (``expert_load``); with expert TP the dispatched tokens are all-gathered over etp
    ranks before the experts and reduce-scattered after. Not overlapped with compute
    here (``_stage`` hides it under the other micro-batch's where the plan overlaps)."""
    # each copy in the experts' width (the latent, where they run in one)
    routed = BF16_BYTES * shard.routed_tokens(model) * model.expert_hidden
    if shard.moe_dispatch is MoeDispatch.DEEPEP:
        out = 2 * deepep_seconds(model, shard, ep_group)
    else:
        # Megatron-Core's all-to-all dispatcher (MoEAlltoAllTokenDispatcher; GShard,
        # Lepikhin et al. 2021): one copy per (token, expert) pair, spread evenly over
        # the ep ranks by uniform routing
        out = 2 * comm.all_to_all(routed, ep_group)
    if shard.etp > 1:
        gathered = routed * shard.etp
        out += comm.all_gather(gathered, etp_group) + comm.reduce_scatter(gathered, etp_group)
    return out


def deepep_seconds(model: Model, shard: Shard, g: comm.Group) -> float:
    """DeepEP's dispatch (its combine moves the same bytes back) of one rank's tokens
    (DeepEP README, "normal kernels with NVLink and RDMA forwarding"): each token goes
    once to every other node its experts sit on, over the rank's own NIC to the GPU of
    the same local index there, which forwards it once to each GPU of its node holding
    one of the token's experts, over NVLink; the token's copies for experts on one GPU
    are made there. RDMA and NVLink traffic flow at once (the kernels forward as they
    receive): the step takes the longer of the two, plus one latency of each link.
    Destinations follow :func:`touched` on the model's routing groups; BF16 both ways
    (Megatron-Core's flex dispatcher; DeepSeek's own FP8 dispatch is not modelled)."""
    if g.size <= 1:
        return 0.0
    e, k = model.experts, model.top_k
    rg, rgk = model.route_groups, model.route_group_topk
    token = BF16_BYTES * model.expert_hidden * shard.norm_tokens * shard.expert_load
    domains, per_domain = g.domains, min(g.per_domain, g.size)
    nvl_copies = touched(e, k, g.size, rg, rgk) * (per_domain - 1) / per_domain
    nvl = token * nvl_copies / g.intra.effective_Bps
    if domains == 1:
        return g.intra.latency_s + nvl
    rdma_copies = touched(e, k, domains, rg, rgk) * (domains - 1) / domains
    rdma = token * rdma_copies / g.inter.effective_Bps
    return g.inter.latency_s + g.intra.latency_s + max(rdma, nvl)


def overlapped_passes(plan: Plan) -> float:
    """Share of a rank's forward (and backward) chunk passes that EP A2A overlap pairs with
    another micro-batch's pass: the 1F1B steady state. Megatron's interleaved schedule
    runs (pp - r - 1) * 2 + (vpp - 1) * pp warm-up forwards on rank r before it (as many
    cool-down backwards after); averaged over ranks, (pp - 1) + (vpp - 1) * pp of the
    m * vpp passes are unpaired. Without pipelining the first forward and last backward
    are (m - 1 of m paired)."""
    lay, m = plan.layout, plan.num_microbatches
    passes = m * lay.vpp
    alone = max(1, (lay.pp - 1) + (lay.vpp - 1) * lay.pp)
    return max(0.0, passes - alone) / passes


def overlap_exposed(plan: Plan, ep_f: float, ep_b: float, compute_f: float,
                    compute_b: float) -> tuple[float, float]:
    """(forward, backward) EP communication left exposed under Megatron-Core's EP A2A
    overlap (--overlap-moe-expert-parallel-comm with --delay-wgrad-compute, MCore 0.14;
    DeepSeek-V3's DualPipe pairs passes the same way, report Sec. 3.2.1): in the steady
    state a forward's dispatch and combine run under the paired backward's compute
    (input and the delayed weight gradients) and the backward's under the forward's,
    each costing the compute it runs beside the SMs its kernels hold
    (``dp.overlapped``); unpaired passes keep theirs."""
    share = overlapped_passes(plan)
    slow = plan.stack.comm_compute_slowdown
    return ((1 - share) * ep_f + share * dp.overlapped(ep_f, compute_b, slow),
            (1 - share) * ep_b + share * dp.overlapped(ep_b, compute_f, slow))
