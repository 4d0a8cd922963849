"""Plans (the execution) and predictions (what the cost model says of one): data-only
types on the descriptors' floor. The plan file is read and written by
:mod:`autoplan.plans.file`, which checks the rules of every axis."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from autoplan.caches import memo
from autoplan.descriptors import pipeline_layout
from autoplan.descriptors.hardware import Cluster, PooledCluster, cache_hash
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import default_stack
from autoplan.descriptors.model import Model
from autoplan.descriptors.pipeline_layout import Chunk, chunk_stage_layers, uniform_stages
from autoplan.descriptors.precision import StatePrecision, written_states
from autoplan.descriptors.stack import Stack
from autoplan.schedules import Schedule
from autoplan.units import GiB
from autoplan.vocab import NO_OFFLOAD, CpComm, MoeDispatch, Offload, Recompute, RecomputeModule, ZeroStage

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, init=False)
class Layout:
    """One degree per mesh axis; their product (without ep and etp) is the GPU count.

    Expert layers fold the same ranks differently (Megatron-Core's MoE parallel folding,
    Liu et al. 2025): the tp*cp*dp ranks of a stage are etp x ep x edp for the experts,
    etp innermost.

    Every field holds its degree from construction on: an ``etp`` not given is tp
    (Megatron-LM's default), a ``dp_shard`` not given is dp (ZeRO over all of dp). The
    constructor resolves them before it writes a field, so no field is back-filled."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int
    etp: int
    # hybrid sharded data parallelism (HSDP, hierarchical ZeRO): ZeRO shards states over
    # dp_shard x cp ranks and replicates them over dp / dp_shard (torchtitan's
    # data_parallel_shard_degree x replicate_degree)
    dp_shard: int
    # plans and memoized costs key on layouts: hashed once (the degrees are frozen)
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __init__(self, *, dp: int, tp: int, pp: int, cp: int = 1, ep: int = 1, vpp: int = 1,
                 etp: int | None = None, dp_shard: int | None = None) -> None:
        # each slot written once, through its descriptor, as a frozen dataclass's own
        # __init__ writes its fields
        for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("vpp", vpp),
                            ("etp", etp or tp),  # None (or 0, as it was spelled before): as tp
                            ("dp_shard", dp_shard or dp)):
            _LAYOUT_SLOTS[name](self, value)
        cache_hash(self)

    @property
    def dp_replicas(self) -> int:
        """Copies of the ZeRO-sharded states: dp / dp_shard (1: sharded over all of dp)."""
        return self.dp // self.dp_shard

    def __hash__(self) -> int:
        return self._hash

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def edp(self) -> int:
        """Expert data parallel degree: replicas of each expert within a stage."""
        return self.dp * self.cp * self.tp // (self.ep * self.etp)

    def to_dict(self) -> dict[str, int]:
        out = {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep,
               "vpp": self.vpp}
        if self.etp != self.tp:
            out["etp"] = self.etp
        if self.dp_shard != self.dp:
            out["dp_shard"] = self.dp_shard
        return out


_LAYOUT_SLOTS = {f.name: getattr(Layout, f.name).__set__ for f in fields(Layout)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Pipeline stages on the pools of a heterogeneous cluster: stage s runs on pool
    ``stage_pools[s]``, its dp*tp*cp ranks inside that pool (``cost.placed``)."""

    cluster: PooledCluster
    stage_pools: tuple[int, ...]  # a pool index per pipeline stage

    def pool(self, stage: int) -> Cluster:
        return self.cluster.pools[self.stage_pools[stage]]

    def stages_on(self, pool: int) -> int:
        return self.stage_pools.count(pool)

    def runs(self) -> list[tuple[Cluster, range]]:
        """Each run of consecutive stages on one pool, in pipeline order: the pool and
        its stages."""
        out, start = [], 0
        for i, run in itertools.groupby(self.stage_pools):
            n = len(list(run))
            out.append((self.cluster.pools[i], range(start, start + n)))
            start += n
        return out

    @staticmethod
    def span(stages: range) -> str:
        """``stage 3`` or ``stages 0-2``."""
        return (f"stage {stages[0]}" if len(stages) == 1
                else f"stages {stages[0]}-{stages[-1]}")

    def to_list(self) -> list[dict[str, Any]]:
        return [{"stage": s, "pool": self.cluster.pools[p].name}
                for s, p in enumerate(self.stage_pools)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: Model
    cluster: Cluster
    job: Job
    layout: Layout
    micro_batch: int
    schedule: Schedule
    recompute: Recompute
    zero: ZeroStage
    sequence_parallel: bool
    stages: tuple[int, ...] | None = None  # layers per pipeline stage; None = uniform
    # per model chunk (virtual stage, Megatron's order), its layers and the embedding,
    # loss and MTP it holds; None: ``stages`` (or uniform) with equal chunks per stage
    chunks: tuple[Chunk, ...] | None = None
    cp_comm: CpComm = CpComm.RING
    stack: Stack = field(default_factory=default_stack)  # the software it runs on
    offload: Offload = NO_OFFLOAD  # what it keeps in host memory (kernels/offload.py)
    # on a heterogeneous cluster, the pool of each stage; ``cluster`` is then stage 0's
    # pool (``on_stage`` gives each stage's); None on a cluster of identical nodes
    placement: Placement | None = None
    # selective recompute's modules (Megatron-Core's --recompute-modules); () with
    # selective: the attention core, Megatron-Core's default
    recompute_modules: tuple[RecomputeModule, ...] = ()
    # MoE: how tokens reach their experts, and whether one micro-batch's dispatch and
    # combine run under another's compute (Megatron-Core's EP A2A overlap)
    moe_dispatch: MoeDispatch = MoeDispatch.ALLTOALL
    ep_overlap: bool = False
    # plans key every memoized cost: hashed on first use, then remembered (frozen fields)
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        if not self._hash:
            object.__setattr__(self, "_hash", hash((
                self.model, self.cluster, self.job, self.layout, self.micro_batch, self.schedule,
                self.recompute, self.zero, self.sequence_parallel, self.stages, self.chunks,
                self.cp_comm, self.stack, self.offload, self.placement, self.recompute_modules,
                self.moe_dispatch, self.ep_overlap)) or 1)
        return self._hash

    def replace(self, **changes: Any) -> Plan:
        """``dataclasses.replace`` for the search's hot paths: the same plan, the fields
        named changed, without the generated ``__init__``'s checks (the fields are the
        caller's, already valid: plans are checked where they are read). It runs as
        straight-line code over the fields (:func:`compile_replace`)."""
        return _replace(self, **changes)

    def on_stage(self, stage: int) -> Plan:
        """The plan as the ranks of ``stage`` run it: on their pool, as on a cluster of
        identical nodes (the plan itself where it has no placement)."""
        if self.placement is None:
            return self
        return self.on_pools()[self.placement.stage_pools[stage]]

    def on_pools(self) -> tuple[Plan, ...]:
        """:meth:`on_stage` of a placed plan, by pool index (made once per plan)."""
        return _views(self)

    @property
    def states(self) -> StatePrecision:
        """The gradients, master weights and moments it keeps: the job's, where it leaves
        them unset its stack's, as its dtype and ZeRO stage keep them
        (``descriptors.precision``)."""
        return self.job.states_at(self.stack.states, self.zero)

    @property
    def recompute_label(self) -> str:
        """``selective``, or with its modules named: ``selective (moe_act, layernorm)``."""
        if not self.recompute_modules:
            return self.recompute.value
        return f"{self.recompute.value} ({', '.join(m.value for m in self.recompute_modules)})"

    @property
    def recomputed(self) -> frozenset[RecomputeModule]:
        """The modules selective recompute recomputes (empty without it)."""
        if self.recompute is not Recompute.SELECTIVE:
            return frozenset()
        return frozenset(self.recompute_modules or (RecomputeModule.CORE_ATTN,))

    @property
    def num_microbatches(self) -> int:
        """Microbatches per pipeline per step (gradient-accumulation steps)."""
        return self.job.global_batch // (self.layout.dp * self.micro_batch)

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers per pipeline stage (uniform split unless ``stages`` is set)."""
        if self.stages is not None:
            return self.stages
        if self.chunks is not None:
            return chunk_stage_layers(self.chunks, self.layout.pp)
        return uniform_stages(self.model.layers, self.layout.pp)

    def to_dict(self, builtin_model: bool = False, builtin_cluster: bool = False,
                builtin_stack: bool = False) -> dict[str, Any]:
        """The plan-file mapping (without prediction). Built-ins are written by name."""
        model: Any = self.model.name if builtin_model else self.model.to_dict()
        cluster: Any = (
            self.placement.cluster.to_dict() if self.placement is not None
            else {"name": self.cluster.name, "nodes": self.cluster.nodes}
            if builtin_cluster
            else self.cluster.to_dict()
        )
        out: dict[str, Any] = {
            "autoplan": SCHEMA_VERSION,
            "model": model,
            "cluster": cluster,
            "job": self.job.to_dict(written_states(self.states, self.stack.states)),
            "layout": self.layout.to_dict(),
            "micro_batch": self.micro_batch,
            "schedule": self.schedule.value,
            "recompute": self.recompute.value,
            **({"recompute_modules": [m.value for m in self.recompute_modules]}
               if self.recompute_modules else {}),
            "zero": int(self.zero),
            "sequence_parallel": self.sequence_parallel,
        }
        if self.layout.cp > 1:
            out["cp_comm"] = self.cp_comm.value
        if self.moe_dispatch is not MoeDispatch.ALLTOALL:
            out["moe_dispatch"] = self.moe_dispatch.value
        if self.ep_overlap:
            out["ep_overlap"] = True
        if self.chunks is not None:
            if pipeline_layout.is_plain(self.chunks, self.model.mtp_layers):
                out["stages"] = pipeline_layout.stage_lists(self.chunks, self.layout.pp)
            else:
                out["pipeline_layout"] = pipeline_layout.render_layout(self.chunks)
        elif self.stages is not None or len(set(self.stage_layers)) > 1:
            out["stages"] = list(self.stage_layers)  # uneven splits are written out
        if self.offload.any:
            out["offload"] = self.offload.to_dict()
        if self.placement is not None:
            out["placement"] = self.placement.to_list()
        if self.stack != default_stack():
            out["stack"] = self.stack.name if builtin_stack else self.stack.to_dict()
        return out


@memo(4096)
def _views(plan: Plan) -> tuple[Plan, ...]:
    """:meth:`Plan.on_pools`, memoized per placed plan."""
    assert plan.placement is not None
    return tuple(plan.replace(cluster=pool, placement=None) for pool in plan.placement.cluster.pools)


# --------------------------------------------------------------------------- predictions

@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """Bytes per GPU, by what holds them."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float
    # what this GPU's offload keeps in host memory (not part of the peak): its optimizer
    # shard and its offloaded activations (kernels/offload.py)
    host: float = 0.0

    @property
    def peak(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.other

    def to_gib_dict(self) -> dict[str, float]:
        out = {"peak": self.peak / GiB, "weights": self.weights / GiB, "grads": self.grads / GiB,
               "optimizer": self.optimizer / GiB, "activations": self.activations / GiB,
               "other": self.other / GiB}
        if self.host:
            out["host"] = self.host / GiB
        return out


TIME_TERMS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
              "bubble", "optimizer", "offload", "overhead")


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """Seconds of the step on the critical stage, by cause; they sum to the step time."""

    compute: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    pp_comm: float = 0.0
    dp_comm: float = 0.0
    bubble: float = 0.0
    optimizer: float = 0.0
    # the offloaded optimizer step (copies and CPU Adam) and activation copies left exposed
    offload: float = 0.0
    overhead: float = 0.0  # the stack's per-step host costs and memory pressure

    @property
    def total(self) -> float:
        return sum(getattr(self, t) for t in TIME_TERMS)

    def to_dict(self) -> dict[str, float]:
        return {t: getattr(self, t) for t in TIME_TERMS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Uncertainty:
    """The spread of the step time over a learned correction's trees (autoplan.measured.surrogate)."""

    step_time_s_p10: float
    step_time_s_p90: float
    profile: str  # the measured profile the correction was fitted on

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s_p10": self.step_time_s_p10, "step_time_s_p90": self.step_time_s_p90,
                "profile": self.profile}


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    feasible: bool
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float  # model FLOPs (recompute not counted)
    hw_tflops_per_gpu: float  # hardware FLOPs (recompute counted)
    mfu: float
    memory: Memory  # the stage with the highest peak
    memory_per_stage: tuple[Memory, ...]
    breakdown: TimeBreakdown
    capacity_bytes: float
    reason: str = ""  # why infeasible
    uncertainty: Uncertainty | None = None  # with a measured profile only
    # host memory the plan's offload takes on each node (every GPU of a node as its fullest)
    host_memory_bytes_per_node: float = 0.0
    # across pools (``Plan.placement``): each stage's pool, its busy seconds per step and
    # its device's memory; () on a cluster of identical nodes
    stage_pools: tuple[str, ...] = ()
    stage_busy_s: tuple[float, ...] = ()
    stage_capacity_bytes: tuple[float, ...] = ()

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.memory.peak

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "feasible": self.feasible,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
            "mfu": self.mfu,
            "memory_gib": self.memory.to_gib_dict(),
            "memory_gib_per_stage": [m.to_gib_dict() for m in self.memory_per_stage],
            "capacity_gib": self.capacity_bytes / GiB,
            "host_memory_gib_per_node": self.host_memory_bytes_per_node / GiB,
            "breakdown_s": self.breakdown.to_dict(),
        }
        if self.stage_pools:
            out["stages"] = [
                {"stage": s, "pool": pool, "busy_s": busy, "memory_gib": mem.peak / GiB,
                 "capacity_gib": cap / GiB}
                for s, (pool, busy, mem, cap) in enumerate(zip(
                    self.stage_pools, self.stage_busy_s, self.memory_per_stage,
                    self.stage_capacity_bytes, strict=True))]
        if self.reason:
            out["reason"] = self.reason
        if self.uncertainty is not None:
            out["uncertainty"] = self.uncertainty.to_dict()
        return out


# --------------------------------------------------------------------------- fast replace

def compile_replace(cls: type, reset: Mapping[str, Any] | None = None) -> Any:
    """``dataclasses.replace`` for a frozen, slotted dataclass, as straight-line code: one
    slot write per field through its slot descriptor (no per-call loop, dict or frozen
    ``__setattr__``), at about half the cost of a loop over the fields (the search builds
    some 10^5 plans and queue items this way). Written from ``fields(cls)``, as
    ``dataclasses`` writes ``__init__``, so it cannot fall out of step with them; an
    unknown field is a TypeError. ``reset``: fields set to a value whatever the original
    holds (a cached hash), not to be named. The fields are the caller's: nothing is
    checked."""
    reset = dict(reset or {})
    names = tuple(f.name for f in fields(cls) if f.name not in reset)
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_KEEP": object()}
    scope.update({f"_set_{n}": getattr(cls, n).__set__ for n in (*names, *reset)})
    scope.update({f"_reset_{n}": v for n, v in reset.items()})
    lines = [f"def replace(self, *, {', '.join(f'{n}=_KEEP' for n in names)}):",
             "    new = _new(_cls)"]
    lines += [f"    _set_{n}(new, self.{n} if {n} is _KEEP else {n})" for n in names]
    lines += [f"    _set_{n}(new, _reset_{n})" for n in reset]
    lines += ["    return new"]
    exec("\n".join(lines), scope)  # noqa: S102 - code built from the dataclass's own field names
    return scope["replace"]


_replace = compile_replace(Plan, {"_hash": 0})
