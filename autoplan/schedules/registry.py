"""The pipeline schedules autoplan knows, by name, as torchtitan picks them by name.

One file per schedule (``schedules/gpipe.py``, ``one_f_one_b.py``, ...) registers a
:class:`ScheduleSpec`: its per-stage operation order, how many model chunks a stage holds,
whether it runs the backward's input and weight gradients apart, its peak in-flight count
in closed form (or none: the order is walked), its shape rule, and the names launchers run
it by. Everything else (the simulator, the memory walk, the search's bounds, the plan
rules, the exports and ``validate``) reads the spec, never a schedule's name, so adding a
schedule is one file (``tests/unit/test_schedule_registry.py`` adds one).

:class:`Schedule` is the value a plan holds: an open enumeration of the registered names
(``autoplan.registry.Named``: a ``str``, iterable in registration order,
``Schedule("1f1b")`` looks one up and raises ``ValueError`` for an unknown name), carrying
its spec's flags for the search's hot paths.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from autoplan.registry import Named

Op = tuple[str, int, int]
"""(kind, microbatch, chunk): "F" forward, "B" input-gradient backward (the whole backward
where the schedule fuses B and W), "W" weight-gradient backward."""


class Chunks(enum.Enum):
    """Model chunks a stage holds, and where chunk c of stage s sits among the p * v."""

    ONE = "one"
    """One chunk: stage s is virtual stage s."""
    LAYOUT = "layout"
    """The layout's vpp chunks, c * p + s (interleaved; Narayanan et al. 2021)."""
    V = "v"
    """Two chunks, down the stages and back: (s, 0) is s, (s, 1) is 2p - 1 - s (Qi et al.
    2024b, Sec. 6)."""


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """Everything autoplan needs of one pipeline schedule."""

    name: str  # as plan files, search spaces and ``--space`` lists spell it
    attr: str  # its Python name (``Schedule.ONE_F_ONE_B``)
    doc: str
    chunks: Chunks
    splits_backward: bool  # runs B and W as separate operations (zero-bubble schedules)
    # stage s's operation order for (s, p, m, v); p, m and v already checked
    stage_order: Callable[[int, int, int, int], Iterable[Op]]
    # most (microbatch, chunk) activations stage s of p holds, in closed form, for (p, m, v, s);
    # None: walked from the order (``schedules.memory.peak_inflight``)
    peak_inflight: Callable[[int, int, int, int], int] | None = None
    p_divides_m: bool = False  # only for microbatch counts that are multiples of p
    torch_class: str | None = None  # torch.distributed.pipelining class ``validate`` runs it with
    torch_multi_stage: bool = False  # that class takes a list of stages (PipelineScheduleMulti)
    torchtitan: str | None = None  # torchtitan's ``pipeline_parallel_schedule`` name
    # each chunk runs every microbatch before the stage moves to its next chunk, so a
    # ZeRO-3 stage gathers a chunk's parameters once a step, not once a microbatch
    # (breadth-first pipelines, Lamy-Poirier 2023: ``cost.stage``)
    breadth_first: bool = False

    @property
    def v_shape(self) -> bool:
        return self.chunks is Chunks.V


class Schedule(Named):
    """A registered pipeline schedule (module doc). Compares and hashes as its name."""

    KIND = "pipeline schedule"
    spec: ScheduleSpec
    splits_backward: bool  # B and W separate (the spec's, kept here: the search asks often)
    v_shape: bool  # two chunks per stage, down and back
    breadth_first: bool  # every microbatch through a chunk before the next chunk

    # the built-in schedules, registered by their files (autoplan/schedules/__init__.py)
    GPIPE: ClassVar[Schedule]
    ONE_F_ONE_B: ClassVar[Schedule]
    INTERLEAVED: ClassVar[Schedule]
    ZB_H1: ClassVar[Schedule]
    ZB_H2: ClassVar[Schedule]
    ZB_V: ClassVar[Schedule]
    V_HALF: ClassVar[Schedule]
    V_MIN: ClassVar[Schedule]
    BFPP: ClassVar[Schedule]



def register(spec: ScheduleSpec) -> Schedule:
    """Make ``spec`` a schedule every part of autoplan takes (its name must be new)."""
    schedule = Schedule._add(spec.name, spec.attr, spec)
    schedule.splits_backward = spec.splits_backward
    schedule.v_shape = spec.v_shape
    schedule.breadth_first = spec.breadth_first
    return schedule


def unregister(schedule: Schedule) -> None:
    """Forget a schedule (tests that register one of their own)."""
    Schedule._remove(schedule, schedule.spec.attr)


def representative(splits_backward: bool, v_shape: bool, breadth_first: bool = False) -> Schedule:
    """The first registered schedule with these flags: what a stage's work reads of any
    schedule (``cost.stage.cost_key``), so schedules alike share one memo."""
    for schedule in Schedule:
        if (schedule.splits_backward == splits_backward and schedule.v_shape == v_shape
                and schedule.breadth_first == breadth_first):
            return schedule
    raise ValueError(f"no schedule registered with splits_backward={splits_backward}, "
                     f"v_shape={v_shape}, breadth_first={breadth_first}")
