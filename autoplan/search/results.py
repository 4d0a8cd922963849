"""What a search returns and how it ranks: the ranked plans, the statistics of what it
generated, pruned (by rule id: a rule of a valid plan, or the search's own pruning) and
found infeasible, the 'smallest plan' message where nothing fits, and the rank keys."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from autoplan.cost.bounds import memory_shortfall
from autoplan.parallel.rules import BY_ID
from autoplan.plan import Memory, Plan, Prediction
from autoplan.vocab import CpComm, MasterWeights, RecomputeModule, StateDtype

BOUND = "bound"
HOST_MEMORY = "offload exceeds the host's memory"
SPLIT_IS_UNIFORM = "split-is-uniform"
ZERO_UNSHARDED = "zero-unsharded"
OUTSIDE_SPACE = "space"
SEARCH_PRUNING = {
    BOUND: "cannot enter the top k",
    SPLIT_IS_UNIFORM: "best layer split is the uniform one (evaluated as such)",
    OUTSIDE_SPACE: "outside the search space's launcher rules",
    ZERO_UNSHARDED: "the same plan as a lower ZeRO stage (dp x cp and expert dp are 1: nothing to shard)",
}
"""Pruning that is the search's own (not a rule of a valid plan), by id."""


def pruning_reason(rule_id: str) -> str:
    """What a pruned-by id in ``SearchStats.pruned`` means."""
    rule = BY_ID.get(rule_id)
    return rule.summary if rule is not None else SEARCH_PRUNING[rule_id]


@dataclass(frozen=True, slots=True)
class Ranked:
    plan: Plan
    prediction: Prediction


class Ceiling(Protocol):
    """What a caller wants of a search beyond its best plan (``engine.search``): told of
    each plan found, the step time past which it wants no more plans (a sweep: those no
    plan of which can enter its top k by its own objective). The search keeps its best
    plan whatever the answer, and may ask again later: the answer may fall as the caller
    learns more."""

    def __call__(self, found: Ranked, /) -> float: ...


@dataclass(slots=True)
class SearchStats:
    generated: int = 0
    pruned: Counter = field(default_factory=Counter)  # rule id (see pruning_reason) -> candidates
    infeasible: Counter = field(default_factory=Counter)  # reason -> candidates
    evaluated: int = 0

    def merge(self, other: SearchStats) -> None:
        """Add ``other``'s counts to these."""
        self.generated += other.generated
        self.pruned.update(other.pruned)
        self.infeasible.update(other.infeasible)
        self.evaluated += other.evaluated

    def to_dict(self) -> dict:
        return {"generated": self.generated, "pruned": dict(sorted(self.pruned.items())),
                "infeasible": dict(sorted(self.infeasible.items())), "evaluated": self.evaluated}


@dataclass(frozen=True, slots=True)
class SearchResult:
    plans: tuple[Ranked, ...]  # best first
    stats: SearchStats
    closest: tuple[Plan, int, Memory] | None  # lowest-memory candidate, its fullest stage

    def why_none(self) -> str:
        if self.closest is None:
            rules = "; ".join(f"{n} by {r} ('{pruning_reason(r)}')"
                              for r, n in self.stats.pruned.most_common())
            return f"no candidate passes the divisibility rules ({rules or 'no candidates'})"
        plan, stage, mem = self.closest
        lay = plan.layout
        return (f"no plan fits in memory: the smallest plan (dp{lay.dp} tp{lay.tp} pp{lay.pp} "
                f"cp{lay.cp}{f' ep{lay.ep}' if lay.ep > 1 else ''}, micro_batch {plan.micro_batch}, "
                f"recompute {plan.recompute_label}, "
                f"zero {int(plan.zero)}{_offload_words(plan)}) "
                + memory_shortfall(plan, stage, mem, plan.cluster.device.mem_bytes))


def _offload_words(plan: Plan) -> str:
    off = plan.offload
    if not off.any:
        return ""
    parts = (["optimizer"] if off.optimizer else []) + (
        [f"{off.activations:.0%} of activations"] if off.activations else [])
    return ", offloading " + " and ".join(parts)


def rank_key(plan: Plan, pred: Prediction) -> tuple:
    """Faster first; then less memory; then the simpler plan, deterministically."""
    return (round(pred.step_time_s, 12), round(pred.memory.peak), *rank_key_static(plan))


def rank_key_static(plan: Plan) -> tuple:
    """The simpler plan first, deterministically: then the attention core alone before
    other module sets, no EP overlap before it, fp32 states before bf16."""
    lay, states = plan.layout, plan.states
    return (lay.tp, lay.pp, lay.cp, lay.vpp, plan.schedule.rank,
            plan.recompute.level, int(plan.zero), not plan.sequence_parallel, plan.micro_batch,
            lay.ep, lay.etp, _CP_COMM_ORDER[plan.cp_comm], plan.offload.optimizer,
            plan.offload.activations, module_rank(plan.recompute_modules),
            plan.ep_overlap, states.main_grads is StateDtype.BF16,
            states.optimizer_states is StateDtype.BF16, _MASTER_ORDER[states.master_weights])


_CP_COMM_ORDER = {c: i for i, c in enumerate(CpComm)}
_MASTER_ORDER = {m: i for i, m in enumerate(MasterWeights)}  # a full fp32 master first
_MODULE_ORDER = {m: i for i, m in enumerate(RecomputeModule)}


def module_rank(modules: tuple[RecomputeModule, ...]) -> tuple[int, ...]:
    """The order of selective recompute's module sets in rank: the attention core alone
    (()) first."""
    return tuple(_MODULE_ORDER[m] for m in modules)
