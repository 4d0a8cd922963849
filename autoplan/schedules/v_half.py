"""V-Half (Qi et al. 2024b, "Pipeline Parallelism with Controllable Memory"): a V-shape
building block at about half of 1F1B's activation memory.

Peak memory with F = B = W, in microbatches of 1F1B's p: (p + 2) // 2 on the most loaded
stage (the paper's repository table; 2 * ((p + 2) // 2) chunk activations), reached once m
is about p; the bubble with F = B = W is 7p/2 - 2 slots (even p; 7(p - 1)/2 odd), against
the paper's ~p/2m of 6m slots."""

from __future__ import annotations

from autoplan.schedules.registry import register
from autoplan.schedules.vblock import Block, v_spec, with_w


def block(stage: int, p: int) -> Block:
    """Stage s's block: the paper's V-Half F and B slots (as in
    sail-sg/zero-bubble-pipeline-parallelism, ``zbv_greedy.stable_pattern_v_half``), with
    the extra gap that keeps slots apart when 2 | p."""
    s = stage
    gap = 3 if p % 2 == 0 else 0
    return with_w("v-half", s, p, 2 * s, 3 * p - 2 - s, 3 * p + gap + 2 * s - 1, 6 * p + gap - s - 2)


V_HALF = register(v_spec(
    "v-half", "V_HALF", "V-shape at about half of 1F1B's activation memory (Qi et al. 2024b, "
    "\"Pipeline Parallelism with Controllable Memory\").", block))
