"""V-shape building blocks (Qi et al. 2024b, "Pipeline Parallelism with Controllable
Memory"): a schedule of this family is one block per stage, the slots of microbatch 0's
forwards and backwards of its two chunks, repeated every :data:`PERIOD` slots. V-Half and
V-Min (``v_half.py``, ``v_min.py``) give their F and B slots; the W slots, the orders and
the peak memory are worked out here for any such block."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec

PERIOD = 6  # slots of one V building block: F, B and W of two chunks, one slot each

Block = tuple[int, int, int, int, int, int]  # (F chunk 0, F chunk 1, B chunk 1, B chunk 0, W 1, W 0)


def with_w(name: str, stage: int, p: int, f0: int, f1: int, b1: int, b0: int) -> Block:
    """The block with its W slots: each W takes one of the two slots per period the F
    and B leave free, the first one after its own B, choosing between the two ways to
    assign them the one with the shorter total wait."""
    used = {f0 % PERIOD, f1 % PERIOD, b1 % PERIOD, b0 % PERIOD}
    assert len(used) == 4, f"{name}: block slots collide (p={p}, stage={stage})"
    free = [r for r in range(PERIOD) if r not in used]

    def first(after: int, residue: int) -> int:
        return after + 1 + (residue - after - 1) % PERIOD

    w1, w0 = min(((first(b1, r1), first(b0, r0)) for r1, r0 in (free, free[::-1])),
                 key=lambda w: (w[0] - b1 + w[1] - b0, w[0]))
    return f0, f1, b1, b0, w1, w0


def block_order(block: Block, m: int) -> Iterator[Op]:
    """The stage's block repeated m times, every operation in the order of its slot. The
    simulator runs each as early as its dependencies allow (the paper's "squeeze"); the
    paper's further reordering of warm-up and cool-down is not applied."""
    f0, f1, b1, b0, w1, w0 = block
    slots = ((f0, "F", 0), (f1, "F", 1), (b1, "B", 1), (b0, "B", 0), (w1, "W", 1), (w0, "W", 0))
    timed = sorted((t + PERIOD * j, kind, j, chunk) for t, kind, chunk in slots for j in range(m))
    return ((kind, j, chunk) for _, kind, j, chunk in timed)


def block_peak(block: Block, m: int) -> int:
    """Peak of a repeated building block.

    Chunk c's activation of microbatch j lives from its F's slot a_c + 6j to its
    W's slot e_c + 6j, so after slot t the stage holds
    sum_c #{j < m : a_c + 6j <= t < e_c + 6j}. The count only rises at an F, and
    from the microbatch K = ceil(max lifespan / 6) + 1 on it repeats with period
    6 (or falls, once m cuts it), so the maximum over the F slots of the first
    min(m, K + 1) microbatches is the peak: O(p) work, independent of m."""
    f0, f1, _, _, w1, w0 = block
    lives = ((f0, w0), (f1, w1))
    horizon = -(-max(e - a for a, e in lives) // PERIOD) + 1
    best = 0
    for a_first, _ in lives:
        for k in range(min(m - 1, horizon) + 1):
            t = a_first + PERIOD * k
            alive = sum(max(0, min(m - 1, (t - a) // PERIOD) - max(-1, (t - e) // PERIOD))
                        for a, e in lives)
            best = max(best, alive)
    return best


def v_spec(name: str, attr: str, doc: str, block: Callable[[int, int], Block]) -> ScheduleSpec:
    """A V-shape schedule of this family from its ``block(stage, p)``: two chunks per stage,
    B and W apart, its order the block repeated (:func:`block_order`) and its peak the
    block's (:func:`block_peak`). Any m >= 1."""

    def order(stage: int, p: int, m: int, v: int = 2) -> Iterator[Op]:
        return block_order(block(stage, p), m)

    def peak(p: int, m: int, v: int, stage: int) -> int:
        return block_peak(block(stage, p), m)

    return ScheduleSpec(name=name, attr=attr, doc=doc, chunks=Chunks.V, splits_backward=True,
                        stage_order=order, peak_inflight=peak)
