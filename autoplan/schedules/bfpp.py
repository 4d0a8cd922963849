"""Breadth-first pipeline parallelism (Lamy-Poirier, "Breadth-First Pipeline Parallelism",
MLSys 2023, arXiv:2211.05953): the looping placement of interleaved 1F1B (chunk c of stage
s is virtual stage c * p + s), run breadth-first. A stage runs every microbatch through
its first chunk, then through its next, ..., then the backwards chunk by chunk in
reverse, the last microbatch first: the order of torch.distributed.pipelining's
``ScheduleLoopedBFS``.

Its bubble is interleaved 1F1B's: with per-chunk forward f and backward b and m >= p
microbatches, a stage's first forward waits (p - 1) f and its last backward (p - 1) b
behind the others, so a step takes (m v + p - 1)(f + b). What it buys is the data-parallel
side: a chunk runs all its microbatches at once, so ZeRO-3 gathers its parameters once a
step and reduce-scatters its gradients once, behind m microbatches of compute
(``cost.stage``), where a depth-first schedule does both every microbatch. What it costs
is GPipe's memory: every microbatch of every chunk is held before the first backward."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register


def bfpp(stage: int, p: int, m: int, v: int) -> Iterator[Op]:
    """Each chunk's forwards for every microbatch, chunk by chunk; then each chunk's
    backwards, the last chunk first and the last microbatch first (``ScheduleLoopedBFS``)."""
    for chunk in range(v):
        yield from (("F", j, chunk) for j in range(m))
    for chunk in reversed(range(v)):
        yield from (("B", j, chunk) for j in reversed(range(m)))


def peak(p: int, m: int, v: int, stage: int) -> int:
    """m v: every forward of every chunk before the first backward."""
    return m * v


BFPP = register(ScheduleSpec(
    name="bfpp", attr="BFPP",
    doc="Breadth-first over looped chunks: all microbatches through a chunk, then the next "
        "(Lamy-Poirier 2023).",
    chunks=Chunks.LAYOUT, splits_backward=False, stage_order=bfpp, peak_inflight=peak,
    torch_class="ScheduleLoopedBFS", torch_multi_stage=True, torchtitan="LoopedBFS",
    breadth_first=True))
