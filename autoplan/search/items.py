"""What the search's best-first queue holds: groups (bundles of candidates sharing all
but their schedule, exchange and, in a bundle, recompute), candidates, and split
variants whose layer split is yet to be found. Each carries a bound valid for all it
stands for, tightened in steps (search/frontier.py)."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.plan import Layout, Plan, compile_replace
from autoplan.schedules import Schedule
from autoplan.search.partition import PartitionProblem
from autoplan.vocab import CpComm, Recompute, RecomputeModule

Sched = tuple[Schedule, int, bool]
"""(schedule, vpp, split): a schedule on so many chunks, as a split variant or not."""

Choice = tuple[Recompute, tuple[RecomputeModule, ...]]
"""A recompute choice: what a plan recomputes, and by module where selective (``Plan.
recompute_modules``; () with selective: the attention core)."""


@dataclass(frozen=True, slots=True)
class Group:
    """Plans that differ only in schedule, context-parallel exchange and (a bundle)
    recompute, under one ``bound``. Its bound is tightened in steps, each named by a flag:
    ``layout_bounded`` (its layout's bound counted), ``exact`` (its own group bound, not its
    layout's), ``memory_floored`` (the allocator's pressure at its memory floor charged;
    ``unpressured_bound`` holds the bound without it)."""

    bound: float
    key: tuple
    plan: Plan  # the group's 1F1B, vpp = 1 member
    schedules: tuple[Sched, ...]  # (schedule, vpp, split)
    cp_comms: tuple[CpComm, ...] = (CpComm.RING,)  # context-parallel exchanges to try
    exact: bool = False  # the bound is the group's own, not its layout's (:meth:`TimeBounds.group_bound`)
    runnable: tuple[Sched, ...] = ()  # those passing the schedule rules
    # once exact: its own bound without the allocator's pressure, which ``bound`` charges
    # at the group's memory floor (:meth:`MemoryFloors.memory_floor`)
    unpressured_bound: float = 0.0
    memory_floored: bool = False  # past the memory floor: ``bound`` charges its pressure
    # a bundle: the groups of ``plan`` at each of these recompute choices (and selective
    # recompute's module sets), one bound for all, ``plan`` at the first (the least in
    # rank, so the bundle comes up when its first group would); opened only if it comes
    # up (:meth:`Enumeration.unbundled`)
    recomputes: tuple[Choice, ...] = ()
    # ``bound`` counts its layout's bound (else its compute floor:
    # :meth:`TimeBounds.with_layout_bound`)
    layout_bounded: bool = True
    # ZeRO-3, before its layout bound is counted: ``bound`` counts its own compute floor
    # (1; else its layout's below ZeRO-3), then (2) the layout bound of the stages below 3
    steps: int = 0

    @property
    def size(self) -> int:
        return len(self.schedules) * len(self.cp_comms) * max(1, len(self.recomputes))


@dataclass(frozen=True, slots=True)
class Candidate:
    """One plan under its ``bound``: ``pending`` (its group's busiest-stage bound), then
    ``chain_counted`` (its schedule's critical chain counted) and ``fits`` (its memory
    checked, the allocator's pressure charged; ``unpressured_bound`` without it)."""

    bound: float
    key: tuple
    plan: Plan
    fits: bool = False  # its memory is checked (and its bound charges the pressure)
    chain_counted: bool = False  # its bound counts its schedule's critical chain
    # its bound is its group's busiest-stage bound: its own stage works, exact bound and
    # memory are yet to be worked out
    pending: bool = False
    # the bound without the allocator's pressure, where ``bound`` charges one already
    # (its group's memory floor's, before its own memory is known); None: ``bound``
    unpressured_bound: float | None = None

    @property
    def unpressured(self) -> float:
        """A step time the plan cannot beat before the allocator's pressure."""
        return self.bound if self.unpressured_bound is None else self.unpressured_bound


@dataclass(frozen=True, slots=True)
class Split:
    """A plan whose best uneven layer split is yet to be found (only if it can win)."""

    bound: float  # valid for every split, tightened in turn (:meth:`Frontier.realize`)
    key: tuple
    plan: Plan  # with the uniform split
    filled: bool = False  # the bound is its own schedule's, with the pipeline fill
    problem: PartitionProblem | None = None  # set once its bound accounts for memory


@dataclass(frozen=True, slots=True)
class Unopened:
    """A layout whose groups are yet to be generated (search/enumeration.py): its bound
    holds for every candidate of the layout (:meth:`TimeBounds.layout_mean_floor`), so its
    groups are worked out only if it comes up."""

    bound: float
    key: tuple
    base: Layout
    size: int  # the candidates it stands for (all it would generate)
    # what it opens into (:meth:`Enumeration.opened`): its schedules, ZeRO stages, sequence
    # parallelism and exchanges, and its candidates per ZeRO stage and per micro-batch
    choices: tuple = ()


@dataclass(frozen=True, slots=True)
class Block:
    """Layouts of one shard (tp, cp, ep, etp) at every pipeline degree and hybrid sharding
    (search/enumeration.py), yet to be looked into: its bound holds for every candidate of
    each (:meth:`TimeBounds.block_floor`), so its layouts are bounded (and their rules
    asked) only if it comes up."""

    bound: float
    key: tuple
    layouts: tuple[tuple[Layout, tuple], ...]  # each with its choices (``Unopened.choices``)
    size: int  # the candidates its layouts stand for


# ``dataclasses.replace`` of a group and of a candidate, as straight-line code: the queue
# replaces them tens of thousands of times a search (``plan.compile_replace``)
evolve_group = compile_replace(Group)
evolve_candidate = compile_replace(Candidate)
