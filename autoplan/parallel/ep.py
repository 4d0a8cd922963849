"""Expert parallel (GShard, Lepikhin et al. 2021) with expert tensor parallel, folded
over a stage's tp x cp x dp ranks as etp x ep x edp (Megatron-Core's MoE parallel
folding; torchtitan's rule): rules, the foldings the search tries, the token
dispatch/combine and the routed experts' weights per rank."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.descriptors.model import Model
from autoplan.kernels import comm
from autoplan.kernels.layer import BF16_BYTES, Shard
from autoplan.parallel.common import Rule, Scope, divisors

if TYPE_CHECKING:
    from autoplan.descriptors.space import SearchSpace
    from autoplan.plan import Layout, Plan


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
                yield dataclasses.replace(lay, ep=ep, etp=etp)


# ----------------------------------------------------------------------------- cost terms

def expert_load(plan: Plan) -> float:
    """Tokens of the busiest expert rank over the mean: the capacity factor where routing
    drops (and pads to) capacity, else the job's imbalance for dropless routing."""
    return plan.model.capacity_factor or plan.job.moe_imbalance


def layer_seconds(model: Model, shard: Shard, ep_group: comm.Group,
                  etp_group: comm.Group) -> float:
    """One direction's MoE communication of one layer: the all-to-all dispatching each
    routed token copy to its expert's rank and the one combining the outputs back
    (Lepikhin et al. 2021, GShard; Megatron-Core MoEAlltoAllTokenDispatcher), on the
    busiest rank's volume; with expert TP the dispatched tokens are all-gathered over
    etp ranks before the experts and reduce-scattered after. Not overlapped with
    compute (Megatron-LM's default)."""
    routed = BF16_BYTES * shard.routed_tokens(model) * model.hidden
    out = 2 * comm.all_to_all(routed, ep_group)
    if shard.etp > 1:
        gathered = routed * shard.etp
        out += comm.all_gather(gathered, etp_group) + comm.reduce_scatter(gathered, etp_group)
    return out
