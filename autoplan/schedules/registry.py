"""The pipeline schedules autoplan knows, by name, as torchtitan picks them by name.

One file per schedule (``schedules/gpipe.py``, ``one_f_one_b.py``, ...) registers a
:class:`ScheduleSpec`: its per-stage operation order, how many model chunks a stage holds
and where they sit, whether it runs the backward's input and weight gradients apart,
whether it runs breadth-first, its peak in-flight count in closed form (or none: the order
is walked), its shape rule, and the names launchers run it by. The simulator and the
memory walk (here) read those; everything else (the cost model, the search's bounds, the
plan rules, the exports and ``validate``) asks the spec's questions, never a schedule's
name nor its flags: its methods answer each question they ask (what stage work reads of it,
:attr:`ScheduleSpec.work_key`; the output layer's stage; the sends per stage; the chunk
counts the search tries; the drain the bounds count; what backward TP hides behind; how
often ZeRO-3 gathers; which schedules the search chains or splits unevenly; the torch
kinds of its operations), each citing where its formula comes from. So adding a schedule
is one file (``tests/unit/test_schedule_spec.py`` adds one in a test and counts the
places outside ``schedules/`` that read a flag: none).

:class:`Schedule` is the value a plan holds: an open enumeration of the registered names
(``autoplan.registry.Named``: a ``str``, iterable in registration order,
``Schedule("1f1b")`` looks one up and raises ``ValueError`` for an unknown name), carrying
its spec's flags for ``schedules/`` and the tests.
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

    # -- what the cost model and the search ask of a schedule --------------------------
    # (each a question of theirs, answered from the fields above; outside ``schedules/``
    # only the rules of chunk placement read ``chunks`` itself: ``parallel.pp``)

    @property
    def work_key(self) -> tuple[bool, bool, bool]:
        """What a stage's work reads of the schedule (``cost.stage.cost_key``), so that
        schedules alike in it share one memo (:func:`alike`): whether W runs apart (the
        backward TP it exposes: :attr:`hides_tp_behind_w`), whether its chunks run in a V
        (where layers and the output layer sit: :meth:`output_stage`, :meth:`sends`) and
        whether a ZeRO-3 stage gathers once a step (:attr:`gathers_once_a_step`)."""
        return (self.splits_backward, self.v_shape, self.breadth_first)

    # placement

    @property
    def looping(self) -> bool:
        """Chunk c of stage s is virtual stage c p + s (the "looping" placement of
        Lamy-Poirier 2023, Sec. 3; Narayanan et al. 2021's interleaving; stage s itself
        with one chunk: ``orders.virtual_stage``): the model's last chunk, with the output
        layer and the logits, sits on stage p - 1; Megatron's per-chunk layout
        (--pipeline-model-parallel-layout, chunk k of stage s is virtual stage k p + s)
        expresses an uneven split of it; a plan across pools runs it one chunk a stage, in
        model order. The search's bounds call these schedules flat. False for a V, whose
        chunk 1 comes back up the stages (Qi et al. 2024b, Sec. 6)."""
        return self.chunks is not Chunks.V

    def chunk_counts(self, vpp_max: int) -> tuple[int, ...]:
        """The model chunks per stage the search tries it at (``pp.schedule_choices``):
        2 to the space's ``vpp_max`` where it takes the layout's (one chunk is 1F1B;
        Megatron-LM's interleaved schedule needs vpp >= 2), 2 in a V (down and back, Qi et
        al. 2024b, Sec. 6), else 1."""
        if self.chunks is Chunks.LAYOUT:
            return tuple(range(2, vpp_max + 1))
        return (2,) if self.chunks is Chunks.V else (1,)

    def output_stage(self, p: int) -> int:
        """The stage holding the output layer and the logits, that of the model's last
        virtual stage (``orders.virtual_stage``): p - 1 where it loops; stage 0 in a V,
        whose last chunk comes back to it (Qi et al. 2024b, Sec. 6: ZB-V's output layer
        shares stage 0 with the embedding)."""
        return p - 1 if self.looping else 0

    def sends(self, p: int, v: int, stage: int) -> tuple[int, int]:
        """Activation sends (forward) and gradient sends (backward) of stage ``stage`` of
        ``p`` per microbatch, at ``v`` chunks a stage (``pp.sends``): every chunk hands
        its output to the next virtual stage, except the model's last chunk (forward) and
        first (backward); looping chunks wrap from stage p - 1 to stage 0 (Megatron-LM's
        interleaved schedule: each of the v chunks sends, stage p - 1's last and stage 0's
        first do not); in a V the turning stage passes chunk 0 to its own chunk 1 without
        a send, so the end stages send once each way and the others twice (Qi et al.
        2024b, Sec. 6)."""
        if p == 1:
            return 0, 0
        if not self.looping:
            both = (stage < p - 1) + (stage > 0)
            return both, both
        return (v - 1 if stage == p - 1 else v), (v - 1 if stage == 0 else v)

    # the backward

    @property
    def op_kinds(self) -> tuple[str, ...]:
        """The operations its orders emit (:data:`Op`): F, B (input gradients) and W
        (weight gradients) where it runs W apart (zero bubble, Qi et al. 2024, Sec. 2); F
        and B, the whole backward, where it fuses them. torch.distributed.pipelining's
        schedule CSV (``_PipelineScheduleRuntime._load_csv``) calls the first kind of B
        "I", the second "B"; ``validate --slice`` runs the second alone."""
        return ("F", "B", "W") if self.splits_backward else ("F", "B")

    @property
    def drain_counts_w(self) -> bool:
        """Whether the drain after a stage's forwards counts the weight gradients: where B
        and W run as one backward (GPipe, 1F1B, interleaved) the last gradient crosses the
        earlier stages in their whole backwards, (m + p - 1)(f + b) with uniform stages
        (Narayanan et al. 2021, Sec. 2.2); where W runs apart the zero-bubble schedules
        fill the drain with it, so the chain counts B alone (Qi et al. 2024, Sec. 2). Read
        by ``cost.bounds.step_time_lower_bound`` (term 2), ``busiest_stage_bound``
        (``fused``), the partitioner's fill (``search.stages``) and the search's bounds."""
        return not self.splits_backward

    @property
    def hides_tp_behind_w(self) -> bool:
        """Whether the backward's TP collectives hide behind its weight-gradient GEMMs:
        Megatron-LM overlaps the input gradient's all-reduce (reduce-scatter with SP) with
        the wgrad GEMM (``LinearWithGradAccumulationAndAsyncCommunication``) and Transformer
        Engine's userbuffers run the dgrad reduce-scatter in bulk beside wgrad
        (``tp.userbuffers_exposed``); a schedule that defers W to fill bubbles (Qi et al.
        2024) leaves them nothing to hide behind (``tp.exposed_backward``, ``cost.stage``,
        the search's drained sync)."""
        return not self.splits_backward

    # ZeRO-3

    @property
    def gathers_once_a_step(self) -> bool:
        """Whether a ZeRO-3 stage gathers each chunk's parameters (and reduce-scatters its
        gradients) once a step rather than once a microbatch: each chunk runs every
        microbatch before the stage moves to the next chunk, so the gather and the
        reduce-scatter hide behind m microbatches of compute (breadth-first pipelines,
        Lamy-Poirier 2023, Sec. 3). The search bounds such schedules off their own works
        (``search.bound``)."""
        return self.breadth_first

    def zero3_passes(self, m: int) -> int:
        """ZeRO-3 parameter passes per step of m microbatches (a chunk's all-gather before
        its forward and again before its backward, and its gradients' reduce-scatter):
        one per microbatch depth-first (DeepSpeed and FSDP gather per forward and
        backward), one a step where it :attr:`gathers_once_a_step` (Lamy-Poirier 2023,
        Sec. 3). ``cost.stage`` charges each pass behind m / passes microbatches of the
        chunk's compute."""
        return 1 if self.gathers_once_a_step else m

    # what the search does with it

    @property
    def uneven_splits(self) -> bool:
        """Whether the search tries it with uneven layer splits (``pp.schedule_choices``'
        split variants, the partitioner's): where it loops, so a per-chunk layout expresses
        the split in Megatron's order (:attr:`looping`), and runs depth-first: a
        breadth-first schedule runs uniform stages, its ZeRO-3 passes bounded off its own
        works (``search.bound``)."""
        return self.looping and not self.breadth_first

    @property
    def chain_bounded(self) -> bool:
        """Whether the search bounds its candidates by the schedule's own critical chain
        (``simulator.critical_chain``, ``cost.bounds.chain_bound``) before simulating
        them: the V schedules. V-Half and V-Min hold microbatches back to save memory:
        their bubbles exceed the fill and drain of ``step_time_lower_bound`` (by 16-40% on
        GPT-3 175B / 1024 A100); ZB-V's, its output layer on stage 0, by 1-3% there, and
        its chain cuts the plans simulated from 92 to 74. The looping schedules' chains cut
        none, at more cost than the simulations they would save (seven searches of the
        golden check: ``search.frontier``)."""
        return self.v_shape

    # launchers

    @property
    def torchtitan_schedule(self) -> str:
        """torchtitan's ``pipeline_parallel_schedule`` for it: its own class's name where
        torch has one; else a class of the same stage placement
        (``pipeline_module_split``: ZBVZeroBubble places stages in a V,
        PipelineScheduleMulti in a loop), the order then coming from a schedule CSV
        (``export.torchtitan.schedule_csv``)."""
        if self.torchtitan is not None:
            return self.torchtitan
        return "PipelineScheduleMulti" if self.looping else "ZBVZeroBubble"


class Schedule(Named):
    """A registered pipeline schedule (module doc). Compares and hashes as its name."""

    KIND = "pipeline schedule"
    spec: ScheduleSpec  # what the rest of autoplan asks of it (its questions: ScheduleSpec)
    # the spec's flags, for ``schedules/`` and the tests (elsewhere the spec's questions)
    splits_backward: bool  # B and W separate
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
    """The first registered schedule whose :attr:`ScheduleSpec.work_key` is these flags:
    what a stage's work reads of any schedule (``cost.stage.cost_key``), so schedules alike
    share one memo."""
    key = (splits_backward, v_shape, breadth_first)
    for schedule in Schedule:
        if schedule.spec.work_key == key:
            return schedule
    raise ValueError(f"no schedule registered with splits_backward={splits_backward}, "
                     f"v_shape={v_shape}, breadth_first={breadth_first}")


def alike(schedule: Schedule) -> Schedule:
    """The first registered schedule whose stage works are ``schedule``'s (the same
    :attr:`ScheduleSpec.work_key`: :func:`representative`)."""
    return representative(*schedule.spec.work_key)
