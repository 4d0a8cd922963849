"""V-Min (Qi et al. 2024b, "Pipeline Parallelism with Controllable Memory"): a V-shape
building block at about a third of 1F1B's activation memory."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register
from autoplan.schedules.vblock import Block, block_order, block_peak, with_w


def block(stage: int, p: int) -> Block:
    """Stage s's block: the paper's V-Min F and B slots (as in
    sail-sg/zero-bubble-pipeline-parallelism, ``zbv_greedy.stable_pattern_v_min``), with
    the extra gap that keeps slots apart when 3 | p."""
    s = stage
    gap = 2 if p % 3 == 0 else 0
    return with_w("v-min", s, p, s, 2 * p - 1 - s, 2 * p + gap + s, 4 * p + gap - 1 - s)


def order(stage: int, p: int, m: int, v: int = 2) -> Iterator[Op]:
    """The block repeated m times. Peak memory with F = B = W, in microbatches of 1F1B's
    p: (p + 4) // 3 on the most loaded stage (the paper's repository table), reached once
    m is about p; the bubble with F = B = W is 4p - 5 slots (4p - 3 when 3 | p), against
    the paper's ~2p/3m of 6m slots. Any m >= 1."""
    return block_order(block(stage, p), m)


def peak(p: int, m: int, v: int, stage: int) -> int:
    """The block's activations alive at once (:func:`vblock.block_peak`); for m large the
    most loaded stage holds 2 * ((p + 4) // 3) chunk activations."""
    return block_peak(block(stage, p), m)


V_MIN = register(ScheduleSpec(
    name="v-min", attr="V_MIN",
    doc="V-shape at about a third of 1F1B's activation memory (Qi et al. 2024b).",
    chunks=Chunks.V, splits_backward=True, stage_order=order, peak_inflight=peak))
