"""ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 6): two chunks per stage
in a V, zero bubble at 1F1B's memory."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register


def zb_v(stage: int, p: int, m: int, v: int = 2) -> Iterator[Op]:
    """ZB-V (Qi et al. 2024, Sec. 6, Fig. 8; the same order as PyTorch's
    ``ScheduleZBVZeroBubble``). Warm-up: 2(p - s) - 1 forwards of chunk 0, then
    s pairs (chunk 1, chunk 0); steady: p - s groups F-B-W of chunk 1, then
    alternate F-B-W groups of chunk 0 and chunk 1; cool-down: the remaining B
    first, W after. Built for max(m, 2p - 1) microbatches, then the operations
    of microbatches >= m are dropped (a sub-order of a valid order stays valid).
    With F = B = W and m >= 2p - 1: zero bubble per stage at 2p chunk
    activations, 1F1B's memory (each chunk holds half a stage). Any m >= 1."""
    n = max(m, 2 * p - 1)
    out: list[Op] = []
    nxt = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0, ("W", 0): 0, ("W", 1): 0}

    def run(kind: str, chunk: int) -> None:
        out.append((kind, nxt[kind, chunk], chunk))
        nxt[kind, chunk] += 1

    def group(chunk: int) -> None:  # F, B and W of the next microbatch of one chunk
        run("F", chunk)
        run("B", chunk)
        run("W", chunk)

    for _ in range(2 * (p - stage) - 1):
        run("F", 0)
    for _ in range(stage):
        run("F", 1)
        run("F", 0)
    for _ in range(p - stage):
        group(1)
    while nxt["F", 1] < nxt["F", 0] or nxt["F", 0] < n:
        if nxt["F", 0] < n:
            run("F", 0)
        run("B", 0)
        run("W", 0)
        group(1)
    for _ in range(stage):
        run("B", 0)
        run("B", 1)
    for _ in range(p - stage):
        run("B", 0)
        run("W", 0)
    while nxt["W", 1] < nxt["B", 1]:
        run("W", 1)
    while nxt["W", 0] < nxt["B", 0]:
        run("W", 0)
    assert all(nxt[k, c] == n for k in "FBW" for c in (0, 1)), (stage, p, m, nxt)
    return (op for op in out if op[1] < m)


def peak(p: int, m: int, v: int, stage: int) -> int:
    """min(2p - s - 1, m) + min(s + 1, m); 2p when m >= 2p - 1, i.e. p microbatches of the
    whole stage, 1F1B's stage-0 memory (Qi et al. 2024, Sec. 6)."""
    return min(2 * p - stage - 1, m) + min(stage + 1, m)


ZB_V = register(ScheduleSpec(
    name="zb-v", attr="ZB_V", doc="Zero-bubble V-shape, two chunks per stage (Qi et al. 2024b).",
    chunks=Chunks.V, splits_backward=True, stage_order=zb_v, peak_inflight=peak,
    torch_class="ScheduleZBVZeroBubble", torch_multi_stage=True, torchtitan="ZBVZeroBubble"))
