"""Each schedule is a generator of per-stage operation orders (one file per schedule,
``registry.py``); this module places chunks and checks (p, m, v) for any of them.

An operation is (kind, microbatch, chunk). kind "F" is a forward; "B" the
input-gradient backward; "W" the weight-gradient backward. Schedules that do
not split the backward (GPipe, 1F1B, interleaved) emit no "W": their "B" is
the whole backward (B and W fused). chunk is the model chunk on this stage (0
unless the schedule places several).

Placement, the virtual stage of (stage s, chunk c) on p stages (``registry.Chunks``):

* one chunk per stage: s;
* the layout's vpp chunks (interleaved): c * p + s, as in Megatron-LM;
* V-shape (ZB-V, V-Half, V-Min): chunk 0 runs down the stages and chunk 1
  back up, so (s, 0) is s and (s, 1) is 2p - 1 - s (Qi et al. 2024, Sec. 6).

The orders are the handcrafted ones; the papers' automatic schedulers (heuristic
search, ILP) are not reproduced. ``stage_orders`` raises ``ValueError`` for a (p, m, v)
the schedule is not defined for; a small m gives a valid order with more bubble, never
an error (except where the schedule keeps Megatron-LM's rule that p divides m).
"""

from __future__ import annotations

from autoplan.schedules.registry import Chunks, Op, Schedule

__all__ = ["Op", "check", "chunks_per_stage", "stage_chunks", "stage_orders", "virtual_stage"]


def virtual_stage(schedule: Schedule, p: int, stage: int, chunk: int) -> int:
    """Position of (stage, chunk) in the model's sequence of p * v chunks: the one home
    of chunk placement (the cost model, the simulator and ``validate`` all ask here).
    Chunk c of stage s is virtual stage c*p + s (interleaved; Narayanan et al. 2021), or
    in a V the way back, 2p - 1 - s (Qi et al. 2024b)."""
    if schedule.v_shape and chunk == 1:
        return 2 * p - 1 - stage
    return chunk * p + stage


def stage_chunks(schedule: Schedule, p: int, v: int, stage: int) -> list[int]:
    """The virtual stages (model chunks) ``stage`` runs, in its chunk order."""
    return [virtual_stage(schedule, p, stage, c) for c in range(chunks_per_stage(schedule, v))]


def chunks_per_stage(schedule: Schedule, v: int) -> int:
    """Model chunks a stage holds: the layout's v (interleaved), 2 (V-shape), else 1."""
    chunks = schedule.spec.chunks
    return v if chunks is Chunks.LAYOUT else 2 if chunks is Chunks.V else 1


def check(schedule: Schedule, p: int, m: int, v: int) -> None:
    """Raise ValueError unless the schedule is defined for p stages, m microbatches, v chunks."""
    name, spec = schedule.value, schedule.spec
    if p < 1 or m < 1:
        raise ValueError(f"{name}: need p >= 1 and m >= 1, got p={p}, m={m}")
    if spec.chunks is Chunks.LAYOUT:
        if v < 1:
            raise ValueError(f"{name}: need v >= 1 model chunks per stage, got v={v}")
    elif spec.chunks is Chunks.V:
        if v != 2:
            raise ValueError(f"{name}: V-shape placement has exactly 2 chunks per stage, got v={v}")
    elif v != 1:
        raise ValueError(f"{name}: one model chunk per stage, got v={v}")
    if spec.p_divides_m and m % p:
        raise ValueError(f"{name}: m={m} microbatches must be a multiple of p={p} (Megatron-LM's rule)")


def stage_orders(schedule: Schedule, p: int, m: int, v: int = 1) -> list[list[Op]]:
    """Every stage's operation order (see :func:`check` for the (p, m, v) accepted)."""
    check(schedule, p, m, v)
    order = schedule.spec.stage_order
    return [list(order(s, p, m, v)) for s in range(p)]
