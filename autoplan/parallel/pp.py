"""Pipeline parallel: the rules of stages, model chunks (vpp) and schedule shapes, the
degrees and (schedule, vpp, split) choices the search tries, where chunks and the
output layer sit, and the p2p sends between stages.

Chunk placement itself (chunk c of stage s is virtual stage c*p + s, or 2p - 1 - s on
a V's way back) lives in ``schedules.orders.virtual_stage``; the schedules' operation
orders and simulator in ``schedules/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.caches import memo
from autoplan.descriptors.space import StageShape
from autoplan.kernels import comm
from autoplan.parallel.common import Rule, Scope, capped_divisors
from autoplan.schedules import Schedule
from autoplan.schedules.orders import virtual_stage
from autoplan.schedules.registry import Chunks

if TYPE_CHECKING:
    from autoplan.descriptors.model import Model
    from autoplan.descriptors.space import SearchSpace
    from autoplan.plan import Layout, Plan


# ----------------------------------------------------------------------------- rules

def _pp_layers(plan: Plan) -> str | None:
    lay, layers = plan.layout, plan.model.layers
    if layers < lay.pp:  # every stage holds at least one layer
        return f"pp*vpp = {lay.pp * lay.vpp} exceeds the {layers} layers"
    return None


def _vpp_layers(plan: Plan) -> str | None:
    lay, layers = plan.layout, plan.model.layers
    chunks = lay.pp * lay.vpp
    if plan.stages is not None or plan.chunks is not None or lay.vpp == 1 or layers < lay.pp:
        return None
    if layers < chunks:
        return f"pp*vpp = {chunks} exceeds the {layers} layers"
    if layers % chunks:
        return f"pp*vpp = {chunks} must divide layers={layers}"
    return None


def _interleaved_chunks(plan: Plan) -> str | None:
    lay = plan.layout
    if plan.schedule.spec.chunks is Chunks.LAYOUT and (lay.vpp < 2 or lay.pp < 2):
        return f"the {plan.schedule.value} schedule needs pp >= 2 and vpp >= 2"
    return None


MAX_PIPELINE_OPS = 1 << 17
"""Microbatches x pp x vpp of one step at most: the simulator walks every (microbatch,
virtual stage) once or three times (F, B, W), about 4-15 us each on one core (1F1B to
V-Min), so a step of this many takes 0.5-2 s to simulate. Far past any launched run
(Llama 3 405B on 16k GPUs: 128 x 16; GPT-3 175B on 64 A100: 1536 x 8); a plan past it
wants a larger micro-batch or more data parallelism, not a longer simulation."""


def pipeline_ops(plan: Plan) -> int:
    """(microbatch, virtual stage) pairs of one step, what the simulator walks."""
    lay = plan.layout
    return plan.num_microbatches * lay.pp * lay.vpp


def _pipeline_ops(plan: Plan) -> str | None:
    if (n := pipeline_ops(plan)) > MAX_PIPELINE_OPS:
        return (f"{plan.num_microbatches:,} microbatches x pp={plan.layout.pp} x "
                f"vpp={plan.layout.vpp} = {n:,} pipeline operations per step, more than "
                f"{MAX_PIPELINE_OPS:,} (raise micro_batch or dp)")
    return None


def _interleaved_microbatches(plan: Plan) -> str | None:
    lay, m = plan.layout, plan.num_microbatches
    if (plan.schedule.spec.p_divides_m and lay.vpp >= 2 and lay.pp >= 2
            and m % lay.pp):
        return (f"{plan.schedule.value} needs the number of microbatches ({m}) to be a "
                f"multiple of pp={lay.pp} (Megatron-LM's rule)")
    return None


def _v_chunks(plan: Plan) -> str | None:
    lay, sched = plan.layout, plan.schedule
    if sched.spec.chunks is Chunks.V and (lay.vpp != 2 or lay.pp < 2):
        return (f"{sched.value} places two model chunks per stage in a V: "
                f"it needs vpp = 2 and pp >= 2, got vpp={lay.vpp}, pp={lay.pp}")
    return None


def _vpp_schedule(plan: Plan) -> str | None:
    sched, vpp = plan.schedule, plan.layout.vpp
    if sched.spec.chunks is Chunks.ONE and vpp != 1:
        return f"vpp={vpp} needs schedule: interleaved (or a V-shape schedule with vpp = 2)"
    return None


def _stages_vpp(plan: Plan) -> str | None:
    if plan.stages is not None and plan.layout.vpp > 1:
        return (f"with vpp={plan.layout.vpp}, give one list of {plan.layout.vpp} chunk layer "
                "counts per stage (or a pipeline_layout)")
    return None


def _chunks_count(plan: Plan) -> str | None:
    lay, chunks = plan.layout, plan.chunks
    if chunks is not None and len(chunks) != lay.pp * lay.vpp:
        return (f"expected pp*vpp = {lay.pp * lay.vpp} virtual stages (pp={lay.pp}, "
                f"vpp={lay.vpp}), got {len(chunks)}")
    return None


def _chunks_layers(plan: Plan) -> str | None:
    chunks, model = plan.chunks, plan.model
    if chunks is None:
        return None
    if (n := sum(c.layers for c in chunks)) != model.layers:
        return f"expected {model.layers} transformer layers (t) in all, got {n}"
    if (n := sum(c.mtp for c in chunks)) != model.mtp_layers:
        return f"expected the model's {model.mtp_layers} MTP layers (m), got {n}"
    return None


def _chunks_mtp(plan: Plan) -> str | None:
    """Megatron-Core's rule: every MTP layer in one virtual stage, the last of its rank."""
    chunks, lay = plan.chunks, plan.layout
    if chunks is None or len(chunks) != lay.pp * lay.vpp:
        return None
    holding = [vs for vs, c in enumerate(chunks) if c.mtp]
    if len(holding) > 1:
        return "all MTP layers (m) go in one virtual stage"
    if holding and holding[0] // lay.pp != lay.vpp - 1:
        return "the MTP layers (m) go in the last model chunk of their pipeline rank"
    return None


def _chunks_schedule(plan: Plan) -> str | None:
    if plan.chunks is not None and not plan.schedule.spec.looping:
        return (f"per-chunk layouts follow Megatron's order (chunk k of stage s is virtual "
                f"stage k*pp + s); {plan.schedule.value} places its chunks in a V")
    return None


def _stages_count(plan: Plan) -> str | None:
    pp = plan.layout.pp
    if plan.stages is not None and plan.layout.vpp == 1 and len(plan.stages) != pp:
        return f"expected {pp} entries (one per pipeline stage), got {len(plan.stages)}"
    return None


def _stages_sum(plan: Plan) -> str | None:
    stages, layers = plan.stages, plan.model.layers
    if (stages is not None and plan.layout.vpp == 1 and len(stages) == plan.layout.pp
            and sum(stages) != layers):
        return f"expected entries summing to layers={layers}, got {sum(stages)}"
    return None


SCHEDULE_RULES = (
    Rule("interleaved-chunks", "layout.vpp", Scope.SCHEDULE,
         "the interleaved schedule needs pp >= 2 and vpp >= 2", _interleaved_chunks),
    Rule("interleaved-microbatches", "layout.vpp", Scope.SCHEDULE,
         "interleaved: pp must divide the microbatches", _interleaved_microbatches),
    Rule("v-shape-chunks", "layout.vpp", Scope.SCHEDULE,
         "V-shape schedules need vpp = 2 and pp >= 2", _v_chunks),
    Rule("vpp-needs-schedule", "layout.vpp", Scope.SCHEDULE,
         "vpp > 1 needs the interleaved or a V-shape schedule", _vpp_schedule),
    Rule("pipeline-ops", "micro_batch", Scope.SCHEDULE,
         f"microbatches*pp*vpp must not exceed {MAX_PIPELINE_OPS:,}", _pipeline_ops),
)
STAGE_RULES = (
    Rule("pp-layers", "layout.pp", Scope.LAYOUT, "pp must not exceed layers", _pp_layers),
    Rule("vpp-layers", "layout.vpp", Scope.SCHEDULE,
         "pp*vpp must divide layers (model chunks)", _vpp_layers),
    Rule("stages-vpp", "stages", Scope.STAGES,
         "with vpp > 1, stages lists chunk layer counts per stage", _stages_vpp),
    Rule("chunks-count", "stages", Scope.STAGES,
         "one layer count per virtual stage (pp*vpp)", _chunks_count),
    Rule("chunks-layers", "stages", Scope.STAGES,
         "chunks hold the model's layers and MTP layers", _chunks_layers),
    Rule("chunks-mtp", "stages", Scope.STAGES,
         "MTP layers in one chunk, the last of its rank", _chunks_mtp),
    Rule("chunks-schedule", "stages", Scope.STAGES,
         "per-chunk layouts need a non-V schedule", _chunks_schedule),
    Rule("stages-count", "stages", Scope.STAGES, "one entry per pipeline stage", _stages_count),
    Rule("stages-sum", "stages", Scope.STAGES, "entries sum to the layers", _stages_sum),
)


# ----------------------------------------------------------------------------- degrees

def degrees(rest: int, space: SearchSpace) -> Iterator[int]:
    """pp dividing the ``rest`` of the GPUs, up to the space's cap."""
    return iter(capped_divisors(rest, space.pp_max))


def schedule_choices(lay: Layout, space: SearchSpace) -> list[tuple[Schedule, int, bool]]:
    """(schedule, vpp, split): each schedule at the chunk counts it runs
    (``ScheduleSpec.chunk_counts``); split variants take the best uneven layer split the
    launcher can express (with vpp > 1 a per-chunk layout), of the schedules taking one
    (``ScheduleSpec.uneven_splits``: not V-shapes, whose chunks do not follow Megatron's
    order, nor breadth-first ones); the others the uniform one."""
    if lay.pp == 1:  # without a pipeline every schedule is the same: generate one
        return [(Schedule.ONE_F_ONE_B, 1, False)]
    out: list[tuple[Schedule, int, bool]] = [
        (sched, v, False) for sched in space.schedules for v in sched.spec.chunk_counts(space.vpp_max)]
    if space.stage_shape is not StageShape.UNIFORM:
        out.extend((sched, v, True) for sched, v, _ in list(out) if sched.spec.uneven_splits)
    return out


# ----------------------------------------------------------------------------- placement

def output_stage(plan: Plan) -> int:
    """The stage holding the output layer and the logits: the last, except for V-shape
    schedules, whose last model chunk comes back to stage 0 (``ScheduleSpec.output_stage``)."""
    return plan.schedule.spec.output_stage(plan.layout.pp)


def dense_per_stage(plan: Plan) -> tuple[int, ...]:
    """Of each stage's layers, those with a dense MLP (the first ``dense_layers`` of the
    model, or where ``Model.mlps`` puts them), through the chunks each stage holds."""
    model = plan.model
    if not model.is_moe:
        return plan.stage_layers
    if model.mlps:
        return tuple(layer_counts(model, 0, 0, indices)[0] for indices in _stage_indices(plan))
    return _dense_per_stage(model.layers, model.layers - model.moe_layers, plan.stage_layers,
                            plan.layout.vpp, plan.schedule)


@memo(4096)
def _dense_per_stage(n_layers: int, k: int, layers: tuple[int, ...], v: int,
                     schedule: Schedule) -> tuple[int, ...]:
    p = len(layers)
    if k == 0:
        return (0,) * p
    if v == 1:
        starts = [sum(layers[:s]) for s in range(p)]
        return tuple(max(0, min(k - a, n)) for a, n in zip(starts, layers, strict=True))
    n = n_layers // (p * v)  # layers per chunk (pp*vpp divides layers)

    def dense_in(virtual: int) -> int:
        return max(0, min(k - virtual * n, n))

    return tuple(sum(dense_in(virtual_stage(schedule, p, s, c)) for c in range(v))
                 for s in range(p))


def mix_per_stage(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """A hybrid model's layers of each stage by kind (``Model.kinds`` order), through the
    chunks each stage holds; () for a model whose layers are alike."""
    if not plan.model.is_hybrid:
        return ()
    return _mixes(plan.model, plan.stage_layers, plan.layout.vpp, plan.schedule)


@memo(4096)
def _mixes(model: Model, layers: tuple[int, ...], v: int,
           schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    return tuple(layer_counts(model, 0, 0, indices)[1] for indices in _indices(layers, v, schedule))


def layer_counts(model: Model, start: int, stop: int,
                 indices: tuple[int, ...] | None = None) -> tuple[int, tuple[int, ...]]:
    """(layers without an MoE, the hybrid's layers by kind or ()) of the model's layers
    ``start`` to ``stop`` (or at ``indices``)."""
    at = range(start, stop) if indices is None else indices
    dense = sum(1 for i in at if not model.is_moe_layer(i))
    if not model.is_hybrid:
        return dense, ()
    order = {kind: k for k, kind in enumerate(model.kinds)}
    counts = [0] * len(order)
    for i in at:
        counts[order[model.kind(i)]] += 1
    return dense, tuple(counts)


def _stage_indices(plan: Plan) -> tuple[tuple[int, ...], ...]:
    return _indices(plan.stage_layers, plan.layout.vpp, plan.schedule)


@memo(4096)
def _indices(layers: tuple[int, ...], v: int, schedule: Schedule) -> tuple[tuple[int, ...], ...]:
    """The model's layer indices each stage holds (its chunks' at vpp > 1, equal chunks)."""
    p = len(layers)
    if v == 1:
        starts = [sum(layers[:s]) for s in range(p)]
        return tuple(tuple(range(a, a + n)) for a, n in zip(starts, layers, strict=True))
    n = sum(layers) // (p * v)
    return tuple(tuple(i for c in range(v) for i in range(
        virtual_stage(schedule, p, s, c) * n, (virtual_stage(schedule, p, s, c) + 1) * n))
        for s in range(p))


def sends(plan: Plan, stage: int) -> tuple[int, int]:
    """Activation sends (forward) and gradient sends (backward) of one stage per microbatch,
    as its schedule places its chunks (``ScheduleSpec.sends``)."""
    return plan.schedule.spec.sends(plan.layout.pp, plan.layout.vpp, stage)


def _cross_domain(plan: Plan) -> bool:
    """Neighbouring stages sit in different NVLink domains (PP is the outermost axis)."""
    lay = plan.layout
    return lay.tp * lay.cp * lay.dp >= min(plan.cluster.nvlink_domain, plan.cluster.gpus)


def send_seconds(plan: Plan, act_bytes: float) -> float:
    """One blocking send of a microbatch's activations (or their gradients) to the next
    stage. Megatron's scatter-gather sends 1/t of the activation with SP."""
    if plan.layout.pp == 1:
        return 0.0
    nbytes = act_bytes / (plan.layout.tp if plan.sequence_parallel else 1)
    return comm.p2p(nbytes, _cross_domain(plan), plan.cluster)
