"""Tensor parallel (Shoeybi et al. 2019), with sequence parallelism as its flag
(Korthikanti et al. 2022): rules, the degrees the search tries, and the per-layer
communication."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
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

def layer_seconds(act_bytes: float, group: comm.Group, sequence_parallel: bool = False) -> float:
    """One direction of one layer: Megatron-LM's 2 all-reduces per layer forward and 2
    backward (Shoeybi et al. 2019, Fig. 4); with SP each becomes an all-gather + a
    reduce-scatter (Korthikanti et al. 2022, Fig. 5), the same bytes on a ring, but priced
    as what runs: a measured NCCL table's all-reduce on NVLink (NVLS) is faster than its
    all-gather and reduce-scatter together. ``act_bytes``: one layer's output, unsplit."""
    if sequence_parallel:
        return 2 * (comm.all_gather(act_bytes, group) + comm.reduce_scatter(act_bytes, group))
    return 2 * comm.all_reduce(act_bytes, group)


def boundary_seconds(act_bytes: float, group: comm.Group) -> float:
    """The vocab-parallel embedding's output all-reduce (reduce-scatter with SP), and
    likewise each output head's."""
    return comm.all_reduce(act_bytes, group)


def exposed_backward(total: float, weight_grad: float, schedule: Schedule) -> float:
    """Backward TP collectives overlap the weight-gradient GEMMs (Megatron-LM's
    LinearWithGradAccumulationAndAsyncCommunication); a schedule that defers W to fill
    bubbles leaves nothing to hide them behind (``ScheduleSpec.hides_tp_behind_w``)."""
    overlap = weight_grad if schedule.spec.hides_tp_behind_w else 0.0
    return max(0.0, total - overlap)


# ----------------------------------------------------------------------------- overlaps

# Transformer Engine's comm-GEMM overlap defaults (transformer_engine/pytorch/module/base.py,
# initialize_ub's get_default_config, TE d0067d0): ring_exchange for qkv_fprop, fc1_fprop,
# proj_dgrad and fc2_dgrad (num_splits = tp, peer copies on the copy engines: use_ce, one SM,
# no SM margin); pipeline for proj_fprop and fc2_fprop (4 splits); bulk for the
# qkv_dgrad/qkv_wgrad and fc1_dgrad/fc1_wgrad pairs; pipeline and bulk run their
# communication kernels on 16 SMs that the GEMM beside them gives up (set_sm_margin).
UB_COMM_SMS = 16
UB_PIPELINE_SPLITS = 4


@dataclass(frozen=True, slots=True)
class LinearGemms:
    """Seconds of one tensor-parallel linear's GEMMs on a rank: forward, input gradient
    (dgrad) and weight gradient (wgrad)."""

    fprop: float
    dgrad: float
    wgrad: float


@dataclass(frozen=True, slots=True)
class TpBlock:
    """A column-parallel linear and the row-parallel one after it (attention's QKV and
    output projection, the MLP's FC1 and FC2): with sequence parallelism an all-gather
    of the input before the first and a reduce-scatter of the output after the second,
    each way (Korthikanti et al. 2022, Fig. 5)."""

    column: LinearGemms
    row: LinearGemms


def ring_exposed(comm_s: float, gemm_s: float, chunks: int) -> float:
    """A collective pipelined with its GEMM in ``chunks`` steps over a ring (TE's
    ring_exchange; torch's fused all-gather-matmul and matmul-reduce-scatter): each step
    computes one chunk while the next moves, the local chunk first, so the chunks - 1
    transfers run beside chunks - 1 of the chunks' GEMMs. With g = G/c and p = C/(c-1)
    the pass takes g + (c-1) max(g, p): exposed max(0, C - G (c-1)/c)."""
    if chunks <= 1:
        return comm_s
    return max(0.0, comm_s - gemm_s * (chunks - 1) / chunks)


def pipeline_exposed(comm_s: float, gemm_s: float, splits: int) -> float:
    """A GEMM in ``splits`` chunks whose outputs are reduce-scattered as each finishes
    (TE's pipeline method): chunk i's reduce-scatter beside chunk i+1's GEMM, the last one
    after all of them. With g = G/s and r = C/s the pass takes g + (s-1) max(g, r) + r:
    exposed r + (s-1) max(0, r - g)."""
    r, g = comm_s / splits, gemm_s / splits
    return r + (splits - 1) * max(0.0, r - g)


def bulk_exposed(comm_s: float, gemm_s: float) -> float:
    """A collective beside one whole GEMM it does not feed (TE's bulk method): what it
    outlasts the GEMM by."""
    return max(0.0, comm_s - gemm_s)


def sm_margin(sms: int) -> float:
    """The slowdown of a GEMM that gives up :data:`UB_COMM_SMS` of the device's ``sms`` SMs
    to communication kernels (its tiles run in proportionally more waves): 16/(sms - 16),
    0.138 on an H100's 132 SMs; none where the SM count is unknown."""
    return UB_COMM_SMS / (sms - UB_COMM_SMS) if sms > UB_COMM_SMS else 0.0


def userbuffers_exposed(gather: float, scatter: float, blocks: tuple[TpBlock, ...],
                        tp: int, sms: int) -> tuple[float, float, float]:
    """(forward, backward, backward with W deferred) seconds that a layer's blocks add to
    their GEMMs under Transformer Engine's comm-GEMM overlap (its defaults above):

    - forward: the input all-gather ring-exchanged with the column GEMM; the row GEMM
      pipelined with its reduce-scatter, slowed by the SM margin;
    - backward: the row linear's output-gradient all-gather ring-exchanged with its dgrad;
      the column linear's input all-gather (for its wgrad) in bulk beside its dgrad, and
      the reduce-scatter of that dgrad in bulk beside its wgrad, both GEMMs slowed by the
      margin. A schedule that defers W (zero bubble) leaves that reduce-scatter exposed;
      such a backward is charged at least the fused one's (Megatron-LM runs no zero-bubble
      schedule under --tp-comm-overlap, and the search's bounds take the fused form as
      every schedule's least: ``cost.bounds.busiest_stage_bound``).

    ``gather``, ``scatter``: one all-gather and one reduce-scatter of the layer's output."""
    m = sm_margin(sms)
    fwd = bwd = deferred = 0.0
    for b in blocks:
        col, row = b.column, b.row
        fwd += (ring_exposed(gather, col.fprop, tp)
                + m * row.fprop + pipeline_exposed(scatter, row.fprop * (1 + m), UB_PIPELINE_SPLITS))
        common = (ring_exposed(gather, row.dgrad, tp)
                  + m * col.dgrad + bulk_exposed(gather, col.dgrad * (1 + m)))
        fused = m * col.wgrad + bulk_exposed(scatter, col.wgrad * (1 + m))
        bwd += common + fused
        deferred += common + max(scatter, fused)
    return fwd, bwd, deferred


def async_exposed(gather: float, scatter: float, blocks: tuple[TpBlock, ...],
                  tp: int) -> tuple[float, float]:
    """(forward, backward) seconds that a layer's blocks add to their GEMMs under PyTorch's
    async TP (torch/distributed/_symmetric_memory: fused all-gather-matmul and
    matmul-reduce-scatter, tp chunks moved by the copy engines, no SMs taken): forward,
    the input all-gather with the column GEMM and the row GEMM with its reduce-scatter;
    backward, the output-gradient all-gather with the row dgrad and the column dgrad with
    its reduce-scatter (the column wgrad reads the gathered input SP saved)."""
    fwd = bwd = 0.0
    for b in blocks:
        fwd += ring_exposed(gather, b.column.fprop, tp) + ring_exposed(scatter, b.row.fprop, tp)
        bwd += ring_exposed(gather, b.row.dgrad, tp) + ring_exposed(scatter, b.column.dgrad, tp)
    return fwd, bwd
