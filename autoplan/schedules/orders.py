"""Each schedule is a generator of per-stage operation orders.

An operation is (kind, microbatch, chunk). kind "F" is a forward; "B" the
input-gradient backward; "W" the weight-gradient backward. Schedules that do
not split the backward (GPipe, 1F1B, interleaved) emit no "W": their "B" is
the whole backward (B and W fused). chunk is the model chunk on this stage (0
unless the schedule places several).

Placement, the virtual stage of (stage s, chunk c) on p stages:

* interleaved: c * p + s, as in Megatron-LM;
* V-shape (ZB-V, V-Half, V-Min): chunk 0 runs down the stages and chunk 1
  back up, so (s, 0) is s and (s, 1) is 2p - 1 - s (Qi et al. 2024, Sec. 6).

The orders below are the handcrafted ones; the papers' automatic schedulers
(heuristic search, ILP) are not reproduced. ``stage_orders`` raises
``ValueError`` for a (p, m, v) the schedule is not defined for; a small m
gives a valid order with more bubble, never an error (except interleaved,
which keeps Megatron-LM's rule that p divides m).
"""

from __future__ import annotations

from collections.abc import Iterator

from autoplan.vocab import Schedule

Op = tuple[str, int, int]

PERIOD = 6  # slots of one V building block: F, B and W of two chunks, one slot each


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


# --- one chunk per stage, fused backward -----------------------------------------------------


def gpipe(stage: int, p: int, m: int) -> Iterator[Op]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    yield from (("F", j, 0) for j in range(m))
    yield from (("B", j, 0) for j in range(m))


def one_f_one_b(stage: int, p: int, m: int) -> Iterator[Op]:
    """PipeDream-Flush (Narayanan et al. 2021, Fig. 4 top): p - s - 1 warm-up
    forwards, then alternate one forward and one backward, then drain."""
    warmup = min(p - stage - 1, m)
    yield from (("F", j, 0) for j in range(warmup))
    for j in range(m - warmup):
        yield ("F", warmup + j, 0)
        yield ("B", j, 0)
    yield from (("B", j, 0) for j in range(m - warmup, m))


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


# --- one chunk per stage, split backward (Qi et al. 2024, "Zero Bubble Pipeline Parallelism") ---


def zb_h1(stage: int, p: int, m: int) -> Iterator[Op]:
    """ZB-H1 (Qi et al. 2024, Sec. 2.1, Fig. 3 top): 1F1B's p - s - 1 warm-up
    forwards, then F, B and a W that runs s microbatches late, so every stage
    holds min(p, m) microbatches (those awaiting B or W); the late W fill the
    tail. For m >= p and W <= F the bubble is exactly (p - 1)(F + B - W)
    (Table 2), a third of 1F1B's (p - 1)(F + B + W) when F = B = W; for m <= p
    the step takes (m + p - 1)(F + B) + W (Appendix H). Any m >= 1."""
    warmup = min(p - stage - 1, m)
    pending: list[int] = []  # microbatches whose B ran and W has not
    yield from (("F", j, 0) for j in range(warmup))
    for j in range(m - warmup):
        yield ("F", warmup + j, 0)
        yield ("B", j, 0)
        pending.append(j)
        if j >= stage:
            yield ("W", pending.pop(0), 0)
    for j in range(m - warmup, m):
        yield ("B", j, 0)
        pending.append(j)
        yield ("W", pending.pop(0), 0)
    yield from (("W", j, 0) for j in pending)


def zb_h2(stage: int, p: int, m: int) -> Iterator[Op]:
    """ZB-H2 (Qi et al. 2024, Sec. 2.2, Fig. 3 bottom): 2(p - s) - 1 warm-up
    forwards fill the wait for the first B; then B, W, F with every stage's W
    running 2s microbatches late, which turns the tail into a parallelogram.
    Each stage holds min(2p - 1, m) microbatches. For m >= 2p - 1 each stage
    idles (p - 1)(F + B - 2W) between its first and last operation (Table 2;
    exact when 2W <= F + B), zero when F = B = W; the step's makespan still
    includes the (p - 1)F fill, which only the paper's optimizer post-validation
    (Sec. 4) overlaps with the previous step. Any m >= 1 (smaller m: bubbles)."""
    warmup = min(2 * (p - stage) - 1, m)
    pending: list[int] = []
    yield from (("F", j, 0) for j in range(warmup))
    for j in range(m):
        yield ("B", j, 0)
        pending.append(j)
        if len(pending) > 2 * stage:
            yield ("W", pending.pop(0), 0)
        if warmup + j < m:
            yield ("F", warmup + j, 0)
    yield from (("W", j, 0) for j in pending)


# --- two chunks per stage, V-shape, split backward ---------------------------------------------


def zb_v(stage: int, p: int, m: int) -> Iterator[Op]:
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


def v_block(schedule: Schedule, stage: int, p: int) -> tuple[int, int, int, int, int, int]:
    """The V-Half or V-Min building block of one stage (Qi et al. 2024b, "Pipeline
    Parallelism with Controllable Memory", V-shape building blocks): slots of microbatch 0's
    (F chunk 0, F chunk 1, B chunk 1, B chunk 0, W chunk 1, W chunk 0); microbatch
    j runs each 6j slots later. The F and B offsets are the paper's V-Min and
    V-Half blocks (as in sail-sg/zero-bubble-pipeline-parallelism,
    ``zbv_greedy.stable_pattern_v_min/_v_half``), with the extra gap that keeps
    slots apart when 3 | p (V-Min) or 2 | p (V-Half). Each W takes one of the two
    slots per period the block leaves free, the first one after its own B,
    choosing between the two ways to assign them the one with the shorter
    total wait."""
    s = stage
    if schedule is Schedule.V_MIN:
        gap = 2 if p % 3 == 0 else 0
        f0, f1, b1, b0 = s, 2 * p - 1 - s, 2 * p + gap + s, 4 * p + gap - 1 - s
    elif schedule is Schedule.V_HALF:
        gap = 3 if p % 2 == 0 else 0
        f0, f1, b1, b0 = 2 * s, 3 * p - 2 - s, 3 * p + gap + 2 * s - 1, 6 * p + gap - s - 2
    else:
        raise ValueError(f"{schedule.value} has no V building block")
    used = {f0 % PERIOD, f1 % PERIOD, b1 % PERIOD, b0 % PERIOD}
    assert len(used) == 4, f"{schedule.value}: block slots collide (p={p}, stage={s})"
    free = [r for r in range(PERIOD) if r not in used]

    def first(after: int, residue: int) -> int:
        return after + 1 + (residue - after - 1) % PERIOD

    w1, w0 = min(((first(b1, r1), first(b0, r0)) for r1, r0 in (free, free[::-1])),
                 key=lambda w: (w[0] - b1 + w[1] - b0, w[0]))
    return f0, f1, b1, b0, w1, w0


def v_building_block(schedule: Schedule, stage: int, p: int, m: int) -> Iterator[Op]:
    """V-Half / V-Min: the stage's building block repeated m times, every
    operation in the order of its slot. The simulator runs each as early as its
    dependencies allow (the paper's "squeeze"); the paper's further reordering of
    warm-up and cool-down is not applied. Peak memory with F = B = W, in
    microbatches of 1F1B's p: V-Half (p + 2) // 2, V-Min (p + 4) // 3 on the most
    loaded stage (the paper's repository table), reached once m is about p; the
    bubble with F = B = W is 4p - 5 slots (V-Min; 4p - 3 when 3 | p) and
    7p/2 - 2 (V-Half, even p; 7(p - 1)/2 odd), against the paper's ~2p/3m and
    ~p/2m of 6m slots. Any m >= 1."""
    f0, f1, b1, b0, w1, w0 = v_block(schedule, stage, p)
    slots = ((f0, "F", 0), (f1, "F", 1), (b1, "B", 1), (b0, "B", 0), (w1, "W", 1), (w0, "W", 0))
    timed = sorted((t + PERIOD * j, kind, j, chunk) for t, kind, chunk in slots for j in range(m))
    return ((kind, j, chunk) for _, kind, j, chunk in timed)


# --- dispatch --------------------------------------------------------------------------------


def chunks_per_stage(schedule: Schedule, v: int) -> int:
    """Model chunks a stage holds: v for interleaved, 2 for V-shape, else 1."""
    if schedule is Schedule.INTERLEAVED:
        return v
    return 2 if schedule.v_shape else 1


def check(schedule: Schedule, p: int, m: int, v: int) -> None:
    """Raise ValueError unless the schedule is defined for p stages, m microbatches, v chunks."""
    if p < 1 or m < 1:
        raise ValueError(f"{schedule.value}: need p >= 1 and m >= 1, got p={p}, m={m}")
    if schedule is Schedule.INTERLEAVED:
        if v < 1:
            raise ValueError(f"interleaved: need v >= 1 model chunks per stage, got v={v}")
        if m % p:
            raise ValueError(f"interleaved: m={m} microbatches must be a multiple of p={p} "
                             "(Megatron-LM's rule)")
    elif schedule.v_shape:
        if v != 2:
            raise ValueError(f"{schedule.value}: V-shape placement has exactly 2 chunks per "
                             f"stage, got v={v}")
    elif v != 1:
        raise ValueError(f"{schedule.value}: one model chunk per stage, got v={v}")


def stage_orders(schedule: Schedule, p: int, m: int, v: int = 1) -> list[list[Op]]:
    """Every stage's operation order (see :func:`check` for the (p, m, v) accepted)."""
    check(schedule, p, m, v)
    if schedule is Schedule.GPIPE:
        return [list(gpipe(s, p, m)) for s in range(p)]
    if schedule is Schedule.ONE_F_ONE_B:
        return [list(one_f_one_b(s, p, m)) for s in range(p)]
    if schedule is Schedule.INTERLEAVED:
        return [list(interleaved(s, p, m, v)) for s in range(p)]
    if schedule is Schedule.ZB_H1:
        return [list(zb_h1(s, p, m)) for s in range(p)]
    if schedule is Schedule.ZB_H2:
        return [list(zb_h2(s, p, m)) for s in range(p)]
    if schedule is Schedule.ZB_V:
        return [list(zb_v(s, p, m)) for s in range(p)]
    if schedule in (Schedule.V_HALF, Schedule.V_MIN):
        return [list(v_building_block(schedule, s, p, m)) for s in range(p)]
    raise ValueError(f"no operation order for schedule {schedule.value}")
