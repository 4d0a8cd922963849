"""Interleaved 1F1B over vpp model chunks per stage (Narayanan et al. 2021, Sec. 2.2.2)."""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register


def interleaved(stage: int, p: int, m: int, v: int) -> Iterator[Op]:
    """Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2), in the order of
    Megatron-LM's ``forward_backward_pipelining_with_interleaving``: microbatches
    go through chunks in groups of p; warm-up is 2(p - s - 1) + (v - 1)p.
    Needs p | m (Megatron-LM's rule)."""
    total = m * v

    def op(kind: str, k: int) -> Op:
        in_group = k % (p * v)
        chunk = in_group // p
        if kind == "B":
            chunk = v - 1 - chunk
        return (kind, (k // (p * v)) * p + k % p, chunk)

    warmup = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)
    yield from (op("F", k) for k in range(warmup))
    for k in range(total - warmup):
        yield op("F", warmup + k)
        yield op("B", k)
    yield from (op("B", k) for k in range(total - warmup, total))


def peak(p: int, m: int, v: int, stage: int) -> int:
    """Warm-up 2(p - s - 1) + (v - 1)p plus one, at most m*v; all m*v when m = p
    (Megatron-LM runs every forward first then)."""
    if m == p:
        return m * v
    return min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)


INTERLEAVED = register(ScheduleSpec(
    name="interleaved", attr="INTERLEAVED",
    doc="1F1B over vpp model chunks per stage (Narayanan et al. 2021, Sec. 2.2.2).",
    chunks=Chunks.LAYOUT, splits_backward=False, stage_order=interleaved, peak_inflight=peak,
    p_divides_m=True, torch_class="ScheduleInterleaved1F1B", torch_multi_stage=True,
    torchtitan="Interleaved1F1B"))
