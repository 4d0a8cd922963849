"""What the search needs from the cost model, in one narrow module: lower bounds on a
plan's step time, and the per-stage work and memory those bounds and the memory
checks are built from. The search imports from here and ``cost.evaluate.evaluate``
only."""

from __future__ import annotations

from autoplan.cost.stage import (
    StageWork,
    chunk_work,
    cost_key,
    memory_shortfall,
    stage_memory,
    stage_state_params,
    stage_work,
    stage_work_for,
)
from autoplan.cost.step import activation_copies_exposed, plan_durations
from autoplan.parallel import mesh
from autoplan.parallel.dp import (
    grad_sync_after,
    grad_sync_after_least,
    grad_sync_bound,
    grad_sync_least,
    memory_pressure,
    optimizer_seconds,
    optimizer_seconds_floor,
    state_bytes,
    state_bytes_of,
    step_overhead,
)
from autoplan.parallel.pp import dense_per_stage, output_stage
from autoplan.plan import Plan
from autoplan.schedules.memory import peak_inflight
from autoplan.schedules.simulator import critical_chain
from autoplan.vocab import ZeroStage

__all__ = [
    "StageWork", "cost_key", "dense_per_stage", "memory_pressure", "memory_shortfall",
    "optimizer_seconds", "optimizer_seconds_floor",
    "output_stage", "stage_memory", "stage_state_params", "stage_work", "stage_work_for",
    "state_bytes", "state_bytes_of", "step_overhead", "busiest_stage_bound", "step_time_lower_bound",
    "chain_bound", "split_chain_floor",
]

CHAIN_ROUNDING = 1e-12  # relative: the chain's sum and the simulator's add in another order


def step_time_lower_bound(plan: Plan, works: tuple[StageWork, ...]) -> float:
    """A step time no schedule of ``plan`` beats (the simulator's makespan plus the
    terms ``evaluate`` adds, each bounded from below).

    Per stage s, with F, B, W its forward, input-gradient and weight-gradient seconds
    per microbatch (all its chunks; B and W fused into one backward unless the schedule
    splits them) and f'_j, b'_j, w'_j those of the first chunk of stage j < s (virtual
    stage j; a V's first leg is Megatron's order too):

    1. s cannot start before the first microbatch's forward has crossed the virtual
       stages before it: fill_s = sum_{j<s} f'_j. Every op of s then runs on s alone:
       the step is at least fill_s + m(F + B + W).
    2. s's last backward follows all of its m forwards and m backwards (B needs its
       F; W is not needed), and its gradient still crosses the earlier virtual stages:
       the step is at least fill_s + m(F + B) + sum_{j<s} b'_j, plus, where W runs
       apart, stage 0's W of that microbatch (it follows that B): w'_0 for s > 0.
       With B and W fused this is term 1 with the fused drain (1F1B and GPipe with
       uniform stages: exactly (m + p - 1)(f + b)). Zero-bubble schedules fill the
       drain with W, which is why it counts only B there (Qi et al. 2024, Sec. 2).
    3. Then the optimizer step, the stack's per-step overhead and the gradient sync
       that is exposed whatever the drain (``dp.grad_sync_bound``: the heaviest stage's
       without a drain counted, or the least of any stage with none, as the stage
       that ends the step has), which ``evaluate`` adds after the makespan,
       and offloaded activations' copies where compute does not hide them, which it adds
       exactly so (:func:`offload_copies`).
    4. Or the makespan and the sync together, from when each stage ends at the earliest
       (``dp.grad_sync_after``): stage s ends no earlier than term 1's fill_s + m(F + B + W),
       nor than the gradient of a later stage s' reaches it, the chain of term 2 cut at
       s: fill_s' + m(F_s' + B_s') + sum_{s<=j<s'} b'_j, plus its W (w'_s) where W runs
       apart (at s = 0 that is term 2 itself). The earlier a stage ends, the longer the
       drain its reduction hides behind at most.
    """
    m, v = plan.num_microbatches, plan.layout.vpp
    split = not plan.schedule.spec.drain_counts_w
    if plan.chunks is not None:  # the first chunk of each stage, by its own size
        firsts = chunk_work(plan)[:plan.layout.pp]
        fwd = [c.forward for c in firsts]
        bwd = [c.backward_input if split else c.backward for c in firsts]
        wgt = [c.backward_weight for c in firsts]
    else:
        fwd = [w.forward / v for w in works]
        bwd = [(w.backward_input if split else w.backward) / v for w in works]
        wgt = [w.backward_weight / v for w in works]
    w0 = wgt[0]
    synced = plan.zero is not ZeroStage.PARAMETERS  # ZeRO-3 syncs inside the stage times
    ends: list[float] = []  # term 1 of each stage: the least time it ends
    chains: list[float] = []  # term 2's chain of each stage, before stage 0's W
    drains: list[float] = []  # sum_{j<s} b'_j
    best, fill, drain = 0.0, 0.0, 0.0
    for s, w in enumerate(works):  # (comparisons written out: the search's hottest loop)
        if split:
            x = fill + m * (w.forward + w.backward)
            if x > best:
                best = x
            if synced:
                ends.append(x)
                chains.append(fill + m * (w.forward + w.backward_input) + drain)
            x = fill + m * (w.forward + w.backward_input) + drain + (w0 if s else 0.0)
        else:
            x = fill + m * (w.forward + w.backward) + drain
            if synced:
                ends.append(x - drain)
                chains.append(x)
        if x > best:
            best = x
        if synced:
            drains.append(drain)
        fill += fwd[s]
        drain += bwd[s]
    rest = optimizer_seconds(plan, works) + step_overhead(plan) + offload_copies(plan, works)
    if not synced:
        return best + rest
    groups = mesh.groups(plan)
    later = float("-inf")  # the latest chain of the stages after s
    for s in range(len(works) - 1, -1, -1):
        if later > ends[s]:
            ends[s] = max(ends[s], later - drains[s] + (wgt[s] if split else 0.0))
        if chains[s] > later:
            later = chains[s]
    return rest + max(best + grad_sync_bound(plan, groups, works),
                      grad_sync_after(plan, groups, works, best, ends))


def split_chain_floor(total: float, share: float, m: float, p: int) -> float:
    """A makespan no layer split over ``p`` one-chunk stages beats, for m microbatches
    whose work per microbatch, summed over every layer and the logits, is ``total``,
    where the chain term of :func:`step_time_lower_bound` charges at least ``share`` of
    each layer's work to the stages after it.

    Terms 1 and 2 there read, per stage s with c_s its work per microbatch and a_s the
    part of it on the chain (its forward; its forward and backward where they are the
    drain's too): T >= a_0 + ... + a_{s-1} + m c_s, with a_j >= share c_j layer by layer,
    so T >= share C_{<s} + m c_s. Let R_s = T - share C_{<s}: then c_s <= R_s / m, and
    R_{s+1} = R_s - share c_s >= R_s (1 - share/m), so T - share C = R_p >= T (1 - share/m)^p,
    whatever the split:

        T >= share C / (1 - (1 - share/m)^p).

    It is m C at p = 1 and C at m = 1 (share 1), never below the mean, m C / p (Bernoulli:
    1 - (1 - x)^p <= p x), and, with share 1, at most equal stages' (m + p - 1) C / p (one
    split of those it holds for). It is the pipeline's fill, which the mean leaves out,
    for every split at once: with share 1, 2.4x the mean at p = 32, m = 15."""
    x = share / m
    return share * total / (1.0 - (1.0 - x) ** p)


def offload_copies(plan: Plan, works: tuple[StageWork, ...]) -> float:
    """The seconds ``evaluate`` adds for offloaded activations' copies
    (``activation_copies_exposed``, from the stages' microbatch-chunks in flight)."""
    if not plan.offload.activations:
        return 0.0
    lay, m = plan.layout, plan.num_microbatches
    inflight = tuple(peak_inflight(plan.schedule, lay.pp, m, lay.vpp, s) for s in range(lay.pp))
    return activation_copies_exposed(plan, works, inflight)


def busiest_stage_bound(plan: Plan, works: tuple[StageWork, ...], vpp: int = 1,
                        sync: bool = False, forward_known: bool = False,
                        drained: float = 0.0, fused: bool = False) -> float:
    """A step time no schedule of the plan's layout beats, of up to ``vpp`` equal chunks
    per stage, plus the optimizer step. ``works``: the layout's 1F1B, vpp = 1 form, whose
    F, B and input-gradient B are the least of every schedule (``tp.exposed_backward``
    hides backward TP traffic only behind a W run with it; more chunks send more).

    Stage s runs m forwards and m backwards of its own one after another, and its first
    cannot start before the first microbatch's forward has crossed stages 0..s-1, one
    chunk of each (virtual stages 0..s-1, interleaved or V): fill_s = sum_{j<s} F_j/vpp,
    so the step is at least fill_s + m(F_s + B_s). Its last input-gradient B is a first
    chunk's (a later chunk's B of that microbatch precedes it on the stage) and follows
    all of the stage's F and B; the gradient then crosses stages s-1..0:
    fill_s + m(F_s + B_in,s) + sum_{j<s} B_in,j/vpp. W is needed by neither (zero-bubble
    schedules run it in the drain). ``fused``: every schedule bounded runs B and W as
    one backward (GPipe, 1F1B, interleaved), so the gradient crosses the earlier stages
    in their whole backwards: fill_s + m(F_s + B_s) + sum_{j<s} B_j/vpp (term 2 of
    :func:`step_time_lower_bound` with B and W fused). ``works`` are at one CP exchange:
    the bound holds for that exchange's schedules (the search takes the least over its
    exchanges). A V places its output layer on stage 0: its schedules are bounded with
    the V's own ``works`` (vpp = 2).

    ``sync``: plus the gradient sync no drain hides (``dp.grad_sync_least``) of every
    schedule of the plan's ZeRO stage at up to ``vpp`` chunks: the heaviest stage's
    parameters are every such schedule's (``works``: its own or its V's) and its backward
    the least. ``forward_known``: every schedule bounded runs ``vpp`` chunks whose
    forward is ``works``' (a V's own works; the flat works at one chunk), so the gather
    hides behind that forward's chunk. ``drained``: another bound on that sync, valid
    for every such schedule (``dp.grad_sync_drained_least``); the more of the two
    counts. Or the makespan and that sync together, from when each stage ends at the
    earliest (``dp.grad_sync_after_least``, as term 4 of :func:`step_time_lower_bound`
    reads them for one plan): stage s ends no earlier than fill_s + m(F_s + B_s), nor
    than the gradient of a later stage s' reaches it, fill_s' + m(F_s' + B_in,s') +
    sum_{s<=j<s'} B_in,j/vpp; a run of equal stages ends latest at its last stage's
    first bound or its first stage's second."""
    m = plan.num_microbatches
    best = fill = drain = 0.0
    heaviest: StageWork | None = None
    coupled = sync and plan.zero is not ZeroStage.PARAMETERS  # ZeRO-3 syncs in the stages
    # per run of equal stages: its work, F, B, its last stage's two bounds, its first's drain
    runs: list[tuple[StageWork, float, float, float, float, float, bool]] = []
    n, i = len(works), 0
    while i < n:  # (comparisons written out: the search's hottest loop)
        w = works[i]
        run = i + 1  # a run of stages sharing one work (equal middle stages): its last has
        while run < n and works[run] is w:  # the most fill and drain before it
            run += 1
        f, b_in, b = w.forward, w.backward_input, w.backward
        if fused:
            b_in = b
        before = run - i - 1
        x = fill + before * f / vpp + m * (f + b)
        if x > best:
            best = x
        x2 = fill + before * f / vpp + m * (f + b_in) + drain + before * b_in / vpp
        if x2 > best:
            best = x2
        if coupled:
            runs.append((w, f, b, x, x2, drain, before > 0))
        fill += (run - i) * f / vpp
        drain += (run - i) * b_in / vpp
        if heaviest is None or w.params + w.expert_params > heaviest.params + heaviest.expert_params:
            heaviest, heaviest_f, heaviest_b = w, f, b
        i = run
    rest = optimizer_seconds(plan, works) + step_overhead(plan)
    if not sync or heaviest is None:
        return best + rest
    groups = mesh.groups(plan)
    least = best + max(grad_sync_least(plan, groups, heaviest.params, heaviest.expert_params,
                                       heaviest_b, heaviest_f / vpp if forward_known else None,
                                       vpp), drained)
    later = float("-inf")  # the latest second bound of the stages after a run's first
    for w, f, b, end, chain, first_drain, longer in reversed(runs):
        reach = max(later, chain) if longer else later
        if reach - first_drain > end:
            end = reach - first_drain
        least = max(least, grad_sync_after_least(
            plan, groups, w.params, w.expert_params, b / vpp,
            f / vpp if forward_known else None, best, end))
        if chain > later:
            later = chain
    return least + rest


def chain_bound(plan: Plan, works: tuple[StageWork, ...]) -> float:
    """A step time the plan cannot beat, from one dependency chain of its own schedule
    (``simulator.critical_chain``: the critical path with equal durations): the chain's
    operations run one after another whatever the durations, so their total is at most
    the simulated makespan; ``evaluate`` then adds the same optimizer step, overhead and
    at least the gradient sync as in :func:`step_time_lower_bound`. Tighter than
    that bound where a schedule holds microbatches back to save memory (V-Half, V-Min:
    Qi et al. 2024), whose extra bubbles no closed-form fill and drain sees, and a little
    for ZB-V (its output layer on stage 0; every V-shaped schedule the search chains)."""
    lay = plan.layout
    chain = critical_chain(plan.schedule, lay.pp, plan.num_microbatches, lay.vpp)
    makespan = chain.length(*plan_durations(plan, works), per_chunk=plan.chunks is not None)
    return (makespan * (1 - CHAIN_ROUNDING) + optimizer_seconds(plan, works) + step_overhead(plan)
            + grad_sync_bound(plan, mesh.groups(plan), works) + offload_copies(plan, works))
