"""V-Min (Qi et al. 2024b, "Pipeline Parallelism with Controllable Memory"): a V-shape
building block at about a third of 1F1B's activation memory.

Peak memory with F = B = W, in microbatches of 1F1B's p: (p + 4) // 3 on the most loaded
stage (the paper's repository table; 2 * ((p + 4) // 3) chunk activations), reached once m
is about p; the bubble with F = B = W is 4p - 5 slots (4p - 3 when 3 | p), against the
paper's ~2p/3m of 6m slots."""

from __future__ import annotations

from autoplan.schedules.registry import register
from autoplan.schedules.vblock import Block, v_spec, with_w


def block(stage: int, p: int) -> Block:
    """Stage s's block: the paper's V-Min F and B slots (as in
    sail-sg/zero-bubble-pipeline-parallelism, ``zbv_greedy.stable_pattern_v_min``), with
    the extra gap that keeps slots apart when 3 | p."""
    s = stage
    gap = 2 if p % 3 == 0 else 0
    return with_w("v-min", s, p, s, 2 * p - 1 - s, 2 * p + gap + s, 4 * p + gap - 1 - s)


V_MIN = register(v_spec(
    "v-min", "V_MIN", "V-shape at about a third of 1F1B's activation memory (Qi et al. 2024b).",
    block))
