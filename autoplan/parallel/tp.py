"""Tensor parallel (Shoeybi et al. 2019), with sequence parallelism as its flag
(Korthikanti et al. 2022): rules, the degrees the search tries, and the per-layer
communication."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.model import Model
from autoplan.kernels import comm
from autoplan.parallel.common import Rule, Scope, capped_divisors
from autoplan.schedules import Schedule

if TYPE_CHECKING:
    from autoplan.descriptors.space import SearchSpace
    from autoplan.plan import Layout, Plan


# ----------------------------------------------------------------------------- rules

def _heads(plan: Plan) -> str | None:
    tp, heads = plan.layout.tp, plan.model.heads
    return f"tp={tp} must divide heads={heads}" if heads % tp else None


def _kv_heads(plan: Plan) -> str | None:
    tp, kv = plan.layout.tp, plan.model.kv_heads
    if kv % tp and tp % kv:
        return f"tp={tp} must divide kv_heads={kv} (or be a multiple)"
    return None


def _ffn(plan: Plan) -> str | None:
    m, tp = plan.model, plan.layout.tp
    if m.ffn_hidden % tp and m.layers > m.moe_layers:  # only dense MLPs split ffn_hidden
        return f"tp={tp} must divide ffn_hidden={m.ffn_hidden}"
    return None


def _sp_needs_tp(plan: Plan) -> str | None:
    if plan.sequence_parallel and plan.layout.tp == 1:
        return "sequence parallelism needs tp > 1"
    return None


def _sp_seq_len(plan: Plan) -> str | None:
    lay = plan.layout
    if plan.sequence_parallel and plan.job.seq_len % (lay.tp * lay.cp):
        return f"tp*cp={lay.tp * lay.cp} must divide seq_len={plan.job.seq_len}"
    return None


LAYOUT_RULES = (
    Rule("tp-heads", "layout.tp", Scope.LAYOUT, "tp must divide heads", _heads),
    Rule("tp-kv-heads", "layout.tp", Scope.LAYOUT,
         "tp must divide kv_heads (or be a multiple)", _kv_heads),
    Rule("tp-ffn", "layout.tp", Scope.LAYOUT, "tp must divide ffn_hidden (dense MLPs)", _ffn),
)
SP_RULES = (
    Rule("sp-needs-tp", "sequence_parallel", Scope.SEQUENCE_PARALLEL,
         "sequence parallelism needs tp > 1", _sp_needs_tp),
    Rule("sp-seq-len", "sequence_parallel", Scope.SEQUENCE_PARALLEL,
         "tp*cp must divide seq_len (sequence parallel)", _sp_seq_len),
)


# ----------------------------------------------------------------------------- degrees

def degrees(cluster: Cluster, space: SearchSpace) -> Iterator[int]:
    """tp up to the space's cap, inside one NVLink domain where the space says so."""
    domain = min(cluster.nvlink_domain, cluster.gpus)
    cap = min(space.tp_max, domain) if space.tp_within_nvlink else space.tp_max
    return iter(capped_divisors(cluster.gpus, cap))


def sequence_parallel_choices(model: Model, lay: Layout, space: SearchSpace) -> tuple[bool, ...]:
    """SP flags to try: none to choose without TP; MoE layers with TP need SP
    (Megatron-Core's token dispatcher), so an MoE model without it has none."""
    if lay.tp == 1:
        return (False,)
    if model.is_moe:
        return (True,) if True in space.sequence_parallel else ()
    return space.sequence_parallel


# ----------------------------------------------------------------------------- cost terms

def layer_seconds(act_bytes: float, group: comm.Group) -> float:
    """One direction of one layer: Megatron-LM's 2 all-reduces per layer forward and 2
    backward (Shoeybi et al. 2019, Fig. 4); with SP each becomes an all-gather +
    reduce-scatter of the same total time. ``act_bytes``: one layer's output, unsplit."""
    return 2 * comm.all_reduce(act_bytes, group)


def boundary_seconds(act_bytes: float, group: comm.Group) -> float:
    """The vocab-parallel embedding's output all-reduce (reduce-scatter with SP), and
    likewise each output head's."""
    return comm.all_reduce(act_bytes, group)


def exposed_backward(total: float, weight_grad: float, schedule: Schedule) -> float:
    """Backward TP collectives overlap the weight-gradient GEMMs (Megatron-LM's
    LinearWithGradAccumulationAndAsyncCommunication); a schedule that defers W to fill
    bubbles leaves nothing to hide them behind."""
    overlap = 0.0 if schedule.splits_backward else weight_grad
    return max(0.0, total - overlap)
