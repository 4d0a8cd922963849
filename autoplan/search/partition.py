"""Layers to pipeline stages: contiguous, possibly uneven, each within its GPU's memory.

The first stage holds the embedding and, under 1F1B, the most in-flight microbatches
(stage s of p holds p - s; Narayanan et al. 2021, Sec. 2.2.1); the last holds the
output layer and the logits (b*s*V values in fp32, often the largest single tensor).
A uniform split makes those two stages the slowest and the fullest; this module
chooses the layers per stage instead.

Two solvers of one problem, held to the same answer by the tests:

- ``partition_dp``: dynamic programming over contiguous splits. Exact for every
  problem a ``PartitionProblem`` can state (any per-layer times and memory, binding
  or not, every ``StageShape``); milliseconds.
- ``partition_cpsat``: the same objective and constraints as an OR-Tools CP-SAT
  model, solved lexicographically in phases. The place to add constraints that couple
  stages, which the DP cannot take.

``best_partition`` uses the DP (see there for the rule).

**Rank of a split** (the same in both solvers; smaller is better, compared in order):

1. the bottleneck: the largest stage time (in the 1F1B steady state the pipeline
   advances at the pace of its slowest stage);
2. the largest stage memory (more headroom);
3. fewer layers on the first stage, then fewer on the last (they carry the embedding,
   the logits and the most in-flight activations);
4. in model order, fewer layers on the earlier middle stages.

**Integer scaling.** Times and memory are ranked in integer ticks. The time tick is
``2**(e - 40)`` s, where ``2**e`` is the least power of two above the largest time
one stage could have (every layer plus the largest fixed stage time); memory has its
own tick, found the same way. Each layer's and each stage's fixed value is rounded
to whole ticks; the scaling, by a power of two, is exact, and sums of ticks are
exact, so both solvers rank every split alike and layers of equal time tie exactly.
Values on a binary grid no finer than the tick (whole bytes below 1 TiB, multiples
of 2**-k s) are not rounded at all, so their ranking is the exact one; other values
can swap the ranks of two splits only when their bottlenecks differ by less than L
ticks, about ``L * p * 2**-40`` of the bottleneck (2e-9 for 128 layers, 16 stages).
The capacity check is *not* scaled: a stage fits iff its bytes, summed in floats
with ``math.fsum``, are at most ``capacity``, the numbers ``stage_memory`` reports.
The times and bytes in a returned ``Partition`` are the float ones.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoplan.descriptors.pipeline_layout import uniform_stages
from autoplan.descriptors.space import StageShape
from autoplan.errors import AutoplanError, InputError, Problem

_TICK_BITS = 40  # the largest possible stage time (or memory) is < 2**40 ticks; see the module doc
_INF = 1 << 62  # above any sum of ticks


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProblem:
    """L layers in model order onto p pipeline stages; p = len(stage_time)."""

    layer_time: tuple[float, ...]  # seconds per microbatch (forward + backward) of each layer
    layer_static: tuple[float, ...]  # bytes of weights, grads and optimizer state per layer, one rank
    layer_activation: tuple[float, ...]  # bytes of activations per layer per in-flight microbatch
    stage_time: tuple[float, ...]  # extra seconds per microbatch of each stage (embedding, logits, p2p)
    stage_static: tuple[float, ...]  # extra bytes of each stage (embedding/output weights, buffers)
    inflight: tuple[int, ...]  # microbatches each stage holds (1F1B: stage s holds p - s)
    capacity: float  # bytes per GPU
    shape: StageShape = StageShape.ANY
    min_layers: int = 1  # per stage

    def __post_init__(self) -> None:
        problems = []

        def bad(field: str, message: str) -> None:
            problems.append(Problem("PartitionProblem", field, message))

        n_layers, n_stages = len(self.layer_time), len(self.stage_time)
        if n_layers == 0:
            bad("layer_time", "expected at least one layer, got none")
        if n_stages == 0:
            bad("stage_time", "expected at least one stage, got none")
        for name in ("layer_static", "layer_activation"):
            if len(getattr(self, name)) != n_layers:
                bad(name, f"expected {n_layers} entries (one per layer, as layer_time), "
                          f"got {len(getattr(self, name))}")
        for name in ("stage_static", "inflight"):
            if len(getattr(self, name)) != n_stages:
                bad(name, f"expected {n_stages} entries (one per stage, as stage_time), "
                          f"got {len(getattr(self, name))}")
        for name in ("layer_time", "layer_static", "layer_activation", "stage_time",
                     "stage_static", "inflight"):
            for k, v in enumerate(getattr(self, name)):
                if not (math.isfinite(v) and v >= 0):
                    bad(f"{name}[{k}]", f"expected a finite number >= 0, got {v!r}")
        if not (math.isfinite(self.capacity) and self.capacity > 0):
            bad("capacity", f"expected a finite number of bytes > 0, got {self.capacity!r}")
        if self.min_layers < 0:
            bad("min_layers", f"expected an integer >= 0, got {self.min_layers}")
        if problems:
            raise InputError(problems)

    @property
    def n_layers(self) -> int:
        return len(self.layer_time)

    @property
    def n_stages(self) -> int:
        return len(self.stage_time)


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    """A split of the layers into stages, with its float stage times and memory."""

    layers: tuple[int, ...]  # per stage, summing to the number of layers
    bottleneck_s: float  # largest stage time, seconds per microbatch
    peak_bytes: tuple[float, ...]  # memory per stage
    optimal: bool = True  # False when CP-SAT ran out of time before proving the rank


class SolverTimeout(AutoplanError):
    """CP-SAT found no split within its time limit (which is not proof that none fits)."""

    exit_code = 1


# --------------------------------------------------------------------------- floats


def stage_time(problem: PartitionProblem, layers: Sequence[int]) -> tuple[float, ...]:
    """Seconds per microbatch of each stage of a split."""
    _check_split(problem, layers)
    bounds = _bounds(layers)
    return tuple(_seconds(problem, s, bounds[s], bounds[s + 1]) for s in range(len(layers)))


def stage_memory(problem: PartitionProblem, layers: Sequence[int]) -> tuple[float, ...]:
    """Bytes per GPU of each stage of a split: fixed + layer states + in-flight activations."""
    _check_split(problem, layers)
    bounds = _bounds(layers)
    return tuple(_bytes(problem, s, bounds[s], bounds[s + 1]) for s in range(len(layers)))


def _check_split(problem: PartitionProblem, layers: Sequence[int]) -> None:
    assert len(layers) == problem.n_stages, f"{len(layers)} stages, expected {problem.n_stages}"
    assert sum(layers) == problem.n_layers, f"{sum(layers)} layers, expected {problem.n_layers}"
    assert min(layers) >= 0, f"negative layer count in {tuple(layers)}"


def _bounds(layers: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(layers)]


def _seconds(problem: PartitionProblem, s: int, i: int, j: int) -> float:
    """Time of stage s holding layers [i, j)."""
    return problem.stage_time[s] + math.fsum(problem.layer_time[i:j])


def _bytes(problem: PartitionProblem, s: int, i: int, j: int) -> float:
    """Memory of stage s holding layers [i, j). Nondecreasing as [i, j) grows: every
    term is >= 0, fsum rounds correctly (so monotonically), and so do + and *."""
    return (problem.stage_static[s] + math.fsum(problem.layer_static[i:j])
            + problem.inflight[s] * math.fsum(problem.layer_activation[i:j]))


def _result(problem: PartitionProblem, layers: Sequence[int], optimal: bool = True) -> Partition:
    return Partition(layers=tuple(layers), bottleneck_s=max(stage_time(problem, layers)),
                     peak_bytes=stage_memory(problem, layers), optimal=optimal)


# --------------------------------------------------------------------------- ticks


@dataclass(frozen=True, slots=True)
class _Ticks:
    """A problem as both solvers see it: times and memory in integer ticks, and the
    exact float capacity check as a table of the last layer each stage can reach."""

    n_layers: int
    n_stages: int
    min_layers: int
    time_prefix: tuple[int, ...]  # ticks of layers [0, j)
    stage_time: tuple[int, ...]
    static_prefix: tuple[int, ...]
    activation_prefix: tuple[int, ...]
    stage_static: tuple[int, ...]
    inflight: tuple[int, ...]
    fit_end: tuple[tuple[int, ...], ...]  # [s][i]: largest j with layers [i, j) fitting stage s; i-1 if none

    def seconds(self, s: int, i: int, j: int) -> int:
        return self.stage_time[s] + self.time_prefix[j] - self.time_prefix[i]

    def memory_prefix(self, s: int) -> list[int]:
        """Memory ticks of layers [0, j) on stage s, for every j (nondecreasing)."""
        f = self.inflight[s]
        return [a + f * b for a, b in zip(self.static_prefix, self.activation_prefix, strict=True)]

    def bytes(self, s: int, i: int, j: int) -> int:
        f = self.inflight[s]
        return (self.stage_static[s] + self.static_prefix[j] - self.static_prefix[i]
                + f * (self.activation_prefix[j] - self.activation_prefix[i]))


def _scaled(values: Sequence[float], largest: float) -> list[int]:
    """Each value in ticks of 2**(e - 40), where 2**e is the least power of two above
    ``largest``: scaling by a power of two is exact, so only the rounding to whole
    ticks changes a value, and values on a coarser binary grid not at all."""
    shift = _TICK_BITS - math.frexp(largest)[1]
    return [round(math.ldexp(v, shift)) for v in values]


def _ticks(problem: PartitionProblem) -> _Ticks:
    lt, ls, la = problem.layer_time, problem.layer_static, problem.layer_activation
    time_unit = math.fsum(lt) + max(problem.stage_time)
    static_all, act_all = math.fsum(ls), math.fsum(la)
    mem_unit = max(c + static_all + f * act_all
                   for c, f in zip(problem.stage_static, problem.inflight, strict=True))
    return _Ticks(
        n_layers=problem.n_layers,
        n_stages=problem.n_stages,
        min_layers=problem.min_layers,
        time_prefix=(0, *itertools.accumulate(_scaled(lt, time_unit))),
        stage_time=tuple(_scaled(problem.stage_time, time_unit)),
        static_prefix=(0, *itertools.accumulate(_scaled(ls, mem_unit))),
        activation_prefix=(0, *itertools.accumulate(_scaled(la, mem_unit))),
        stage_static=tuple(_scaled(problem.stage_static, mem_unit)),
        inflight=problem.inflight,
        fit_end=tuple(_fit_end(problem, s) for s in range(problem.n_stages)),
    )


def _fit_end(problem: PartitionProblem, s: int) -> tuple[int, ...]:
    """For each start i, the largest end j such that layers [i, j) fit on stage s
    (i - 1 when not even an empty stage fits). Nondecreasing in i, as _bytes is."""
    n, cap = problem.n_layers, problem.capacity
    if len(set(problem.layer_static)) == 1 and len(set(problem.layer_activation)) == 1:
        # identical layers (a dense model): memory depends only on how many layers a
        # stage holds, so one binary search over that count serves every start
        if _bytes(problem, s, 0, 0) > cap:
            return tuple(i - 1 for i in range(n + 1))
        lo, hi = 0, n  # largest k with layers [0, k) fitting
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _bytes(problem, s, 0, mid) <= cap else (lo, mid - 1)
        return tuple(min(n, i + lo) for i in range(n + 1))
    out, j = [], -1
    for i in range(n + 1):
        j = max(j, i - 1)
        while j < n and _bytes(problem, s, i, j + 1) <= cap:
            j += 1
        out.append(j)
    return tuple(out)


def _rank(t: _Ticks, layers: Sequence[int]) -> tuple[int, ...]:
    """The rank of a split (module doc), as a tuple to compare."""
    b = _bounds(layers)
    p = len(layers)
    return (max(t.seconds(s, b[s], b[s + 1]) for s in range(p)),
            max(t.bytes(s, b[s], b[s + 1]) for s in range(p)),
            layers[0], layers[-1], *layers[1:-1])


def _allowed(t: _Ticks, layers: Sequence[int]) -> bool:
    b = _bounds(layers)
    return all(n >= t.min_layers and b[s + 1] <= t.fit_end[s][b[s]] for s, n in enumerate(layers))


# --------------------------------------------------------------------------- DP


def partition_dp(problem: PartitionProblem) -> Partition | None:
    """The best split (module doc) by dynamic programming; None if none fits in memory.

    ANY: four passes over contiguous splits, one per level of the rank, each keeping
    the optimum of the levels before it as a bound. FIRST_LAST: a split is fixed by
    the first size and the middle size, so every one is ranked. UNIFORM: one split.
    """
    t = _ticks(problem)
    p, n, m = t.n_stages, t.n_layers, t.min_layers
    if p * m > n:
        return None
    if problem.shape is StageShape.UNIFORM:
        candidates: Sequence[tuple[int, ...]] = [uniform_stages(n, p)]
    elif problem.shape is StageShape.FIRST_LAST and p > 2:
        candidates = _first_last_splits(n, p, m)
    else:
        layers = _any_dp(t)
        return None if layers is None else _result(problem, layers)
    fitting = [c for c in candidates if _allowed(t, c)]
    if not fitting:
        return None
    return _result(problem, min(fitting, key=lambda c: _rank(t, c)))


def _first_last_splits(n: int, p: int, m: int) -> list[tuple[int, ...]]:
    """Every split whose p - 2 middle stages are equal, all stages >= m layers."""
    out = []
    for middle in range(m, (n - 2 * m) // (p - 2) + 1):
        rest = n - (p - 2) * middle
        for first in range(m, rest - m + 1):
            out.append((first, *([middle] * (p - 2)), rest - first))
    return out


def _any_dp(t: _Ticks) -> tuple[int, ...] | None:
    p, n, m = t.n_stages, t.n_layers, t.min_layers
    ends = [list(e) for e in t.fit_end]  # [s][i]: the last end allowed from start i

    # 1. the bottleneck
    bottleneck = _min_max(t, ends, lambda s: t.time_prefix, t.stage_time)
    if bottleneck is None:
        return None
    for s in range(p):
        tp, limit = t.time_prefix, bottleneck - t.stage_time[s]
        for i in range(n + 1):
            ends[s][i] = min(ends[s][i], bisect.bisect_right(tp, limit + tp[i]) - 1)

    # 2. the largest stage memory, under that bottleneck
    prefixes = [t.memory_prefix(s) for s in range(p)]
    peak = _min_max(t, ends, lambda s: prefixes[s], t.stage_static)
    assert peak is not None, "the bottleneck pass found a split; it must still fit"
    for s in range(p):
        w, limit = prefixes[s], peak - t.stage_static[s]
        for i in range(n + 1):
            ends[s][i] = min(ends[s][i], bisect.bisect_right(w, limit + w[i]) - 1)

    # 3. fewest layers on the first stage, then on the last, then the middle in order
    if p == 1:
        return (n,)
    finish = _can_finish(ends, 1, p, n, m)  # finish[s][i]: stages s..p-1 can hold [i, n)
    first = next(j for j in range(m, ends[0][0] + 1) if finish[1][j])
    if p == 2:
        return (first, n - first)
    last_start = max(e for e in _reachable(ends, 1, p - 1, first, m)
                     if e + m <= n <= ends[p - 1][e])
    finish = _can_finish(ends, 1, p - 1, last_start, m)  # middle stages hold [i, last_start)
    bounds = [0, first]
    for s in range(1, p - 2):
        i = bounds[-1]
        bounds.append(next(j for j in range(i + m, ends[s][i] + 1) if finish[s + 1][j]))
    bounds += [last_start, n]
    return _sizes(bounds)


def _min_max(t: _Ticks, ends: list[list[int]], prefix: Callable[[int], Sequence[int]],
             const: Sequence[int]) -> int | None:
    """The least, over splits whose stage s ends within ``ends[s][start]``, of the
    largest ``const[s] + prefix(s)[end] - prefix(s)[start]``; None if no split.

    f[s][j], the best for stages 0..s holding [0, j), is the least over starts i of
    max(f[s-1][i], cost of stage s on [i, j)). The cost grows as i falls, so the scan
    of i runs downward from j - m and stops once the cost alone reaches the best.
    """
    p, n, m = t.n_stages, t.n_layers, t.min_layers
    prev = [0] + [_INF] * n
    reached = 0  # the largest j with prev[j] finite
    for s in range(p):
        pre, c, end = prefix(s), const[s], ends[s]
        cur = [_INF] * (n + 1)
        first_j = n if s == p - 1 else m * (s + 1)
        i0 = 0  # the least start from which stage s can reach j (end[] is nondecreasing)
        for j in range(first_j, n - m * (p - 1 - s) + 1):
            while i0 <= n and end[i0] < j:
                i0 += 1
            best, top = _INF, c + pre[j]
            for i in range(min(j - m, reached), i0 - 1, -1):
                h = top - pre[i]
                if h >= best:
                    break
                f = prev[i]
                if f < best:
                    best = h if h > f else f
            cur[j] = best
        prev = cur
        reached = max((j for j in range(n + 1) if prev[j] < _INF), default=-1)
    return prev[n] if prev[n] < _INF else None


def _can_finish(ends: list[list[int]], lo: int, hi: int, target: int, m: int) -> list[list[bool]]:
    """table[s][i] for lo <= s <= hi: stages s..hi-1 can hold layers [i, target)."""
    n = len(ends[0]) - 1
    table: list[list[bool]] = [[] for _ in range(hi + 1)]
    table[hi] = [i == target for i in range(n + 1)]
    for s in range(hi - 1, lo - 1, -1):
        count = [0, *itertools.accumulate(table[s + 1])]  # count[j]: how many of [0, j) can
        end = ends[s]
        table[s] = [i + m <= end[i] and count[end[i] + 1] > count[i + m] for i in range(n + 1)]
    return table


def _reachable(ends: list[list[int]], lo: int, hi: int, start: int, m: int) -> list[int]:
    """The ends that stages lo..hi-1 can reach together from ``start``."""
    n = len(ends[0]) - 1
    here = [i == start for i in range(n + 1)]
    for s in range(lo, hi):
        delta = [0] * (n + 2)
        for i in range(n + 1):
            if here[i] and i + m <= ends[s][i]:
                delta[i + m] += 1
                delta[ends[s][i] + 1] -= 1
        here = [k > 0 for k in itertools.accumulate(delta[:n + 1])]
    return [i for i in range(n + 1) if here[i]]


# --------------------------------------------------------------------------- CP-SAT


def partition_cpsat(problem: PartitionProblem, time_limit_s: float = 10.0) -> Partition | None:
    """The best split (module doc) by CP-SAT; None if CP-SAT proves that none fits.

    Variables: boundaries 0 = b_0 <= b_1 <= ... <= b_p = L (stage s holds [b_s, b_s+1)).
    Stage sums come from element constraints on the prefix sums in ticks; the memory
    check from an element constraint on the float-checked table of reachable ends. The
    rank is minimized one level at a time, each optimum fixed as a constraint of the
    next (the last levels packed into as few mixed-radix objectives as fit in 62 bits).
    The uniform split is the hint, and ``p * bottleneck >= all the time`` a redundant
    bound. One worker and a fixed seed make it deterministic; probing and the LP
    relaxation are off, which made the first level 3-10x faster at 126 layers and 16
    stages (the LP of element constraints is weak). Presolve is off too: with it (and
    probing off) OR-Tools' CP-SAT reported as optimal a memory level above a split the
    model holds (9 GB where the DP finds 8 GB, and 20 GB where it finds 15 GB: both
    cases in ``tests/unit/test_partition.py``, found by the property test there); without
    it, it finds them, and 126 layers on 16 stages take 1.4 s. Should the time limit cut a level
    short, the best split found so far comes back with ``optimal=False``; if it cuts
    the first level short before any split is found, ``SolverTimeout``.
    """
    # imported here: OR-Tools (and the pandas and numpy it loads) take ~0.4 s to import,
    # which every command would pay; only this model needs it
    from ortools.sat.python import cp_model

    deadline = time.monotonic() + time_limit_s
    t = _ticks(problem)
    p, n, m = t.n_stages, t.n_layers, t.min_layers
    if p * m > n:
        return None
    model = cp_model.CpModel()
    b = [model.new_int_var(0, 0, "b0")]
    b += [model.new_int_var(0, n, f"b{k}") for k in range(1, p)]
    b += [model.new_int_var(n, n, f"b{p}")]

    def at(prefix: Sequence[int], k: int, name: str) -> cp_model.IntVar:
        """prefix[b_k] as a variable."""
        v = model.new_int_var(0, prefix[-1], f"{name}{k}")
        model.add_element(b[k], list(prefix), v)
        return v

    tp = [at(t.time_prefix, k, "time") for k in range(p + 1)]
    sp = [at(t.static_prefix, k, "static") for k in range(p + 1)]
    ap = [at(t.activation_prefix, k, "act") for k in range(p + 1)]
    most_time = max(t.stage_time) + t.time_prefix[-1]
    most_bytes = max(t.bytes(s, 0, n) for s in range(p))
    bottleneck = model.new_int_var(0, most_time, "bottleneck")
    peak = model.new_int_var(0, most_bytes, "peak")
    for s in range(p):
        model.add(b[s + 1] - b[s] >= m)
        fit = model.new_int_var(-1, n, f"fit_end{s}")
        model.add_element(b[s], list(t.fit_end[s]), fit)
        model.add(b[s + 1] <= fit)
        model.add(bottleneck >= t.stage_time[s] + tp[s + 1] - tp[s])
        model.add(peak >= t.stage_static[s] + sp[s + 1] - sp[s]
                  + t.inflight[s] * (ap[s + 1] - ap[s]))
    if problem.shape is StageShape.UNIFORM:
        for k, bound in enumerate(_bounds(uniform_stages(n, p))):
            model.add(b[k] == bound)
    elif problem.shape is StageShape.FIRST_LAST:
        for s in range(2, p - 1):
            model.add(b[s + 1] - b[s] == b[2] - b[1])

    # levels 3 and 4 of the rank: b_1, then L - b_(p-1), then b_2 .. b_(p-2)
    order = [b[1], n - b[p - 1], *b[2:p - 1]] if p > 1 else []
    per_objective = max(1, 62 // (n + 1).bit_length())
    levels: list[cp_model.LinearExprT] = [bottleneck, peak]
    for k in range(0, len(order), per_objective):
        chunk = order[k:k + per_objective]
        levels.append(sum(x * (n + 1) ** (len(chunk) - 1 - r) for r, x in enumerate(chunk)))

    model.add(p * bottleneck >= sum(t.stage_time) + t.time_prefix[-1])
    for x, v in zip(b, _bounds(uniform_stages(n, p)), strict=True):
        model.add_hint(x, v)

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.linearization_level = 0
    solver.parameters.cp_model_presolve = False  # see the docstring
    found: list[int] | None = None
    for level in levels:
        solver.parameters.max_time_in_seconds = max(0.0, deadline - time.monotonic())
        model.minimize(level)
        status = solver.solve(model)
        if status == cp_model.INFEASIBLE:
            assert found is None, "a level fixed at its optimum cannot make the model infeasible"
            return None
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if found is None:
                raise SolverTimeout(f"CP-SAT found no split of {n} layers into {p} stages "
                                    f"within {time_limit_s:g} s ({solver.status_name(status)})")
            return _result(problem, _sizes(found), optimal=False)
        found = [solver.value(x) for x in b]
        if status == cp_model.FEASIBLE:
            return _result(problem, _sizes(found), optimal=False)
        model.add(level <= solver.value(level))
        model.clear_hints()
        for x, v in zip(b, found, strict=True):
            model.add_hint(x, v)
    assert found is not None
    return _result(problem, _sizes(found))


def _sizes(bounds: Sequence[int]) -> tuple[int, ...]:
    return tuple(b - a for a, b in itertools.pairwise(bounds))


# --------------------------------------------------------------------------- choice


def best_partition(problem: PartitionProblem) -> Partition | None:
    """The best split (module doc); None if none fits.

    The rule: the DP whenever it applies, CP-SAT otherwise. Today the DP applies to
    every ``PartitionProblem``: the constraints are per stage (memory, minimum size,
    the shape's equal middle sizes), and uneven layer times or memory (MoE and dense
    layers mixed, binding capacity) only change the numbers it sums, not the method.
    CP-SAT is the model to extend when a constraint couples stages the DP cannot
    follow (interleaved chunks, a shared budget); route such problems to it here.
    """
    return partition_dp(problem)
