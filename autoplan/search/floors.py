"""Memory floors of the search's items, decided before any pipeline simulation: the
model states of a layout's fullest stage (no micro-batch or recompute can help where
they do not fit), a group's memory floor (no member needs less), and a candidate's own
fullest stage; with the allocator's pressure each charges a fitting candidate's bound,
and the least-memory plan noted for the 'smallest plan' message where nothing fits.
``tests/unit/test_bounds.py`` holds each floor to the evaluated peaks of its members."""

from __future__ import annotations

import enum

from autoplan.cost.bounds import (
    StageWork,
    dense_per_stage,
    memory_pressure,
    output_stage,
    stage_memory,
    stage_state_params,
    stage_work,
    state_bytes_of,
    step_overhead,
)
from autoplan.cost.stage import (
    activation_terms,
    held_in_equal_chunks,
    memory_with,
    offloaded_chunk_bytes,
    stage_work_for,
)
from autoplan.descriptors.job import Job
from autoplan.descriptors.precision import StatePrecision
from autoplan.parallel.dp import PRESSURE_START
from autoplan.plan import Layout, Memory, Plan
from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_inflight
from autoplan.search.context import Context
from autoplan.search.items import Candidate, Group, Sched
from autoplan.search.results import HOST_MEMORY, SearchStats, rank_key_static
from autoplan.vocab import Offload, Recompute, ZeroStage


def _fullest_stages(plan: Plan, works: tuple[StageWork, ...]) -> list[tuple[int, int]]:
    """(stage, in-flight count) of the stages that can hold the most memory: among stages
    with the same work and position class (first, middle, last), memory grows only with
    the in-flight count, so the first stage holding the most stands for them. In-flight
    counts need not fall with the stage index (V-Min), so every stage is looked at."""
    lay, m, out = plan.layout, plan.num_microbatches, output_stage(plan)
    best: dict[tuple[bool, bool, StageWork], tuple[int, int]] = {}
    for s, w in enumerate(works):
        n = peak_inflight(plan.schedule, lay.pp, m, lay.vpp, s)
        key = (s == 0, s == out, w)
        if key not in best or n > best[key][1]:
            best[key] = (s, n)
    return list(best.values())


class States(enum.Enum):
    """:meth:`MemoryFloors.states_verdict`."""

    FIT = 0
    EXCEED = 1  # for good: a plan holding less is noted
    NOTED = 2  # asked of each plan: the least noted so far may be its


class MemoryFloors:
    """The memory side of one search: what does not fit is counted in ``stats`` (and the
    plan needing the least noted in ``closest``); the floors' memos."""

    def __init__(self, ctx: Context, stats: SearchStats):
        self.ctx, self.stats = ctx, stats
        self.capacity = ctx.capacity  # the allocator's pressure is relative to it
        self.limit = ctx.limit  # what a plan's peak may reach
        # (peak, rank key, plan, fullest stage, its memory) of the plan needing the least
        # memory noted so far (:meth:`note_closest`)
        self.closest: tuple[float, tuple, Plan, int, Memory] | None = None
        self._fullest_states: dict[tuple[Layout, ZeroStage, bool, StatePrecision],
                                   tuple[float, int, Memory]] = {}
        self._layout_params: dict[Layout, tuple[tuple[int, float, float], ...]] = {}
        self._fewest_memo: dict[tuple, tuple[tuple[int, int, int, Schedule], ...]] = {}
        self._every_memo: dict[tuple, tuple[tuple[int, int, int, Schedule], ...]] = {}
        self._fullest_memo: dict[tuple, tuple[tuple[StageWork, ...], list[tuple[int, int]]]] = {}
        # (what a group's members' activations depend on) -> (stage, work, activations,
        # moved to host) of the members holding the least activations on stages 0 and
        # last, of each kind (:meth:`memory_floor`)
        self._floor_members: dict[tuple, tuple[tuple[int, StageWork, float, float], ...]] = {}
        # (layout, split, chunks, V chunks and kind or None: flat) -> per-stage works, any member's:
        # the floor reads their layers and parameters, the same for every micro-batch, SP,
        # recompute, exchange, ZeRO stage and offload (:meth:`memory_floor`)
        self._shape_works: dict[tuple, tuple[StageWork, ...]] = {}
        self._split_caps: dict[tuple, tuple[int, ...]] = {}  # :meth:`split_caps`

    # -- a layout's model states --------------------------------------------------------
    def states_verdict(self, lay: Layout, zero: ZeroStage, off: Offload, mbs: int,
                       sp: bool, job: Job | None = None) -> States:
        """Whether the weights, grads and optimizer states of the fullest stage (no
        activations) plus the reserve exceed the device, where no micro-batch or recompute
        can help: they fit; they exceed and a plan holding less is noted for the 'smallest
        plan needs ...' message already (the same for every micro-batch and SP, whenever
        asked again: the noted plan only ever holds less); or they exceed, the plan noted if
        it holds the least so far. The states depend on the layout, ZeRO, the job's states
        (``job``: the search's where None) and the optimizer's offload only: worked out once
        for every micro-batch and SP."""
        job = job or self.ctx.job
        key = (lay, zero, off.optimizer, self.ctx.states(job, zero))
        worst = self._fullest_states.get(key)
        if worst is None:
            worst = self._fullest_states[key] = self._fullest_state(lay, zero, off.optimizer, job)
        if worst[0] <= self.limit:
            return States.FIT
        if self.closest is not None and worst[0] > self.closest[0]:
            return States.EXCEED  # the 'smallest plan' already noted holds less
        ctx = self.ctx
        plan = Plan(model=ctx.model, cluster=ctx.cluster, job=job, stack=ctx.space.stack, layout=lay,
                    micro_batch=mbs, schedule=Schedule.ONE_F_ONE_B, recompute=Recompute.FULL,
                    zero=zero, sequence_parallel=sp, offload=off)
        self.note_closest(plan, worst[1], worst[2])
        return States.NOTED

    def fullest_states(self, lay: Layout, zero: ZeroStage, optimizer_offloaded: bool,
                       job: Job | None = None) -> float | None:
        """The peak of the fullest stage's model states of the layout at ``zero`` and
        ``job``'s states (the search's where None; the optimizer's states offloaded or
        not), where :meth:`states_verdict` has worked it out; None where it has not."""
        job = job or self.ctx.job
        worst = self._fullest_states.get((lay, zero, optimizer_offloaded,
                                          self.ctx.states(job, zero)))
        return None if worst is None else worst[0]

    def _fullest_state(self, lay: Layout, zero: ZeroStage, optimizer_offloaded: bool,
                       job: Job) -> tuple[float, int, Memory]:
        """(peak, stage, memory) of the layout's stage holding the most model state at
        ``zero`` and ``job``'s states, its optimizer's states offloaded or not."""
        reserve = self.ctx.cluster.device.reserve_bytes
        shards, edp = lay.dp_shard * lay.cp, lay.edp
        worst: tuple[float, int, Memory] | None = None
        for s, params, experts in self._state_params(lay):
            st = state_bytes_of(job.dtype, self.ctx.states(job, zero), zero, shards, edp,
                                optimizer_offloaded, params, experts)
            mem = Memory(weights=st.weights, grads=st.grads, optimizer=st.optimizer,
                         activations=0.0, other=reserve)
            if worst is None or mem.peak > worst[0]:
                worst = (mem.peak, s, mem)
        assert worst is not None
        return worst

    def _state_params(self, lay: Layout) -> tuple[tuple[int, float, float], ...]:
        """(stage, non-expert parameters, expert parameters) of the layout's stages that
        can hold the most model state, whatever its ZeRO stage: its first, its last, and
        the one with the most MoE layers (then the most layers). Per layout."""
        hit = self._layout_params.get(lay)
        if hit is None:
            probe = self.ctx.probe(lay)
            layers, dense = probe.stage_layers, dense_per_stage(probe)
            last = lay.pp - 1
            heaviest = max(range(lay.pp), key=lambda i: (layers[i] - dense[i], layers[i]))
            hit = self._layout_params[lay] = tuple(
                (s, *stage_state_params(self.ctx.model, lay, s == 0, s == last, layers[s],
                                        dense[s]))
                for s in sorted({0, last, heaviest}))
        return hit

    def note_closest(self, plan: Plan, stage: int, mem: Memory) -> None:
        """Keep the plan for the 'smallest plan' message if it needs less than the one kept
        (ties: the first in rank)."""
        key = (mem.peak, rank_key_static(plan))
        if self.closest is None or key < self.closest[:2]:
            self.closest = (mem.peak, key[1], plan, stage, mem)

    # -- a candidate's memory -----------------------------------------------------------
    def checked(self, item: Candidate) -> Candidate | None:
        """The candidate with its memory checked: None (and counted) when it does not fit,
        else its bound with the allocator's pressure, which grows with the step and the
        peak (charged without the stack's fixed overhead, as evaluate charges it). A plan
        of chunks of their own sizes whose stages' memory at most (:meth:`_roomy`) leaves
        the allocator no pressure fits so, its chunks' order left unwalked."""
        works = stage_work(item.plan)
        roomy = self._roomy(item.plan, works)
        if roomy is not None:
            return self._fitted(item, roomy)
        worst = self._fitting_memory(item.plan, works)
        return None if worst is None else self._fitted(item, worst)

    def _roomy(self, plan: Plan, works: tuple[StageWork, ...]) -> Memory | None:
        """Memory at least every stage's of a plan with a per-chunk layout (no activation
        offload), where it fits below the allocator's pressure (and the host holds what it
        keeps there); None otherwise (its fullest stage is then found by walking its
        chunks' order, ``peak_held``). A stage holds at most its most microbatch-chunks
        in flight (``peak_inflight``) of its heaviest chunk's activations
        (``offloaded_chunk_bytes``)."""
        if plan.chunks is None or plan.offload.activations:
            return None
        lay, m = plan.layout, plan.num_microbatches
        working = activation_terms(plan).working
        most: Memory | None = None
        host = 0.0
        for s, work in enumerate(works):
            held = peak_inflight(plan.schedule, lay.pp, m, lay.vpp, s) * offloaded_chunk_bytes(
                plan, s, work)
            mem = memory_with(plan, work, held + working, 0.0)
            host = max(host, mem.host)
            if most is None or mem.peak > most.peak:
                most = mem
        assert most is not None
        capacity = self.ctx.cluster.host_mem_bytes
        if (most.peak > min(self.limit, PRESSURE_START * self.capacity)
                or (capacity is not None and self.ctx.cluster.gpus_per_node * host > capacity)):
            return None
        return most

    def _fitted(self, item: Candidate, worst: Memory) -> Candidate:
        """The candidate known to fit, its pressure-free bound charged the pressure of its
        peak (at least what its group's floor charged: the peak is no lower)."""
        unpressured = item.unpressured
        pressure = memory_pressure(unpressured - step_overhead(item.plan), worst.peak, self.capacity)
        return Candidate(max(item.bound, unpressured + pressure), item.key, item.plan, fits=True,
                         chain_counted=item.chain_counted)

    def _fitting_memory(self, plan: Plan, works: tuple[StageWork, ...]) -> Memory | None:
        """The memory of the plan's fullest stage, or None (counted, and noted for the
        'smallest plan' message) when it exceeds the device. ``works`` need only hold the
        plan's per-stage layers and parameters: those of any schedule of its layout but
        a V (which moves the output layer to stage 0), at any vpp."""
        stage, worst, host = self._fullest_and_host(plan, works)
        if worst.peak > self.limit:
            self.stats.infeasible[self.why_not(worst)] += 1
            self.note_closest(plan, stage, worst)
            return None
        capacity = self.ctx.cluster.host_mem_bytes
        if capacity is not None and self.ctx.cluster.gpus_per_node * host > capacity:
            # the host memory an offloading plan takes per node (every GPU of a node as
            # the fullest stage's, as ``evaluate`` counts it) does not fit the cluster's
            self.stats.infeasible[HOST_MEMORY] += 1
            return None
        return worst

    def why_not(self, mem: Memory) -> str:
        """Why ``mem``, past the limit, does not fit: its model states alone, or with them
        its activations."""
        static = mem.weights + mem.grads + mem.optimizer + mem.other
        return "model states exceed memory" if static > self.limit else "activations exceed memory"

    # -- a group's memory floor ---------------------------------------------------------
    def memory_floor(self, group: Group) -> Memory | None:
        """Memory no member of the group needs less than (None where this does not say:
        a group with split variants, whose layer splits move memory between stages).

        A member's peak is its fullest stage's, so at least what it holds on any one
        stage s; so the most, over s in {0, last}, of the least any member holds on s
        bounds every member's peak from below. On s, a member of v equal chunks holding
        n microbatch-chunks in flight (``peak_inflight``) holds its weights, gradients and
        optimizer states (the same for every schedule but a V, whose stage 0 holds the
        output layer), n/v of the stage's activations per microbatch and, on the first
        and output stage, ceil(n/v) microbatches' embedding output and logits
        (``stage_memory``): all growing with n/v, so the member with the fewest
        microbatches in flight, n/v, holds the least of the flat schedules, and the one
        with the fewest chunks in flight of the V schedules (``stage_memory`` of that
        member is then the least on s). Schedules that break a schedule rule are no
        members. ``test_bounds`` checks the floor against every member's evaluated peak."""
        lay = group.plan.layout
        if group.plan.offload.activations:
            # offloaded activations keep 1 + (n - 1)(1 - a) chunks of n: the fewest in
            # flight need not hold the least, so every member is asked
            fewest = self._every_inflight(lay, group.plan.num_microbatches, group.schedules)
        else:
            fewest = self._fewest_inflight(lay, group.plan.num_microbatches, group.schedules)
        if not fewest:
            return None
        # Members of one kind (flat, or V) hold the same model states on a stage, whatever
        # their ZeRO stage or optimizer offload: the one holding the least activations
        # there holds the least. Which one that is, and what activations it holds, depend
        # on neither: found once for the groups alike but for them, whose floor then adds
        # only their own states (``memory_with``).
        plan = group.plan
        alike = (lay, plan.micro_batch, plan.sequence_parallel, plan.recompute,
                 plan.recompute_modules, plan.cp_comm, plan.offload.activations, group.schedules)
        known = self._floor_members.get(alike)
        if known is None:
            known = self._floor_members[alike] = self._least_held(plan, fewest)
        least: dict[int, Memory] = {}  # stage -> the least any member holds there
        for s, work, held, moved in known:
            mem = memory_with(plan, work, held, moved)  # stage_memory(at, s, work, n)
            if s not in least or mem.peak < least[s].peak:
                least[s] = mem
        return max(least.values(), key=lambda mem: mem.peak)

    def split_caps(self, group: Group) -> tuple[int, ...] | None:
        """Most layers each stage of any uneven split of any of the group's split variants
        (passing the schedule rules) holds in the device's memory, as the partitioner's
        problem weighs them (``stages.partition_problem``: linear in a stage's layers, at
        the stage's microbatch-chunks in flight, ``peak_inflight``, over its chunk count);
        None where the group has none. Per stage, the least over the variants of a stage
        of one layer and of what each more layer, by kind, adds (the states alike, the
        activations at the fewest in flight per chunk): its x lightest layers at those
        bound what x layers weigh on it in each variant's problem, so a variant whose
        stages cannot hold every layer this way (:func:`stages.layer_caps`) has no split
        that fits. Read off the group's 1F1B, vpp = 1 plan (the same layers and states)."""
        plan = group.plan
        lay, m = plan.layout, plan.num_microbatches
        p, rules = lay.pp, self.ctx.schedule_rule
        members = [(sched, v) for sched, v, split in group.schedules
                   if split and not rules[(p, m, sched, v, split)]]
        if not members:
            return None
        key = (plan, tuple(members))
        hit = self._split_caps.get(key)
        if hit is not None:
            return hit
        model, terms = plan.model, activation_terms(plan)
        dense = model.layers - model.moe_layers if 0 < model.moe_layers < model.layers else 0
        mid = min(1, p - 1)
        works: dict[tuple[int, int, int], StageWork] = {}  # (class, layers, dense) -> work

        def work(c: int, layers: int, dense_: int = 0) -> StageWork:
            w = works.get((c, layers, dense_))
            if w is None:
                w = works[(c, layers, dense_)] = stage_work_for(
                    plan, c, layers, dense_ if dense_ else None)
            return w

        def held(v: int, c: int, w: StageWork, n: int) -> Memory:
            return memory_with(plan, w, *held_in_equal_chunks(plan, terms, v, p - 1, c, w, n))

        deltas: dict[tuple[int, int, int], tuple[float, float]] = {}

        def per_layer(v: int, c: int, n: int, dense_: int) -> float:
            """What a layer (a dense one where ``dense_``) adds at n in flight on class c:
            its states, and its activations per chunk in flight (those of a stage of two
            layers less one's, at one in flight, as the partitioner's problem reads them)."""
            d = deltas.get((v, c, dense_))
            if d is None:
                a, b = held(v, c, work(c, 1), 1), held(v, c, work(c, 2, dense_), 1)
                d = deltas[(v, c, dense_)] = (
                    b.weights + b.grads + b.optimizer - a.weights - a.grads - a.optimizer,
                    b.activations - a.activations)
            return d[0] + n * d[1]

        capacity, out = plan.cluster.device.mem_bytes, []
        for s in range(p):
            c = 0 if s == 0 else p - 1 if s == p - 1 else mid
            static, moe_layer, dense_layer = float("inf"), float("inf"), float("inf")
            for sched, v in members:  # the partitioner's problem of each (its stage s)
                n = peak_inflight(sched, p, m, v, s)
                static = min(static, held(v, c, work(c, 1), n).peak - per_layer(v, c, n, 0))
                moe_layer = min(moe_layer, per_layer(v, mid, n, 0))
                if dense:
                    dense_layer = min(dense_layer, per_layer(v, mid, n, 1))
            room, count = capacity - static, 0
            if room < 0:
                out.append(-1)
                continue
            for each, kind in sorted(((moe_layer, model.layers - dense), (dense_layer, dense))):
                take = kind if each <= 0 else min(kind, int(room // each))
                count, room = count + take, room - take * max(each, 0.0)
                if take < kind:
                    break
            out.append(count)
        hit = self._split_caps[key] = tuple(out)
        return hit

    def _least_held(self, plan: Plan, fewest: tuple[tuple[int, int, int, Schedule], ...]
                    ) -> tuple[tuple[int, StageWork, float, float], ...]:
        """(stage, work, activations, moved to host) of the member of ``fewest`` holding
        the least activations, per stage and kind (flat, V): on a stage, members of one
        kind hold the same model states (their works' layers and parameters), so the one
        holding the least activations holds the least (:meth:`memory_floor`)."""
        lay = plan.layout
        shapes = self._shape_works
        flat = shapes.get((lay, plan.stages, plan.chunks, None))
        if flat is None:
            flat = shapes[(lay, plan.stages, plan.chunks, None)] = stage_work(plan)
        terms = activation_terms(plan)  # every member's: they differ in schedule and chunks
        # (stage, V) -> the least activations of a member, and what the floor keeps of it
        fewest_act: dict[tuple[int, bool], tuple[float, int, tuple[int, StageWork, float, float]]] = {}
        for i, (s, n, v, sched) in enumerate(fewest):
            if not sched.spec.looping:  # its own works (``cost_key``), its output layer on stage 0
                alike_v = (lay, plan.stages, plan.chunks, (v, sched.spec.work_key))
                v_works = shapes.get(alike_v)
                if v_works is None:
                    v_works = shapes[alike_v] = stage_work(
                        plan.replace(layout=self.ctx.at_vpp(lay, v), schedule=sched))
                work = v_works[s]
            else:
                work = flat[s]
            output = sched.spec.output_stage(lay.pp)
            held, moved = held_in_equal_chunks(plan, terms, v, output, s, work, n)
            kind = (s, not sched.spec.looping)
            if kind not in fewest_act or held < fewest_act[kind][0]:
                fewest_act[kind] = (held, i, (s, work, held, moved))
        return tuple(member for _, _, member in sorted(fewest_act.values(), key=lambda f: f[1]))

    def _every_inflight(self, lay: Layout, m: int, schedules: tuple[Sched, ...]
                        ) -> tuple[tuple[int, int, int, Schedule], ...]:
        """(stage, in flight, vpp, schedule) of the members passing the schedule rules on
        stages 0 and last that hold the fewest microbatch-chunks in flight of those alike
        in all else ``stage_memory`` reads of them (stage, vpp and whether a V places the
        output layer), the first of them: with activation offload a stage keeps
        1 + (n - 1)(1 - a) of its n chunks (``offload.kept_chunks``), and ceil(n/v)
        microbatches' embedding and logits, both growing with n. Empty where a member is
        a split variant. Memoized, as :meth:`_fewest_inflight`."""
        key = (lay.pp, m, schedules)
        every = self._every_memo.get(key)
        if every is not None:
            return every
        if any(split for *_, split in schedules):
            every = self._every_memo[key] = ()
            return every
        memo = self.ctx.schedule_rule
        out: dict[tuple[int, int, bool], tuple[int, int, int, Schedule]] = {}
        for sched, v, split in schedules:
            if memo[(lay.pp, m, sched, v, split)]:
                continue
            for s in sorted({0, lay.pp - 1}):
                n = peak_inflight(sched, lay.pp, m, v, s)
                kind = (s, v, not sched.spec.looping)
                held = out.get(kind)
                if held is None or n < held[1]:
                    out[kind] = (s, n, v, sched)
        every = self._every_memo[key] = tuple(out.values())
        return every

    def _fewest_inflight(self, lay: Layout, m: int, schedules: tuple[Sched, ...]
                         ) -> tuple[tuple[int, int, int, Schedule], ...]:
        """(stage, in flight, vpp, schedule) per stage in {0, last} and kind (flat first,
        then V) of the member holding the fewest microbatches in flight there (n/vpp);
        empty where a member is a split variant or none passes the schedule rules.
        Memoized: every ZeRO and recompute group of a layout and micro-batch asks it."""
        key = (lay.pp, m, schedules)
        out = self._fewest_memo.get(key)
        if out is not None:
            return out
        memo = self.ctx.schedule_rule
        fewest: dict[tuple[int, bool], tuple[int, int, Schedule]] = {}  # (stage, V) -> (n, v, sched)
        stages = sorted({0, lay.pp - 1})
        for sched, v, split in schedules:
            if split:
                fewest.clear()
                break
            if memo[(lay.pp, m, sched, v, split)]:
                continue
            for s in stages:
                n = peak_inflight(sched, lay.pp, m, v, s)
                kind = (s, not sched.spec.looping)
                held = fewest.get(kind)
                if held is None or n * held[1] < held[0] * v:
                    fewest[kind] = (n, v, sched)
        out = self._fewest_memo[key] = tuple((s, *fewest[(s, vs)]) for s, vs in sorted(fewest))
        return out

    # -- a plan's fullest stage ---------------------------------------------------------
    def fullest(self, plan: Plan, works: tuple[StageWork, ...]) -> tuple[int, Memory]:
        """(stage, memory) of the plan's fullest stage, the first of equals (as
        ``evaluate``)."""
        stage, worst, _ = self._fullest_and_host(plan, works)
        return stage, worst

    def _fullest_and_host(self, plan: Plan, works: tuple[StageWork, ...]
                          ) -> tuple[int, Memory, float]:
        """(stage, memory) of the plan's fullest stage, the first of equals (as
        ``evaluate``), and the most any stage keeps in host memory. The stages that can be
        fullest (``_fullest_stages``) depend on the schedule, the microbatch count and the
        works only: found once for each (the memo keeps the works it was keyed on alive, so
        their id is not reused). What a stage keeps on the host grows, within a class of
        equal stages, with its parameters and microbatches in flight as its device memory
        does: those stages hold the most on the host too."""
        lay = plan.layout
        key = (plan.schedule, lay.pp, plan.num_microbatches, lay.vpp, id(works))
        hit = self._fullest_memo.get(key)
        if hit is None:
            hit = self._fullest_memo[key] = (works, _fullest_stages(plan, works))
        mems = [(s, stage_memory(plan, s, works[s], n)) for s, n in hit[1]]
        stage, worst = max(mems, key=lambda sm: (sm[1].peak, -sm[0]))
        return stage, worst, max(m.host for _, m in mems)

